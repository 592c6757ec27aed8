"""`GET /metrics`: Prometheus text exposition, scraped with a bearer token like the API.

Two spends are exported and kept apart: the draft spend (`batchdesk_spend_total`: every draft
recorded, priced in USD at its job's batch price as it arrives) and the settled spend
(`batchdesk_spend_business_total`: what each settled unit was charged, in the currency it was kept in).
"""

from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from ledger.health import attention_by_provider, collector_stalled, last_poll_at, units_failing_to_record
from ledger.lifecycle.deadlines import collection_at_risk
from ledger.models import AttemptOutcome, DestinationAttempt, Event, ItemTally, Submission
from ledger.money.budgets import settled_spend_by_currency
from ledger.money.pricing import draft_spend
from ledger.notices.notifications import undelivered
from ledger.providers import configured_provider_names
from ledger.states import ItemState, SubmissionState

from ..permissions import VIEWERS
from .doors import BEARER_TOKEN, door

# Submissions that have not finished: still to be sent, being reconciled, at the provider, or
# waiting to be collected.
UNFINISHED_SUBMISSION_STATES = (
    SubmissionState.INTENT,
    SubmissionState.UNCERTAIN,
    SubmissionState.OPEN,
    SubmissionState.ENDED,
)
DESTINATION_FAILURES = (AttemptOutcome.RETRYABLE, AttemptOutcome.REJECTED, AttemptOutcome.REFUSED_BY_GUARD)


def label_value(text: str) -> str:
    """A Prometheus label value: backslash, double quote and line feed escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric(lines: list[str], name: str, kind: str, help_text: str, samples: dict[str, object]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value}" for labels, value in samples.items()]


def failures_by_provider() -> dict[tuple[str, str], int]:
    """Failed inferences and failed destination attempts by (kind, provider of their job), every
    configured provider's series present from the start. Two grouped counts over the few rows of
    their partial indexes."""
    inference = (
        Event.objects.filter(to_state=ItemState.INFERENCE_FAILED)
        .order_by()
        .values_list("job__provider")
        .annotate(n=Count("pk"))
    )
    destination = (
        DestinationAttempt.objects.filter(outcome__in=DESTINATION_FAILURES)
        .order_by()
        .values_list("item__job__provider")
        .annotate(n=Count("pk"))
    )
    kinds = {"inference": inference, "destination": destination}
    counts = {(kind, provider): 0 for kind in kinds for provider in configured_provider_names()}
    for kind, rows in kinds.items():
        for provider, n in rows:
            key = (kind, provider or "unknown")  # an event that names no job
            counts[key] = counts.get(key, 0) + n
    return dict(sorted(counts.items()))


@door(BEARER_TOKEN, GET=VIEWERS)
def metrics(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    items_by_state = ItemTally.objects.counts_by_state()
    unfinished = Submission.objects.filter(state__in=UNFINISHED_SUBMISSION_STATES).aggregate(
        n=Count("pk"), oldest=Min("created_at")
    )
    oldest_age = (now - unfinished["oldest"]).total_seconds() if unfinished["oldest"] else 0
    failures = failures_by_provider()
    polled = last_poll_at()
    lines: list[str] = []
    metric(
        lines,
        "batchdesk_items",
        "gauge",
        "Items in each state.",
        {f'{{state="{state}"}}': items_by_state.get(state, 0) for state in ItemState.values},
    )
    metric(
        lines,
        "batchdesk_open_submissions",
        "gauge",
        "Submissions not yet collected: intent, uncertain, open or ended.",
        {"": unfinished["n"]},
    )
    metric(
        lines,
        "batchdesk_oldest_open_submission_age_seconds",
        "gauge",
        "Age of the oldest submission not yet collected; 0 when there is none.",
        {"": f"{oldest_age:.3f}"},
    )
    metric(
        lines,
        "batchdesk_failures_total",
        "counter",
        "Failed inferences (results with no usable answer, retried or not) and failed destination "
        "attempts, by the provider of their job.",
        {
            f'{{kind="{kind}",provider="{label_value(provider)}"}}': count
            for (kind, provider), count in failures.items()
        },
    )
    metric(
        lines,
        "batchdesk_items_needing_attention",
        "gauge",
        "Items waiting for an operator (as on the operations page), by the provider of their job and state.",
        {
            f'{{provider="{label_value(provider)}",state="{state}"}}': count
            for (provider, state), count in attention_by_provider(with_zeros=True).items()
        },
    )
    drafts = draft_spend()
    metric(
        lines,
        "batchdesk_spend_total",
        "counter",
        "Draft spend: what every draft recorded so far cost in USD at its job's batch price, settled or "
        "not (models with a known price only). Not what providers charged: see "
        "batchdesk_spend_business_total.",
        {"": drafts.total},
    )
    metric(
        lines,
        "batchdesk_spend_business_total",
        "counter",
        "Settled spend: what each settled provider batch cost, in the currency it was kept in (the "
        "business currency at the rate in force on its day; USD where no rate was). Not the draft "
        "spend of batchdesk_spend_total.",
        {
            f'{{currency="{label_value(currency)}"}}': amount
            for currency, amount in settled_spend_by_currency().items()
        },
    )
    metric(
        lines,
        "batchdesk_unpriced_tokens_total",
        "counter",
        "Tokens used by models without a known price (not in batchdesk_spend_total).",
        {
            f'{{provider="{label_value(provider)}",model="{label_value(model)}"}}': tokens
            for (provider, model), tokens in sorted(drafts.unpriced_tokens.items())
        },
    )
    metric(
        lines,
        "batchdesk_collector_stalled",
        "gauge",
        "1 when work waits on a collector that has not polled within 3 poll intervals.",
        {"": int(collector_stalled())},
    )
    metric(
        lines,
        "batchdesk_units_failing_to_record",
        "gauge",
        "Units whose results failed to be recorded several collections in a row.",
        {"": units_failing_to_record()},
    )
    at_risk = collection_at_risk()
    metric(
        lines,
        "batchdesk_units_collection_at_risk",
        "gauge",
        "Ended units not collected yet past half the time their provider keeps their results.",
        {"": at_risk["units"]},
    )
    metric(
        lines,
        "batchdesk_earliest_collect_by_timestamp_seconds",
        "gauge",
        "The earliest collect-by date of a unit at risk, in Unix seconds; 0 when none is at risk.",
        {"": f"{at_risk['earliest_collect_by'].timestamp():.3f}" if at_risk["earliest_collect_by"] else 0},
    )
    told = undelivered()
    metric(
        lines,
        "batchdesk_notifications_retrying",
        "gauge",
        "Job notifications whose delivery failed and is being tried again (for 24 hours).",
        {"": told["retrying"]},
    )
    metric(
        lines,
        "batchdesk_notifications_given_up",
        "gauge",
        "Job notifications given up after 24 hours of failed deliveries.",
        {"": told["given_up"]},
    )
    metric(
        lines,
        "batchdesk_collector_last_poll_timestamp_seconds",
        "gauge",
        "When the collector last polled, in Unix seconds; 0 if it never has.",
        {"": f"{polled.timestamp():.3f}" if polled else 0},
    )
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4; charset=utf-8")
