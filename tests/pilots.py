"""A known pilot, brought where its report can project, for the report's tests (API, screen, 390 px).

The scope: 8 `kitchen` and 4 `garden` products (12), named. The pilot draws 2 of each (seed 5), and its
four items end as follows (within each stratum in SKU order), priced as gpt-4o-mini at OpenAI's
batch price (0.15 and 0.60 USD per million tokens, half off):

| item      | tokens in / out     | first draft cost | outcome                                  |
|-----------|---------------------|------------------|------------------------------------------|
| kitchen 1 | 1,000,000 / 500,000 | 0.225            | approved as it is, 60 s after shown      |
| kitchen 2 | 2,000,000 / 500,000 | 0.300            | approved with one word edited, 120 s     |
| garden 1  | 1,000,000 / 1,000,000 | 0.375          | invalid: too long                        |
| garden 2  | 1,000,000 / 500,000 | 0.225            | rejected, 30 s                           |

Each decision is a different reviewer's first, so each is timed from its draft being ready.

Three products of the scope outside the sample were revised once (0.25 revisions per product per
month: the history is shorter than a month). One unit of its 4 requests took 600 s from sending to
collection (150 s a request).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from ledger.actions.core import change_state
from ledger.actions.jobs import Arm, create_job, create_pilot_arms
from ledger.actions.reviewing import approve_version, reject_version
from ledger.catalogue import revise_product
from ledger.models import Event, GeneratedVersion, Item, Job, Submission
from ledger.pilots.sample import PilotPlan
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.factories import ProductFactory, UserFactory, add_version

SHOWN_AT = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@contextmanager
def clock_at(moment: datetime) -> Iterator[None]:
    """What the ledger writes meanwhile is dated `moment` (events are never updated afterwards)."""
    real = timezone.now
    timezone.now = lambda: moment
    try:
        yield
    finally:
        timezone.now = real


def draft(
    item: Item, input_tokens: int, output_tokens: int, *, valid: bool = True, content: str = ""
) -> GeneratedVersion:
    """The item's draft, returned from the model and judged (sent first, if it was not yet)."""
    if Item.objects.get(pk=item.pk).state == ItemState.PREPARED:
        change_state(item.pk, to=ItemState.SUBMITTED)
    version = add_version(item, content, valid=valid, reasons=[] if valid else ["Too long: 1,300 characters"])
    GeneratedVersion.objects.filter(pk=version.pk).update(
        input_tokens=input_tokens, output_tokens=output_tokens
    )
    change_state(item.pk, to=ItemState.RETURNED)
    if valid:
        change_state(item.pk, to=ItemState.AWAITING_REVIEW)
    else:
        change_state(
            item.pk,
            to=ItemState.VALIDATION_FAILED,
            reason="Too long: 1,300 characters",
            code=ReasonCode.TOO_LONG,
            data={"codes": [ReasonCode.TOO_LONG]},
        )
    version.refresh_from_db()
    return version


def known_pilot(owner, reference: str = "known-pilot") -> Job:
    """Its scope is its 12 products, named: whatever else the catalogue holds."""
    scope = [
        f"{category}-{n}" for category, count in {"kitchen": 8, "garden": 4}.items() for n in range(count)
    ]
    for sku in scope:
        ProductFactory(sku=sku, revision__fields={"category": sku.split("-")[0], "material": "oak"})
    job = create_job(
        reference=reference,
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        skus=scope,
        pilot=PilotPlan(per_stratum=2, strata=("category",), seed=5),
    )
    items = list(job.items.select_related("product").order_by("product__sku"))
    # Three reviewers, each deciding once: each decision is timed from its draft being ready.
    reviewers = [UserFactory(roles=["catalogue_owner"]) for _ in range(2)]
    (garden_1, garden_2), (kitchen_1, kitchen_2) = items[:2], items[2:]
    with clock_at(SHOWN_AT):
        k1 = draft(kitchen_1, 1_000_000, 500_000)
        k2 = draft(kitchen_2, 2_000_000, 500_000)
        draft(garden_1, 1_000_000, 1_000_000, valid=False)
        g2 = draft(garden_2, 1_000_000, 500_000)
    with clock_at(SHOWN_AT + timedelta(seconds=60)):
        approve_version(item_id=kitchen_1.pk, version_id=k1.pk, version_hash=k1.content_hash, approver=owner)
    with clock_at(SHOWN_AT + timedelta(seconds=120)):
        edited = k2.content.replace("sturdy", "solid")
        approve_version(
            item_id=kitchen_2.pk,
            version_id=k2.pk,
            version_hash=k2.content_hash,
            approver=reviewers[0],
            content=edited,
        )
    with clock_at(SHOWN_AT + timedelta(seconds=30)):
        reject_version(item_id=garden_2.pk, version_id=g2.pk, reviewer=reviewers[1], reason="Too generic")
    sampled = {item.product.sku for item in items}
    for sku in [sku for sku in (f"kitchen-{n}" for n in range(8)) if sku not in sampled][:3]:
        revise_product(sku=sku, title=f"Oak chopping board {sku}, revised", fields={"category": "kitchen"})
    sent_at = SHOWN_AT - timedelta(minutes=20)
    unit = Submission.objects.create(
        job=job,
        provider="emulator",
        model=job.model,
        intent_key=f"{reference}-unit",
        state=SubmissionState.COLLECTED,
        sent_at=sent_at,
        requests_sent=4,
    )
    with clock_at(sent_at + timedelta(seconds=600)):
        Event.objects.create(
            submission=unit, job=job, from_state=SubmissionState.ENDED, to_state=SubmissionState.COLLECTED
        )
    return job


# Each arm's drafts read differently (and say nothing of the arm), so a test can tell on which side
# of a blind comparison each arm's draft was shown.
ARM_WORDING = {
    1: "A sturdy oak board for {sku}, oiled by hand.",
    2: "Chop on solid oak: {sku} lasts for years <b>and</b> cleans easily.",
}


def same_sample_arms(owner, reference: str = "zebra-pilot", products: int = 6) -> list[Job]:
    """A pilot of two arms over `products` kitchen products, every arm drafting the same sample
    (gpt-4o-mini and gpt-4.1-mini), started as the API starts one; each arm's draft of every product
    returned, valid and waiting for review, worded as ARM_WORDING says."""
    skus = [f"board-{n:02}" for n in range(products)]
    for sku in skus:
        ProductFactory(sku=sku, revision__fields={"category": "kitchen"})
    jobs = create_pilot_arms(
        reference=reference,
        pilot=PilotPlan(per_stratum=products, strata=("category",), seed=7, same_sample=True),
        arms=[Arm(model="gpt-4.1-mini")],
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        skus=skus,
    )
    for number, job in enumerate(jobs, start=1):
        for item in job.items.select_related("product"):
            draft(item, 1_000, 500, content=ARM_WORDING[number].format(sku=item.product.sku))
    return jobs
