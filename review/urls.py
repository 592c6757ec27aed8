from django.urls import path

from . import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("items/<int:item_id>/", views.item_detail, name="item_detail"),
    path("items/<int:item_id>/approve", views.approve, name="approve_item"),
    path("items/<int:item_id>/reject", views.reject, name="reject_item"),
    path("review/", views.review_queue, name="review_queue"),
]
