"""What a pilot's acceptance drill shows (SPEC §6 `drill: {ran, checks: [{name, held, evidence}]}`):
each step with the ledger entries it changed, and three checks.

The checks are read from the ledger over the pilot's whole job, not from the drill's own notes: a
check fails whenever the guard it stands for failed, in a drilled step or anywhere else in the run.

- `no_inference_paid_twice`: each draft of the job answers a request the ledger sent and recorded
  (its custom_id is one of the job's requests, recorded as returned), and no request has two drafts.
- `no_product_published_twice`: no product is published twice for one revision of its source by the
  job: one catalogue publication, or one operation key applied at a webhook, per product and revision
  (a product revised after its publication may be published again, for its new revision).
- `nothing_published_from_obsolete_or_withdrawn_source`: each publication of the job's drafts was of
  the product's current revision at that moment (no later revision was made before it) and of a product
  not withdrawn then (a withdrawal leaves an event on each unfinished item of the product: none came
  before it).

A publication is a catalogue `Publication` (written with the product's text), or, at a webhook, the
first attempt applied under an operation key.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Exists, Min, OuterRef, Q, QuerySet

from ..models import (
    AttemptOutcome,
    DestinationAttempt,
    DrillKind,
    DrillStep,
    Event,
    GeneratedVersion,
    Item,
    Job,
    Pilot,
    Publication,
    SourceRevision,
    SubmissionItem,
)
from ..states import ItemState, SubmissionState
from .drill import unit_item_events, unit_recorded, unit_versions

# Ids listed in a check's evidence at most; the counts say how many there are.
IDS_SHOWN = 50


@dataclass(frozen=True)
class Check:
    name: str
    label: str
    held: bool
    evidence: dict

    def as_json(self) -> dict:
        return {"name": self.name, "label": self.label, "held": self.held, "evidence": self.evidence}


@dataclass(frozen=True)
class Published:
    """One publication of one of the job's drafts: a catalogue `Publication`, or a webhook's operation
    key first applied."""

    kind: str  # "publication" or "attempt": which ledger row `id` is
    id: int
    product_id: int
    sku: str
    revision: int  # the source revision's number
    at: datetime
    operation_key: str
    later_revision: bool  # a newer revision of the product was made before it
    withdrawn_before: bool  # the product had been withdrawn before it

    def as_json(self) -> dict:
        return {
            self.kind: self.id,
            "sku": self.sku,
            "revision": self.revision,
            "at": self.at.isoformat(),
            "operation_key": self.operation_key,
        }


def drill_report(pilot: Pilot) -> dict:
    """The report's `drill`: for a pilot that did not ask for it, `{ran: false, checks: []}`."""
    if not pilot.drill:
        return {"ran": False, "checks": []}
    steps = list(DrillStep.objects.filter(pilot=pilot).select_related("submission", "item__product"))
    return {
        "ran": bool(steps) and all(step.done_at for step in steps),
        "checks": [check.as_json() for check in drill_checks(pilot.job)],
        "steps": [step_json(pilot.job, step) for step in steps],
    }


def drill_checks(job: Job) -> list[Check]:
    published = publications(job)
    return [
        no_inference_paid_twice(job),
        no_product_published_twice(published),
        nothing_published_from_obsolete_or_withdrawn_source(published),
    ]


def no_inference_paid_twice(job: Job) -> Check:
    versions = GeneratedVersion.objects.filter(item__job=job)
    twice = list(
        versions.order_by()
        .values_list("custom_id")
        .annotate(drafts=Count("pk"))
        .filter(drafts__gt=1)
        .values_list("custom_id", flat=True)[:IDS_SHOWN]
    )
    returned = SubmissionItem.objects.filter(
        item_id=OuterRef("item_id"), custom_id=OuterRef("custom_id"), outcome="returned"
    )
    unasked = list(versions.exclude(Exists(returned)).order_by("pk").values_list("pk", flat=True)[:IDS_SHOWN])
    requests = SubmissionItem.objects.filter(item__job=job, outcome="returned").count()
    drafts = versions.count()
    held = not twice and not unasked
    summary = (
        f"{drafts} draft{'' if drafts == 1 else 's'} for {requests} request{'' if requests == 1 else 's'} "
        "answered with one: each answers a request sent and recorded, no request has two"
        if held
        else "Paid twice: "
        + "; ".join(
            part
            for part in (
                twice and f"requests with two drafts: {', '.join(twice)}",
                unasked and f"drafts answering no request recorded: {', '.join(map(str, unasked))}",
            )
            if part
        )
    )
    return Check(
        "no_inference_paid_twice",
        "No inference paid twice",
        held,
        {
            "summary": summary,
            "requests_answered": requests,
            "drafts": drafts,
            "requests_with_two_drafts": [
                {
                    "custom_id": custom_id,
                    "versions": sorted(versions.filter(custom_id=custom_id).values_list("pk", flat=True)),
                }
                for custom_id in twice
            ],
            "drafts_answering_no_request": unasked,
        },
    )


def publications(job: Job) -> list[Published]:
    """Every publication of the job's drafts, oldest first, with what the ledger knew of its product's
    source when it was made."""

    def later_revision(product: str, number: str, at: str) -> Exists:
        return Exists(
            SourceRevision.objects.filter(
                product_id=OuterRef(product), number__gt=OuterRef(number), created_at__lte=OuterRef(at)
            )
        )

    def withdrawn_before(product: str, at: str) -> Exists:
        items = Item.objects.filter(product_id=OuterRef(OuterRef(product))).values("pk")
        return Exists(
            Event.objects.filter(item_id__in=items, to_state=ItemState.WITHDRAWN, at__lte=OuterRef(at))
        )

    def as_published(rows: QuerySet, *, product: str, revision: str, at: str) -> QuerySet:
        """`rows` as `Published`'s fields: whether a later revision or a withdrawal of the product
        was recorded by the time `at`."""
        sku = product.removesuffix("_id") + "__sku"
        return rows.annotate(
            later=later_revision(product, revision, at), withdrawn=withdrawn_before(product, at)
        ).values_list("pk", product, sku, revision, at, "operation_key", "later", "withdrawn")

    catalogue = as_published(
        Publication.objects.filter(version__item__job=job),
        product="product_id",
        revision="version__item__source_revision__number",
        at="published_at",
    )
    found = [Published("publication", *row) for row in catalogue]
    # At a webhook: the first attempt applied under each operation key (a retry under the same key
    # is the same publication, confirmed).
    first_applied = (
        DestinationAttempt.objects.filter(item__job=job, outcome=AttemptOutcome.APPLIED)
        .exclude(destination="catalogue")
        .values("operation_key")
        .annotate(first=Min("pk"))
        .values("first")
    )
    attempts = as_published(
        DestinationAttempt.objects.filter(pk__in=first_applied),
        product="item__product_id",
        revision="item__source_revision__number",
        at="finished_at",
    )
    found += [Published("attempt", *row) for row in attempts]
    return sorted(found, key=lambda published: (published.at, published.id))


def no_product_published_twice(published: list[Published]) -> Check:
    by_source: dict[tuple[int, int], list[Published]] = {}
    for one in published:
        by_source.setdefault((one.product_id, one.revision), []).append(one)
    twice = [ones for ones in by_source.values() if len(ones) > 1]
    products = len({one.product_id for one in published})
    return Check(
        "no_product_published_twice",
        "No product published twice",
        not twice,
        {
            "summary": (
                f"{products} product{'' if products == 1 else 's'} published, each once for its revision"
                if not twice
                else "Published twice: "
                + "; ".join(
                    f"{ones[0].sku} revision {ones[0].revision} ({len(ones)} times)" for ones in twice
                )
            ),
            "publications": [one.as_json() for one in published[:IDS_SHOWN]],
            "published_twice": [[one.as_json() for one in ones] for ones in twice[:IDS_SHOWN]],
        },
    )


def nothing_published_from_obsolete_or_withdrawn_source(published: list[Published]) -> Check:
    obsolete = [one for one in published if one.later_revision]
    withdrawn = [one for one in published if one.withdrawn_before]
    held = not obsolete and not withdrawn
    return Check(
        "nothing_published_from_obsolete_or_withdrawn_source",
        "Nothing published from an obsolete or withdrawn source",
        held,
        {
            "summary": (
                f"Each of {len(published)} publication{'' if len(published) == 1 else 's'} was of its "
                "product's current revision, the product active"
                if held
                else "; ".join(
                    part
                    for part in (
                        obsolete
                        and "from an obsolete revision: "
                        + ", ".join(f"{one.sku} revision {one.revision}" for one in obsolete),
                        withdrawn and "of a withdrawn product: " + ", ".join(one.sku for one in withdrawn),
                    )
                    if part
                )
            ),
            "from_obsolete_revisions": [one.as_json() for one in obsolete[:IDS_SHOWN]],
            "of_withdrawn_products": [one.as_json() for one in withdrawn[:IDS_SHOWN]],
        },
    )


# --- the steps -----------------------------------------------------------------------------------


def step_json(job: Job, step: DrillStep) -> dict:
    shown = {
        "kind": step.kind,
        "label": step.get_kind_display(),
        "done": step.done_at is not None,
        "taken_at": step.taken_at,
        "done_at": step.done_at,
        "unit": (
            {
                "id": step.submission.pk,
                "provider_ref": step.submission.provider_ref,
                "state": step.submission.state,
            }
            if step.submission
            else None
        ),
        "item": {"id": step.item.pk, "sku": step.item.product.sku} if step.item else None,
        "recorded": step.evidence,
    }
    if step.kind == DrillKind.INTERRUPTED_COLLECTION and step.submission:
        shown["ledger_now"] = collected_since(step)
    elif step.kind == DrillKind.REPEATED_DELIVERY and step.done_at:
        shown["ledger_now"] = {"changed": step.evidence.get("changed", [])}
    elif step.kind == DrillKind.DESTINATION_TIMEOUT and step.item:
        shown["ledger_now"] = applied_since(job, step)
    return shown


def collected_since(step: DrillStep) -> dict:
    """The interrupted unit now: what the worker that resumed it recorded, and whether any request has
    two drafts."""
    unit = step.submission
    now = unit_recorded(unit.pk)
    before = set(step.evidence.get("before_the_kill", {}).get("versions", []))
    per_request = (
        unit_versions(unit.pk).order_by().values_list("custom_id").annotate(n=Count("pk")).filter(n__gt=1)
    )
    collected = (
        Event.objects.filter(submission=unit, to_state=SubmissionState.COLLECTED)
        .values_list("pk", flat=True)
        .first()
    )
    return {
        **now,
        "versions_after_the_kill": [pk for pk in now["versions"] if pk not in before],
        "requests_with_two_drafts": len(per_request),
        "item_events": unit_item_events(unit.pk).count(),
        "collected_event": collected,
    }


def applied_since(job: Job, step: DrillStep) -> dict:
    """The drilled item now: its attempts (each with its operation key), the publications of its
    product by the job, and its events from approval on."""
    item = step.item
    attempts = DestinationAttempt.objects.filter(item=item).order_by("pk")
    return {
        "state": Item.objects.values_list("state", flat=True).get(pk=item.pk),
        "attempts": [
            {"id": pk, "operation_key": key, "outcome": outcome, "response": response}
            for pk, key, outcome, response in attempts.values_list(
                "pk", "operation_key", "outcome", "response"
            )
        ],
        "operation_keys": sorted(set(attempts.values_list("operation_key", flat=True))),
        "publications": list(
            Publication.objects.filter(product_id=item.product_id, version__item__job=job)
            .order_by("pk")
            .values_list("pk", flat=True)
        ),
        "events": [
            {"id": pk, "from": from_state, "to": to_state, "reason": reason}
            for pk, from_state, to_state, reason in Event.objects.filter(item=item)
            .filter(Q(to_state__in=[ItemState.APPROVED, ItemState.APPLYING, ItemState.APPLIED]))
            .order_by("pk")
            .values_list("pk", "from_state", "to_state", "reason")
        ],
    }
