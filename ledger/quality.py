"""Draft quality (SPEC §8, `/quality/`): how reviewers decided on the drafts, measured in the
database, set-wise, whatever the number of items.

The words, defined here once:

- A *decision* names one draft: an approval (an `Approval` row) or a rejection (the event that moved
  its item to `rejected`, `Event.objects.rejections()`). A draft is *decided* once either happened.
- *Acceptance rate*: approved ÷ decided.
- *Edit rate*: approvals whose final text differs from the draft (`Approval.edited`) ÷ approvals.
- *Edit distance* of an edited approval: the character edit distance (Levenshtein) between the draft
  and the final text, divided by the longer one's length: 0 the same text, 1 nothing left. Measured
  in Python on the most recent `EDIT_SAMPLE` edited approvals of the scope, never on all of them.
- *First-draft usable rate*: items' first drafts (version 1) that passed validation ÷ first drafts,
  counted by when the draft arrived. A draft that failed validation never reaches a reviewer, so the
  acceptance rate alone says nothing of it: a category can show a high acceptance while most of its
  first drafts were unusable.
- *Time to decide*: from the draft being put before a person (its item's latest event into
  `awaiting_review`, or `validation_failed` for an unusable draft an edit repaired) to the decision.
- A *quick approval* (possible rubber-stamping): an approval without edits made within
  `settings.BATCHDESK_RUBBER_STAMP_SECONDS` of the draft being put before a person or of the same
  reviewer's previous decision (the desk shows the next draft as soon as one is decided). Each draft
  of a bulk approval follows the one before within a second, so bulk approvals are quick approvals.

Figures are grouped by prompt version, provider, model and category (the `category` field of the
item's source revision; `NO_CATEGORY` when it has none), and by day or week of the decision in the
viewer's time zone."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db import models
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce, TruncDay, TruncWeek
from django.utils import timezone
from rapidfuzz.distance import Levenshtein

from .models import Approval, Event, GeneratedVersion, Job, PromptVersion, category_text
from .states import DECIDABLE_STATES, DEFAULT_REJECTION_REASONS

# Edited approvals whose edit distance is measured, the most recent first.
EDIT_SAMPLE = 500
# Rejection reasons listed, the most frequent first.
REASONS_SHOWN = 20
NO_CATEGORY = "(none)"

PROMPT_VERSION, PROVIDER, MODEL, CATEGORY = "prompt_version", "provider", "model", "category"
DIMENSIONS = {
    PROMPT_VERSION: "Prompt version",
    PROVIDER: "Provider",
    MODEL: "Model",
    CATEGORY: "Category",
}
DAY, WEEK = "day", "week"
PERIODS = {WEEK: "Week", DAY: "Day"}


def group_keys() -> dict[str, models.Expression]:
    """Each dimension's value for a decision; approvals and rejection events both reach the draft's
    item as `item`."""
    return {
        PROMPT_VERSION: F("item__job__prompt_version"),
        PROVIDER: F("item__job__provider"),
        MODEL: F("item__job__model"),
        CATEGORY: category_text("item__source_revision__fields"),
    }


def period_of(decided_at: str, period: str) -> models.Func:
    """The day or week (from Monday) of a decision, in the current time zone."""
    return (TruncDay if period == DAY else TruncWeek)(decided_at, tzinfo=timezone.get_current_timezone())


def ready_at(decided_at: str) -> Subquery:
    """When the decided draft was put before a person: its item's latest event into a `DECIDABLE_STATES`
    state at or before the decision (`decided_at`, the decision's own time field)."""
    events = Event.objects.filter(
        item=OuterRef("item"), to_state__in=DECIDABLE_STATES, at__lte=OuterRef(decided_at)
    )
    return Subquery(events.order_by("-id").values("at")[:1])


def waited(decided_at: str) -> Sum:
    """Time to decide, summed over the decisions whose draft's `ready_at` is known."""
    return Sum(F(decided_at) - F("ready_at"), output_field=models.DurationField())


@dataclass(frozen=True)
class Scope:
    """Which decisions are measured: made from `since` to `until` (days in the current time zone),
    in one job, with one prompt version; None is no limit."""

    since: date | None = None
    until: date | None = None
    job_id: int | None = None
    prompt_version_id: int | None = None

    def approvals(self) -> QuerySet[Approval]:
        return self._narrowed(Approval.objects.standing().order_by(), "approved_at")

    def rejections(self) -> QuerySet[Event]:
        return self._narrowed(Event.objects.rejections().order_by(), "at")

    def first_drafts(self) -> QuerySet[GeneratedVersion]:
        """Items' first drafts, by when they arrived."""
        return self._narrowed(GeneratedVersion.objects.filter(number=1).order_by(), "created_at")

    def jobs(self) -> QuerySet[Job]:
        """The jobs whose costs are shown: started from `since` to `until`."""
        return self._narrowed(Job.objects.order_by(), "created_at", job="")

    def _narrowed(self, rows: QuerySet, moment: str, job: str = "item__job__") -> QuerySet:
        """`rows` whose `moment` is within the dates and whose job (reached by `job`) is the scope's."""
        # Bounds on the column itself (not on its date), so its index serves them.
        if self.since:
            rows = rows.filter(**{f"{moment}__gte": start_of_day(self.since)})
        if self.until:
            rows = rows.filter(**{f"{moment}__lt": start_of_day(self.until + timedelta(days=1))})
        if self.job_id:
            rows = rows.filter(**{f"{job}pk": self.job_id})
        if self.prompt_version_id:
            rows = rows.filter(**{f"{job}prompt_version_id": self.prompt_version_id})
        return rows


def start_of_day(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


@dataclass
class Figures:
    """One group's decisions, added up. `key` is the group's value as the database gives it."""

    key: object
    label: str = ""
    approved: int = 0
    edited: int = 0
    rejected: int = 0
    # Time to decide, summed over the `timed` decisions whose draft's ready time is known.
    waited: timedelta = timedelta(0)
    timed: int = 0
    # Edit distances of the sampled edited approvals, summed.
    distance: float = 0.0
    sampled: int = 0
    # Items' first drafts, and those of them that passed validation.
    first_drafts: int = 0
    usable_first_drafts: int = 0

    @property
    def decided(self) -> int:
        return self.approved + self.rejected

    @property
    def acceptance_rate(self) -> float | None:
        return self.approved / self.decided if self.decided else None

    @property
    def first_draft_usable_rate(self) -> float | None:
        return self.usable_first_drafts / self.first_drafts if self.first_drafts else None

    @property
    def edit_rate(self) -> float | None:
        return self.edited / self.approved if self.approved else None

    @property
    def edit_distance(self) -> float | None:
        """The average edit distance of the sampled edited approvals."""
        return self.distance / self.sampled if self.sampled else None

    @property
    def seconds_to_decide(self) -> float | None:
        """The average time to decide, in seconds."""
        return self.waited.total_seconds() / self.timed if self.timed else None

    def add(
        self, *, approved=0, edited=0, rejected=0, waited=None, timed=0, first_drafts=0, usable_first_drafts=0
    ) -> None:
        self.approved += approved
        self.edited += edited
        self.rejected += rejected
        self.waited += waited or timedelta(0)
        self.timed += timed
        self.first_drafts += first_drafts
        self.usable_first_drafts += usable_first_drafts


@dataclass(frozen=True)
class Reviewer:
    """One reviewer's approvals, and how many of them were quick approvals without edits."""

    name: str
    approvals: int
    unchanged: int
    quick: int

    @property
    def quick_share(self) -> float:
        return self.quick / self.approvals


@dataclass
class Report:
    total: Figures
    # Dimension → its groups (prompt versions by task and number, the others by name).
    groups: dict[str, list[Figures]]
    period: str
    over_time: list[Figures]


def latest_decision_day() -> date | None:
    """The day (in the current time zone) of the latest approval or rejection; None before any."""
    latest = [
        moment
        for moment in (
            Approval.objects.standing().aggregate(latest=models.Max("approved_at"))["latest"],
            Event.objects.rejections().aggregate(latest=models.Max("at"))["latest"],
        )
        if moment is not None
    ]
    return timezone.localdate(max(latest)) if latest else None


def measure(scope: Scope, *, period: str) -> Report:
    """The figures of `scope`'s decisions and first drafts, in all and by group: six aggregate queries
    whose rows are groups, and one bounded sample of edited approvals."""
    total = Figures(key=None, label="All decisions")
    groups: dict[str, dict[object, Figures]] = {dimension: {} for dimension in DIMENSIONS}
    over_time: dict[object, Figures] = {}

    for decisions, decided_at, counts in (
        (
            scope.approvals(),
            "approved_at",
            {"approved": Count("pk"), "edited": Count("pk", filter=Q(edited=True))},
        ),
        (scope.rejections(), "at", {"rejected": Count("pk")}),
    ):
        decisions = decisions.annotate(ready_at=ready_at(decided_at))
        counts = {**counts, "waited": waited(decided_at), "timed": Count("ready_at")}
        # One row per combination of the dimensions' values (a few per job set-up and category),
        # added up here into each dimension's groups.
        for row in decisions.values(**group_keys()).annotate(**counts).iterator():
            figures = {name: row.pop(name) for name in counts}
            total.add(**figures)
            for dimension, key in row.items():
                groups[dimension].setdefault(key, Figures(key=key)).add(**figures)
        for row in decisions.values(when=period_of(decided_at, period)).annotate(**counts).iterator():
            key = row.pop("when")
            over_time.setdefault(key, Figures(key=key)).add(**row)

    # Items' first drafts, usable or not, the same way: by group, and by when they arrived.
    first_drafts = scope.first_drafts()
    counts = {"first_drafts": Count("pk"), "usable_first_drafts": Count("pk", filter=Q(valid=True))}
    for row in first_drafts.values(**group_keys()).annotate(**counts).iterator():
        figures = {name: row.pop(name) for name in counts}
        total.add(**figures)
        for dimension, key in row.items():
            groups[dimension].setdefault(key, Figures(key=key)).add(**figures)
    for row in first_drafts.values(when=period_of("created_at", period)).annotate(**counts).iterator():
        key = row.pop("when")
        over_time.setdefault(key, Figures(key=key)).add(**row)

    for distance, keys in edit_distances(scope, period):
        for figures in (
            total,
            over_time.get(keys.pop("when")),
            *(groups[dimension].get(key) for dimension, key in keys.items()),
        ):
            if figures is not None:
                figures.distance += distance
                figures.sampled += 1

    return Report(
        total=total,
        groups=labelled(groups),
        period=period,
        over_time=[labelled_period(figures, period) for _, figures in sorted(over_time.items())],
    )


def edit_distance(draft: str, final: str) -> float:
    """Characters inserted, deleted or replaced to turn the draft into the final text, over the longer
    one's length: 0 the same text, 1 nothing in common."""
    return Levenshtein.normalized_distance(draft, final)


def edit_distances(scope: Scope, period: str) -> Iterable[tuple[float, dict]]:
    """The edit distance of each of the most recent `EDIT_SAMPLE` edited approvals of the scope, with
    its groups' keys."""
    sample = (
        scope.approvals()
        .filter(edited=True)
        .order_by("-approved_at", "-pk")
        .values(
            draft=F("version__content"),
            final=F("final_content"),
            when=period_of("approved_at", period),
            **group_keys(),
        )[:EDIT_SAMPLE]
    )
    for row in sample:
        yield edit_distance(row.pop("draft"), row.pop("final")), row


def rejection_codes(scope: Scope) -> list[tuple[str, str, int]]:
    """The reason codes reviewers picked (their prompt versions' lists, SPEC §8), each with its words
    and how many rejections gave it, the most frequent first; "" for rejections with words only."""
    rows = (
        scope.rejections()
        .values(
            code=Coalesce(KeyTextTransform("reason_code", "data"), Value(""), output_field=models.TextField())
        )
        .annotate(rejections=Count("pk"))
        .order_by("-rejections", "code")
        .values_list("code", "rejections")
    )
    labels = {reason["code"]: reason["label"] for reason in DEFAULT_REJECTION_REASONS}
    for reasons in PromptVersion.objects.values_list("rejection_reasons", flat=True):
        for reason in reasons:
            labels.setdefault(reason.get("code"), reason.get("label"))
    return [
        (code, labels.get(code, code) if code else "No code: the reviewer's words only", count)
        for code, count in rows
    ]


def rejection_reasons(scope: Scope) -> list[tuple[str, int]]:
    """The reasons reviewers gave, as they typed them, with how many rejections gave each."""
    rows = (
        scope.rejections()
        .values("reason")
        .annotate(rejections=Count("pk"))
        .order_by("-rejections", "reason")
        .values_list("reason", "rejections")
    )
    return list(rows[:REASONS_SHOWN])


def quick_approval(quick_seconds: float) -> Q:
    """An approval without edits made within `quick_seconds` of its draft being put before a person
    (`ready_at`, annotated) or of its reviewer's previous approval or rejection. Each look-back reads
    only that window of an index: the reviewer's approvals (`approval_by_person`), the rejections
    (`event_rejection`)."""
    window = timedelta(seconds=quick_seconds)
    previous_approval = Approval.objects.standing().filter(
        approved_by=OuterRef("approved_by"),
        approved_at__lt=OuterRef("approved_at"),
        approved_at__gte=OuterRef("approved_at") - window,
    )
    previous_rejection = Event.objects.rejections().filter(
        actor=OuterRef("approved_by"),
        at__lt=OuterRef("approved_at"),
        at__gte=OuterRef("approved_at") - window,
    )
    return Q(edited=False) & (
        Q(approved_at__lt=F("ready_at") + window)
        | Q(Exists(previous_approval))
        | Q(Exists(previous_rejection))
    )


def reviewers(scope: Scope, quick_seconds: float) -> list[Reviewer]:
    """Each reviewer's approvals in the scope and their quick approvals, the most quick first."""
    rows = (
        scope.approvals()
        .annotate(ready_at=ready_at("approved_at"))
        .values(name=F("approved_by__username"))
        .annotate(
            approvals=Count("pk"),
            unchanged=Count("pk", filter=Q(edited=False)),
            quick=Count("pk", filter=quick_approval(quick_seconds)),
        )
        .order_by("-quick", "name")
    )
    return [Reviewer(**row) for row in rows]


# --- labels and order ---------------------------------------------------------------------


def labelled(groups: dict[str, dict[object, Figures]]) -> dict[str, list[Figures]]:
    """Each dimension's groups with their labels: prompt versions by task and number, the others
    by name, a category-less group last."""
    prompts = PromptVersion.objects.in_bulk(key for key in groups[PROMPT_VERSION] if key is not None)
    for figures in groups[PROMPT_VERSION].values():
        prompt = prompts[figures.key]
        figures.label = f"{prompt.task} v{prompt.version}"
    for figures in [*groups[PROVIDER].values(), *groups[MODEL].values()]:
        figures.label = figures.key
    for figures in groups[CATEGORY].values():
        figures.label = figures.key if figures.key not in (None, "") else NO_CATEGORY
    by_prompt = sorted(
        groups[PROMPT_VERSION].values(), key=lambda f: (prompts[f.key].task, prompts[f.key].version)
    )
    by_name = {
        dimension: sorted(
            groups[dimension].values(), key=lambda f: (f.label == NO_CATEGORY, f.label.casefold())
        )
        for dimension in (PROVIDER, MODEL, CATEGORY)
    }
    return {PROMPT_VERSION: by_prompt, **by_name}


def labelled_period(figures: Figures, period: str) -> Figures:
    day = timezone.localtime(figures.key).date()
    figures.label = day.isoformat() if period == DAY else f"Week of {day.isoformat()}"
    return figures
