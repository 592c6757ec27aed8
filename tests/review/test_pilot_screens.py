"""A pilot on the screens (issue 19, points 1 and 3): the start screen's pilot option, with its
sample's size and cost before it starts, and the report at `/jobs/{id}/pilot`."""

import re
from decimal import Decimal
from uuid import uuid4

import pytest
from django.urls import reverse

from ledger.models import Event, ExchangeRate, Item, Job, Pilot
from ledger.pilots.drill import plan_drill
from tests.factories import JobFactory, ProductFactory, UserFactory
from tests.pilots import known_pilot

pytestmark = pytest.mark.django_db


@pytest.fixture
def products():
    for category, count in {"kitchen": 6, "garden": 3, "bath": 1}.items():
        for n in range(count):
            ProductFactory(sku=f"{category}-{n}", revision__fields={"category": category, "material": "oak"})


def start(**changes) -> dict:
    data = {
        "start_token": str(uuid4()),
        "reference": "",
        "task": "product_description",
        "prompt_version": "",
        "provider": "emulator",
        "model": "gpt-4o-mini",
        "destination": "catalogue",
        "unit_size": "500",
        "scope": "all",
        "category": "",
        "skus": "",
        "pilot": "on",
        "pilot-per_stratum": "2",
        "pilot-strata": "category",
        "pilot-seed": "42",
    }
    return {key: value for key, value in {**data, **changes}.items() if value is not None}


def ledger_size() -> tuple[int, ...]:
    return Job.objects.count(), Item.objects.count(), Event.objects.count(), Pilot.objects.count()


# --- starting a pilot ------------------------------------------------------------------------


def test_the_start_screen_offers_a_pilot_with_a_new_seed_each_time(client, owner):
    client.force_login(owner)
    first = client.get(reverse("job_start")).content.decode()
    second = client.get(reverse("job_start")).content.decode()

    assert 'data-testid="pilot-option"' in first
    for name in ("pilot", "pilot-per_stratum", "pilot-strata", "pilot-seed", "pilot-drill"):
        assert f'name="{name}"' in first
    seed = re.compile(r'name="pilot-seed" value="(-?\d+)"')
    assert seed.search(first) and seed.search(second)


def test_the_estimate_of_a_pilot_is_its_samples_size_and_cost_and_starts_nothing(client, owner, products):
    client.force_login(owner)
    before = ledger_size()

    response = client.post(reverse("job_start"), start(step="estimate"))

    assert response.status_code == 200
    page = response.content.decode()
    # 2 kitchen, 2 garden and the 1 bath product: 5 of the 10 chosen.
    assert re.search(r'data-testid="estimated-requests">5 requests<', page)
    assert 'data-testid="estimated-cost"' in page
    pilot = re.search(r'data-testid="pilot-estimate">(.*?)</p>', page, re.S).group(1)
    assert "2 products from each of\n  3 strata of category" in pilot
    assert "(seed 42): 5 of the 10 products chosen" in pilot
    assert ledger_size() == before


def test_starting_a_pilot_draws_its_sample_as_the_estimate_said(client, owner, products):
    client.force_login(owner)
    estimate = client.post(reverse("job_start"), start(step="estimate")).content.decode()
    assert "5 requests" in estimate

    response = client.post(reverse("job_start"), start(step="start", reference="spring-pilot"))

    job = Job.objects.get(reference="spring-pilot")
    assert response.status_code == 302 and response["Location"] == reverse("job_detail", args=[job.pk])
    assert (job.pilot.per_stratum, job.pilot.strata, job.pilot.seed, job.pilot.scope_skus) == (
        2,
        ["category"],
        42,
        None,
    )
    assert job.items.count() == 5
    page = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert 'data-testid="pilot-report-link"' in page and reverse("pilot_report", args=[job.pk]) in page


def test_a_pilot_of_one_category_draws_from_that_category(client, owner, products):
    client.force_login(owner)
    client.post(
        reverse("job_start"),
        start(
            step="start",
            reference="kitchen-pilot",
            scope="category",
            category="kitchen",
            **{"pilot-strata": ""},
        ),
    )

    job = Job.objects.get(reference="kitchen-pilot")
    assert set(job.items.values_list("product__sku", flat=True)) <= {f"kitchen-{n}" for n in range(6)}
    assert job.pilot.scope_skus == [f"kitchen-{n}" for n in range(6)]
    assert job.pilot.strata == ["category", "source_length"]  # the default
    assert job.items.count() == 6  # 2 from each length band of the kitchen's 6


def test_a_pilot_started_with_the_drill_box_ticked_drills(client, owner, products):
    client.force_login(owner)
    client.post(reverse("job_start"), start(step="start", reference="drilled", **{"pilot-drill": "on"}))
    client.post(reverse("job_start"), start(step="start", reference="undrilled"))

    assert Job.objects.get(reference="drilled").pilot.drill is True
    assert Job.objects.get(reference="drilled").pilot.drill_steps.count() == 3
    assert Job.objects.get(reference="undrilled").pilot.drill is False
    assert not Job.objects.get(reference="undrilled").pilot.drill_steps.exists()


def test_without_the_box_ticked_the_job_is_no_pilot(client, owner, products):
    client.force_login(owner)
    client.post(reverse("job_start"), start(step="start", reference="whole", pilot=None))
    job = Job.objects.get(reference="whole")
    assert not Pilot.objects.filter(job=job).exists() and job.items.count() == 10


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"pilot-per_stratum": "0"},
            "Products per stratum: Ensure this value is greater than or equal to 1.",
        ),
        ({"pilot-per_stratum": "some"}, "Products per stratum: Enter a whole number."),
        ({"pilot-strata": "colour"}, "Strata: No product to work on has the field “colour”."),
        ({"pilot-strata": "category, category"}, "Strata: a field is named twice"),
        ({"pilot-seed": "lucky"}, "Seed: Enter a whole number."),
        ({"pilot-seed": ""}, "Seed: This field is required."),
    ],
)
def test_bad_pilot_settings_are_refused_and_start_nothing(client, owner, products, changes, message):
    client.force_login(owner)
    before = ledger_size()

    response = client.post(reverse("job_start"), start(step="start", **changes))

    assert response.status_code == 400
    assert message in response.content.decode().replace("&#x27;", "'").replace("&ldquo;", "“").replace(
        "&rdquo;", "”"
    )
    assert ledger_size() == before


def test_an_operator_sees_the_pilot_option_but_starts_no_pilot(client, operator, products):
    client.force_login(operator)
    assert client.get(reverse("job_start")).status_code == 200
    assert client.post(reverse("job_start"), start(step="start")).status_code == 403
    assert not Job.objects.exists()


# --- the report ----------------------------------------------------------------------------


@pytest.mark.parametrize("roles", [["catalogue_owner"], ["operator"], ["admin"]])
def test_the_report_shows_the_sample_the_measurements_and_the_projection(client, owner, roles):
    job = known_pilot(owner)
    client.force_login(UserFactory(roles=roles))

    response = client.get(reverse("pilot_report", args=[job.pk]))

    assert response.status_code == 200
    page = response.content.decode()
    assert "4 of 12 products drawn (the scope: 12 SKUs named)" in page
    assert "2 per stratum of category" in page and "seed 5" in page
    assert re.search(r'data-testid="projected-first-pass">.*?\$3\.30.*?\$2\.75.*?\$3\.85', page, re.S)
    assert re.search(r'data-testid="projected-reprocessing">.*?\$3\.60.*?\$0\.63.*?\$6\.13', page, re.S)
    assert re.search(r'data-testid="projected-cost".*?\$6\.90.*?\$3\.76.*?\$9\.63', page, re.S)
    assert re.search(r'data-testid="projected-review-hours">.*?0\.27.*?0\.06.*?0\.89', page, re.S)
    # No hourly rate: review is unpriced, and the whole workflow is the pilot's $1.125 and the full job's.
    assert re.search(r'data-testid="review-unpriced">Unpriced: Review is unpriced', page)
    assert re.search(r'data-testid="whole-workflow".*?\$7\.50', page, re.S)
    assert "the pilot's <span" in page and "leaves out the 2 products whose pilot draft was approved" in page
    risk = re.search(r'data-testid="risk">(.*?)</li>', page, re.S).group(1)
    assert "category garden" in risk and "every draft the pilot made for it was unusable" in risk
    assert re.search(r"about 4 of its 4 products\s+\(100 %\) would stay unusable after 3 redrafts", risk)
    assert re.search(r'data-testid="risk-amount">.*?\$4\.80', risk, re.S)
    rows = re.findall(r'data-testid="measured-row">\s*<th scope="row">(.*?)</th>', page)
    assert rows == ["category garden", "category kitchen", "<strong>All</strong>"]
    assert "25 %" in page and "66.7 %" in page  # invalid and accepted in all
    assert "Too long: 1 draft" in page
    assert "Amounts in USD, the provider's currency: no rate to the business currency is in force" in page


def test_the_report_prices_review_at_the_hourly_rate_and_adds_it_to_the_whole_workflow(
    client, owner, settings
):
    """16 decisions × 60 s at £30 an hour: £8; at 0.8 a dollar the pilot's £0.90 and the full job's £5.10."""
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_REVIEW_HOURLY_RATE = "30"
    ExchangeRate.objects.create(
        currency="GBP", valid_from="2020-01-01", per_usd=Decimal("0.8"), source="test"
    )
    job = known_pilot(owner)
    client.force_login(owner)

    page = client.get(reverse("pilot_report", args=[job.pk])).content.decode()

    assert re.search(r'data-testid="projected-review-cost">.*?£8\.00', page, re.S)
    assert 'data-testid="review-unpriced"' not in page
    assert re.search(r'data-testid="whole-workflow".*?£14\.00', page, re.S)
    assert "0.27 hours at" in page and ", plus the review." in page


def test_the_report_says_how_many_decisions_it_still_needs(client, owner, products):
    client.force_login(owner)
    client.post(reverse("job_start"), start(step="start", reference="young-pilot"))
    job = Job.objects.get(reference="young-pilot")

    page = client.get(reverse("pilot_report", args=[job.pk])).content.decode()

    assert re.search(r'data-testid="decisions-needed">.*?5 more decisions.*?\(0 so far\)', page, re.S)
    assert 'data-testid="projected-cost"' not in page
    assert "Named once the pilot's drafts are decided enough to project" in page


def test_a_job_that_is_no_pilot_has_no_report_and_an_outsider_sees_none(client, owner, outsider):
    job = JobFactory(owner=owner)
    client.force_login(owner)
    assert client.get(reverse("pilot_report", args=[job.pk])).status_code == 404
    pilot = known_pilot(owner, reference="other")
    client.force_login(outsider)
    assert client.get(reverse("pilot_report", args=[pilot.pk])).status_code == 403
    client.logout()
    assert client.get(reverse("pilot_report", args=[pilot.pk])).status_code == 302


def test_the_report_is_printable_without_the_navigation(client, owner):
    """Its print style hides the top bar and what only works on screen."""
    from pathlib import Path

    from django.conf import settings

    job = known_pilot(owner)
    client.force_login(owner)
    page = client.get(reverse("pilot_report", args=[job.pk])).content.decode()
    assert 'class="crumbs no-print"' in page
    css = (Path(settings.BASE_DIR) / "static" / "batchdesk.css").read_text()
    print_rules = css[css.index("@media print") :]
    assert ".topbar" in print_rules and ".no-print" in print_rules


def drill_section(page: str) -> str:
    start = page.index('data-testid="drill"')
    return re.sub(r"\s+", " ", page[start : page.index("</section>", start)])


def test_the_report_shows_the_drills_checks_and_steps_and_a_check_that_did_not_hold(client, owner):
    job = known_pilot(owner)
    client.force_login(owner)
    assert "Not asked for." in drill_section(
        client.get(reverse("pilot_report", args=[job.pk])).content.decode()
    )

    Pilot.objects.filter(job=job).update(drill=True)
    plan_drill(Pilot.objects.get(job=job))
    section = drill_section(client.get(reverse("pilot_report", args=[job.pk])).content.decode())

    assert "Under way" in section and section.count(": not yet.") == 3
    # The known pilot's drafts were written by hand, answering no request the ledger sent: the check
    # reads the ledger, so it says so.
    inference = re.search(r'drill-check-no_inference_paid_twice">(.*?)</li>', section).group(1)
    assert (
        "No inference paid twice: <strong>did not hold</strong>. Paid twice: drafts answering no request"
        in inference
    )
    assert "No product published twice: held." in section
