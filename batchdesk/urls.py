from django.contrib import admin
from django.urls import include, path

from review import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("review.api_urls")),
    path("metrics", api.metrics, name="metrics"),
    path("", include("review.urls")),
]
