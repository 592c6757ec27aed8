"""What several screens share: htmx rendering choice, a refused form in words, item counts by state."""

import json
import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from django import forms
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import get_script_prefix, get_urlconf, reverse
from django_htmx.middleware import HtmxDetails

from ledger.models import ItemTally, Job, SourceRevision
from ledger.states import ItemState, JobState

# Jobs whose progress still moves on its own; pages showing one keep polling.
WORKING_JOB_STATES = frozenset({JobState.PREPARING, JobState.RUNNING})


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def wants_partial(request: HtmxHttpRequest) -> bool:
    return bool(request.htmx) and not request.htmx.boosted


def form_errors(form: forms.Form) -> str:
    """Every error of a refused form, in one line."""
    return " ".join(str(error) for errors in form.errors.values() for error in errors)


class DatesFilter(forms.Form):
    """A filter's "from" and "to" days (either may be left out), the start not after the end."""

    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self) -> dict:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            raise forms.ValidationError("The start date is after the end date.")
        return data


def refused_page(request: HttpRequest, message: str, next_url: str) -> HttpResponse:
    """A request that cannot be read (a malformed form): a 400 page saying why, and the way back."""
    return render(request, "refused.html", {"message": message, "next_url": next_url}, status=400)


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
    """Item counts by state for many jobs in one query over their tallies."""
    counts = ItemTally.objects.counts_by_job(job.pk for job in jobs)
    return [JobProgress(job, state_counts(counts[job.pk])) for job in jobs]


@dataclass(frozen=True)
class ShownValue:
    """A field's value as `_field_value.html` shows it: `text`, or a list of values (`entries`), or
    an object (`pairs` of name and value, by name). Plain text throughout: the template escapes it."""

    text: str = ""
    entries: tuple["ShownValue", ...] | None = None
    pairs: tuple[tuple[str, "ShownValue"], ...] | None = None


def shown_value(value: object) -> ShownValue:
    if isinstance(value, list):
        return ShownValue(entries=tuple(shown_value(inner) for inner in value))
    if isinstance(value, dict):
        return ShownValue(pairs=tuple((key, shown_value(value[key])) for key in sorted(value)))
    if isinstance(value, str):
        return ShownValue(text=value)
    return ShownValue(text=json.dumps(value))  # a number, true, false or null as JSON writes it


def fields_of(revision: SourceRevision) -> list[tuple[str, ShownValue]]:
    """A revision's fields as pairs: a template looking up `fields.items` would find a field named "items"."""
    return [(name, shown_value(value)) for name, value in revision.fields.items()]


# A word with the whitespace around it; whitespace alone is not a word, so it never makes a change.
WORD = re.compile(r"\s*\S+\s*")


def words_of(text: str) -> list[str]:
    return WORD.findall(text) or ([text] if text else [])


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """How `before` (the published text) became `after` (a draft), word by word, as (op, text) pieces:
    op is "equal", "delete" or "insert". The pieces other than deletions join up to `after` exactly.
    Plain text, never markup: the template escapes every piece."""
    old, new = words_of(before), words_of(after)
    # autojunk would treat frequent words ("the", "and") in long texts as noise and mark them changed.
    matcher = SequenceMatcher(None, [w.strip() for w in old], [w.strip() for w in new], autojunk=False)
    pieces = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            pieces.append(("equal", "".join(new[j1:j2])))
            continue
        if i2 > i1:
            pieces.append(("delete", "".join(old[i1:i2])))
        if j2 > j1:
            pieces.append(("insert", "".join(new[j1:j2])))
    return pieces


# --- addresses of many rows --------------------------------------------------------------------

_ID_MARK = 918_273_645_546
_id_urls: dict[tuple, str] = {}


def url_of(name: str, pk: int) -> str:
    """`reverse(name, args=[pk])` for an address with one id in it, at a fraction of the cost: a
    list of fifty rows with three links each spent 4 ms in `reverse` (Django matches every
    pattern's converters each time). The address is reversed once with a mark in the id's place."""
    key = (name, get_script_prefix(), get_urlconf() or settings.ROOT_URLCONF)
    pattern = _id_urls.get(key)
    if pattern is None:
        pattern = _id_urls[key] = reverse(name, args=[_ID_MARK]).replace(str(_ID_MARK), "{}", 1)
    return pattern.format(int(pk))
