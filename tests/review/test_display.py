"""One way to show money, times and states on every screen (issue 18, point 8)."""

import re
from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.template import Context, Template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from ledger.actions.reviewing import reject_version
from ledger.models import ImportState
from ledger.states import ItemState, JobState, SubmissionState
from review.display import (
    BAD,
    GOOD,
    IMPORT_BADGES,
    ITEM_BADGES,
    JOB_BADGES,
    KINDS,
    SUBMISSION_BADGES,
    TONES,
    badge_for,
    duration_text,
    money_text,
    share_text,
    time_text,
    unit_price_text,
)


def render(source: str, **context) -> str:
    return Template("{% load display %}" + source).render(Context(context))


@pytest.mark.parametrize(
    "amount, shown",
    [
        ("0", "$0.00"),
        ("0.000031", "$0.000031"),
        ("0.006213", "$0.0062"),
        ("0.0042", "$0.0042"),
        ("0.00031", "$0.00031"),
        ("0.004", "$0.004"),
        ("0.0099999", "$0.01"),  # two digits make a cent: shown as one
        ("-0.0042", "-$0.0042"),
        ("0.01", "$0.01"),
        ("0.014999", "$0.01"),
        ("0.015", "$0.02"),
        ("1.5", "$1.50"),
        ("1234.5", "$1,234.50"),
        ("-2.5", "-$2.50"),
    ],
)
def test_money_has_a_symbol_and_two_decimals_or_under_a_cent_the_digits_that_tell_it_apart(amount, shown):
    assert money_text(Decimal(amount), "USD") == shown


def test_money_in_another_currency_is_one_parameter():
    assert money_text(Decimal("1.5"), "GBP") == "£1.50"
    assert money_text(Decimal("0.0042"), "GBP") == "£0.0042"
    assert money_text(Decimal("0.00031"), "CHF") == "0.00031 CHF"
    assert money_text(Decimal("12"), "CHF") == "12.00 CHF"


@pytest.fixture
def two_rates(settings, tmp_path):
    rates = tmp_path / "rates.json"
    rates.write_text('{"source": "BoE", "per_usd": {"2026-11-28": "0.8", "2026-12-01": "0.5"}}')
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(rates)


@pytest.mark.django_db
def test_the_money_filter_shows_the_business_currency_and_keeps_the_exact_amounts_in_its_title(two_rates):
    html = render("{{ amount|money }}", amount=Decimal("1234.5"))  # dollars estimated today
    assert html == (
        '<span class="money" title="617.250000 GBP = 1234.5 USD at 0.5 GBP per USD (2026-12-01, BoE)">'
        "£617.25</span>"
    )
    assert render("{{ amount|money:'GBP' }}", amount=Decimal("1234.5")) == (
        '<span class="money" title="1234.5 GBP">£1,234.50</span>'
    )
    assert render("{{ amount|money }}", amount=None) == "—"


@pytest.mark.django_db
def test_a_cost_is_shown_at_the_rate_of_the_day_it_was_incurred(two_rates):
    incurred = datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert ">£0.80<" in render("{{ amount|money_on:when }}", amount=Decimal("1"), when=incurred)
    assert ">£0.50<" in render("{{ amount|money_on:when }}", amount=Decimal("1"), when=timezone.now())


@pytest.mark.django_db
def test_an_amount_with_no_rate_is_shown_in_dollars_and_says_so(settings):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", ""
    html = render("{{ amount|money }}", amount=Decimal("0.000031"))
    assert html.startswith('<span class="money" title="0.000031 USD: no rate from USD to GBP is in force')
    assert ">$0.000031</span>" in html and "(no GBP rate)" in html


def test_a_price_per_million_tokens_is_never_rounded_away():
    assert unit_price_text(Decimal("0.075")) == "$0.075"
    assert unit_price_text(Decimal("2.5")) == "$2.50"
    assert unit_price_text(Decimal("0.150000")) == "$0.15"


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (None, "—"),
        (0, "0 s"),
        (44.6, "45 s"),
        (200, "3 min 20 s"),
        (3600, "1 h"),
        (7500, "2 h 5 min"),
        (93_600, "1 d 2 h"),
    ],
)
def test_a_duration_is_shown_in_its_two_largest_units(seconds, shown):
    assert duration_text(seconds) == shown
    assert render("{{ seconds|duration }}", seconds=seconds) == shown


def test_a_share_is_a_percentage_with_one_decimal_or_a_dash_when_nothing_was_divided():
    assert [share_text(v) for v in (None, 0, 2 / 3, 1)] == ["—", "0.0%", "66.7%", "100.0%"]
    assert render("{{ rate|share }}", rate=0.5) == "50.0%"


MOMENT = datetime(2026, 12, 3, 7, 14, 9, tzinfo=UTC)


def test_a_time_says_its_zone_utc_by_default():
    assert time_text(MOMENT) == "2026-12-03 07:14 UTC"
    assert time_text(MOMENT, seconds=True) == "2026-12-03 07:14:09 UTC"


@pytest.mark.parametrize(
    "zone, shown",
    [
        ("Europe/Paris", "2026-12-03 08:14 CET"),
        ("America/New_York", "2026-12-03 02:14 EST"),
        ("Asia/Dubai", "2026-12-03 11:14 UTC+04"),
    ],
)
def test_a_time_is_shown_in_the_viewers_zone_and_names_it(zone, shown):
    with timezone.override(ZoneInfo(zone)):
        assert time_text(MOMENT) == shown
        html = render("{{ moment|when }}", moment=MOMENT)
    assert html == f'<time datetime="{MOMENT.astimezone(ZoneInfo(zone)).isoformat()}">{shown}</time>'


def test_summer_time_is_named_as_such():
    with timezone.override(ZoneInfo("Europe/London")):
        assert time_text(datetime(2026, 7, 1, 12, 0, tzinfo=UTC)) == "2026-07-01 13:00 BST"


@pytest.mark.parametrize(
    "table, choices",
    [
        (ITEM_BADGES, ItemState),
        (JOB_BADGES, JobState),
        (SUBMISSION_BADGES, SubmissionState),
        (IMPORT_BADGES, ImportState),
    ],
)
def test_every_state_has_a_short_badge_with_a_known_tone(table, choices):
    for state in choices.values:
        assert state in table, f"{choices.__name__}.{state} has no badge in review/display.py"
        badge = table[state]
        assert badge.tone in TONES
        assert 0 < len(badge.word) <= 16, badge.word


def test_failure_and_refusal_states_are_never_shown_as_success():
    for state in ("rejected", "destination_rejected", "inference_failed", "validation_failed", "dead_letter"):
        assert ITEM_BADGES[state].tone == BAD
    assert ITEM_BADGES["applied"].tone == GOOD
    assert JOB_BADGES["completed"].tone == GOOD
    assert SUBMISSION_BADGES["failed"].tone == BAD


def test_a_rejected_badge_is_short_red_and_has_its_sentence_beside_it():
    html = render("{{ state|item_badge }}", state="rejected")
    assert html == (
        '<span class="badge bad" data-state="rejected">Rejected</span> '
        '<span class="state-sentence">A reviewer rejected this draft (reason shown)</span>'
    )
    assert " good" not in html
    alone = render("{{ state|item_badge:'alone' }}", state="rejected")
    assert alone == (
        '<span class="badge bad" data-state="rejected" title="A reviewer rejected this draft (reason shown)">'
        "Rejected</span>"
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kinds_badge_filter_shows_a_state_of_its_own_kind(kind):
    """`<kind>_badge` reads the state in its kind's table: the same state word may mean another
    thing (or nothing) in another kind's."""
    _, states = KINDS[kind]
    for state in states.values:
        badge, sentence = badge_for(kind, state)
        html = render(f"{{{{ state|{kind}_badge }}}}", state=state)
        assert html == (
            f'<span class="badge {badge.tone}" data-state="{state}">{escape(badge.word)}</span> '
            f'<span class="state-sentence">{escape(sentence)}</span>'
        ), (kind, state)


@pytest.mark.django_db
def test_a_rejected_item_is_red_on_its_page_the_jobs_and_in_the_review_desks_outcome(client, owner, draft):
    item = reject_version(item_id=draft.item_id, version_id=draft.pk, reviewer=owner, reason="Too generic")
    client.force_login(owner)
    for address in (reverse("item_detail", args=[item.pk]), reverse("job_detail", args=[item.job_id])):
        html = client.get(address).content.decode()
        badges = re.findall(r'<span class="badge ([a-z ]+)" data-state="rejected"', html)
        assert badges and all(tone == BAD for tone in badges), address
    assert render('<p class="outcome {{ state|state_tone }}">Rejected.</p>', state=item.state) == (
        '<p class="outcome bad">Rejected.</p>'
    )


def test_a_legend_shows_the_short_word_and_keeps_the_sentence_in_its_title():
    assert render("{{ state|item_badge:'word' }}", state="awaiting_review") == (
        '<span title="Draft ready for review">To review</span>'
    )
