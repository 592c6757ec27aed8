"""What an import's revisions cost in work already started: each unfinished job queues a revised
product's current revision again (paid for again), estimated before anyone confirms it (rule 16)."""

from ..models import Job
from ..money.estimates import price_note, request_estimate, work_cost
from ..money.pricing import price_for
from .records import ImportReport


def price_rework(report: ImportReport) -> None:
    """Name each job of `report.rework` and estimate the cost of what it queues again."""
    jobs = Job.objects.filter(pk__in=list(report.rework)).select_related("prompt_version")
    for job in jobs:
        rework = report.rework[job.pk]
        rework.reference = job.reference
        if not rework.requeued:
            continue
        per_request = request_estimate(
            job.prompt_version, rework.sample, provider=job.provider, model=job.model
        )
        rework.cost = work_cost(price_for(job.provider, job.model), rework.requeued, per_request)
        rework.estimate_source = per_request.source
        rework.price_note = price_note(job.provider, job.model)
