"""`/api/` (SPEC §6). Addresses have no trailing slash; anything else under /api/ is a JSON 404."""

from django.urls import path, re_path

from . import api, job_export, job_notifications, job_stream, pilot_api
from .ids import register_id_converter

register_id_converter()

app_name = "api"

urlpatterns = [
    path("jobs", api.job_list, name="jobs"),
    path("jobs/<id:job_id>", api.job_detail, name="job"),
    path("jobs/<id:job_id>/cancel", api.cancel, name="cancel_job"),
    path("jobs/<id:job_id>/budget", api.budget, name="job_budget"),
    path("jobs/<id:job_id>/resume", api.resume, name="resume_job"),
    path("jobs/<id:job_id>/items", api.job_items, name="job_items"),
    path("jobs/<id:job_id>/submissions", api.job_submissions, name="job_submissions"),
    path("jobs/<id:job_id>/pilot", pilot_api.pilot_report, name="pilot_report"),
    path("jobs/<id:job_id>/stream", job_stream.job_stream, name="job_stream"),
    path("jobs/<id:job_id>/notifications", job_notifications.notifications, name="job_notifications"),
    path("jobs/<id:job_id>/export", job_export.api_job_export, name="job_export"),
    path("items/<id:item_id>", api.item_detail, name="item"),
    path("items/<id:item_id>/versions/<id:version_id>/approve", api.approve, name="approve"),
    path("items/<id:item_id>/versions/<id:version_id>/reject", api.reject, name="reject"),
    path("items/<id:item_id>/retry", api.retry, name="retry"),
    path("products/<str:sku>", api.product_detail, name="product"),
    path("products/<str:sku>/withdraw", api.withdraw, name="withdraw"),
    path("prompts/<str:task>/current", api.prompt_current, name="prompt_current"),
    path("health", api.health, name="health"),
    re_path(r"^.*$", api.unknown),
]
