"""Draft quality (`/quality/`): the figures on a small world made through the ledger's verbs, at
known moments, their grouping, the quick approvals flagged by reviewer, the CSV, and bad filters."""

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.http import QueryDict
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.actions.core import change_state
from ledger.actions.prompts import create_prompt_version
from ledger.actions.reviewing import approve_version, reject_version
from ledger.models import GeneratedVersion, Item, PromptVersion
from ledger.money.pricing import job_cost
from ledger.quality import (
    CATEGORY,
    MODEL,
    NO_CATEGORY,
    PROMPT_VERSION,
    PROVIDER,
    WEEK,
    Scope,
    edit_distance,
    measure,
    rejection_reasons,
    reviewers,
)
from ledger.states import ItemState
from review.models import Preferences
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class WallClock:
    """`timezone.now()` as the test sets it: every row the verbs write is stamped with it."""

    def __init__(self, monkeypatch):
        self.now = START
        monkeypatch.setattr(timezone, "now", lambda: self.now)

    def at(self, seconds: float) -> "WallClock":
        self.now = START + timedelta(seconds=seconds)
        return self


@pytest.fixture
def wall_clock(monkeypatch) -> WallClock:
    return WallClock(monkeypatch)


def draft_ready(job, *, category: str | None = None, text: str = "") -> Item:
    """A product (of `category`) whose draft is put before reviewers now."""
    fields = {"material": "oak", "dimensions": "40 x 25 cm"}
    if category is not None:
        fields["category"] = category
    item = ItemFactory(job=job, product=ProductFactory(revision__fields=fields), awaiting_review=True)
    add_version(item, text)
    return item


def approve(item: Item, by, *, content: str | None = None):
    draft = item.versions.get()
    return approve_version(
        item_id=item.pk, version_id=draft.pk, version_hash=draft.content_hash, approver=by, content=content
    )


def reject(item: Item, by, reason: str):
    return reject_version(item_id=item.pk, version_id=item.versions.get().pk, reviewer=by, reason=reason)


DRAFT = "A sturdy board made from oak. It measures 40 x 25 cm and suits daily use in any kitchen."
EDITED = "A sturdy board made from oak. It measures 40 x 25 cm and suits daily use in a busy kitchen."


@pytest.fixture
def second_prompt():
    first = PromptVersion.objects.get(task="product_description", version=1)
    return create_prompt_version(
        task="product_description",
        system_message=first.system_message,
        template=first.template,
        output_schema=first.output_schema,
        rules=first.rules,
        max_output_tokens=first.max_output_tokens,
    )


@pytest.fixture
def world(wall_clock, second_prompt):
    """Two jobs, six decisions by two reviewers, at known moments:

    job one (prompt v1, emulator, gpt-4o-mini):
      kitchen 1: ready at 0 s, approved unchanged by ann at 30 s
      kitchen 2: ready at 0 s, approved by ann with an edit at 90 s
      garden:    ready at 0 s, rejected by bob at 60 s, "Too vague"
      no category: ready at 0 s, approved unchanged by ann at 92 s (2 s after her previous decision)
    job two (prompt v2, openai, gpt-4.1-mini), seven days later:
      kitchen:   ready at 7 d, rejected by bob at 7 d + 120 s, "Too vague"
      garden:    ready at 7 d, rejected by ann at 7 d + 200 s, "Wrong size"
    """
    ann = UserFactory(username="ann", roles=["catalogue_owner"])
    bob = UserFactory(username="bob", roles=["catalogue_owner"])
    one = JobFactory(reference="one")
    two = JobFactory(reference="two", prompt_version=second_prompt, provider="openai", model="gpt-4.1-mini")
    wall_clock.at(0)
    kitchen1, kitchen2 = (
        draft_ready(one, category="kitchen", text=DRAFT),
        draft_ready(one, category="kitchen", text=DRAFT),
    )
    garden, plain = draft_ready(one, category="garden"), draft_ready(one)
    wall_clock.at(30)
    approve(kitchen1, ann)
    wall_clock.at(60)
    reject(garden, bob, "Too vague")
    wall_clock.at(90)
    approve(kitchen2, ann, content=EDITED)
    wall_clock.at(92)
    approve(plain, ann)
    week = 7 * 24 * 3600
    wall_clock.at(week)
    kitchen3, garden2 = draft_ready(two, category="kitchen"), draft_ready(two, category="garden")
    wall_clock.at(week + 120)
    reject(kitchen3, bob, "Too vague")
    wall_clock.at(week + 200)
    reject(garden2, ann, "Wrong size")
    return {"one": one, "two": two, "ann": ann, "bob": bob}


def by_label(figures) -> dict:
    return {f.label: f for f in figures}


def test_the_figures_of_every_decision(world):
    report = measure(Scope(), period=WEEK)
    total = report.total
    assert (total.decided, total.approved, total.rejected, total.edited) == (6, 3, 3, 1)
    assert total.acceptance_rate == pytest.approx(0.5)
    assert total.edit_rate == pytest.approx(1 / 3)
    # 30 + 60 + 90 + 92 + 120 + 200 seconds over six decisions.
    assert total.seconds_to_decide == pytest.approx(592 / 6)
    assert total.sampled == 1
    assert total.edit_distance == pytest.approx(edit_distance(DRAFT, EDITED))
    assert rejection_reasons(Scope()) == [("Too vague", 2), ("Wrong size", 1)]


def test_grouped_by_prompt_version_provider_model_and_category(world):
    groups = measure(Scope(), period=WEEK).groups
    prompts = by_label(groups[PROMPT_VERSION])
    assert list(prompts) == ["product_description v1", "product_description v2"]
    v1, v2 = prompts.values()
    assert (v1.approved, v1.rejected, v1.edited) == (3, 1, 1)
    assert v1.acceptance_rate == pytest.approx(0.75)
    assert v1.seconds_to_decide == pytest.approx((30 + 60 + 90 + 92) / 4)
    assert (v2.approved, v2.rejected, v2.acceptance_rate, v2.edit_rate) == (0, 2, 0, None)
    assert v2.seconds_to_decide == pytest.approx(160)
    assert {f.label: f.decided for f in groups[PROVIDER]} == {"emulator": 4, "openai": 2}
    assert {f.label: f.decided for f in groups[MODEL]} == {"gpt-4.1-mini": 2, "gpt-4o-mini": 4}
    categories = by_label(groups[CATEGORY])
    assert list(categories) == ["garden", "kitchen", NO_CATEGORY]
    assert (categories["kitchen"].approved, categories["kitchen"].rejected) == (2, 1)
    assert categories["kitchen"].edit_rate == pytest.approx(0.5)
    assert categories["kitchen"].sampled == 1
    assert (categories["garden"].approved, categories["garden"].rejected) == (0, 2)
    assert (categories[NO_CATEGORY].approved, categories[NO_CATEGORY].rejected) == (1, 0)


def test_first_drafts_that_failed_validation_are_counted_beside_the_decisions(world, wall_clock):
    """Furniture: four products, three of whose first drafts failed validation and never reached a
    reviewer; the fourth was approved. Acceptance says 100 %, the first-draft usable rate 25 %."""
    wall_clock.at(10)  # the first day, with job one's drafts
    furniture = []
    for valid in (False, False, False, True):
        item = ItemFactory(
            job=world["one"],
            product=ProductFactory(revision__fields={"category": "furniture"}),
            state=ItemState.SUBMITTED,
        )
        add_version(item, valid=valid, reasons=[] if valid else ["Too short"])
        furniture.append(item)
    # A second draft of a failed one passes: it is no first draft, and leaves the rate alone.
    add_version(furniture[0])
    change_state(furniture[3].pk, to=ItemState.RETURNED)
    change_state(furniture[3].pk, to=ItemState.AWAITING_REVIEW)
    approve(Item.objects.get(pk=furniture[3].pk), world["ann"])

    report = measure(Scope(), period=WEEK)
    chairs = by_label(report.groups[CATEGORY])["furniture"]
    assert (chairs.approved, chairs.rejected, chairs.acceptance_rate) == (1, 0, 1.0)
    assert (chairs.first_drafts, chairs.usable_first_drafts) == (4, 1)
    assert chairs.first_draft_usable_rate == pytest.approx(0.25)
    assert (report.total.first_drafts, report.total.usable_first_drafts) == (10, 7)
    v1 = by_label(report.groups[PROMPT_VERSION])["product_description v1"]
    assert (v1.first_drafts, v1.usable_first_drafts) == (8, 5)
    assert by_label(report.groups[MODEL])["gpt-4o-mini"].first_draft_usable_rate == pytest.approx(5 / 8)
    # The first drafts count by when they arrived, as decisions count by when they were made.
    assert measure(Scope(since=START.date() + timedelta(days=1)), period=WEEK).total.first_drafts == 2


def test_over_time_by_week_or_day(world):
    weeks = measure(Scope(), period=WEEK).over_time
    # 1 December 2026 is a Tuesday: its week starts on Monday 30 November.
    assert [(f.label, f.approved, f.rejected) for f in weeks] == [
        ("Week of 2026-11-30", 3, 1),
        ("Week of 2026-12-07", 0, 2),
    ]
    days = measure(Scope(), period="day").over_time
    assert [(f.label, f.decided) for f in days] == [("2026-12-01", 4), ("2026-12-08", 2)]


def test_the_scope_narrows_by_dates_job_and_prompt_version(world, second_prompt):
    def decided(**scope) -> int:
        return measure(Scope(**scope), period=WEEK).total.decided

    assert decided(job_id=world["two"].pk) == 2
    assert decided(prompt_version_id=second_prompt.pk) == 2
    assert decided(until=START.date()) == 4
    assert decided(since=START.date() + timedelta(days=1)) == 2
    assert decided(since=START.date() + timedelta(days=8)) == 0


def test_quick_approvals_without_edits_are_flagged_by_reviewer(world):
    found = reviewers(Scope(), quick_seconds=5)
    # ann: 30 s after the draft was ready (not quick), an edit (never quick), and 2 s after her
    # previous approval (quick). bob only rejected.
    assert [(r.name, r.approvals, r.unchanged, r.quick) for r in found] == [("ann", 3, 2, 1)]
    assert found[0].quick_share == pytest.approx(1 / 3)
    # Within 31 s, her first approval (30 s after its draft was ready) is quick too; within 1 s, none.
    assert reviewers(Scope(), quick_seconds=31)[0].quick == 2
    assert reviewers(Scope(), quick_seconds=1)[0].quick == 0


def test_a_quick_approval_after_the_reviewers_own_rejection(wall_clock):
    cleo = UserFactory(username="cleo", roles=["catalogue_owner"])
    job = JobFactory()
    wall_clock.at(0)
    first, second = draft_ready(job), draft_ready(job)
    wall_clock.at(100)
    reject(first, cleo, "Too vague")
    wall_clock.at(103)
    approve(second, cleo)
    [reviewer] = reviewers(Scope(), quick_seconds=5)
    assert (reviewer.approvals, reviewer.quick) == (1, 1)


# --- the page and its CSV ------------------------------------------------------------------


def test_the_page_shows_every_figure_in_its_tables(client, world):
    client.force_login(world["bob"])
    response = client.get(reverse("quality"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "6 (3 approved, 3 rejected)" in page
    assert "50.0%" in page  # acceptance
    assert "33.3%" in page  # edit rate
    assert "1 min 39 s" in page  # 592 s / 6, rounded
    for label in ("product_description v1", "product_description v2", "openai", "gpt-4.1-mini", "kitchen"):
        assert f'<th scope="row">{label}</th>' in page
    assert "Week of 2026-11-30" in page
    assert "Too vague" in page and "Wrong size" in page
    # The charts' figures, for static/quality.js.
    assert '<script id="quality-charts" type="application/json">' in page
    charts = response.context["charts"]
    assert charts["by-prompt_version"]["series"][0]["values"] == [75.0, 0.0]
    assert charts["over-time-decisions"]["series"][1]["values"] == [1, 2]
    assert [r.quick for r in response.context["reviewers"]] == [1]


def test_the_page_narrowed_to_a_job_from_its_page(client, world):
    client.force_login(world["ann"])
    link = f"{reverse('quality')}?job={world['two'].pk}"
    assert f'href="{link}"' in client.get(reverse("job_detail", args=[world["two"].pk])).content.decode()
    response = client.get(link + "&period=day")
    assert response.status_code == 200
    assert response.context["report"].total.decided == 2
    assert "of job two" in response.content.decode()
    assert "2026-12-08" in response.content.decode()


def test_days_and_dates_are_the_viewers(client, world):
    """09:00 UTC on 1 December is 23:00 on 30 November in Honolulu: the day, the week and a date
    filter follow the viewer's time zone."""
    Preferences.objects.create(user=world["ann"], time_zone="Pacific/Honolulu")
    client.force_login(world["ann"])
    response = client.get(reverse("quality"), {"period": "day"})
    assert [f.label for f in response.context["report"].over_time] == ["2026-11-30", "2026-12-07"]
    response = client.get(reverse("quality"), {"until": "2026-11-30"})
    assert response.context["report"].total.decided == 4


def test_with_no_decisions_the_page_says_so(client, owner):
    client.force_login(owner)
    response = client.get(reverse("quality"))
    assert response.status_code == 200
    assert 'data-testid="no-decisions"' in response.content.decode()
    assert "quality-charts" not in response.content.decode()


def read_csv(response) -> list[dict]:
    body = response.content.decode("utf-8")
    assert body.startswith("\ufeff")
    return list(csv.DictReader(io.StringIO(body[1:])))


def test_the_csv_holds_the_grouped_figures(client, world):
    client.force_login(world["ann"])
    response = client.get(reverse("quality_csv"), {"period": "week"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="quality-')
    rows = read_csv(response)
    assert rows[0] == {
        "dimension": "all",
        "group": "All decisions",
        "decided": "6",
        "approved": "3",
        "rejected": "3",
        "acceptance_rate": "0.5000",
        "first_drafts": "6",
        "usable_first_drafts": "6",
        "first_draft_usable_rate": "1.0000",
        "edited": "1",
        "edit_rate": "0.3333",
        "edit_distance": f"{edit_distance(DRAFT, EDITED):.4f}",
        "edit_distance_sample": "1",
        "seconds_to_decide": "98.7",
    }
    keyed = {(row["dimension"], row["group"]): row for row in rows}
    assert keyed["prompt_version", "product_description v2"]["acceptance_rate"] == "0.0000"
    assert keyed["prompt_version", "product_description v2"]["edit_rate"] == ""
    assert keyed["category", NO_CATEGORY]["decided"] == "1"
    assert keyed["provider", "openai"]["seconds_to_decide"] == "160.0"
    assert keyed["model", "gpt-4o-mini"]["decided"] == "4"
    assert keyed["week", "Week of 2026-12-07"]["rejected"] == "2"
    assert len(rows) == 1 + 2 + 2 + 2 + 3 + 2


def test_a_category_that_looks_like_a_formula_is_quoted_in_the_csv(client, owner, wall_clock):
    job = JobFactory()
    wall_clock.at(0)
    item = draft_ready(job, category="=HYPERLINK(1)")
    wall_clock.at(20)
    approve(item, owner)
    client.force_login(owner)
    rows = read_csv(client.get(reverse("quality_csv")))
    assert ("category", "'=HYPERLINK(1)") in {(row["dimension"], row["group"]) for row in rows}


@pytest.mark.parametrize(
    "query, problem",
    [
        ({"since": "yesterday"}, "From: Enter a valid date."),
        ({"until": "2026-13-45"}, "To: Enter a valid date."),
        ({"job": "twelve"}, "Job id: Ids are whole numbers"),
        ({"job": "99999999999999999999999"}, "Job id: Ids are whole numbers"),
        ({"job": "987654"}, "Job id: There is no job 987654."),
        ({"prompt_version": "newest"}, "Prompt version: Select a valid choice."),
        ({"period": "fortnight"}, "Over time by: Select a valid choice."),
        ({"since": "2026-12-09", "until": "2026-12-01"}, "The start date is after the end date."),
    ],
)
def test_a_bad_filter_is_refused_with_a_clear_message(client, owner, query, problem):
    client.force_login(owner)
    page = client.get(reverse("quality"), query)
    assert page.status_code == 400
    assert problem in page.content.decode()
    assert "Nothing was measured" in page.content.decode()
    exported = client.get(reverse("quality_csv"), query)
    assert exported.status_code == 400
    assert exported["Content-Type"].startswith("text/plain")
    assert problem in exported.content.decode()


def test_every_role_may_see_it_and_nobody_else(client, owner, operator, admin_person, outsider):
    for address in (reverse("quality"), reverse("quality_csv")):
        client.logout()
        assert client.get(address).url.startswith(f"/accounts/login/?next={address}")
        for person in (owner, operator, admin_person):
            client.force_login(person)
            assert client.get(address).status_code == 200
        client.force_login(outsider)
        assert client.get(address).status_code == 403


# --- cost by a field -----------------------------------------------------------------------


def drafted(job, category: str | None, *, tokens: int, state=ItemState.AWAITING_REVIEW) -> Item:
    fields = {"material": "oak"} if category is None else {"material": "oak", "category": category}
    item = ItemFactory(job=job, product=ProductFactory(revision__fields=fields), state=state)
    version = add_version(item)
    GeneratedVersion.objects.filter(pk=version.pk).update(input_tokens=tokens, output_tokens=tokens)
    return item


@pytest.fixture
def spending(pounds, owner):
    """Two jobs in pounds: furniture dear and mostly rejected, stationery cheap and approved."""
    one, two = JobFactory(reference="one"), JobFactory(reference="two", model="gpt-4o")
    for job in (one, two):
        for _ in range(3):
            item = drafted(job, "furniture", tokens=40_000)
            reject_version(item_id=item.pk, version_id=item.versions.get().pk, reviewer=owner, reason="Vague")
        approve(drafted(job, "furniture", tokens=40_000), owner)
        approve(drafted(job, "stationery", tokens=300), owner)
        drafted(job, None, tokens=1_000)
    return one, two


def test_by_default_the_page_shows_cost_by_set_up_without_reading_items(client, owner, spending):
    """Cost by a field reads every item of the jobs: a visit does so only when asked (a job of a
    million items would be read at each one); the cost by prompt version and model is from tallies."""
    client.force_login(owner)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("quality"), {"period": "day"})
    assert response.status_code == 200
    grouped_items = [q["sql"] for q in queries if 'FROM "ledger_item"' in q["sql"] and "GROUP BY" in q["sql"]]
    assert grouped_items == []
    assert "field_costs" not in response.context
    assert [g.amount for g in response.context["set_up_groups"]] == [
        job_cost(spending[1])["total"],
        job_cost(spending[0])["total"],
    ]
    page = response.content.decode()
    assert 'data-testid="table-cost-set-up"' in page and 'data-testid="table-cost"' not in page
    # The link asks for the cost by category, keeping the filter.
    ask = QueryDict(response.context["cost_by_query"])
    assert (ask["cost_by"], ask["period"]) == ("category", "day")
    assert "reads every item of the jobs in the filter" in page
    asked = client.get(reverse("quality"), ask)
    assert [g.label for g in asked.context["cost_groups"]] == ["furniture", NO_CATEGORY, "stationery"]
    assert "Read from every item of the jobs in the filter" in asked.content.decode()


def test_the_page_shows_cost_by_category_with_its_chart(client, owner, spending):
    client.force_login(owner)
    response = client.get(reverse("quality"), {"cost_by": "category"})
    assert response.status_code == 200
    costs = response.context["field_costs"]
    assert [g.label for g in response.context["cost_groups"]] == ["furniture", NO_CATEGORY, "stationery"]
    furniture, _, stationery = response.context["cost_groups"]
    assert (furniture.items, furniture.approved, stationery.items, stationery.approved) == (8, 2, 2, 2)
    # Each job's groups add up to its cost exactly, so the column adds up to the jobs' costs.
    jobs = sum(job_cost(job)["total"] for job in spending)
    assert costs.total.amount == jobs == sum(g.amount for g in response.context["cost_groups"])
    assert furniture.wasted > 0 and stationery.wasted == 0
    assert furniture.per_approved == (furniture.amount / 2).quantize(Decimal("0.000001"))
    page = response.content.decode()
    assert 'data-testid="table-cost"' in page and 'data-testid="cost-chart"' in page
    assert '<th scope="row">stationery</th>' in page
    # The dearest group's bar is the whole width; the cheapest's a sliver.
    assert [bar.percent for bar in response.context["cost_bars"]][0] == "100.0"
    assert 'style="width: 100.0%"' in page
    assert "£" in page
    # By prompt version and model, from each job's own figures: the same whole.
    set_up = {g.label: g for g in response.context["set_up_groups"]}
    assert list(set_up) == ["product_description v1 · gpt-4o", "product_description v1 · gpt-4o-mini"]
    assert [g.amount for g in set_up.values()] == [
        job_cost(spending[1])["total"],
        job_cost(spending[0])["total"],
    ]
    assert [(g.items, g.approved) for g in set_up.values()] == [(6, 2), (6, 2)]
    assert 'data-testid="table-cost-set-up"' in page


def test_cost_by_another_field_or_by_state(client, owner, spending):
    client.force_login(owner)
    by_state = client.get(reverse("quality"), {"cost_by": "state"})
    assert {g.label: g.items for g in by_state.context["cost_groups"]} == {
        "rejected": 6,
        "approved": 4,
        "awaiting_review": 2,
    }
    by_material = client.get(reverse("quality"), {"cost_by": "material"})
    assert [(g.label, g.items) for g in by_material.context["cost_groups"]] == [("oak", 12)]
    narrowed = client.get(reverse("quality"), {"job": spending[1].pk})
    assert narrowed.context["field_costs"].total.amount == job_cost(spending[1])["total"]


def test_one_job_chosen_shows_its_cost_by_category_or_by_state_without_any(client, owner, pounds):
    job = JobFactory()
    drafted(job, None, tokens=100)
    client.force_login(owner)
    response = client.get(reverse("quality"), {"job": job.pk})
    assert response.context["cost_by"] == "state"
    assert [g.label for g in response.context["cost_groups"]] == ["awaiting_review"]


def test_a_bad_cost_field_is_refused(client, owner):
    client.force_login(owner)
    page = client.get(reverse("quality"), {"cost_by": "fields.category"})
    assert page.status_code == 400
    assert "Cost by: Give a product field" in page.content.decode()


def test_a_field_with_too_many_values_is_said_instead_of_read(client, owner, spending, monkeypatch):
    monkeypatch.setattr("review.quality.COST_ROWS_READ", 4)
    client.force_login(owner)
    response = client.get(reverse("quality"), {"cost_by": "title"})
    assert response.status_code == 200
    assert "title has too many values to show here" in response.content.decode()
    assert response.context["set_up_groups"]  # the cost by prompt version and model is still there
