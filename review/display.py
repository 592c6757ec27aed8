"""How screens show money, times and states to people: one rule for each, used by every template
(through the `display` template tags) and by the views that format in Python. The API never uses
this: machines get exact amounts, ISO times in UTC and machine state names."""

from dataclasses import dataclass
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal

from django.utils import timezone

from ledger.models import ImportState
from ledger.money.currency import PROVIDER_CURRENCY, Money, business_currency, in_business_currency
from ledger.states import ItemState, JobState, SubmissionState

# --- money -----------------------------------------------------------------------------------

# Providers price in US dollars (ledger/money/pricing.py); screens show amounts in the business currency
# (SPEC §9, `ledger.money.currency`), converted at the rate in force when the cost was incurred, the
# provider's amount and the rate in the figure's title. Prices per million tokens stay in the
# provider's currency.
SYMBOLS = {"USD": "$", "GBP": "£", "EUR": "€", "JPY": "¥"}
CENT = Decimal("0.01")


def shown_money(usd: Decimal | int | str, on: date | None = None) -> Money:
    """A provider's amount (USD), incurred or estimated on `on` (today when not given), as shown."""
    return in_business_currency(Decimal(usd), on=on)


def shown_money_text(usd: Decimal) -> str:
    """A provider's amount estimated now, as words for a sentence: `£0.42`, or `$0.53 (no GBP rate)`."""
    shown = shown_money(usd)
    text = money_text(shown.amount, shown.currency)
    return text if shown.converted else f"{text} (no {business_currency()} rate)"


def money_title(money: Money) -> str:
    """What the figure's title says: the exact amount, and how it was converted."""
    if money.rate is None:
        return (
            f"{exact_money_text(money.provider_amount, PROVIDER_CURRENCY)}: no rate from {PROVIDER_CURRENCY} "
            f"to {business_currency()} is in force, so the amount is shown in {PROVIDER_CURRENCY}"
        )
    if money.currency == PROVIDER_CURRENCY:
        return exact_money_text(money.amount, money.currency)
    return (
        f"{exact_money_text(money.amount, money.currency)} = "
        f"{exact_money_text(money.provider_amount, PROVIDER_CURRENCY)} at {money.rate.per_usd} "
        f"{money.currency} per {PROVIDER_CURRENCY} ({money.rate.valid_from:%Y-%m-%d}, {money.rate.source})"
    )


def money_text(amount: Decimal | int | str, currency: str) -> str:
    """`$1,234.50`, `$0.00`; an amount under a cent with the two significant digits that tell it apart
    from its neighbours (`$0.0042`, `$0.00031`), never rounded away (SPEC §9); the exact amount is
    `exact_money_text`. A currency without a symbol is named after the figure: `12.00 CHF`."""
    amount = Decimal(amount)
    symbol = SYMBOLS.get(currency)

    def shown(figure: str, negative: bool) -> str:
        sign = "-" if negative else ""
        return f"{sign}{symbol}{figure}" if symbol else f"{sign}{figure} {currency}"

    if 0 < abs(amount) < CENT:
        digits = abs(amount).quantize(Decimal(1).scaleb(amount.adjusted() - 1), rounding=ROUND_HALF_UP)
        if digits < CENT:  # 0.0099999 rounds to a cent: shown as one below
            return shown(f"{digits.normalize():f}", amount < 0)
    rounded = amount.quantize(CENT, rounding=ROUND_HALF_UP)
    return shown(f"{abs(rounded):,.2f}", rounded < 0)


def exact_money_text(amount: Decimal | int | str, currency: str) -> str:
    """The amount as the ledger holds it, with its currency code: `0.000031 USD`."""
    return f"{Decimal(amount)} {currency}"


def unit_price_text(amount: Decimal | int | str, currency: str = PROVIDER_CURRENCY) -> str:
    """A price per million tokens: never rounded away (`$0.075`), at least two decimals (`$2.50`)."""
    amount = Decimal(amount)
    places = max(2, -amount.normalize().as_tuple().exponent)
    figure = f"{amount:,.{places}f}"
    symbol = SYMBOLS.get(currency)
    return f"{symbol}{figure}" if symbol else f"{figure} {currency}"


# --- times -----------------------------------------------------------------------------------


def zone_name(moment: datetime) -> str:
    """The zone's usual abbreviation (UTC, GMT, BST, CET, EST); an offset-only one as UTC+04."""
    name = moment.tzname() or "UTC"
    return f"UTC{name}" if name[0] in "+-" else name


def time_text(moment: datetime, *, seconds: bool = False) -> str:
    """`2026-12-03 09:14 CET`: in the viewer's time zone (the one activated for the request), and
    always saying which."""
    local = timezone.localtime(moment)
    shown = local.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    return f"{shown} {zone_name(local)}"


# --- shares and durations --------------------------------------------------------------------


def share_text(share: float | None) -> str:
    """A share of 0 to 1 as a percentage with one decimal: `66.7%`; `—` when there is none (nothing
    to divide)."""
    return "—" if share is None else f"{100 * share:.1f}%"


def duration_text(seconds: float | None) -> str:
    """A span of time in its two largest units: `45 s`, `3 min 20 s`, `2 h 5 min`, `3 d 4 h`."""
    if seconds is None:
        return "—"
    whole = round(seconds)
    for unit, size, smaller, smaller_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            count, rest = divmod(whole, size)
            rest //= smaller_size
            return f"{count} {unit} {rest} {smaller}" if rest else f"{count} {unit}"
    return f"{whole} s"


# --- state badges ----------------------------------------------------------------------------

# A badge's tone says what the state means for the person looking: done well, gone wrong or refused
# (bad: it needs someone), worth a look (warn), still on its way (neutral), or kept as evidence only.
GOOD, BAD, WARN, NEUTRAL, QUIET = "good", "bad", "warn", "neutral", "quiet"
TONES = (GOOD, BAD, WARN, NEUTRAL, QUIET)


@dataclass(frozen=True)
class Badge:
    word: str  # short, shown in the badge; the state's sentence is shown beside it
    tone: str


S, J, U = ItemState, JobState, SubmissionState

ITEM_BADGES: dict[str, Badge] = {
    S.PREPARED: Badge("Prepared", NEUTRAL),
    S.SUBMITTED: Badge("Submitted", NEUTRAL),
    S.SUBMISSION_UNCERTAIN: Badge("Uncertain", WARN),
    S.RETURNED: Badge("Returned", NEUTRAL),
    S.INFERENCE_FAILED: Badge("No draft", BAD),
    S.VALIDATION_FAILED: Badge("Invalid", BAD),
    S.OBSOLETE: Badge("Obsolete", QUIET),
    S.WITHDRAWN: Badge("Withdrawn", QUIET),
    S.AWAITING_REVIEW: Badge("To review", NEUTRAL),
    S.REJECTED: Badge("Rejected", BAD),
    S.APPROVED: Badge("Approved", GOOD),
    S.APPLYING: Badge("Applying", NEUTRAL),
    S.APPLIED: Badge("Applied", GOOD),
    S.DESTINATION_REJECTED: Badge("Refused", BAD),
    S.DEAD_LETTER: Badge("Dead letter", BAD),
    S.CANCELLED: Badge("Cancelled", QUIET),
}

JOB_BADGES: dict[str, Badge] = {
    J.PREPARING: Badge("Preparing", NEUTRAL),
    J.RUNNING: Badge("Running", NEUTRAL),
    J.PAUSED: Badge("Paused", WARN),
    J.IN_REVIEW: Badge("In review", NEUTRAL),
    J.NEEDS_ATTENTION: Badge("Needs attention", BAD),
    J.COMPLETED: Badge("Completed", GOOD),
    J.CANCELLED: Badge("Cancelled", QUIET),
}

SUBMISSION_BADGES: dict[str, Badge] = {
    U.INTENT: Badge("Recorded", NEUTRAL),
    U.UNCERTAIN: Badge("Uncertain", WARN),
    U.OPEN: Badge("Open", NEUTRAL),
    U.ENDED: Badge("Ended", NEUTRAL),
    U.COLLECTED: Badge("Collected", GOOD),
    U.FAILED: Badge("Not run", BAD),
}

IMPORT_BADGES: dict[str, Badge] = {
    ImportState.QUEUED: Badge("Queued", NEUTRAL),
    ImportState.RUNNING: Badge("Importing", NEUTRAL),
    ImportState.DONE: Badge("Finished", GOOD),
    ImportState.FAILED: Badge("Failed", BAD),
    ImportState.PREVIEWED: Badge("To confirm", WARN),
    ImportState.DISCARDED: Badge("Discarded", QUIET),
}

# Which table and which sentences each kind of state has.
KINDS = {
    "item": (ITEM_BADGES, ItemState),
    "job": (JOB_BADGES, JobState),
    "submission": (SUBMISSION_BADGES, SubmissionState),
    "import": (IMPORT_BADGES, ImportState),
}


def badge_for(kind: str, state: str) -> tuple[Badge, str]:
    """The badge of a `kind` ("item", "job", "submission", "import") of state, and its sentence."""
    badges, choices = KINDS[kind]
    sentence = dict(choices.choices).get(state, state)
    return badges.get(state) or Badge(state.replace("_", " ").capitalize(), NEUTRAL), sentence
