"""What several screens share: htmx rendering choice and item counts by state."""

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails

from ledger.models import Item, Job, SourceRevision
from ledger.states import ItemState, JobState

# Jobs whose progress still moves on its own; pages showing one keep polling.
WORKING_JOB_STATES = frozenset({JobState.PREPARING, JobState.RUNNING})


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def wants_partial(request: HtmxHttpRequest) -> bool:
    return bool(request.htmx) and not request.htmx.boosted


# --- progress by state ---------------------------------------------------------------------


@dataclass(frozen=True)
class StateCount:
    state: str
    label: str
    count: int
    percent: str  # the width of its segment in a stacked bar


def state_counts(counts: dict[str, int]) -> list[StateCount]:
    """Counts in the order of the state table, leaving out states no item is in."""
    total = sum(counts.values())
    return [
        StateCount(state, ItemState(state).label, counts[state], f"{100 * counts[state] / total:.3f}")
        for state in ItemState.values
        if counts.get(state)
    ]


@dataclass(frozen=True)
class JobProgress:
    job: Job
    counts: list[StateCount]

    @property
    def item_count(self) -> int:
        return sum(c.count for c in self.counts)


def progress_of(jobs: list[Job]) -> list[JobProgress]:
    """Item counts by state for many jobs in one GROUP BY query."""
    rows = Item.objects.filter(job__in=jobs).order_by().values("job", "state").annotate(n=Count("id"))
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for row in rows:
        counts[row["job"]][row["state"]] = row["n"]
    return [JobProgress(job, state_counts(counts[job.pk])) for job in jobs]


def fields_of(revision: SourceRevision) -> list[tuple[str, object]]:
    """A revision's fields as pairs: a template looking up `fields.items` would find a field named "items"."""
    return list(revision.fields.items())
