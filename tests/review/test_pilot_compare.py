"""The blind comparison of two arms' drafts (issue 30 point 5, SPEC §8): the page never says which arm
wrote which draft, and both orders occur; an answer is recorded once, however often the form is sent;
operators see but do not decide; the arms report counts the answers with their intervals."""

import re
from collections import Counter

import pytest
from django.urls import reverse

from ledger.actions.comparing import record_preference, show_next_pair
from ledger.actions.jobs import Arm, create_pilot_arms
from ledger.models import ArmPreference, Pilot, Preference
from ledger.pilots.sample import PilotPlan
from tests.factories import ProductFactory, UserFactory
from tests.pilots import ARM_WORDING, known_pilot, same_sample_arms

pytestmark = pytest.mark.django_db


def compare_url(job) -> str:
    return reverse("pilot_compare", args=[job.pk])


def shown_side(html: str, sku: str) -> str:
    """Which side arm 1's draft of `sku` is on, read from the page as a reviewer sees it."""
    left = html.split('data-testid="draft-left"', 1)[1].split('data-testid="draft-right"', 1)[0]
    return "left" if f"A sturdy oak board for {sku}" in left else "right"


def answer_url(html: str) -> str:
    return re.search(r'<form method="post" action="([^"]+)"', html).group(1)


def test_the_page_never_says_which_arm_wrote_which_and_both_orders_occur(client):
    jobs = same_sample_arms(UserFactory(roles=["catalogue_owner"]), products=6)
    secrets_of_the_arms = [
        "zebra-pilot",  # the references: zebra-pilot and zebra-pilot-arm-2
        "gpt-4o-mini",
        "gpt-4.1-mini",
        "emulator",
        "prompt version",
        "prompt_version",
        ">v1<",
        "arm 1",
        "arm 2",
        "arm-1",
        "arm-2",
        "arm_a",
        "arm_b",
        "/items/",
    ]
    sides = Counter()
    # Five reviewers each compare all six products: thirty showings, each drawn at random.
    for _ in range(5):
        client.force_login(UserFactory(roles=["catalogue_owner"]))
        for _ in range(6):
            page = client.get(compare_url(jobs[1]))
            html = page.content.decode()
            assert page.status_code == 200
            for secret in secrets_of_the_arms:
                assert secret not in html.lower(), secret
            sku = re.search(r"<h2>(board-\d\d)</h2>", html).group(1)
            sides[shown_side(html, sku)] += 1
            # The drafts are text, never markup.
            assert "&lt;b&gt;and&lt;/b&gt;" in html and "<b>and</b>" not in html
            assert client.post(answer_url(html), {"side": "both"}).status_code == 302
        assert 'data-testid="compare-done"' in client.get(compare_url(jobs[0])).content.decode()
    # Arm 1 was on each side (the chance of 30 alike is 2 in a billion).
    assert sides["left"] > 0 and sides["right"] > 0
    assert ArmPreference.objects.exclude(preference="").count() == 30


def test_the_answer_maps_back_to_the_arm_on_that_side(client, owner):
    jobs = same_sample_arms(owner, products=2)
    client.force_login(owner)
    html = client.get(compare_url(jobs[0])).content.decode()
    sku = re.search(r"<h2>(board-\d\d)</h2>", html).group(1)
    arm_1_side = shown_side(html, sku)

    client.post(answer_url(html), {"side": arm_1_side})

    recorded = ArmPreference.objects.get(product__sku=sku)
    assert (recorded.arm_a, recorded.arm_b, recorded.preference) == (1, 2, Preference.A)
    assert recorded.reviewer == owner and recorded.decided_at is not None
    assert recorded.a_on_left == (arm_1_side == "left")
    assert recorded.version_a.content == ARM_WORDING[1].format(sku=sku)


def test_a_form_sent_twice_records_once(client, owner):
    jobs = same_sample_arms(owner, products=2)
    client.force_login(owner)
    html = client.get(compare_url(jobs[0])).content.decode()
    address = answer_url(html)

    first = client.post(address, {"side": "left"}, follow=True)
    # Back, and the same form again, with the other answer: nothing changes, and the page says so.
    again = client.post(address, {"side": "right"}, follow=True)
    htmx_again = client.post(address, {"side": "neither"}, headers={"HX-Request": "true"})

    assert "Recorded: you preferred the left draft." in first.content.decode()
    assert "compared already: nothing more was recorded" in again.content.decode()
    assert "compared already: nothing more was recorded" in htmx_again.content.decode()
    recorded = ArmPreference.objects.exclude(preference="")
    assert recorded.count() == 1
    one = recorded.get()
    assert one.preference == (Preference.A if one.a_on_left else Preference.B)


def test_one_comparison_per_reviewer_per_product_and_pair_of_arms(owner):
    jobs = same_sample_arms(owner, products=2)
    first = Pilot.objects.get(job=jobs[0])
    reviewer = UserFactory(roles=["catalogue_owner"])

    shown = show_next_pair(first=first, reviewer=reviewer)
    # Shown again (a refresh, a second tab) before it is answered: the same pair, the same sides.
    assert show_next_pair(first=first, reviewer=reviewer) == shown
    record_preference(first=first, comparison_id=shown.pk, reviewer=reviewer, side="neither")
    second = show_next_pair(first=first, reviewer=reviewer)
    record_preference(first=first, comparison_id=second.pk, reviewer=reviewer, side="left")

    assert second.product != shown.product
    assert show_next_pair(first=first, reviewer=reviewer) is None
    # Another reviewer compares the same products afresh.
    assert show_next_pair(first=first, reviewer=owner).product == shown.product
    with pytest.raises(ArmPreference.DoesNotExist):
        record_preference(first=first, comparison_id=shown.pk, reviewer=owner, side="left")


def test_a_side_that_is_none_of_the_four_is_refused_and_records_nothing(client, owner):
    jobs = same_sample_arms(owner, products=2)
    client.force_login(owner)
    address = answer_url(client.get(compare_url(jobs[0])).content.decode())

    refused = client.post(address, {"side": "arm-1"})

    assert refused.status_code == 400
    assert "Nothing was recorded" in refused.content.decode()
    assert not ArmPreference.objects.exclude(preference="").exists()


def test_operators_see_the_page_but_cannot_decide(client, owner, operator):
    jobs = same_sample_arms(owner, products=2)
    client.force_login(owner)
    address = answer_url(client.get(compare_url(jobs[0])).content.decode())
    client.force_login(operator)

    page = client.get(compare_url(jobs[0])).content.decode()

    assert 'data-testid="compare-not-yours"' in page and '<form method="post" action="/jobs' not in page
    assert client.post(address, {"side": "left"}).status_code == 403
    assert not ArmPreference.objects.exclude(preference="").exists()
    # Nothing was shown to the operator, so nothing waits for their answer either.
    assert not ArmPreference.objects.filter(reviewer=operator).exists()


def test_someone_elses_comparison_is_not_found(client, owner, admin_person):
    jobs = same_sample_arms(owner, products=2)
    client.force_login(owner)
    address = answer_url(client.get(compare_url(jobs[0])).content.decode())
    client.force_login(admin_person)

    assert client.post(address, {"side": "left"}).status_code == 404
    assert not ArmPreference.objects.exclude(preference="").exists()


def test_a_pilot_of_one_arm_has_nothing_to_compare(client, owner):
    job = known_pilot(owner)
    client.force_login(owner)

    assert client.get(compare_url(job)).status_code == 404


def test_arms_that_drafted_different_products_say_why_nothing_can_be_compared(client, owner):
    for n in range(4):
        ProductFactory(sku=f"K-{n}", revision__fields={"category": "kitchen"})
    job, _ = create_pilot_arms(
        reference="apart",
        pilot=PilotPlan(per_stratum=4, strata=("category",), seed=3),
        arms=[Arm(model="gpt-4o")],
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
    )
    client.force_login(owner)

    page = client.get(compare_url(job)).content.decode()

    assert 'data-testid="compare-impossible"' in page
    report = client.get(reverse("pilot_report", args=[job.pk])).content.decode()
    assert 'data-testid="compare-link"' not in report
    assert not ArmPreference.objects.exists()


def test_the_report_screen_counts_the_answers_and_links_to_the_comparison(client, owner):
    jobs = same_sample_arms(owner, products=6)
    first = Pilot.objects.get(job=jobs[0])
    # Four reviewers compare the six products: arm 1 preferred 14 times, arm 2 4, both 3, neither 3.
    answers = ["a"] * 14 + ["b"] * 4 + ["both"] * 3 + ["neither"] * 3
    for _ in range(4):
        reviewer = UserFactory(roles=["catalogue_owner"])
        while shown := show_next_pair(first=first, reviewer=reviewer):
            wanted = answers.pop()
            side = (
                wanted
                if wanted in ("both", "neither")
                else ("left" if (wanted == "a") == shown.a_on_left else "right")
            )
            record_preference(first=first, comparison_id=shown.pk, reviewer=reviewer, side=side)
    client.force_login(owner)

    html = client.get(reverse("pilot_report", args=[jobs[1].pk])).content.decode()

    assert 'data-testid="compare-link"' in html
    assert "Blind comparisons: 24: arm 1 preferred 14, arm 2 4, both 3, neither 3." in html
    # 14 of the 18 that preferred one draft only: 77.8 %, Wilson's 95 % interval 54.8 % to 91 %.
    assert 'arm 1\'s share: 77.8 % <span class="meta">(95 %: 54.8 %–91 %)</span>' in html
    assert "<strong>distinguishable from chance</strong>: arm 1's drafts are preferred" in html
