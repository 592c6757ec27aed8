"""The job ledger: what was sent, what came back, whether it is usable and whether it was applied."""

import hashlib
import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

import orjson
from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import connection, models, transaction
from django.db.models import F, Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from .database.json_as_written import JSONAsWrittenField
from .database.tallies import DRAFT_TALLY_PERIOD
from .retrying import PERMANENT_REFUSAL_PATIENCE
from .states import (
    DISCARDED_STATES,
    NEEDS_ATTENTION_STATES,
    DraftNote,
    ItemState,
    JobState,
    ReasonCode,
    SubmissionState,
    default_rejection_reasons,
)

# One encoder for every rendering: json.dumps with these options builds a new one each call.
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def canonical_json(value) -> str:
    """One rendering per JSON value: keys sorted at every depth, no spaces. Two values are the same
    content exactly when their renderings are equal (Python's `True == 1` does not hold here).

    Written by orjson where it writes the same text as the json module (several times faster: a
    unit's prompts render tens of thousands of values, its drafts are hashed one by one): a value
    without floats (which the two write differently in exponent form, 1e+16 and 1e16). What orjson
    refuses (an integer beyond 64 bits, a lone surrogate, a key that is not text) is written by the
    json module."""
    if not _holds_float(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return _CANONICAL.encode(value)


def compact_json(value) -> str:
    """JSON text without spaces, keys in their order, for what is written by the thousand: a request
    line, an emulator's result line, a draft's usage or an event's data in a JSON column. Written by
    orjson, several times faster than the json module; what orjson cannot write (an integer beyond
    64 bits, a lone surrogate, a key that is not text) by the json module, with anything not ASCII
    escaped (a lone surrogate has no UTF-8)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, separators=(",", ":"))


def _holds_float(value) -> bool:
    """Whether a float is anywhere in `value`. Its lists and objects are walked without recursion, a
    text or an integer (most of a product's facts) passed over on one look at its type: a unit's
    prompts ask this of tens of thousands of values."""
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list | tuple):
        return False
    waiting = [value]
    while waiting:
        for inner in waiting.pop():
            kind = type(inner)
            if kind is str or kind is int:
                continue
            if isinstance(inner, float):
                return True
            if isinstance(inner, dict):
                waiting.append(inner.values())
            elif isinstance(inner, list | tuple):
                waiting.append(inner)
    return False


def content_hash(value) -> str:
    """sha256 of the canonical JSON rendering: equal content, equal hash."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


class ProductStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    WITHDRAWN = "withdrawn", "Withdrawn"


class Product(models.Model):
    sku = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=ProductStatus.choices, default=ProductStatus.ACTIVE)
    # Checked by the database once per statement, not by a foreign key once per row (migration 0023).
    current_revision = models.ForeignKey(
        "SourceRevision", on_delete=models.PROTECT, null=True, related_name="+", db_constraint=False
    )
    # What the built-in `catalogue` destination has published for this product.
    published_content = models.TextField(blank=True)
    published_version = models.ForeignKey(
        "GeneratedVersion", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    published_revision = models.PositiveIntegerField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    # The digest of the catalogue line that made the product what it is now (its current revision
    # and status): a re-import meeting the same line again knows it changes nothing without reading
    # it. Any other change of revision or status clears it (a trigger, migration 0019, PostgreSQL).
    line_digest = models.BinaryField(null=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["sku"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ProductStatus.values), name="product_status_valid")
        ]

    def __str__(self) -> str:
        return self.sku

    @property
    def is_active(self) -> bool:
        return self.status == ProductStatus.ACTIVE


class SourceRevision(models.Model):
    """An immutable snapshot of a product's content. Status is not content."""

    # Checked once per statement (migration 0023); found through `revision_number_unique`.
    product = models.ForeignKey(
        Product, on_delete=models.PROTECT, related_name="revisions", db_constraint=False, db_index=False
    )
    number = models.PositiveIntegerField()
    title = models.CharField(max_length=300)
    fields = models.JSONField(default=dict)
    content_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["product", "number"]
        constraints = [models.UniqueConstraint(fields=["product", "number"], name="revision_number_unique")]

    def __str__(self) -> str:
        return f"{self.product.sku} r{self.number}"

    @staticmethod
    def hash_content(title: str, fields: dict) -> str:
        return content_hash({"title": title, "fields": fields})


def category_text(fields: str) -> Cast:
    """The `category` field of the revision whose fields are at `fields` (a lookup path such as
    "current_revision__fields"), as text: 5 and "5" alike; NULL when it has none. Cast, because on
    SQLite the key's value keeps its JSON type (a number stays a number)."""
    return Cast(KeyTextTransform("category", fields), output_field=models.TextField())


class PromptVersionQuerySet(models.QuerySet):
    def current(self) -> "PromptVersionQuerySet":
        """The current version of each task among these (SPEC §1): the one its task's newest
        `CurrentPromptChoice` names. A job that names no version uses it."""
        return self.filter(pk=models.Subquery(newest_choice_of_task()))

    def for_job(self, task: str, version: int | None = None) -> "PromptVersion | None":
        """The version a job of `task` uses: the one it names, else the task's current one."""
        versions = self.filter(task=task)
        return versions.filter(version=version).first() if version else versions.current().first()

    def with_current(self) -> "PromptVersionQuerySet":
        """Each version with `is_current`."""
        return self.annotate(
            is_current=models.ExpressionWrapper(
                Q(pk=models.Subquery(newest_choice_of_task())), output_field=models.BooleanField()
            )
        )


def no_prompt_for_job(task: str, version: int | None = None) -> str:
    """Why `PromptVersionQuerySet.for_job` found nothing."""
    if not PromptVersion.objects.filter(task=task).exists():
        return f"There is no prompt for the task {task!r}"
    if version:
        return f"The task {task!r} has no prompt version {version}"
    return (
        f"The task {task!r} has no current prompt version: make one current on its page under "
        "/prompts/, or name a version"
    )


def newest_choice_of_task() -> models.QuerySet:
    return (
        CurrentPromptChoice.objects.filter(task=models.OuterRef("task"))
        .order_by("-pk")
        .values("prompt_version")[:1]
    )


class PromptVersion(models.Model):
    """Task + version + template + output schema + validation rules. Never edited once used. A new
    version is not current until someone makes it so (`actions.prompts.make_prompt_current`)."""

    task = models.CharField(max_length=64)
    version = models.PositiveIntegerField()
    system_message = models.TextField()
    template = models.TextField(help_text="Python str.format template; {title} and {facts} are filled in.")
    # Kept as written: the order of its properties is the order a model writes them in (rule 19).
    output_schema = JSONAsWrittenField()
    # {"min_length": int, "max_length": int, "text_field": str, "claim_words": [str]}
    rules = models.JSONField(default=dict)
    max_output_tokens = models.PositiveIntegerField(default=600)
    # The reasons a reviewer picks from when rejecting its drafts: [{"code": ..., "label": ...}].
    rejection_reasons = models.JSONField(default=default_rejection_reasons)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PromptVersionQuerySet.as_manager()

    class Meta:
        ordering = ["task", "-version"]
        constraints = [models.UniqueConstraint(fields=["task", "version"], name="prompt_version_unique")]

    def __str__(self) -> str:
        return f"{self.task} v{self.version}"

    def rejection_reason_label(self, code: str) -> str | None:
        """The words of one of its rejection reason codes; None for a code it does not have."""
        return next((r["label"] for r in self.rejection_reasons if r.get("code") == code), None)


class CurrentPromptChoice(models.Model):
    """A prompt version made the current one of its task: by whom, when, and which it replaced. Rows
    are only added; the newest of a task names its current version, the older ones are its history."""

    task = models.CharField(max_length=64)
    prompt_version = models.ForeignKey(PromptVersion, on_delete=models.PROTECT, related_name="made_current")
    replaced = models.ForeignKey(
        PromptVersion, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # None: `migrate` made the default prompt current (actor_name "system").
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    actor_name = models.CharField(max_length=150, default="system")
    made_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["task", "-id"]
        indexes = [models.Index(fields=["task", "-id"], name="current_prompt_of_task")]

    def __str__(self) -> str:
        return f"{self.prompt_version} made current by {self.actor_name}"


# What a job is when its starter does not say (the model is the provider's: settings.PROVIDERS).
# The largest unit is each provider's own (its adapter's `capabilities.max_requests`).
DEFAULT_DESTINATION = "catalogue"
# Requests a unit (one provider batch) holds when a job does not say, within each provider's own
# cap (`default_unit_size`). Each unit costs a create, its polls and a collection round, and planning,
# sending and collecting each wait their turn in the queue: at 500, a 1.2-million-product catalogue
# made 2,400 units and the queue, not the provider, set the pace. At 5,000 the same catalogue is 240
# units, still enough for every worker of several clusters to have one; what a unit risks stays
# small: a batch that expires part-way sends its unrun requests again by themselves (transient,
# rule 8), a unit sent is about 6 MB of requests held by one worker, and the first drafts reach
# reviewers after one unit's turn rather than the whole job's.
DEFAULT_UNIT_SIZE = 5_000
# A job may name at most this many SKUs (more: leave them out for every active product).
MAX_NAMED_SKUS = 20_000


class Job(models.Model):
    reference = models.CharField(max_length=200, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    task = models.CharField(max_length=64)
    prompt_version = models.ForeignKey(PromptVersion, on_delete=models.PROTECT, related_name="jobs")
    provider = models.CharField(max_length=32)
    model = models.CharField(max_length=128)
    destination = models.CharField(max_length=64, default=DEFAULT_DESTINATION)
    unit_size = models.PositiveIntegerField(default=DEFAULT_UNIT_SIZE)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PREPARING)
    # A planner (a task, or a send planning the next unit) holds the job's planning until then: a
    # pass queues no second planning task meanwhile; a dead planner's claim simply runs out.
    planning_claimed_until = models.DateTimeField(null=True, blank=True)
    # Spend may not pass this, in `budget_currency` (rule 18); null: no budget.
    budget = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    budget_currency = models.CharField(max_length=3, blank=True)
    # Why the job is `paused`, and what the person should know (by how much, the provider's words).
    pause_reason = models.CharField(max_length=32, blank=True)
    pause_detail = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Where the job's events are posted (SPEC §6, `ledger.notices.notifications`); empty: nowhere.
    notify_url = models.CharField(max_length=2000, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid")]

    def __str__(self) -> str:
        return self.reference


class ItemQuerySet(models.QuerySet):
    def awaiting_review(self):
        return self.filter(state=ItemState.AWAITING_REVIEW)

    def needs_attention(self) -> "ItemQuerySet":
        """Items a person must look at (`NEEDS_ATTENTION_STATES`): the operations page and `/metrics`
        count these. A cancelled job's items are never sent again, so they need nobody."""
        return self.filter(state__in=NEEDS_ATTENTION_STATES).exclude(job__state=JobState.CANCELLED)

    def approved_products(self) -> "models.QuerySet":
        """The product ids of these items whose approved draft stands: approved, for the product's
        current revision, and not obsolete, withdrawn or cancelled since. The one rule of "the products
        a pilot approved": the pilot decision counts them (`plan_full_job`) and the full job leaves them
        out (`create_job(leaving_out_approved_in=...)`) with this query, so nobody pays twice for a
        product whose pilot draft stands, and a product whose approval fell is drafted again."""
        return (
            self.filter(approved_version__isnull=False, source_revision_id=F("product__current_revision_id"))
            .exclude(state__in=DISCARDED_STATES)
            .values("product_id")
        )

    def counts_by_state(self) -> dict[str, int]:
        """Items by state, counted row by row (the tallies' reference: `ItemTally` answers the screens)."""
        rows = self.order_by().values_list("state").annotate(n=models.Count("id"))
        return dict(rows)

    def claim_application(self, item_id: int) -> bool:
        """Take an item being applied for one attempt, if it is due and no live worker holds it.
        The lease outlasts one destination call, so only a dead worker's claim runs out."""
        now = timezone.now()
        lease = timedelta(
            seconds=settings.BATCHDESK_WEBHOOK_TIMEOUT + min(60, settings.BATCHDESK_LEASE_SECONDS)
        )
        return bool(
            self.filter(pk=item_id, state=ItemState.APPLYING)
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
            .update(next_attempt_at=now + lease)
        )


# Item states not indexed by age (`item_state_age`): every item of a new job is in the first, then the second.
UNAGED_STATES = [ItemState.PREPARED, ItemState.SUBMITTED]


class Item(models.Model):
    """(job, product, source revision at snapshot time): one unit of business work."""

    # Indexed by the composite indexes they lead (a job writes a million items: every index costs).
    # Its references are checked by the database once per statement, not once per row (see
    # migration 0015): a per-row foreign key made a million-item job spend most of its time checking.
    job = models.ForeignKey(
        Job, on_delete=models.PROTECT, related_name="items", db_index=False, db_constraint=False
    )
    product = models.ForeignKey(
        Product, on_delete=models.PROTECT, related_name="items", db_index=False, db_constraint=False
    )
    # Items of a revision are found through its product (`item_product_state`): no index of its own.
    source_revision = models.ForeignKey(
        SourceRevision, on_delete=models.PROTECT, related_name="items", db_index=False, db_constraint=False
    )
    state = models.CharField(max_length=24, choices=ItemState.choices, default=ItemState.PREPARED)
    reason = models.TextField(blank=True)
    # What kind of reason it is: screens group by this, never by the reason's words.
    reason_code = models.CharField(max_length=32, choices=ReasonCode.choices, blank=True)
    # Which inference this is; a retry bumps it, so the next request gets a new custom_id.
    inference_attempt = models.PositiveIntegerField(default=1)
    # Transient failures seen by this item's inferences, and by its applications.
    inference_failures = models.PositiveIntegerField(default=0)
    apply_failures = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    approved_version = models.ForeignKey(
        "GeneratedVersion",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    # The submission this inference attempt belongs to; cleared when the item is re-prepared.
    submission = models.ForeignKey(
        "Submission",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="items",
        db_index=False,
        db_constraint=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ItemQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=ItemState.values), name="item_state_valid"),
            models.UniqueConstraint(fields=["job", "source_revision"], name="item_once_per_revision"),
        ]
        indexes = [
            # Keyset pages (`review/paging.py`): a job's items, of one state or all, in id order;
            # the review queue and the operations groups, oldest first.
            models.Index(fields=["job", "state", "id"], name="item_job_state"),
            models.Index(fields=["job", "id"], name="item_job"),
            # Items waiting to be planned into a unit. Planned items stay `prepared` until their unit
            # is sent, so without it planning a unit, and the collector's look for a job with work
            # to plan, read past every item planned before (planning a job was quadratic in its size).
            models.Index(
                fields=["job", "id"],
                name="item_unplanned",
                condition=Q(state=ItemState.PREPARED, submission__isnull=True),
            ),
            # Not the states a whole job passes through at once (a million items created, then sent),
            # which nothing lists across jobs by age: creating or sending them leaves this index alone.
            models.Index(
                fields=["state", "updated_at", "id"],
                name="item_state_age",
                condition=~Q(state__in=UNAGED_STATES),
            ),
            models.Index(fields=["product", "state"], name="item_product_state"),
            # Mostly empty columns: only the rows that have one are indexed.
            models.Index(
                fields=["approved_version"],
                name="item_approved_version",
                condition=Q(approved_version__isnull=False),
            ),
            models.Index(
                fields=["submission"], name="item_submission", condition=Q(submission__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"item {self.pk} ({self.product_id})"

    @property
    def label(self) -> str:
        return ItemState(self.state).label

    @property
    def custom_id(self) -> str:
        """Derived from the work, never random: a redelivery computes the same id."""
        return f"bd-{self.pk}-{self.inference_attempt}"


class ItemTallyQuerySet(models.QuerySet):
    def counts_by_state(self) -> dict[str, int]:
        """Items by state of the tallied jobs (filter by `job` first, or none for every job): a sum over
        a few rows per job and state, however many items there are."""
        return self.counts_and_newest_row()[0]

    def counts_and_newest_row(self) -> tuple[dict[str, int], int]:
        """`counts_by_state`, and the id of the newest row summed (0: none), read in the same
        statement. Rows are only ever added (a compaction adds its sums as new rows), so it never
        falls, and grows with each change of the counts."""
        rows = list(
            self.order_by().values_list("state").annotate(n=models.Sum("items"), newest=models.Max("id"))
        )
        return {state: n for state, n, _ in rows if n}, max((newest for *_, newest in rows), default=0)

    def counts_by_job(self, job_ids: Iterable[int]) -> dict[int, dict[str, int]]:
        counts: dict[int, dict[str, int]] = {job_id: {} for job_id in job_ids}
        rows = (
            self.filter(job_id__in=list(counts))
            .order_by()
            .values_list("job_id", "state")
            .annotate(n=models.Sum("items"))
        )
        for job_id, state, n in rows:
            if n:
                counts[job_id][state] = n
        return counts

    def compact(self, job_id: int) -> None:
        """Fold the job's rows into one per state. Rows other transactions append meanwhile are not
        seen, so they stay as they are; a compaction already running elsewhere makes this one wait
        for nothing: it leaves the rows alone."""

        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [TALLY_LOCK, job_id])
                if not cursor.fetchone()[0]:
                    return
            cursor.execute(
                f"DELETE FROM {ItemTally._meta.db_table} WHERE job_id = %s RETURNING state, "
                + ", ".join(TALLIED),
                [job_id],
            )
            sums: dict[str, list[int]] = {}
            for state, *values in cursor.fetchall():
                sums[state] = [
                    a + b for a, b in zip(sums.get(state, [0] * len(TALLIED)), values, strict=True)
                ]
            self.bulk_create(
                ItemTally(job_id=job_id, state=state, **dict(zip(TALLIED, values, strict=True)))
                for state, values in sums.items()
                if any(values)
            )


# What a tally row sums, besides its job and state; and the advisory lock class of compaction.
TALLIED = (
    "items",
    "pending_input",
    "pending_output",
    "approved_drafts",
    "approved_input",
    "approved_output",
    "all_input",
    "all_output",
    "apportioned_drafts",
)
TALLY_LOCK = 7_413


class ItemTally(models.Model):
    """How many items each job has in each state, and what their drafts cost in tokens, kept by the
    database itself: triggers on `ledger_item` and `ledger_generatedversion` (migration 0013) append a
    row of differences in the same transaction as every change, whichever code makes it (one row,
    a set-wise UPDATE, an INSERT … SELECT). Rows are only ever added, so concurrent workers never
    wait on one another; a job's rows are summed when read and folded into one row per state from
    time to time (`compact_tallies`). Never written by Python otherwise."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    state = models.CharField(max_length=24)
    items = models.BigIntegerField(default=0)
    # Tokens of the latest draft of items waiting for a decision (returned, awaiting review).
    pending_input = models.BigIntegerField(default=0)
    pending_output = models.BigIntegerField(default=0)
    # Items whose approved draft may still be published (not obsolete, withdrawn or cancelled),
    # and that draft's tokens.
    approved_drafts = models.BigIntegerField(default=0)
    approved_input = models.BigIntegerField(default=0)
    approved_output = models.BigIntegerField(default=0)
    # Every draft ever generated (counted under its item's state when it arrived).
    all_input = models.BigIntegerField(default=0)
    all_output = models.BigIntegerField(default=0)
    apportioned_drafts = models.BigIntegerField(default=0)

    objects = ItemTallyQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["job", "state"], name="item_tally_job")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.state} {self.items:+}"


class DraftTally(models.Model):
    """The drafts each job received in each quarter hour (`received`, its start) and their tokens, kept
    by the database itself as `ItemTally` is: triggers on `ledger_generatedversion` (migration
    0049 on PostgreSQL, ledger/database/tallies.py on SQLite) append a row of differences in the
    same transaction as every draft written, changed or deleted. The dashboard's spend of the day
    sums a few rows of the day, however many drafts arrived. Never written by Python otherwise."""

    # Nothing looks a job's rows up: they are read by their quarter hour.
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    received = models.DateTimeField()
    drafts = models.BigIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["received"], name="draft_tally_received")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.received:%Y-%m-%d %H:%M} {self.drafts:+}"

    @staticmethod
    def period_from(moment: datetime) -> datetime:
        """The start of the first quarter hour that begins at or after `moment`."""
        start = moment.astimezone(UTC).replace(second=0, microsecond=0)
        start -= timedelta(minutes=start.minute % (DRAFT_TALLY_PERIOD.seconds // 60))
        return start if start == moment else start + DRAFT_TALLY_PERIOD


def lease_end() -> datetime:
    """When a claim taken now runs out, unless renewed: a dead worker's claim simply expires."""
    return timezone.now() + timedelta(seconds=settings.BATCHDESK_LEASE_SECONDS)


class SubmissionQuerySet(models.QuerySet):
    """Claims: one worker at a time acts on a submission, until its lease runs out."""

    def claim(self, submission_id: int, *, states: Iterable[str], held: str = "") -> str | None:
        """Take the submission, if it is in one of `states` and nobody holds it. Returns the claim's
        token, or None when another worker holds it or it is in another state. `held`: the claim
        the task was queued with (a pass's or planning's), taken over with no moment unclaimed in
        which a pass could queue the same work again."""
        token = uuid.uuid4().hex
        free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=timezone.now())
        won = (
            self.filter(pk=submission_id, state__in=list(states))
            .filter(free | Q(claimed_by=held) if held else free)
            .update(claimed_until=lease_end(), claimed_by=token)
        )
        return token if won == 1 else None

    def renew_claim(self, submission_id: int, token: str) -> bool:
        """Still ours? Then hold it for another lease. Asked just before a call that costs money."""
        held = self.filter(pk=submission_id, claimed_by=token, claimed_until__gt=timezone.now())
        return held.update(claimed_until=lease_end()) == 1

    def release(self, submission_id: int) -> None:
        self.filter(pk=submission_id).update(claimed_until=None)


# Failed collections in a row after which a unit is shown on operations and in /api/health: one is
# a passing outage, three are a cause that retrying alone will not end.
RECORDING_FAILURES_SHOWN = 3


class Refusal(NamedTuple):
    what: str
    said: str


class Submission(models.Model):
    """One provider batch. The intent row exists before any provider call is made."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="submissions")
    provider = models.CharField(max_length=32)
    model = models.CharField(max_length=128)
    # Sent with the unit where the provider keeps it (batch metadata, display name); the key a
    # lost create answer is reconciled by.
    intent_key = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, choices=SubmissionState.choices, default=SubmissionState.INTENT)
    provider_ref = models.CharField(max_length=256, blank=True)
    # When the create call last went out (cleared when the provider answered it with a refusal),
    # and with how many requests: a unit created then may exist at the provider.
    sent_at = models.DateTimeField(null=True, blank=True)
    requests_sent = models.PositiveIntegerField(null=True, blank=True)
    # Units the provider's listing showed that may be this one (rule 13), by reference:
    # "watching" until their results confirm or rule them out, then "ruled_out".
    candidates = models.JSONField(default=dict, blank=True)
    last_observed_at = models.DateTimeField(null=True, blank=True)
    # The provider's own word, shown as is; the ledger never reads it.
    last_observed_status = models.CharField(max_length=64, blank=True)
    # {total, succeeded, failed} as the provider counted them, translated by the adapter.
    request_counts = models.JSONField(default=dict, blank=True)
    # How the unit ended, in the ledger's words: the provider refused all of it, or requests it
    # left unanswered failed for this reason (a `ReasonCode`).
    refused = models.BooleanField(default=False)
    unanswered_reason = models.CharField(max_length=32, blank=True)
    # Lines and requests collection could not match: kept, shown, never dropped.
    anomalies = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    # Since when the provider has refused, with a permanent error, to tell the unit's status or hand
    # over its results; cleared when it answers. `gives_up_at` follows from it.
    refusing_since = models.DateTimeField(null=True, blank=True)
    # A server answering each request asked us to slow down (429) for longer than a worker waits:
    # its requests are asked again from then (the claim holds it till then); cleared when it answers.
    slowed_until = models.DateTimeField(null=True, blank=True)
    # Collections of its results that failed in a row for a cause of ours (a database error, a bug),
    # and the last one's words, scrubbed: shown once `recording_stuck`; cleared when one ends well.
    collect_failures = models.PositiveIntegerField(default=0)
    collect_problem = models.TextField(blank=True)
    # How often a worker has claimed this intent to send it.
    send_attempts = models.PositiveIntegerField(default=0)
    # A worker holds the submission until then; a dead worker's lease simply runs out.
    claimed_until = models.DateTimeField(null=True, blank=True)
    # Which claim holds it: a worker whose lease ran out finds out before it acts.
    claimed_by = models.CharField(max_length=32, blank=True)
    # Its job was cancelled while it ran: when the provider answered our request to cancel it.
    cancel_answered_at = models.DateTimeField(null=True, blank=True)
    # Its deadlines (SPEC §11, `ledger.lifecycle.deadlines`): when the provider said (or we first saw) it
    # ended; the date by which its results must be collected before the provider deletes them (set
    # when sent or at its end, by its adapter's `results_kept`); and from when, still uncollected,
    # it raises the collector's alarm: half way from its end to that date.
    ended_at = models.DateTimeField(null=True, blank=True)
    collect_by = models.DateTimeField(null=True, blank=True)
    at_risk_from = models.DateTimeField(null=True, blank=True)
    # Its files at the provider (input, results) are to be deleted now that it is collected
    # (`ledger.lifecycle.provider_files`), and when they were.
    files_to_delete = models.BooleanField(default=False)
    files_deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SubmissionQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=SubmissionState.values), name="submission_state_valid"
            )
        ]
        indexes = [
            models.Index(fields=["state", "last_observed_at"], name="submission_open"),
            # A provider's batch webhook names its unit by the provider's reference (provider_hooks).
            models.Index(
                fields=["provider_ref"], name="submission_provider_ref", condition=~Q(provider_ref="")
            ),
            # The collector's pass looks for collected units whose provider files wait to be deleted.
            models.Index(fields=["id"], name="submission_files_to_delete", condition=Q(files_to_delete=True)),
        ]

    def __str__(self) -> str:
        return self.provider_ref or self.intent_key

    @property
    def gives_up_at(self) -> datetime | None:
        """When, still refused, the unit's unanswered requests fail for good (`refused_for_good`)."""
        return self.refusing_since + PERMANENT_REFUSAL_PATIENCE if self.refusing_since else None

    @property
    def refusal(self) -> "Refusal":
        """The refusal it waits out, in its adapter's words "<what is refused>: <what the server
        said>" (a server answering each request: "The server refuses our requests: No connected
        db. (…)"), in two parts for the sentence "<what> since <when>: <said>"."""
        what, _, said = self.error.partition(": ")
        return Refusal(what, said)

    @property
    def recording_stuck(self) -> bool:
        """Its results have failed to be recorded often enough in a row to need a person."""
        return self.collect_failures >= RECORDING_FAILURES_SHOWN

    @property
    def collection_at_risk(self) -> bool:
        """Ended, not yet collected, and past half the time it had left at its end to be collected
        (the collector's alarm; `ledger.lifecycle.deadlines.units_at_risk` asks the same of many)."""
        return (
            self.state == SubmissionState.ENDED
            and self.at_risk_from is not None
            and timezone.now() >= self.at_risk_from
        )


class SubmissionItem(models.Model):
    """Which item was sent in which submission, under which custom_id."""

    # References checked by the database once per statement (migration 0053), not per row: planning
    # a unit writes its thousands of entries at once. A submission's entries are found by
    # `entry_custom_id_unique`, which it leads: no index of its own.
    submission = models.ForeignKey(
        Submission, on_delete=models.PROTECT, related_name="entries", db_index=False, db_constraint=False
    )
    item = models.ForeignKey(
        Item, on_delete=models.PROTECT, related_name="submission_entries", db_constraint=False
    )
    custom_id = models.CharField(max_length=64)
    # Set once a line for this request has been recorded.
    outcome = models.CharField(max_length=32, blank=True)
    # The `max_tokens` the request was sent with (rule 18: lowered for a job with a budget), kept as
    # the unit is sent: only a draft cut off at a limit below its prompt version's own is drafted
    # again (`redrafting.redraft_cut_off`). None until sent, and for a job without a budget (sent with
    # the prompt version's own limit, nothing lowered).
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["submission", "custom_id"], name="entry_custom_id_unique"),
            models.UniqueConstraint(fields=["custom_id"], name="custom_id_sent_once"),
        ]


class GeneratedVersion(models.Model):
    # References checked by the database once per statement (migration 0018), not per row: a chunk
    # of a collection writes thousands of versions. The item is indexed by `version_number_unique`.
    item = models.ForeignKey(
        Item, on_delete=models.PROTECT, related_name="versions", db_index=False, db_constraint=False
    )
    number = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=64)
    # Nothing looks drafts up by their submission (the ledger deletes no submission): not indexed, so
    # each of the thousands of drafts a collection writes costs one index entry fewer.
    submission = models.ForeignKey(
        Submission,
        on_delete=models.PROTECT,
        null=True,
        related_name="versions",
        db_index=False,
        db_constraint=False,
    )
    content = models.TextField()
    # The answer as returned, when it is not `content` itself (JSON whose text field is the draft,
    # a fenced block): one copy of an answer at most. `answer` reads whichever holds it.
    raw_output = models.TextField(blank=True)
    content_hash = models.CharField(max_length=64)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    usage = models.JSONField(default=dict, blank=True)
    valid = models.BooleanField(null=True)
    validation_reasons = models.JSONField(default=list, blank=True)
    # How a draft was read, when worth knowing (`DraftNote` values): not failures.
    validation_notes = models.JSONField(default=list, db_default=[], blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the retention pass (ledger/lifecycle/retention.py, SPEC §11) erased an unusable draft's text, and how
    # many characters it had: its hash, usage, cost, reasons and events stay.
    content_expired_at = models.DateTimeField(null=True, blank=True)
    content_length = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["item", "number"]
        constraints = [
            models.UniqueConstraint(fields=["item", "number"], name="version_number_unique"),
            # A constraint rather than `unique=True`, which adds a second index for LIKE.
            models.UniqueConstraint(fields=["custom_id"], name="version_custom_id_unique"),
        ]

    def __str__(self) -> str:
        return f"item {self.item_id} v{self.number}"

    @property
    def answer(self) -> str:
        """The answer as the provider returned it."""
        return self.raw_output or self.content

    @property
    def length(self) -> int:
        """Characters of its text, kept when the text is erased."""
        return self.content_length if self.content_expired_at else len(self.content)

    @property
    def note_labels(self) -> list[str]:
        """The words of its validation notes."""
        return [DraftNote(note).label if note in DraftNote.values else note for note in self.validation_notes]


class ApprovalQuerySet(models.QuerySet):
    def standing(self) -> "ApprovalQuerySet":
        """Approvals not undone."""
        return self.filter(undone_at__isnull=True)


class Approval(models.Model):
    item = models.ForeignKey(Item, on_delete=models.PROTECT, related_name="approvals")
    version = models.ForeignKey(GeneratedVersion, on_delete=models.PROTECT, related_name="approvals")
    version_hash = models.CharField(max_length=64)
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    approved_at = models.DateTimeField(auto_now_add=True)
    final_content = models.TextField()
    edited = models.BooleanField(default=False)
    note = models.TextField(blank=True)
    # The approver undid it within BATCHDESK_UNDO_SECONDS, before anything was applied: kept for the
    # audit, no longer an approval (the undo's event says so too).
    undone_at = models.DateTimeField(null=True, blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-approved_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["version"], name="one_approval_per_version", condition=Q(undone_at__isnull=True)
            )
        ]
        indexes = [
            models.Index(fields=["approved_by", "approved_at"], name="approval_by_person"),
            # The audit screen's keyset pages, newest first.
            models.Index(fields=["approved_at", "id"], name="approval_time"),
        ]


class Comment(models.Model):
    """A note on a draft for colleagues: who wrote it, when, about which version. Never edited."""

    item = models.ForeignKey(Item, on_delete=models.PROTECT, related_name="comments")
    version = models.ForeignKey(GeneratedVersion, on_delete=models.PROTECT, null=True, related_name="+")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    text = models.TextField()
    at = models.DateTimeField(auto_now_add=True)
    # The form it was written in: the same form sent twice (double click, Back, refresh) adds it once.
    form_token = models.UUIDField(null=True, blank=True)

    class Meta:
        ordering = ["at", "id"]
        constraints = [models.UniqueConstraint(fields=["author", "form_token"], name="comment_once_per_form")]

    def __str__(self) -> str:
        return f"comment on item {self.item_id} by {self.author_id}"


class ReviewClaimQuerySet(models.QuerySet):
    def held(self) -> "ReviewClaimQuerySet":
        return self.filter(until__gt=timezone.now())


class ReviewClaim(models.Model):
    """A reviewer's short hold on a waiting draft while its card is open on their desk: nobody else is
    shown it or may decide it until the hold runs out or is let go (SPEC §8)."""

    item = models.OneToOneField(Item, on_delete=models.CASCADE, primary_key=True, related_name="claim")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    until = models.DateTimeField()

    objects = ReviewClaimQuerySet.as_manager()

    def __str__(self) -> str:
        return f"item {self.item_id} held by {self.reviewer_id} until {self.until}"


class AttemptOutcome(models.TextChoices):
    STARTED = "started", "Sent; no answer yet"
    APPLIED = "applied", "Applied"
    RETRYABLE = "retryable", "Failed; will be retried with the same key"
    REJECTED = "rejected", "Refused by the destination"
    REFUSED_BY_GUARD = "refused_by_guard", "Not sent: the product changed or was withdrawn"


class DestinationAttempt(models.Model):
    item = models.ForeignKey(Item, on_delete=models.PROTECT, related_name="destination_attempts")
    version = models.ForeignKey(GeneratedVersion, on_delete=models.PROTECT, related_name="+")
    destination = models.CharField(max_length=64)
    operation_key = models.CharField(max_length=128)
    outcome = models.CharField(max_length=24, choices=AttemptOutcome.choices, default=AttemptOutcome.STARTED)
    response = models.TextField(blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at"]
        indexes = [
            models.Index(fields=["operation_key"], name="attempt_operation_key"),
            # /metrics counts the failed attempts, a few among many.
            models.Index(
                fields=["id"],
                name="attempt_failed",
                condition=Q(
                    outcome__in=[
                        AttemptOutcome.RETRYABLE,
                        AttemptOutcome.REJECTED,
                        AttemptOutcome.REFUSED_BY_GUARD,
                    ]
                ),
            ),
        ]


class Publication(models.Model):
    """What the built-in catalogue destination published, once per operation key. Written in the
    same transaction as the product's published text, so a retry can tell its own earlier write."""

    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="publications")
    version = models.ForeignKey(GeneratedVersion, on_delete=models.PROTECT, related_name="+")
    operation_key = models.CharField(max_length=128, unique=True)
    content = models.TextField()
    published_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-published_at"]

    def __str__(self) -> str:
        return f"{self.product_id} v{self.version_id}"


class EventQuerySet(models.QuerySet):
    def rejections(self, *, undone_too: bool = False) -> "EventQuerySet":
        """A reviewer's rejection of a draft is the event that moved its item to `rejected`; its
        `data.version` names the draft, its actor the reviewer and its reason (and `data.reason_code`)
        is theirs. A rejection its reviewer undid is not one (its undo event names it), unless
        `undone_too` (the audit's: each then has `undone_at`)."""
        rejections = self.filter(to_state=ItemState.REJECTED, item__isnull=False)
        undo = (
            Event.objects.filter(item=models.OuterRef("item"), to_state=ItemState.AWAITING_REVIEW)
            .alias(undoes=Cast(KeyTextTransform("undoes", "data"), models.BigIntegerField()))
            .filter(undoes=models.OuterRef("pk"))
        )
        if undone_too:
            return rejections.annotate(undone_at=models.Subquery(undo.values("at")[:1]))
        return rejections.exclude(models.Exists(undo))

    def note_on_unit(self, unit: "Submission", *, reason: str, data: dict) -> "Event":
        """An event of a unit that records what happened to it without changing its state."""
        state = unit.state  # noted, not changed
        return self.create(
            submission=unit, job_id=unit.job_id, from_state=state, to_state=state, reason=reason, data=data
        )


class Event(models.Model):
    """Append-only: one row per state change, written in the same transaction as the change."""

    # Item and job are indexed by `event_item` and `event_job`; submission and actor, mostly empty,
    # by partial indexes: a job of a million items writes a million events.
    # Item, submission, job and actor are checked once per statement (migration 0015), like an item's.
    item = models.ForeignKey(
        Item, on_delete=models.PROTECT, null=True, related_name="events", db_index=False, db_constraint=False
    )
    submission = models.ForeignKey(
        Submission,
        on_delete=models.PROTECT,
        null=True,
        related_name="events",
        db_index=False,
        db_constraint=False,
    )
    job = models.ForeignKey(
        Job, on_delete=models.PROTECT, null=True, related_name="events", db_index=False, db_constraint=False
    )
    from_state = models.CharField(max_length=24, blank=True)
    to_state = models.CharField(max_length=24)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    actor_name = models.CharField(max_length=150, default="system")
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(auto_now_add=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["item", "id"], name="event_item"),
            # A job's own events (its state, its submissions'); an item's are found through the item.
            models.Index(fields=["job", "id"], name="event_job", condition=Q(item__isnull=True)),
            models.Index(
                fields=["submission"], name="event_submission", condition=Q(submission__isnull=False)
            ),
            models.Index(fields=["actor"], name="event_actor", condition=Q(actor__isnull=False)),
            # /metrics counts failed inferences, a few among a million events.
            models.Index(
                fields=["id"], name="event_inference_failed", condition=Q(to_state=ItemState.INFERENCE_FAILED)
            ),
            # The audit's rejections, newest first: a few among a million events.
            models.Index(
                fields=["at", "id"], name="event_rejection", condition=Q(to_state=ItemState.REJECTED)
            ),
        ]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("Events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("Events are append-only")


class CollectorHeartbeat(models.Model):
    """One row: when the poller last ran. Used to tell 'stalled' from 'provider not finished'."""

    name = models.CharField(max_length=32, unique=True)
    last_poll_at = models.DateTimeField(null=True)
    # Only one collector round runs at a time, whatever the number of worker clusters.
    lease_until = models.DateTimeField(null=True)
    lease_holder = models.CharField(max_length=120, blank=True)


class ApiTokenQuerySet(models.QuerySet):
    def usable(self, now: datetime) -> "ApiTokenQuerySet":
        """Tokens that open `/api/` at `now`: not revoked and not expired."""
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True)


class ImportState(models.TextChoices):
    QUEUED = "queued", "Waiting for a worker"
    RUNNING = "running", "Importing"
    DONE = "done", "Finished"  # imported, or refused with its report
    FAILED = "failed", "Failed"  # stopped by an error of its own; nothing was imported
    # Checked and rolled back: it would queue paid work again (or a preview was asked for); waits
    # for the person to confirm it, or to discard it.
    PREVIEWED = "previewed", "Waiting for confirmation"
    DISCARDED = "discarded", "Discarded"  # previewed, then not imported


class CatalogueImport(models.Model):
    """A catalogue file uploaded on the import screen, imported by a worker, and what came of it.
    The file's bytes are kept in `chunks` (in the database, so a worker on any machine reads them)
    until the import finishes."""

    file_name = models.CharField(max_length=255)
    size = models.PositiveBigIntegerField()
    skip_invalid = models.BooleanField(default=False)
    # Each record is the product's whole content (`import_catalogue --replace`).
    replace = models.BooleanField(default=False)
    # Stop at the preview even when nothing paid would be queued again.
    preview_first = models.BooleanField(default=False)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # Who confirmed a preview, when, and how many products queued again they saw: an import that
    # would queue more than that stops at a new preview.
    confirmed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    confirmed_at = models.DateTimeField(null=True, blank=True)
    confirmed_requeues = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=ImportState.choices, default=ImportState.QUEUED)
    # Which worker's claim runs it: a worker whose claim was taken over cannot commit.
    claimed_by = models.CharField(max_length=32, blank=True)
    # Progress: rows and bytes the checking pass has read, rows the writing pass has written.
    rows_read = models.PositiveBigIntegerField(default=0)
    checked_bytes = models.PositiveBigIntegerField(default=0)
    rows_written = models.PositiveBigIntegerField(default=0)
    # The report: {"created": n, "revised": n, "unchanged": n, "withdrawn": n, "reactivated": n,
    # "rejected": n}, the first 100 problems as [line, message, whether the whole file is unreadable]
    # and how many there are in all.
    counts = models.JSONField(default=dict, blank=True)
    errors = models.JSONField(default=list, blank=True)
    # What the revisions change: {"changed_fields": {field: n}, "revisions": [[sku, [field, …]]],
    # "rework": [{job_id, reference, obsolete, requeued, withdrawn, cost, price_note}]}.
    changes = models.JSONField(default=dict, blank=True)
    error_count = models.PositiveBigIntegerField(default=0)
    imported = models.BooleanField(default=False)
    failure = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Last sign of life: of the worker running it (a claim silent for long is taken over), or, while
    # queued, when its task was queued (a task not started within a lease is queued again).
    progress_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=ImportState.values), name="catalogue_import_state_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.file_name} ({self.get_state_display()})"

    @property
    def finished(self) -> bool:
        return self.state in (ImportState.DONE, ImportState.FAILED, ImportState.DISCARDED)

    @property
    def at_work(self) -> bool:
        """A worker has it or will take it: its page follows it."""
        return self.state in (ImportState.QUEUED, ImportState.RUNNING)

    @property
    def percent(self) -> int:
        """How far it has come: checking the file is the first half, writing its rows the second."""
        if self.finished:
            return 100
        checked = self.checked_bytes / self.size if self.size else 0
        written = self.rows_written / self.rows_read if self.rows_read else 0
        return int(50 * checked + 50 * written)


class CatalogueImportChunk(models.Model):
    """One piece of an uploaded file, in order; read one at a time so no process holds the file."""

    catalogue_import = models.ForeignKey(CatalogueImport, on_delete=models.CASCADE, related_name="chunks")
    number = models.PositiveIntegerField()
    data = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["catalogue_import", "number"], name="import_chunk_number_unique")
        ]


class ApiToken(models.Model):
    """A bearer token for `/api/`. Only its sha256 is stored; the token is shown once, at creation."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to tell tokens apart")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires")
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @staticmethod
    def hash(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8")).hexdigest()


class PauseReason(models.TextChoices):
    """Why a job sends nothing new until someone acts (job state `paused`, SPEC §2)."""

    BUDGET_REACHED = "budget_reached", "The next unit could pass the job's budget"
    BILLING_REFUSED = (
        "billing_refused",
        "The provider refused to bill the account (no credit or a spend limit)",
    )


class ExchangeRateQuerySet(models.QuerySet):
    def with_corrections(self) -> "ExchangeRateQuerySet":
        """Each rate with `corrected_by`: the id of the newest rate entered after it for the same
        date and currency, which is in force instead (None: it is in force itself)."""
        newer = ExchangeRate.objects.filter(
            currency=models.OuterRef("currency"),
            valid_from=models.OuterRef("valid_from"),
            pk__gt=models.OuterRef("pk"),
        ).order_by("-pk")
        return self.annotate(corrected_by=models.Subquery(newer.values("pk")[:1]))


class ExchangeRate(models.Model):
    """A rate entered by an admin (SPEC §9): one US dollar is worth `per_usd` of `currency` from
    `valid_from` on. Never changed: a rate entered later for the same date and currency corrects it
    and is in force instead (the last entered, by id), both kept. Rates from `BATCHDESK_FX_FILE` are
    read from the file (`ledger.money.currency`), and both are held to its rule."""

    currency = models.CharField(
        max_length=3,
        validators=[RegexValidator(r"^[A-Z]{3}$", "A currency code of three capital letters, such as GBP")],
    )
    valid_from = models.DateField(help_text="The rate is in force from this date until a later one")
    per_usd = models.DecimalField(
        max_digits=18,
        decimal_places=8,
        validators=[MinValueValidator(Decimal("0.00000001"))],
        help_text="What one US dollar is worth in the currency",
    )
    source = models.CharField(max_length=200, help_text="Where the rate comes from, e.g. a bank's daily spot")
    entered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ExchangeRateQuerySet.as_manager()

    class Meta:
        ordering = ["-valid_from", "-created_at"]
        constraints = [models.CheckConstraint(condition=Q(per_usd__gt=0), name="exchange_rate_positive")]

    def __str__(self) -> str:
        return f"1 USD = {self.per_usd} {self.currency} from {self.valid_from}"

    @property
    def source_text(self) -> str:
        by = f", entered by {self.entered_by.get_username()}" if self.entered_by_id else ""
        return f"{self.source}{by}"


class UnitCharge(models.Model):
    """What one unit (submission) costs (rule 18, SPEC §9). Its worst case (every request's input
    and `max_tokens` at the batch price) is reserved before it is sent; the usage its results
    return settles it. Kept with the provider's amount, the rate, its date and source, so the cost's
    history never changes when a price or a rate does."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="charges")
    submission = models.OneToOneField("Submission", on_delete=models.PROTECT, related_name="charge")
    requests = models.PositiveIntegerField(default=0)
    # The business currency at the time, and the amounts in it (null: no rate was in force).
    currency = models.CharField(max_length=3)
    reserved_usd = models.DecimalField(max_digits=20, decimal_places=6)
    reserved = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    reserved_at = models.DateTimeField(default=timezone.now)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    # The longest answer among the unit's drafts, in output tokens, kept as it settles: what a job with
    # a budget lowers its `max_tokens` to (`actions.requests.output_cap`) without reading every draft.
    largest_output = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    cost = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    rate = models.DecimalField(max_digits=18, decimal_places=8, null=True, blank=True)
    rate_date = models.DateField(null=True, blank=True)
    rate_source = models.CharField(max_length=250, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job"], name="unit_charge_job")]

    def __str__(self) -> str:
        return f"unit {self.submission_id}: {self.cost if self.settled_at else self.reserved} {self.currency}"


class Pilot(models.Model):
    """A job run over a stratified sample of a scope (SPEC §1, "pilot"): what it asked for, and the
    scope it was drawn from. Its items are the job's ordinary items; `PilotProduct` says which
    stratum each sampled product was drawn from, and `PilotStratum` how many products of the scope
    each stratum held when it was drawn: what the report projects to (`ledger.pilots`)."""

    job = models.OneToOneField(Job, on_delete=models.PROTECT, related_name="pilot")
    per_stratum = models.PositiveIntegerField()
    # Product field names, in order; `source_length` is the length band of the source text.
    strata = models.JSONField(default=list)
    seed = models.BigIntegerField()
    # The acceptance drill was asked for (SPEC §6).
    drill = models.BooleanField(default=False)
    # The SKUs the job named; null: every active product.
    scope_skus = models.JSONField(null=True, blank=True)
    # One of `arms` pilots over the same scope and seed, each its own job (a provider, model or prompt
    # version), each given its share of every stratum's draw (`ledger.pilots.sample`), or, with
    # `same_sample`, every arm the whole draw: the same products drafted by each arm, which the blind
    # comparison needs (`ArmPreference`); the others point at the first arm.
    arm = models.PositiveSmallIntegerField(default=1)
    arms = models.PositiveSmallIntegerField(default=1)
    same_sample = models.BooleanField(default=False)
    first_arm = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="other_arms"
    )
    drawn_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"pilot of {self.job}"


class PilotStratum(models.Model):
    """One stratum of a pilot's scope: its products' values of the pilot's fields, how many active
    products of the scope it held, and how many of them were drawn."""

    # Found through `pilot_stratum_unique`, which the pilot leads.
    pilot = models.ForeignKey(Pilot, on_delete=models.PROTECT, related_name="strata_drawn", db_index=False)
    # 1, 2, … in the order of the strata's values.
    number = models.PositiveIntegerField()
    # {field: the field's value as text, or null when the product has none}.
    values = models.JSONField(default=dict)
    scope_products = models.PositiveIntegerField()
    sample_products = models.PositiveIntegerField()

    class Meta:
        ordering = ["pilot", "number"]
        constraints = [models.UniqueConstraint(fields=["pilot", "number"], name="pilot_stratum_unique")]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        """`category kitchen · source_length short`; a field the products lack says `(none)`."""
        if not self.values:
            return "every product"
        return " · ".join(
            f"{name} {'(none)' if value is None else value}" for name, value in self.values.items()
        )


class PilotProduct(models.Model):
    """A product drawn into a pilot's sample, and its stratum (by number within the pilot)."""

    pilot = models.ForeignKey(Pilot, on_delete=models.PROTECT, related_name="products_drawn", db_index=False)
    # Found through `pilot_product_unique`, which the pilot leads.
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="+", db_index=False)
    stratum = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pilot", "product"], name="pilot_product_unique")]


class Preference(models.TextChoices):
    """What a reviewer preferred of two arms' drafts of one product, shown unnamed (SPEC §8), in the
    arms' terms: `a` is the lower-numbered arm of the pair, `b` the other."""

    A = "a", "Arm a's draft"
    B = "b", "Arm b's draft"
    BOTH = "both", "Both drafts"
    NEITHER = "neither", "Neither draft"


class ArmPreference(models.Model):
    """One reviewer's blind comparison of two arms' drafts of one product (`ledger.actions.comparing`).
    Written when the pair is first shown to the reviewer, with the side each draft was drawn to (at
    random, kept so that a refresh, Back or a second tab shows the same sides and an answer maps back to
    the arms); `preference` is blank until the reviewer decides, and set once."""

    # The pilot's group: its first arm.
    pilot = models.ForeignKey(Pilot, on_delete=models.PROTECT, related_name="preferences", db_index=False)
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="+")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # The pair's arm numbers (arm_a < arm_b) and the draft of each that was shown.
    arm_a = models.PositiveSmallIntegerField()
    arm_b = models.PositiveSmallIntegerField()
    version_a = models.ForeignKey(
        GeneratedVersion, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    version_b = models.ForeignKey(
        GeneratedVersion, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # Which side arm a's draft was shown on; arm b's was on the other.
    a_on_left = models.BooleanField()
    shown_at = models.DateTimeField(default=timezone.now)
    preference = models.CharField(max_length=8, choices=Preference.choices, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One decision per reviewer per product and pair of arms.
            models.UniqueConstraint(
                fields=["pilot", "arm_a", "arm_b", "reviewer", "product"], name="arm_preference_unique"
            ),
            models.CheckConstraint(condition=Q(arm_a__lt=F("arm_b")), name="arm_preference_pair_ordered"),
            models.CheckConstraint(
                condition=Q(preference="") | Q(preference__in=Preference.values), name="arm_preference_valid"
            ),
            models.CheckConstraint(
                condition=Q(preference="", decided_at__isnull=True)
                | (~Q(preference="") & Q(decided_at__isnull=False)),
                name="arm_preference_decided_at",
            ),
        ]

    def __str__(self) -> str:
        return f"arms {self.arm_a} and {self.arm_b} on product {self.product_id}: {self.preference or 'undecided'}"


MAX_DECISION_NOTE_LENGTH = 2000


class PilotVerdict(models.TextChoices):
    """Go or no-go on a pilot's report (SPEC §1 "pilot decision")."""

    GO = "go", "Go: start the full job"
    NO_GO = "no_go", "No-go: start nothing"


class PilotDecision(models.Model):
    """Go or no-go on a pilot's report, once (`ledger.actions.pilot_decisions`): who decided, when, with
    a note and the report's figures as they stood; a go names the full job it started."""

    pilot = models.OneToOneField(Pilot, on_delete=models.PROTECT, related_name="decision")
    decision = models.CharField(max_length=8, choices=PilotVerdict.choices)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField(default=timezone.now)
    note = models.TextField(blank=True, max_length=MAX_DECISION_NOTE_LENGTH)
    # The projection and what was measured when the decision was made, and the budget go gave.
    figures = models.JSONField(default=dict)
    full_job = models.OneToOneField(
        Job, on_delete=models.PROTECT, null=True, blank=True, related_name="started_by_decision"
    )
    # How the projection held (`ledger.pilots.accuracy`), kept once the full job's first pass settled:
    # it never changes after, and the report reads it instead of scanning the full job again.
    accuracy = models.JSONField(null=True, blank=True)
    accuracy_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(decision__in=PilotVerdict.values), name="pilot_decision_valid"
            ),
            models.CheckConstraint(
                condition=Q(full_job__isnull=True) | Q(decision=PilotVerdict.GO),
                name="pilot_decision_only_go_starts",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_decision_display()} on {self.pilot}"


class DrillKind(models.TextChoices):
    """The steps of a pilot's acceptance drill (SPEC §6 `drill`), each with its business words."""

    INTERRUPTED_COLLECTION = "interrupted_collection", "A collection killed mid-chunk and resumed"
    REPEATED_DELIVERY = "repeated_delivery", "The same results delivered and collected twice"
    DESTINATION_TIMEOUT = "destination_timeout", "A first destination attempt that timed out and was retried"


class DrillStep(models.Model):
    """One step of a pilot's acceptance drill (`ledger.pilots.drill`): planned with the pilot, its
    unit or item taken when the pilot's own run reaches it, done once it has happened, with what the
    ledger showed then (`evidence`). The report reads everything else from the ledger itself."""

    # Found through `drill_step_unique`, which the pilot leads.
    pilot = models.ForeignKey(Pilot, on_delete=models.PROTECT, related_name="drill_steps", db_index=False)
    kind = models.CharField(max_length=32, choices=DrillKind.choices)
    submission = models.ForeignKey(
        "Submission", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    item = models.ForeignKey(Item, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    taken_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    evidence = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["pilot", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pilot", "kind"], name="drill_step_unique"),
            models.CheckConstraint(condition=Q(kind__in=DrillKind.values), name="drill_step_kind_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.pilot}: {self.get_kind_display()}"


class NotificationChannel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook to the job's notify_url"
    EMAIL = "email", "E-mail to the job's owner"


class JobNotification(models.Model):
    """One event of a job to tell someone (`ledger.notices.notifications`): written in the transaction of the
    change it tells of (the outbox), sent by a worker after commit, tried again with backoff until
    it is delivered or given up 24 hours after the event. `body` is the exact bytes signed and sent
    (a webhook) or the message's text (an e-mail); `recipient` the address it goes to."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="notifications")
    channel = models.CharField(max_length=16, choices=NotificationChannel.choices)
    # The Standard Webhooks `webhook-id`: the same on every attempt, so a receiver drops repeats.
    message_id = models.CharField(max_length=64, unique=True)
    event_type = models.CharField(max_length=64)
    recipient = models.CharField(max_length=2000)
    body = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveIntegerField(default=0)
    # When the next attempt is due; while a worker sends, the end of its lease; null once delivered
    # or given up.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(next_attempt_at__isnull=False),
                name="notification_due",
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(channel__in=NotificationChannel.values), name="notification_channel_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_type} of {self.job_id} to {self.get_channel_display().lower()}"


class NotificationAttempt(models.Model):
    """One try to deliver a notification and what came back: the receiver's HTTP status and the
    start of its answer (scrubbed), or the error that stopped the call."""

    notification = models.ForeignKey(JobNotification, on_delete=models.PROTECT, related_name="tries")
    at = models.DateTimeField(default=timezone.now)
    delivered = models.BooleanField(default=False)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    answer = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["notification", "id"]


class HintOutcome(models.TextChoices):
    """What a provider's batch webhook (`/hooks/<provider>`, `ledger/notices/provider_hooks.py`) led to."""

    POLL_QUEUED = "poll_queued", "The unit was claimed and its poll queued"
    POLL_UNDER_WAY = "poll_under_way", "The unit is already being polled or collected"
    NOT_OPEN = "not_open", "The unit is no longer waiting for its provider"
    UNKNOWN_UNIT = "unknown_unit", "No unit of this provider has that batch id"
    UNREADABLE = "unreadable", "The body names no batch"


class ProviderHint(models.Model):
    """A provider's batch webhook, correctly signed, kept once per `webhook-id`: the provider delivers
    at least once, and a repeated id changes nothing. The body is not kept; only the batch id read
    from it (untrusted text, at most 256 characters) and the event's type."""

    provider = models.CharField(max_length=32)
    webhook_id = models.CharField(max_length=256)
    event_type = models.CharField(max_length=64, blank=True)
    batch_ref = models.CharField(max_length=256, blank=True)
    submission = models.ForeignKey(
        Submission, on_delete=models.PROTECT, null=True, blank=True, related_name="hints"
    )
    outcome = models.CharField(max_length=16, choices=HintOutcome.choices)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "webhook_id"], name="provider_hint_once"),
            models.CheckConstraint(condition=Q(outcome__in=HintOutcome.values), name="provider_hint_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.event_type or 'event'} {self.batch_ref or '?'}: {self.outcome}"
