"""A pilot of several arms (issue 19 point 3): one job per arm over the same scope and seed, each
given its share of every stratum's draw (stratified randomisation), and a report that compares cost
per approved draft and acceptance between the arms."""

from collections import Counter

import pytest

from ledger.actions.comparing import record_preference, show_next_pair
from ledger.actions.reviewing import approve_version, reject_version
from ledger.models import Item, Job, Pilot, PilotProduct, Product
from ledger.pilots.sample import PilotPlan, sample_products
from tests.api.conftest import assert_error
from tests.factories import ProductFactory
from tests.pilots import draft, known_pilot

pytestmark = pytest.mark.django_db

BODY = {"reference": "arms", "task": "product_description", "provider": "emulator", "model": "gpt-4o-mini"}


@pytest.fixture
def catalogue():
    for n in range(9):
        ProductFactory(sku=f"K-{n}", revision__fields={"category": "kitchen"})
    for n in range(7):
        ProductFactory(sku=f"G-{n}", revision__fields={"category": "garden"})


def arms_body(*arms, per_stratum=4, seed=11) -> dict:
    return {
        **BODY,
        "pilot": {"per_stratum": per_stratum, "strata": ["category"], "seed": seed, "arms": list(arms)},
    }


def test_each_arm_is_a_job_with_its_share_of_every_stratum_and_no_product_twice(as_owner, catalogue):
    response = as_owner.post_json("/api/jobs", arms_body({"model": "gpt-4o"}, {"model": "gpt-4.1-mini"}))

    assert response.status_code == 202, response.content
    body = response.json()
    assert [arm["reference"] for arm in body["arms"]] == ["arms", "arms-arm-2", "arms-arm-3"]
    assert body["id"] == body["arms"][0]["id"]
    jobs = [Job.objects.get(pk=arm["id"]) for arm in body["arms"]]
    assert [job.model for job in jobs] == ["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"]
    pilots = [Pilot.objects.get(job=job) for job in jobs]
    assert [(p.arm, p.arms, p.first_arm_id) for p in pilots] == [
        (1, 3, None),
        (2, 3, pilots[0].pk),
        (3, 3, pilots[0].pk),
    ]
    drawn = [set(Item.objects.filter(job=job).values_list("product__sku", flat=True)) for job in jobs]
    # No product in two arms, and together the arms are exactly the one sample the seed draws.
    assert sum(len(skus) for skus in drawn) == len(set().union(*drawn))
    plan = PilotPlan(per_stratum=4, strata=("category",), seed=11)
    whole = set(sample_products(plan, Product.objects.all()).values_list("sku", flat=True))
    assert set().union(*drawn) == whole and len(whole) == 8
    # Every arm has a share of every stratum: 4 drawn from each, so 2, 1, 1.
    for pilot, expected in zip(pilots, [2, 1, 1], strict=True):
        per_stratum = Counter(PilotProduct.objects.filter(pilot=pilot).values_list("stratum", flat=True))
        assert sorted(per_stratum.values()) == [expected, expected]


def test_the_same_request_again_is_the_same_arms(as_owner, catalogue):
    body = arms_body({"model": "gpt-4o"})
    assert as_owner.post_json("/api/jobs", body).status_code == 202

    again = as_owner.post_json("/api/jobs", body)

    assert again.status_code == 200
    assert Job.objects.count() == 2
    assert (
        as_owner.post_json("/api/jobs", arms_body({"model": "gpt-4o"}, {"model": "gpt-4.1"})).status_code
        == 409
    )


@pytest.mark.parametrize(
    "arms",
    [
        "gpt-4o",
        [["gpt-4o"]],
        [{"colour": "red"}],
        [{}],
        [{"model": ""}],
        [{"model": 4}],
        [{"prompt_version": "2"}],
        [{"prompt_version": 99}],
        [{"provider": "nowhere"}],
        [{"model": "gpt-4o-mini"}],  # the job's own settings again
        [{"model": "gpt-4o"}, {"model": "gpt-4.1"}, {"model": "gpt-5"}, {"model": "gpt-5-mini"}],
    ],
)
def test_arms_that_cannot_be_run_are_refused_and_nothing_starts(as_owner, catalogue, arms):
    body = {**BODY, "pilot": {"per_stratum": 2, "strata": ["category"], "seed": 1, "arms": arms}}

    assert_error(as_owner.post_json("/api/jobs", body), 400, fields={"pilot.arms"})
    assert not Job.objects.exists()


def test_the_report_compares_cost_per_approved_draft_and_acceptance_between_arms(as_owner, owner, catalogue):
    body = as_owner.post_json("/api/jobs", arms_body({"model": "gpt-4o"}, per_stratum=2)).json()
    first, second = (Job.objects.get(pk=arm["id"]) for arm in body["arms"])
    # Arm 1 (gpt-4o-mini: 0.15 and 0.60 USD per million, half off): two drafts of 1M in and 0.5M out,
    # 0.225 USD each; one approved, one rejected.
    one, two = Item.objects.filter(job=first).order_by("id")
    for item in (one, two):
        draft(item, 1_000_000, 500_000)
    kept = one.versions.get()
    approve_version(item_id=one.pk, version_id=kept.pk, version_hash=kept.content_hash, approver=owner)
    dropped = two.versions.get()
    reject_version(item_id=two.pk, version_id=dropped.pk, reason="vague", reviewer=owner)
    # Arm 2 (gpt-4o: 2.50 and 10.00 USD per million, half off): two drafts of 0.1M in and 0.1M out,
    # 0.625 USD each; both approved.
    for item in Item.objects.filter(job=second):
        version = draft(item, 100_000, 100_000)
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )

    arms = as_owner.get(f"/api/jobs/{second.pk}/pilot").json()["arms"]

    assert [(a["arm"], a["model"], a["items"], a["decisions"], a["approvals"]) for a in arms] == [
        (1, "gpt-4o-mini", 2, 2, 1),
        (2, "gpt-4o", 2, 2, 2),
    ]
    assert [a["acceptance_rate"] for a in arms] == [0.5, 1.0]
    assert [a["cost"] for a in arms] == ["0.450000", "1.250000"]
    assert [a["cost_per_approved_draft"] for a in arms] == ["0.450000", "0.625000"]
    assert {a["currency"] for a in arms} == {"USD"}
    assert as_owner.get(f"/api/jobs/{first.pk}/pilot").json()["arms"] == arms


def test_a_pilot_of_one_arm_compares_nothing(as_owner, owner):
    job = known_pilot(owner)

    report = as_owner.get(f"/api/jobs/{job.pk}/pilot")

    assert report.status_code == 200 and report.json()["arms"] is None


def test_the_report_page_shows_the_arms_side_by_side(as_owner, owner, catalogue, client):
    body = as_owner.post_json("/api/jobs", arms_body({"model": "gpt-4o"}, per_stratum=2)).json()
    first, second = (Job.objects.get(pk=arm["id"]) for arm in body["arms"])
    for job in (first, second):
        for item in Item.objects.filter(job=job):
            version = draft(item, 100_000, 100_000)
            approve_version(
                item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
            )
    client.force_login(owner)

    html = client.get(f"/jobs/{first.pk}/pilot").content.decode()

    assert 'data-testid="arms"' in html
    assert "arms-arm-2" in html and "emulator / gpt-4o<" in html
    assert html.count('data-testid="arm-cost-per-approved"') == 2


def test_arms_of_the_same_sample_each_draft_every_product_drawn(as_owner, catalogue):
    body = arms_body({"model": "gpt-4o"}, per_stratum=4)
    body["pilot"]["same_sample"] = True

    response = as_owner.post_json("/api/jobs", body)

    assert response.status_code == 202, response.content
    jobs = [Job.objects.get(pk=arm["id"]) for arm in response.json()["arms"]]
    drawn = [set(Item.objects.filter(job=job).values_list("product__sku", flat=True)) for job in jobs]
    plan = PilotPlan(per_stratum=4, strata=("category",), seed=11)
    assert (
        drawn[0]
        == drawn[1]
        == set(sample_products(plan, Product.objects.all()).values_list("sku", flat=True))
    )
    assert [Pilot.objects.get(job=job).same_sample for job in jobs] == [True, True]
    # The same request again is the same pilot; the same arms drawing shares instead are another.
    assert as_owner.post_json("/api/jobs", body).status_code == 200
    assert as_owner.post_json("/api/jobs", arms_body({"model": "gpt-4o"}, per_stratum=4)).status_code == 409


@pytest.mark.parametrize(
    ("pilot", "why"),
    [
        ({"per_stratum": 2, "same_sample": True}, "only a pilot of several arms"),
        ({"per_stratum": 2, "same_sample": "yes", "arms": [{"model": "gpt-4o"}]}, "must be true or false"),
    ],
)
def test_a_same_sample_that_means_nothing_is_refused(as_owner, catalogue, pilot, why):
    response = as_owner.post_json("/api/jobs", {**BODY, "pilot": pilot})

    assert_error(response, 400, fields={"pilot.same_sample"})
    assert why in response.json()["error"]["fields"]["pilot.same_sample"]
    assert not Job.objects.exists()


def test_the_report_gives_acceptance_and_blind_preference_with_95_percent_intervals(
    as_owner, owner, catalogue
):
    body = arms_body({"model": "gpt-4o"}, per_stratum=4)
    body["pilot"]["same_sample"] = True
    first, second = (
        Job.objects.get(pk=arm["id"]) for arm in as_owner.post_json("/api/jobs", body).json()["arms"]
    )
    # Arm 1 has 6 of its 8 drafts approved, arm 2 3 of 8.
    for job, approved in ((first, 6), (second, 3)):
        for n, item in enumerate(Item.objects.filter(job=job).order_by("product__sku")):
            version = draft(item, 1_000, 500)
            if n < approved:
                approve_version(
                    item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
                )
            else:
                reject_version(item_id=item.pk, version_id=version.pk, reason="vague", reviewer=owner)
    # One reviewer compares the 8 products blind: arm 1's draft preferred 5 times, arm 2's once, both
    # once, neither once.
    group = Pilot.objects.get(job=first)
    answers = ["a"] * 5 + ["b", "both", "neither"]
    while shown := show_next_pair(first=group, reviewer=owner):
        wanted = answers.pop()
        side = (
            wanted
            if wanted in ("both", "neither")
            else "left"
            if (wanted == "a") == shown.a_on_left
            else "right"
        )
        record_preference(first=group, comparison_id=shown.pk, reviewer=owner, side=side)

    report = as_owner.get(f"/api/jobs/{second.pk}/pilot").json()

    assert (report["pilot"]["arms"], report["pilot"]["same_sample"]) == (2, True)
    arms = report["arms"]
    # Wilson's 95 % interval of 6/8 is 0.4093 to 0.9285; of 3/8, 0.1368 to 0.6943.
    assert [a["acceptance"] for a in arms] == [
        {"rate": 0.75, "low": 0.4093, "high": 0.9285, "successes": 6, "trials": 8},
        {"rate": 0.375, "low": 0.1368, "high": 0.6943, "successes": 3, "trials": 8},
    ]
    # Preferred (alone or as one of both): arm 1 in 6 of 8 comparisons, arm 2 in 2 of 8.
    assert [a["preference"] for a in arms] == [
        {"rate": 0.75, "low": 0.4093, "high": 0.9285, "successes": 6, "trials": 8},
        {"rate": 0.25, "low": 0.0715, "high": 0.5907, "successes": 2, "trials": 8},
    ]
    assert report["arm_pairs"] == [
        {
            "arms": [1, 2],
            # Newcombe's interval of 0.375 spans 0: not yet told apart. At 0.75 and 0.375, 27 decisions an
            # arm would (Fleiss, 5 % two-sided, 80 % power): 19 more each.
            "acceptance": {
                "difference": 0.375,
                "low": -0.0919,
                "high": 0.6726,
                "distinguishable": False,
                "more_decisions_needed": 38,
            },
            # 5 of the 6 comparisons that preferred one draft only: 0.8333, Wilson 0.4365 to 0.9699, spans
            # 1/2. The score test needs 16 such comparisons at 5/6; 6 of 8 were, so 22 in all: 14 more.
            "preference": {
                "comparisons": 8,
                "a": 5,
                "b": 1,
                "both": 1,
                "neither": 1,
                "a_share_of_one_preferred": {"rate": 0.8333, "low": 0.4365, "high": 0.9699},
                "distinguishable": False,
                "more_comparisons_needed": 14,
            },
        }
    ]
    assert as_owner.get(f"/api/jobs/{first.pk}/pilot").json()["arm_pairs"] == report["arm_pairs"]
