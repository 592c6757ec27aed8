"""The review queue (SPEC §8): which drafts wait for a decision and in what order, and each as a card,
as both the desk (one draft at a time, `desk.py`) and the list (many at once, `review_list.py`) show
it; why a waiting draft may not be approved; where a decision sent without htmx returns to."""

from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from urllib.parse import urlencode

from django.db.models import OuterRef, QuerySet, Subquery, Sum
from django.http import HttpRequest
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import Truncator

from ledger.actions import currency_problem
from ledger.models import GeneratedVersion, Item, ItemTally, Job
from ledger.money.pricing import is_apportioned, unknown_price, version_cost
from ledger.states import STOPS, ItemState

from .common import ShownValue, fields_of, word_diff
from .forms import ReviewPlaceForm

INVALID_NOTE = "Only a valid draft can be approved"
# How much of each draft the list shows.
PREVIEW_CHARS = 140
# The queue's order, oldest first: a decision takes one draft out and the rest keep their place.
QUEUE_ORDER = ["updated_at", "id"]


def published_text(item: Item) -> str:
    product = item.product
    return product.published_content if product.published_version_id else ""


def refusal_of(version: GeneratedVersion | None, currency: str | None) -> str:
    """Why approving this draft would be refused, said before anyone tries; "" when it may be approved.
    The ledger decides again at approval."""
    if currency:
        return STOPS[currency].note
    if version is None:
        return "No draft recorded"
    if not version.valid:
        return INVALID_NOTE
    return ""


@dataclass(frozen=True)
class ReviewCard:
    """An item waiting for a decision, the draft to decide on (its latest version), and whether the
    product is still what the draft was written for (`currency`: None, "obsolete" or "withdrawn")."""

    item: Item
    version: GeneratedVersion | None
    currency: str | None = None
    # Who else has this draft open on their desk now (list mode says so): a username, or "".
    held_by: str = ""

    @property
    def source_fields(self) -> list[tuple[str, ShownValue]]:
        return fields_of(self.item.source_revision)

    @property
    def published(self) -> str:
        return published_text(self.item)

    @cached_property
    def diff(self) -> list[tuple[str, str]]:
        return word_diff(self.published, self.version.content) if self.version else []

    @cached_property
    def cost(self) -> Decimal | None:
        """None without a draft, or when the job's model has no known price (`price_note` says so)."""
        return version_cost(self.version) if self.version else None

    @property
    def price_note(self) -> str:
        return unknown_price(self.item.job.provider, self.item.job.model)

    @property
    def apportioned(self) -> bool:
        return bool(self.version) and is_apportioned(self.version)

    @cached_property
    def refusal(self) -> str:
        return refusal_of(self.version, self.currency)

    @cached_property
    def preview(self) -> str:
        """The start of the draft, as `truncatechars:PREVIEW_CHARS` shows it (plain ASCII text is cut
        directly: the filter looks at every character for combining marks, which ASCII has none of)."""
        text = (self.version.content if self.version else "") or "No draft recorded."
        if text.isascii():
            return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
        return Truncator(text).chars(PREVIEW_CHARS)

    @property
    def cut(self) -> bool:
        """The preview shows only the start of the draft: list mode offers the whole text in place."""
        return bool(self.version and self.version.content) and self.preview != self.version.content


def with_latest_draft(items: QuerySet[Item]) -> QuerySet[Item]:
    """Items as a card shows them: with job, product and revision, and their latest version's id."""
    latest = GeneratedVersion.objects.filter(item=OuterRef("pk")).order_by("-number").values("pk")[:1]
    return items.select_related("job", "product", "source_revision").annotate(
        latest_version_id=Subquery(latest)
    )


def review_cards(items: QuerySet[Item] | list[Item]) -> list[ReviewCard]:
    """Cards for many items in two queries (items already read `with_latest_draft`: one);
    `currency` read from the products loaded with them."""
    if isinstance(items, QuerySet):
        items = list(with_latest_draft(items))
    versions = GeneratedVersion.objects.in_bulk(i.latest_version_id for i in items if i.latest_version_id)
    cards = []
    for item in items:
        version = versions.get(item.latest_version_id)
        if version is not None:
            version.item = item  # the job, for its price, without a query per row
        cards.append(ReviewCard(item, version, currency_problem(item, product=item.product)))
    return cards


def review_queue_items(job_id: int | None) -> QuerySet[Item]:
    """Drafts waiting for a decision, oldest first: a decision takes one out and the rest keep their place."""
    queue = Item.objects.awaiting_review().order_by(*QUEUE_ORDER)
    return queue.filter(job_id=job_id) if job_id else queue


def waiting_count(job_id: int | None) -> int:
    """Drafts waiting, from the item tallies (of the job, or of every job)."""
    tallies = ItemTally.objects.filter(job_id=job_id) if job_id else ItemTally.objects.all()
    return tallies.counts_by_state().get(ItemState.AWAITING_REVIEW, 0)


def queue_url(**params) -> str:
    query = urlencode({name: value for name, value in params.items() if value})
    return reverse("review_queue") + (f"?{query}" if query else "")


def jobs_in_review(selected: int | None) -> list[tuple[int, str, int]]:
    """(id, reference, drafts waiting) for the job filter, newest job first; the selected job always."""
    rows = [
        row
        for row in ItemTally.objects.filter(state=ItemState.AWAITING_REVIEW)
        .order_by("-job_id")
        .values_list("job_id", "job__reference")
        .annotate(n=Sum("items"))
        if row[2]
    ]
    if selected and selected not in {job_id for job_id, _, _ in rows}:
        rows += [
            (pk, reference, 0)
            for pk, reference in Job.objects.filter(pk=selected).values_list("pk", "reference")
        ]
    return rows


def place_of(data) -> dict:
    """The valid parts of a ReviewPlaceForm; a bad value is as if it were absent."""
    form = ReviewPlaceForm(data)
    form.is_valid()
    return form.cleaned_data


def next_url(request: HttpRequest, default: str = "") -> str:
    """Where a plain form post returns to: the page it came from, if it is ours."""
    url = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return url
    return default or reverse("review_queue")
