from django.urls import path

from . import audit, catalogue, job_export, jobs, operations, pilots, prompts, quality, views
from .ids import register_id_converter

register_id_converter()

urlpatterns = [
    path("", jobs.dashboard, name="dashboard"),
    path("jobs/", jobs.job_list, name="job_list"),
    path("jobs/new", jobs.job_start, name="job_start"),
    path("jobs/new/estimate", jobs.job_estimate, name="job_estimate"),
    path("jobs/<id:job_id>/", jobs.job_detail, name="job_detail"),
    path("jobs/<id:job_id>/cancel", jobs.job_cancel, name="job_cancel"),
    path("jobs/<id:job_id>/budget", jobs.job_budget, name="job_budget"),
    path("jobs/<id:job_id>/resume", jobs.job_resume, name="job_resume"),
    path("jobs/<id:job_id>/pilot", pilots.pilot_report, name="pilot_report"),
    path("jobs/<id:job_id>/export", job_export.job_export, name="job_export"),
    path("items/<id:item_id>/", views.item_detail, name="item_detail"),
    path("items/<id:item_id>/approve", views.approve, name="approve_item"),
    path("items/<id:item_id>/reject", views.reject, name="reject_item"),
    path("review/", views.review_queue, name="review_queue"),
    path("review/approve-selected", views.approve_selected, name="approve_selected"),
    path("review/reject-selected", views.reject_selected, name="reject_selected"),
    path("review/decide-matching", views.decide_matching, name="decide_matching"),
    path("items/<id:item_id>/regenerate", views.regenerate, name="regenerate_item"),
    path("catalogue/", catalogue.catalogue, name="catalogue"),
    path("catalogue/import", catalogue.catalogue_import, name="catalogue_import"),
    path("catalogue/import/history", catalogue.import_history, name="import_history"),
    path("catalogue/imports/<id:import_id>/", catalogue.catalogue_import_detail, name="import_detail"),
    path("catalogue/imports/<id:import_id>/confirm", catalogue.import_confirm, name="import_confirm"),
    path("catalogue/imports/<id:import_id>/discard", catalogue.import_discard, name="import_discard"),
    path("catalogue/<str:sku>/", catalogue.catalogue_product, name="catalogue_product"),
    path("prompts/", prompts.prompts, name="prompts"),
    path("prompts/new", prompts.prompt_new, name="prompt_new"),
    path("prompts/<id:prompt_id>/", prompts.prompt_detail, name="prompt_detail"),
    path("prompts/<id:prompt_id>/current", prompts.prompt_make_current, name="prompt_make_current"),
    path("operations/", operations.operations, name="operations"),
    path("operations/retry", operations.retry, name="operations_retry"),
    path("operations/retry-group", operations.retry_group, name="operations_retry_group"),
    path("operations/submissions/<id:submission_id>/resolve", operations.resolve, name="resolve_submission"),
    path("operations/submissions/<id:submission_id>/resend", operations.resend, name="resend_submission"),
    path("quality/", quality.quality, name="quality"),
    path("quality/quality.csv", quality.quality_csv, name="quality_csv"),
    path("audit/", audit.audit, name="audit"),
    path("audit/approvals.csv", audit.approvals_csv, name="audit_csv"),
    path("audit/items/<id:item_id>/events", audit.item_events, name="audit_events"),
]
