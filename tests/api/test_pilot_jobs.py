"""`POST /api/jobs` with `pilot` (SPEC §6, issue 19 point 1): a job over a stratified sample, its
settings checked like every other field, and part of what a repeated request is compared on."""

import pytest

from ledger.models import DrillKind, DrillStep, Event, Item, Job, Pilot, PilotProduct, PilotStratum
from tests.api.conftest import assert_error
from tests.factories import ProductFactory

pytestmark = pytest.mark.django_db

BODY = {"reference": "pilot-2026", "task": "product_description", "provider": "emulator"}
PILOT = {"per_stratum": 2, "strata": ["category"], "seed": 11, "drill": False}


@pytest.fixture
def catalogue():
    for category, count in {"kitchen": 5, "garden": 3, "bath": 1}.items():
        for n in range(count):
            ProductFactory(sku=f"{category}-{n}", revision__fields={"category": category})


def snapshot() -> tuple[int, ...]:
    return tuple(model.objects.count() for model in (Job, Item, Event, Pilot, PilotStratum, PilotProduct))


def test_a_pilot_is_a_job_over_its_sample(as_owner, catalogue):
    response = as_owner.post_json("/api/jobs", {**BODY, "pilot": PILOT})

    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["id"])
    pilot = job.pilot
    assert (pilot.per_stratum, pilot.strata, pilot.seed, pilot.drill, pilot.scope_skus) == (
        2,
        ["category"],
        11,
        False,
        None,
    )
    assert [(s.label, s.scope_products, s.sample_products) for s in pilot.strata_drawn.all()] == [
        ("category bath", 1, 1),
        ("category garden", 3, 2),
        ("category kitchen", 5, 2),
    ]
    assert job.items.count() == 5
    assert set(job.items.values_list("product_id", flat=True)) == set(
        PilotProduct.objects.filter(pilot=pilot).values_list("product_id", flat=True)
    )


def test_a_pilot_asked_to_drill_plans_its_acceptance_drill_and_no_other_job_does(as_owner, catalogue):
    drilled = as_owner.post_json("/api/jobs", {**BODY, "pilot": {**PILOT, "drill": True}})
    plain = as_owner.post_json("/api/jobs", {**BODY, "reference": "plain", "pilot": PILOT})

    assert drilled.status_code == 202, drilled.content
    assert as_owner.get(f"/api/jobs/{drilled.json()['id']}").json()["pilot"]["drill"] is True
    steps = DrillStep.objects.filter(pilot__job_id=drilled.json()["id"])
    assert sorted(steps.values_list("kind", flat=True)) == sorted(DrillKind.values)
    # Planned only: each step takes its unit or item when the pilot's run reaches it.
    assert (
        not steps.filter(submission__isnull=False).exists() and not steps.filter(item__isnull=False).exists()
    )
    assert not DrillStep.objects.filter(pilot__job_id=plain.json()["id"]).exists()


def test_a_job_says_whether_it_is_a_pilot_and_where_its_report_is(as_owner, catalogue):
    pilot = as_owner.post_json("/api/jobs", {**BODY, "pilot": PILOT}).json()
    plain = as_owner.post_json("/api/jobs", {**BODY, "reference": "plain"}).json()

    assert as_owner.get(f"/api/jobs/{pilot['id']}").json()["pilot"] == {
        **PILOT,
        "report_url": f"http://testserver/api/jobs/{pilot['id']}/pilot",
    }
    assert as_owner.get(f"/api/jobs/{plain['id']}").json()["pilot"] is None
    listed = {job["id"]: job["pilot"] for job in as_owner.get("/api/jobs").json()["results"]}
    assert listed[plain["id"]] is None and listed[pilot["id"]]["seed"] == 11


def test_the_same_request_again_is_the_same_pilot_and_another_pilot_is_409(as_owner, catalogue):
    first = as_owner.post_json("/api/jobs", {**BODY, "pilot": PILOT})
    before = snapshot()

    again = as_owner.post_json("/api/jobs", {**BODY, "pilot": PILOT})
    assert again.status_code == 200 and again.json() == first.json()
    for other in (
        {**PILOT, "per_stratum": 3},
        {**PILOT, "seed": 12},
        {**PILOT, "strata": ["source_length"]},
        {**PILOT, "drill": True},
    ):
        error = assert_error(
            as_owner.post_json("/api/jobs", {**BODY, "pilot": other}), 409, "reference_in_use"
        )
        assert "pilot" in error["message"]
    error = assert_error(as_owner.post_json("/api/jobs", BODY), 409, "reference_in_use")
    assert "pilot" in error["message"]
    assert snapshot() == before


def test_an_ordinary_job_asked_again_as_a_pilot_is_409(as_owner, catalogue):
    as_owner.post_json("/api/jobs", BODY)
    assert_error(as_owner.post_json("/api/jobs", {**BODY, "pilot": PILOT}), 409, "reference_in_use")


def test_a_pilot_without_seed_or_strata_takes_a_new_seed_and_the_default_strata(as_owner, catalogue):
    body = {**BODY, "pilot": {"per_stratum": 1}}
    assert as_owner.post_json("/api/jobs", body).status_code == 202
    pilot = Pilot.objects.get()
    assert pilot.strata == ["category", "source_length"]
    assert isinstance(pilot.seed, int)
    # Repeated without a seed, it is the same pilot: the seed drawn is not what the request differs in.
    assert as_owner.post_json("/api/jobs", body).status_code == 200
    assert (
        as_owner.post_json("/api/jobs", {**BODY, "pilot": {"per_stratum": 1, "seed": pilot.seed}}).status_code
        == 200
    )


def test_a_pilot_over_named_skus_is_compared_on_its_scope_not_its_sample(as_owner, catalogue):
    skus = ["kitchen-0", "kitchen-1", "kitchen-2", "garden-0"]
    body = {**BODY, "skus": skus, "pilot": {**PILOT, "per_stratum": 1}}
    assert as_owner.post_json("/api/jobs", body).status_code == 202
    assert Job.objects.get().items.count() == 2
    assert Pilot.objects.get().scope_skus == sorted(skus)

    assert as_owner.post_json("/api/jobs", {**body, "skus": list(reversed(skus))}).status_code == 200
    assert_error(as_owner.post_json("/api/jobs", {**body, "skus": skus[:3]}), 409, "reference_in_use")


@pytest.mark.parametrize(
    ("pilot", "fields"),
    [
        ({**PILOT, "per_stratum": 0}, {"pilot.per_stratum"}),
        ({**PILOT, "per_stratum": "five"}, {"pilot.per_stratum"}),
        ({**PILOT, "per_stratum": "5"}, {"pilot.per_stratum"}),
        ({**PILOT, "per_stratum": True}, {"pilot.per_stratum"}),
        ({**PILOT, "per_stratum": 2.5}, {"pilot.per_stratum"}),
        ({**PILOT, "per_stratum": 1_001}, {"pilot.per_stratum"}),
        ({"strata": ["category"], "seed": 1}, {"pilot.per_stratum"}),
        ({**PILOT, "strata": "category"}, {"pilot.strata"}),
        ({**PILOT, "strata": [1, 2]}, {"pilot.strata"}),
        ({**PILOT, "strata": ["colour"]}, {"pilot.strata"}),
        ({**PILOT, "strata": ["category", "category"]}, {"pilot.strata"}),
        ({**PILOT, "strata": ["category", " "]}, {"pilot.strata"}),
        ({**PILOT, "strata": ["a", "b", "c", "d"]}, {"pilot.strata"}),
        ({**PILOT, "seed": "11"}, {"pilot.seed"}),
        ({**PILOT, "seed": 1.5}, {"pilot.seed"}),
        ({**PILOT, "seed": False}, {"pilot.seed"}),
        ({**PILOT, "seed": 2**63}, {"pilot.seed"}),
        ({**PILOT, "drill": "yes"}, {"pilot.drill"}),
        ({**PILOT, "drill": 1}, {"pilot.drill"}),
        ({**PILOT, "arms": [{"colour": "red"}]}, {"pilot.arms"}),  # arms: tests/api/test_pilot_arms.py
        ({"per_stratum": "x", "seed": "y"}, {"pilot.per_stratum", "pilot.seed"}),
        ([PILOT], {"pilot"}),
        ("category", {"pilot"}),
        (7, {"pilot"}),
    ],
)
def test_bad_pilot_settings_are_400_naming_each_field_and_create_nothing(as_owner, catalogue, pilot, fields):
    before = snapshot()
    response = as_owner.post_json("/api/jobs", {**BODY, "pilot": pilot})
    assert_error(response, 400, "invalid", fields)
    assert snapshot() == before


def test_a_sample_too_large_for_a_pilot_is_400(as_owner, catalogue, monkeypatch):
    from ledger.pilots import sample

    monkeypatch.setattr(sample, "MAX_SAMPLE", 4)
    before = snapshot()
    error = assert_error(
        as_owner.post_json("/api/jobs", {**BODY, "pilot": PILOT}), 400, "invalid", {"pilot.per_stratum"}
    )
    assert "would draw 5 products; at most 4" in error["fields"]["pilot.per_stratum"]
    assert snapshot() == before


def test_a_field_only_products_outside_the_skus_have_is_unknown_there(as_owner, catalogue):
    ProductFactory(sku="lamp-0", revision__fields={"category": "light", "wattage": "40"})
    body = {**BODY, "skus": ["kitchen-0"], "pilot": {**PILOT, "strata": ["wattage"]}}
    error = assert_error(as_owner.post_json("/api/jobs", body), 400, "invalid", {"pilot.strata"})
    assert "wattage" in error["fields"]["pilot.strata"]


def test_a_pilot_with_other_bad_fields_names_them_all(as_owner, catalogue):
    body = {**BODY, "unit_size": "big", "pilot": {**PILOT, "per_stratum": 0}}
    assert_error(as_owner.post_json("/api/jobs", body), 400, "invalid", {"unit_size", "pilot.per_stratum"})


@pytest.mark.parametrize("client", ["as_operator", "as_outsider"])
def test_only_catalogue_owners_and_admins_start_a_pilot(request, catalogue, client):
    before = snapshot()
    assert_error(
        request.getfixturevalue(client).post_json("/api/jobs", {**BODY, "pilot": PILOT}), 403, "forbidden"
    )
    assert snapshot() == before


def test_an_admin_starts_a_pilot(api_as, admin_person, catalogue):
    assert api_as(admin_person).post_json("/api/jobs", {**BODY, "pilot": PILOT}).status_code == 202


def test_without_a_token_it_is_401(client, catalogue):
    response = client.post("/api/jobs", {**BODY, "pilot": PILOT}, content_type="application/json")
    assert_error(response, 401, "unauthenticated")
    assert not Job.objects.exists()
