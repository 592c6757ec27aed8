"""Template face of review/display.py: `{% load display %}`, then

- `{{ amount|money }}` or `{{ amount|money:cost.currency }}`: `<span title="0.000031 USD">$0.000031</span>`
- `{{ price|unit_price }}`: a price per million tokens, never rounded away
- `{{ moment|when }}` or `{{ moment|when:"seconds" }}`: `<time datetime=…>2026-12-03 09:14 CET</time>`;
  `when_text` the same words alone, for a title
- `{{ rate|share }}`: `66.7%`, or `—` when there is nothing to divide; `{{ seconds|duration }}`: `3 min 20 s`
- `{{ item.state|item_badge }}` (also `job_badge`, `submission_badge`, `import_badge`): the short
  badge with the state's sentence beside it; `:"alone"` for the badge alone, the sentence in its title;
  `:"word"` for the short word alone (a legend beside colour swatches), the sentence in its title.
"""

from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledger.money.currency import PROVIDER_CURRENCY, Money, business_currency
from review.display import (
    badge_for,
    duration_text,
    exact_money_text,
    money_text,
    money_title,
    share_text,
    shown_money,
    time_text,
    unit_price_text,
)

register = template.Library()


@register.filter
def money(amount: Money | Decimal | None, currency: str = "") -> SafeString | str:
    """`{{ usd|money }}`: a provider's amount (USD) incurred or estimated now, in the business
    currency at today's rate; `{{ amount|money:cost.currency }}`: an amount already converted (a
    job's cost, converted at its units' own rates); a `Money` as it is."""
    if amount is None or amount == "":
        return "—"
    if isinstance(amount, Money):
        return _money_html(amount)
    if currency:
        return format_html(
            '<span class="money" title="{}">{}</span>',
            exact_money_text(amount, currency),
            money_text(amount, currency),
        )
    return _money_html(shown_money(amount))


@register.filter
def money_on(amount: Decimal | None, moment: datetime | date | None) -> SafeString | str:
    """`{{ version_cost|money_on:version.created_at }}`: a provider's amount incurred then, at the
    rate in force that day, so what was spent never changes when a rate does."""
    if amount is None or amount == "":
        return "—"
    day = timezone.localdate(moment) if isinstance(moment, datetime) else moment
    return _money_html(shown_money(amount, on=day))


def _money_html(shown: Money) -> SafeString:
    figure = format_html(
        '<span class="money" title="{}">{}</span>',
        money_title(shown),
        money_text(shown.amount, shown.currency),
    )
    if shown.converted:
        return figure
    return format_html('{} <span class="meta no-rate">(no {} rate)</span>', figure, business_currency())


@register.filter
def unit_price(amount: Decimal | None, currency: str = PROVIDER_CURRENCY) -> str:
    return "—" if amount is None or amount == "" else unit_price_text(amount, currency)


@register.filter
def share(value: float | None) -> str:
    return share_text(value)


@register.filter
def duration(seconds: float | None) -> str:
    return duration_text(seconds)


@register.filter
def when(moment: datetime | None, detail: str = "") -> SafeString | str:
    if not moment:
        return ""
    local = timezone.localtime(moment)
    return format_html(
        '<time datetime="{}">{}</time>', local.isoformat(), time_text(local, seconds=detail == "seconds")
    )


@register.filter
def when_text(moment: datetime | None, detail: str = "") -> str:
    """The same words as `when` without the element, for a title beside a relative time ("5 minutes ago")."""
    return time_text(moment, seconds=detail == "seconds") if moment else ""


def _badge(kind: str, state: str, shape: str) -> SafeString:
    badge, sentence = badge_for(kind, state)
    if shape == "word":
        return format_html('<span title="{}">{}</span>', sentence, badge.word)
    if shape == "alone":
        return format_html(
            '<span class="badge {}" data-state="{}" title="{}">{}</span>',
            badge.tone,
            state,
            sentence,
            badge.word,
        )
    return format_html(
        '<span class="badge {}" data-state="{}">{}</span> <span class="state-sentence">{}</span>',
        badge.tone,
        state,
        badge.word,
        sentence,
    )


def _badge_filter(kind: str) -> Callable[[str, str], SafeString]:
    def badge(state: str, shape: str = "") -> SafeString:
        return _badge(kind, state, shape)

    return badge


# `item_badge`, `job_badge`, `submission_badge`, `import_badge`: a state of that kind as a badge.
for _kind in ("item", "job", "submission", "import"):
    register.filter(f"{_kind}_badge", _badge_filter(_kind))


@register.filter
def state_tone(state: str, kind: str = "item") -> str:
    """The tone class alone, for an element that shows a state in its own words (the review desk's
    outcome)."""
    return badge_for(kind, state)[0].tone
