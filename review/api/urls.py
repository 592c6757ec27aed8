"""`/api/` (SPEC §6). Addresses have no trailing slash; anything else under /api/ is a JSON 404.
`/metrics` and the providers' `/hooks/*` are mounted beside it (batchdesk/urls.py), behind the same
door."""

from django.urls import path, re_path

from ..ids import register_id_converter
from . import charges, costs, exports, health, items, jobs, notifications, pilots, products, prompts, stream
from .errors import unknown

register_id_converter()

app_name = "api"

urlpatterns = [
    path("jobs", jobs.job_list, name="jobs"),
    path("jobs/<id:job_id>", jobs.job_detail, name="job"),
    path("jobs/<id:job_id>/cancel", jobs.cancel, name="cancel_job"),
    path("jobs/<id:job_id>/budget", jobs.budget, name="job_budget"),
    path("jobs/<id:job_id>/resume", jobs.resume, name="resume_job"),
    path("jobs/<id:job_id>/items", jobs.job_items, name="job_items"),
    path("jobs/<id:job_id>/submissions", jobs.job_submissions, name="job_submissions"),
    path("jobs/<id:job_id>/pilot", pilots.pilot_report, name="pilot_report"),
    path("jobs/<id:job_id>/pilot/decision", pilots.pilot_decision, name="pilot_decision"),
    path("jobs/<id:job_id>/stream", stream.job_stream, name="job_stream"),
    path("jobs/<id:job_id>/notifications", notifications.notifications, name="job_notifications"),
    path("jobs/<id:job_id>/export", exports.job_export, name="job_export"),
    path("jobs/<id:job_id>/costs", costs.job_costs, name="job_costs"),
    path("jobs/<id:job_id>/charges", charges.charges, name="job_charges"),
    path("items/<id:item_id>", items.item_detail, name="item"),
    path("items/<id:item_id>/versions/<id:version_id>/approve", items.approve, name="approve"),
    path("items/<id:item_id>/versions/<id:version_id>/reject", items.reject, name="reject"),
    path("items/<id:item_id>/retry", items.retry, name="retry"),
    path("items/<id:item_id>/undo", items.undo, name="undo"),
    path("items/<id:item_id>/comments", items.comment, name="comments"),
    path("products/<str:sku>", products.product_detail, name="product"),
    path("products/<str:sku>/withdraw", products.withdraw, name="withdraw"),
    path("prompts/<str:task>/current", prompts.prompt_current, name="prompt_current"),
    path("health", health.health, name="health"),
    re_path(r"^.*$", unknown),
]
