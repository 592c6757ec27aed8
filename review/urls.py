from django.urls import path

from . import jobs, views

urlpatterns = [
    path("", jobs.dashboard, name="dashboard"),
    path("jobs/<int:job_id>/", jobs.job_detail, name="job_detail"),
    path("items/<int:item_id>/", views.item_detail, name="item_detail"),
    path("items/<int:item_id>/approve", views.approve, name="approve_item"),
    path("items/<int:item_id>/reject", views.reject, name="reject_item"),
    path("review/", views.review_queue, name="review_queue"),
]
