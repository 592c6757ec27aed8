"""Budgets that hold (rule 18): a unit's worst case is reserved before it is sent, a unit that could
pass the budget is not sent (the job pauses), returned usage settles the reservation, a billing
refusal pauses the job, and two clusters sending at once never pass the budget together."""

import json
import math
import threading
from decimal import Decimal

import httpx
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.actions.budgeting import BudgetReached, next_request_need, reserve, resume_when_it_fits
from ledger.actions.collecting import poll_submission
from ledger.actions.core import NotAllowed
from ledger.actions.job_states import refresh_job_state
from ledger.actions.jobs import resume_job, set_budget
from ledger.actions.reactions import settle
from ledger.actions.redrafting import redraft_cut_off
from ledger.actions.requests import MEASURED_OUTPUT_MARGIN, MEASURED_OUTPUT_SPARE_TOKENS, build_requests
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.models import (
    Event,
    GeneratedVersion,
    Item,
    Job,
    PauseReason,
    PromptVersion,
    Submission,
    SubmissionItem,
    UnitCharge,
)
from ledger.money import budgets
from ledger.money.pricing import job_cost, price_for
from ledger.states import ItemState, JobState, ReasonCode, SubmissionState
from ledger.tasks import claim_due_submissions, poll_everything, resume_if_it_fits
from tests.factories import JobFactory, ProductFactory, add_version
from tests.provider_emulators import BY_NAME, ONE_PER_PROTOCOL, serving

pytestmark = pytest.mark.django_db

RATE = Decimal("0.7890")
# Units are held at the rate and a margin for its rise before they settle.
HELD_AT = RATE * (1 + budgets.RATE_RISE_MARGIN)


@pytest.fixture
def pounds(settings, tmp_path):
    """A deployment in pounds, with a rate file as SPEC §9 shows it."""
    rates = tmp_path / "rates.json"
    rates.write_text(
        json.dumps({"source": "Bank of England daily spot, 4 pm", "per_usd": {"2020-01-01": str(RATE)}})
    )
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_FX_FILE = str(rates)
    # Dear tokens, so that one small unit's worst case is pounds, not fractions of a penny.
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "openai": {
                    "models": {"gpt-4o-mini": {"input_per_million": "1000", "output_per_million": "4000"}}
                }
            }
        )
    )
    settings.BATCHDESK_PRICE_FILE = str(prices)
    return rates


def job_with_items(n: int, *, unit_size: int, budget: Decimal | None, **fields) -> Job:
    job = JobFactory(unit_size=unit_size, budget=budget, budget_currency="GBP" if budget else "", **fields)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def unit_worst_case_pounds(submission_id: int) -> Decimal:
    """Computed here from the requests as sent: one token per byte of the messages and the schema,
    16 tokens of overhead, and `max_tokens` out, at the price file's batch price, in pounds at the
    rate held at."""
    submission = Submission.objects.get(pk=submission_id)
    requests = build_requests(submission)
    tokens_in = sum(
        16
        + len(r.system_message.encode())
        + len(r.user_message.encode())
        + len(json.dumps(r.output_schema, ensure_ascii=False).encode())
        for r in requests
    )
    tokens_out = sum(r.max_output_tokens for r in requests)
    usd = (Decimal(tokens_in) * 1000 + Decimal(tokens_out) * 4000) / 1_000_000 / 2
    return usd.quantize(Decimal("0.000001")) * HELD_AT


def collect(clock, submission_id, provider):
    for _ in range(200):
        poll_submission(submission_id, provider=provider)
        if Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED:
            return
        clock.advance(ms=50)
    raise AssertionError("never collected")


def test_a_unit_is_reserved_at_its_worst_case_before_it_is_sent(pounds, emulator, provider):
    job = job_with_items(3, unit_size=3, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    expected = unit_worst_case_pounds(unit)

    assert send_submission(unit, provider=provider) == "sent"

    charge = UnitCharge.objects.get(submission_id=unit)
    assert charge.requests == 3
    assert charge.currency == "GBP"
    assert charge.reserved == expected.quantize(Decimal("0.000001"))
    assert charge.settled_at is None
    assert budgets.committed(job.pk) == charge.reserved


def test_a_unit_that_could_pass_the_budget_is_not_sent_and_the_job_pauses(pounds, emulator, provider):
    job = job_with_items(4, unit_size=2, budget=Decimal("100.00"))
    first, second = plan_submissions(job.pk)
    worst = unit_worst_case_pounds(first)
    # Room for one unit's worst case, not two.
    Job.objects.filter(pk=job.pk).update(budget=(worst * 3 / 2).quantize(Decimal("0.01")))

    assert send_submission(first, provider=provider) == "sent"
    assert send_submission(second, provider=provider) == "paused"

    job.refresh_from_db()
    assert job.state == JobState.PAUSED
    assert job.pause_reason == PauseReason.BUDGET_REACHED
    assert "Raise it by at least" in job.pause_detail
    assert emulator.stats()["batches"] == 1
    assert Submission.objects.get(pk=second).state == SubmissionState.INTENT
    assert not UnitCharge.objects.filter(submission_id=second).exists()
    assert set(Item.objects.filter(submission_id=second).values_list("state", flat=True)) == {
        ItemState.PREPARED
    }
    # Nothing new goes out while paused, however often a pass asks.
    Submission.objects.filter(pk=second).update(claimed_until=None)
    assert send_submission(second, provider=provider) == "paused"
    assert emulator.stats()["batches"] == 1
    # The job stays paused while its results come in (the state is not derived away).
    refresh_job_state(job.pk)
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED


def test_raising_the_budget_resumes_the_job(pounds, emulator, provider, owner):
    job = job_with_items(4, unit_size=2, budget=Decimal("100.00"), owner=owner)
    first, second = plan_submissions(job.pk)
    worst = unit_worst_case_pounds(first)
    Job.objects.filter(pk=job.pk).update(budget=(worst * 3 / 2).quantize(Decimal("0.01")))
    send_submission(first, provider=provider)
    send_submission(second, provider=provider)
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED

    with pytest.raises(NotAllowed):
        set_budget(job.pk, Decimal("0.01"), actor=owner)  # below what it holds already
    set_budget(job.pk, (worst * 3).quantize(Decimal("0.01")), actor=owner)

    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.pause_reason == ""
    assert Submission.objects.get(pk=second).claimed_until is None  # the next pass sends it
    assert send_submission(second, provider=provider) == "sent"
    assert emulator.stats()["batches"] == 2


def test_returned_usage_settles_the_reservation_and_keeps_its_rate(pounds, clock, emulator, provider):
    job = job_with_items(3, unit_size=3, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    send_submission(unit, provider=provider)
    collect(clock, unit, provider)

    charge = UnitCharge.objects.get(submission_id=unit)
    versions = GeneratedVersion.objects.filter(submission_id=unit)
    tokens_in = sum(v.input_tokens for v in versions)
    tokens_out = sum(v.output_tokens for v in versions)
    assert versions.count() == 3 and tokens_in > 0
    usd = price_for("emulator", "gpt-4o-mini").cost(tokens_in, tokens_out).quantize(Decimal("0.000001"))
    assert (charge.input_tokens, charge.output_tokens) == (tokens_in, tokens_out)
    assert charge.cost_usd == usd
    assert charge.cost == (usd * RATE).quantize(Decimal("0.000001"))
    assert (charge.rate, str(charge.rate_date), charge.rate_source) == (
        RATE,
        "2020-01-01",
        "Bank of England daily spot, 4 pm",
    )
    assert charge.cost < charge.reserved  # the worst case is a ceiling
    assert budgets.committed(job.pk) == charge.cost

    # A new rate changes nothing already spent, nor the job's cost shown.
    pounds.write_text(json.dumps({"source": "another bank", "per_usd": {"2020-01-01": "2.0000"}}))
    shown = job_cost(job)
    assert shown["currency"] == "GBP"
    assert shown["total"] == (shown["provider_currency"]["total"] * RATE).quantize(Decimal("0.000001"))
    assert UnitCharge.objects.get(pk=charge.pk).cost == charge.cost


@pytest.mark.postgresql_only  # several clusters share a PostgreSQL database; SQLite is the demo's
@pytest.mark.django_db(transaction=True)
def test_two_clusters_sending_at_once_never_pass_the_budget(pounds, emulator, provider):
    job = job_with_items(4, unit_size=2, budget=Decimal("100.00"))
    units = plan_submissions(job.pk)
    worst = unit_worst_case_pounds(units[0])
    Job.objects.filter(pk=job.pk).update(budget=(worst * 3 / 2).quantize(Decimal("0.01")))
    start = threading.Barrier(2)
    outcomes = {}

    def send(unit):
        try:
            start.wait()
            outcomes[unit] = send_submission(unit, provider=provider)
        finally:
            connection.close()

    senders = [threading.Thread(target=send, args=(unit,)) for unit in units]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()

    assert sorted(outcomes.values()) == ["paused", "sent"]
    assert emulator.stats()["batches"] == 1
    assert budgets.committed(job.pk) <= Job.objects.get(pk=job.pk).budget


@pytest.mark.parametrize("name", [p.name for p in ONE_PER_PROTOCOL if p.name != "openai_compatible"])
def test_a_billing_refusal_pauses_the_job_instead_of_failing_its_items(settings, monkeypatch, name):
    provider = BY_NAME[name]
    with serving(provider, settings, monkeypatch, billing_refusals=1) as emulator:
        job = job_with_items(3, unit_size=3, budget=None, provider=provider.name, model=provider.model)
        [unit] = plan_submissions(job.pk)

        assert send_submission(unit) == "paused"

        job.refresh_from_db()
        assert job.state == JobState.PAUSED
        assert job.pause_reason == PauseReason.BILLING_REFUSED
        assert set(job.items.values_list("state", flat=True)) == {ItemState.PREPARED}
        submission = Submission.objects.get(pk=unit)
        assert (submission.state, submission.sent_at, submission.claimed_until) == (
            SubmissionState.INTENT,
            None,
            None,
        )
        assert emulator.stats()["creates"] == 1  # asked once, refused
        # Not retried while paused: the pass leaves a paused job's units alone.
        assert unit not in [pk for pk, _ in claim_due_submissions(timezone.now())[1]]

        resume_job(job.pk, actor=job.owner)
        assert send_submission(unit) == "sent"
        assert emulator.stats()["creates"] == 2
        assert Submission.objects.get(pk=unit).state == SubmissionState.OPEN


def test_a_job_cancelled_after_its_unit_was_planned_stays_cancelled_and_holds_nothing(pounds):
    # A budget no unit fits: before the one job-state path, this pause brought a cancelled job back.
    job = job_with_items(2, unit_size=2, budget=Decimal("0.01"))
    [unit] = plan_submissions(job.pk)
    submission = Submission.objects.get(pk=unit)
    requests = build_requests(submission)
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)  # cancelled between planning and sending

    with pytest.raises(BudgetReached, match="The job was cancelled"):
        reserve(submission, requests)

    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert not UnitCharge.objects.filter(submission_id=unit).exists()
    assert not Event.objects.filter(job_id=job.pk, to_state=JobState.PAUSED).exists()


# --- budgets that flow (issue 27 point 5) --------------------------------------------------------


def sent_max_tokens(emulator, submission_id: int) -> list[int]:
    """The `max_completion_tokens` of each request the emulator received in the unit, read back over
    its own HTTP API (the batch's input file)."""
    ref = Submission.objects.get(pk=submission_id).provider_ref
    with httpx.Client(base_url=emulator.base_url, headers={"Authorization": "Bearer k"}) as client:
        batch = client.get(f"/batches/{ref}").json()
        lines = client.get(f"/files/{batch['input_file_id']}/content").text.splitlines()
    return [json.loads(line)["body"]["max_completion_tokens"] for line in lines if line.strip()]


def measured(job: Job, *output_tokens: int) -> None:
    """Drafts of `job` that produced these output tokens, in a unit settled as `budgets.settle` keeps
    it: its longest answer on its charge."""
    unit = Submission.objects.create(
        job=job,
        provider=job.provider,
        model=job.model,
        intent_key=f"bd_measured_{job.pk}_{len(output_tokens)}",
    )
    for tokens in output_tokens:
        product = ProductFactory()
        item = Item.objects.create(job=job, product=product, source_revision=product.current_revision)
        GeneratedVersion.objects.filter(pk=add_version(item).pk).update(output_tokens=tokens, submission=unit)
    UnitCharge.objects.create(
        job=job,
        submission=unit,
        currency="GBP",
        reserved_usd=Decimal(0),
        output_tokens=sum(output_tokens),
        largest_output=max(output_tokens),
        settled_at=timezone.now(),
    )


def test_a_budgeted_job_sends_max_tokens_lowered_to_the_largest_output_measured(pounds, emulator, provider):
    # A pilot of the same prompt version, provider and model measured answers of 60 and 100 tokens.
    pilot = JobFactory()
    measured(pilot, 60, 100)
    measured(JobFactory(model="gpt-4o"), 500)  # another model's answers say nothing of this one's
    job = job_with_items(3, unit_size=3, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    lowered = math.ceil(100 * MEASURED_OUTPUT_MARGIN) + MEASURED_OUTPUT_SPARE_TOKENS
    assert lowered == 141 < job.prompt_version.max_output_tokens == 600
    assert budgets.worst_case(build_requests(Submission.objects.get(pk=unit))).output_tokens == 3 * lowered
    expected = unit_worst_case_pounds(unit)

    assert send_submission(unit, provider=provider) == "sent"

    assert sent_max_tokens(emulator, unit) == [lowered] * 3
    # The hold is the worst case of the requests as sent: at the lowered max_tokens.
    assert UnitCharge.objects.get(submission_id=unit).reserved == expected.quantize(Decimal("0.000001"))


def test_a_lowered_max_tokens_is_never_above_the_prompt_versions_own(pounds, emulator, provider):
    measured(JobFactory(), 590)  # 590 × 1.25 + 16 = 754 would pass the prompt's 600
    job = job_with_items(2, unit_size=2, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)

    assert send_submission(unit, provider=provider) == "sent"

    assert sent_max_tokens(emulator, unit) == [600, 600]


def test_max_tokens_is_the_prompts_without_a_budget_or_before_anything_was_measured(
    pounds, emulator, provider
):
    unmeasured = job_with_items(2, unit_size=2, budget=Decimal("100.00"))
    [first] = plan_submissions(unmeasured.pk)
    assert send_submission(first, provider=provider) == "sent"
    measured(JobFactory(), 100)
    unbudgeted = job_with_items(2, unit_size=2, budget=None)
    [second] = plan_submissions(unbudgeted.pk)

    with CaptureQueriesContext(connection) as queries:
        build_requests(Submission.objects.select_related("job__prompt_version").get(pk=second))
    assert send_submission(second, provider=provider) == "sent"

    assert sent_max_tokens(emulator, first) == [600, 600]
    assert sent_max_tokens(emulator, second) == [600, 600]
    # A job without a budget is sent with the prompt's own limit: nothing is written to its entries.
    assert not SubmissionItem.objects.filter(submission_id=second, max_output_tokens__isnull=False).exists()
    assert set(
        SubmissionItem.objects.filter(submission_id=first).values_list("max_output_tokens", flat=True)
    ) == {600}
    assert not [q for q in queries.captured_queries if "MAX(" in q["sql"].upper()]  # no measure asked for


def test_a_hold_at_the_lowered_max_tokens_is_close_to_what_the_unit_costs(pounds, clock, emulator, provider):
    first = job_with_items(5, unit_size=5, budget=Decimal("1000.00"))
    [unmeasured] = plan_submissions(first.pk)
    send_submission(unmeasured, provider=provider)
    collect(clock, unmeasured, provider)
    second = job_with_items(5, unit_size=5, budget=Decimal("1000.00"))
    [lowered] = plan_submissions(second.pk)
    send_submission(lowered, provider=provider)
    collect(clock, lowered, provider)

    before, after = (UnitCharge.objects.get(submission_id=unit) for unit in (unmeasured, lowered))
    largest = max(
        GeneratedVersion.objects.filter(submission_id=unmeasured).values_list("output_tokens", flat=True)
    )
    assert before.largest_output == largest  # kept as the unit settled
    assert sent_max_tokens(emulator, lowered) == [math.ceil(largest * MEASURED_OUTPUT_MARGIN) + 16] * 5
    # At max_tokens 600 a unit held 12 times what it cost; at the measured limit 4 times, the rest being
    # its input counted at a token a byte (the emulator's words are few tokens for their bytes).
    assert before.reserved > 10 * before.cost
    assert after.reserved < 5 * after.cost
    assert after.reserved < before.reserved / 3


def test_a_unit_that_does_not_fit_sends_the_head_that_fits_and_plans_the_rest_again(
    pounds, emulator, provider
):
    job = job_with_items(4, unit_size=4, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    submission = Submission.objects.select_related("job__prompt_version").get(pk=unit)
    two = budgets.worst_case(build_requests(submission)[:2])
    usd = (
        price_for("emulator", "gpt-4o-mini")
        .cost(two.input_tokens, two.output_tokens)
        .quantize(Decimal("0.000001"))
    )
    # Room for two requests' worst case, not three.
    Job.objects.filter(pk=job.pk).update(
        budget=(usd * HELD_AT).quantize(Decimal("0.01"), rounding="ROUND_CEILING")
    )

    assert send_submission(unit, provider=provider) == "sent"

    assert emulator.stats()["batches"] == 1
    assert len(sent_max_tokens(emulator, unit)) == 2
    assert UnitCharge.objects.get(submission_id=unit).requests == 2
    assert Job.objects.get(pk=job.pk).state != JobState.PAUSED
    assert Item.objects.filter(submission_id=unit, state=ItemState.SUBMITTED).count() == 2
    # The other two wait to be planned into a unit of their own; sent, not one of it fits: the job pauses.
    waiting = Item.objects.filter(job=job, state=ItemState.PREPARED, submission__isnull=True)
    assert waiting.count() == 2
    [rest] = plan_submissions(job.pk)
    assert send_submission(rest, provider=provider) == "paused"
    assert Job.objects.get(pk=job.pk).pause_reason == PauseReason.BUDGET_REACHED
    assert budgets.committed(job.pk) <= Job.objects.get(pk=job.pk).budget


def paused_with_one_unit_in_flight(provider) -> tuple[Job, int, int]:
    """A job of two units whose budget holds the first unit's worst case and a little: the second
    does not fit, not even one request of it, so the job pauses with the first in flight."""
    job = job_with_items(4, unit_size=2, budget=Decimal("100.00"))
    first, second = plan_submissions(job.pk)
    Job.objects.filter(pk=job.pk).update(
        budget=(unit_worst_case_pounds(first) * Decimal("1.05")).quantize(Decimal("0.01"))
    )
    assert send_submission(first, provider=provider) == "sent"
    assert send_submission(second, provider=provider) == "paused"
    return Job.objects.get(pk=job.pk), first, second


def test_a_job_its_budget_paused_resumes_by_itself_once_a_settled_unit_frees_enough(
    pounds, clock, emulator, provider
):
    job, first, second = paused_with_one_unit_in_flight(provider)
    assert job.state == JobState.PAUSED

    collect(clock, first, provider)  # settles far below its hold
    resume_if_it_fits(job.pk)  # the task the settling queued

    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.pause_reason == ""
    resumed = Event.objects.filter(job=job, item=None, from_state=JobState.PAUSED).get()
    assert resumed.actor_name == "system"
    assert resumed.reason.startswith("Resumed by itself: settled units freed enough of the budget")
    assert resumed.data["resumed"] == "budget_freed"
    assert Decimal(resumed.data["next_needs"]) <= Decimal(resumed.data["left"])
    assert Submission.objects.get(pk=second).claimed_until is None  # the next pass sends it
    assert send_submission(second, provider=provider) == "sent"
    assert budgets.committed(job.pk) <= job.budget


def test_a_job_stays_paused_while_what_settles_frees_too_little(pounds, emulator, provider):
    job, first, _ = paused_with_one_unit_in_flight(provider)
    charge = UnitCharge.objects.get(submission_id=first)
    # The unit cost all it held: settling it frees nothing.
    UnitCharge.objects.filter(pk=charge.pk).update(settled_at=timezone.now(), cost=charge.reserved)

    assert resume_when_it_fits(job.pk) is False

    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED
    assert not Event.objects.filter(job=job, from_state=JobState.PAUSED).exists()


def test_what_a_paused_job_waits_for_is_told_with_the_figures_of_now(pounds, emulator, provider):
    job, first, _ = paused_with_one_unit_in_flight(provider)
    held = UnitCharge.objects.get(submission_id=first).reserved
    figures = budgets.figures(job, next_needs=next_request_need(job))

    assert (figures.spent, figures.held, figures.in_flight) == (Decimal("0.000000"), held, 1)
    assert figures.left == job.budget - held
    assert not figures.next_fits and figures.short > 0
    told = figures.waiting_for()
    assert told.startswith(
        f"Waiting for 1 unit in flight to settle: {held} GBP held; the next request needs up to"
    )
    assert f"{figures.left} GBP is left" in told
    # The words kept at the pause are the event's; once the unit is in flight no longer, the words change.
    UnitCharge.objects.filter(submission_id=first).update(settled_at=timezone.now(), cost=held)
    told_now = budgets.figures(job, next_needs=next_request_need(job)).waiting_for()
    assert told_now.startswith("Nothing in flight will free any of the budget")
    assert "Raise the budget by at least" in told_now


def test_a_lowered_max_tokens_that_cut_a_draft_off_has_it_drafted_again_at_the_prompts_own(
    pounds, clock, emulator, provider
):
    measured(JobFactory(), 8)  # a short answer measured: the limit becomes 26 tokens
    job = job_with_items(2, unit_size=2, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    assert send_submission(unit, provider=provider) == "sent"
    assert sent_max_tokens(emulator, unit) == [26, 26]
    assert sent_limits(unit) == [26, 26]  # kept as sent

    collect(clock, unit, provider)  # every answer ran into the 26 tokens

    items = Item.objects.filter(job=job)
    assert set(items.values_list("state", "reason_code")) == {(ItemState.PREPARED, ReasonCode.TRUNCATED)}
    assert set(items.values_list("inference_attempt", flat=True)) == {2}
    [again] = plan_submissions(job.pk)
    assert send_submission(again, provider=provider) == "sent"
    assert sent_max_tokens(emulator, again) == [600, 600]
    assert sent_limits(again) == [600, 600]
    collect(clock, again, provider)
    assert set(items.values_list("state", flat=True)) == {ItemState.AWAITING_REVIEW}


def sent_limits(submission_id: int) -> list[int]:
    return list(
        Submission.objects.get(pk=submission_id)
        .entries.order_by("id")
        .values_list("max_output_tokens", flat=True)
    )


def test_a_draft_cut_off_at_the_limit_it_was_sent_with_is_not_drafted_again_whatever_tokens_it_counts(
    pounds, clock, emulator, provider
):
    # Nothing measured: the unit is sent at the prompt's own 20 tokens, and its drafts are cut off there.
    PromptVersion.objects.filter(task="product_description", version=1).update(max_output_tokens=20)
    job = job_with_items(1, unit_size=1, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    send_submission(unit, provider=provider)
    collect(clock, unit, provider)
    item = Item.objects.get(job=job)
    assert (item.state, item.reason_code) == (ItemState.VALIDATION_FAILED, ReasonCode.TRUNCATED)
    # A provider that counts only the answer's own tokens, not its thinking (Gemini), records fewer
    # than the limit the draft stopped at.
    GeneratedVersion.objects.filter(item=item).update(output_tokens=12)

    assert redraft_cut_off(job, Submission.objects.get(pk=unit)) == []

    assert Item.objects.get(pk=item.pk).state == ItemState.VALIDATION_FAILED
    assert sent_limits(unit) == [20]


def test_an_item_once_sent_at_the_prompts_own_limit_is_not_drafted_again(pounds, clock, emulator, provider):
    measured(JobFactory(), 8)  # the limit becomes 26 tokens
    job = job_with_items(1, unit_size=1, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    send_submission(unit, provider=provider)
    collect(clock, unit, provider)  # cut off at 26: drafted again at 600
    [again] = plan_submissions(job.pk)
    send_submission(again, provider=provider)
    collect(clock, again, provider)
    item = Item.objects.get(job=job)
    assert sent_limits(again) == [600]
    # Sent once more at the lowered limit (its reason since changed, say) and cut off there again.
    third = Submission.objects.create(
        job=job,
        provider=job.provider,
        model=job.model,
        intent_key="bd_third",
        state=SubmissionState.COLLECTED,
    )
    SubmissionItem.objects.create(submission=third, item=item, custom_id="bd-third", max_output_tokens=26)
    Item.objects.filter(pk=item.pk).update(
        state=ItemState.VALIDATION_FAILED, reason_code=ReasonCode.TRUNCATED, submission=third
    )

    assert redraft_cut_off(job, third) == []
    SubmissionItem.objects.filter(submission_id=again).update(max_output_tokens=26)  # never sent at 600
    assert redraft_cut_off(job, third) == [item.pk]  # then it is drafted again


def test_a_draft_cut_off_at_the_prompts_own_max_tokens_is_not_drafted_again(
    pounds, clock, emulator, provider
):
    PromptVersion.objects.filter(task="product_description", version=1).update(max_output_tokens=20)
    job = job_with_items(1, unit_size=1, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    send_submission(unit, provider=provider)
    collect(clock, unit, provider)

    assert Item.objects.get(job=job).state == ItemState.VALIDATION_FAILED


def test_a_job_paused_on_a_hold_that_settled_meanwhile_is_resumed_by_that_settle(
    pounds, emulator, provider, django_capture_on_commit_callbacks
):
    job, first, second = paused_with_one_unit_in_flight(provider)
    # The settling cluster read the job before the other cluster's pause was committed: running.
    read_before_the_pause = Job.objects.get(pk=job.pk)
    read_before_the_pause.state, read_before_the_pause.pause_reason = JobState.RUNNING, ""
    unit = Submission.objects.get(pk=first)
    unit.job = read_before_the_pause
    unit.state = SubmissionState.FAILED

    with django_capture_on_commit_callbacks() as queued:
        settle(unit, {})  # no drafts came back: it cost nothing
    assert UnitCharge.objects.get(submission=unit).settled_at is not None
    assert len(queued) == 1  # the job is looked at again once the settling commits
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED

    assert resume_if_it_fits(job.pk) is True  # the task it queued, which locks the job and reads it anew

    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_the_collector_resumes_a_job_its_budget_paused_once_its_next_requests_fit(pounds, emulator, provider):
    job, first, second = paused_with_one_unit_in_flight(provider)
    started = []
    poll_everything(start=lambda *task: started.append(task))
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED  # its unit is still in flight
    # Settled by a cluster that never saw the pause.
    UnitCharge.objects.filter(submission_id=first).update(settled_at=timezone.now(), cost=Decimal(0))

    poll_everything(start=lambda *task: started.append(task))

    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_a_head_under_a_tenth_of_the_unit_waits_for_the_units_in_flight_and_goes_once_none_are(
    pounds, emulator, provider
):
    job = job_with_items(40, unit_size=20, budget=Decimal("100.00"))
    first, second = plan_submissions(job.pk)
    one = budgets.requests_need(job, build_requests(Submission.objects.get(pk=second))[:1])
    budget = (unit_worst_case_pounds(first) + one * Decimal("1.5")).quantize(
        Decimal("0.01"), rounding="ROUND_CEILING"
    )
    Job.objects.filter(pk=job.pk).update(budget=budget)  # room for one request of the second unit, not two
    assert send_submission(first, provider=provider) == "sent"

    # One request fits, fewer than a tenth of the unit (2), and a unit in flight may free more: no batch of one.
    assert send_submission(second, provider=provider) == "paused"
    assert emulator.stats()["batches"] == 1
    job.refresh_from_db()
    assert job.pause_reason == PauseReason.BUDGET_REACHED
    assert "rather than sending a batch of fewer than 2" in job.pause_detail
    assert next_request_need(job) > job.budget - budgets.committed(job.pk)  # it waits for two to fit

    # The unit in flight settles at all it held: nothing freed, nothing in flight. The one that fits is sent.
    charge = UnitCharge.objects.get(submission_id=first)
    UnitCharge.objects.filter(pk=charge.pk).update(settled_at=timezone.now(), cost=charge.reserved)
    assert resume_when_it_fits(job.pk) is True
    assert send_submission(second, provider=provider) == "sent"
    assert UnitCharge.objects.get(submission_id=second).requests == 1
    assert budgets.committed(job.pk) <= budget


def test_a_unit_held_today_still_covers_its_worst_case_after_the_rate_rises_two_percent(
    pounds, clock, emulator, provider
):
    job = job_with_items(2, unit_size=2, budget=Decimal("100.00"))
    [unit] = plan_submissions(job.pk)
    assert send_submission(unit, provider=provider) == "sent"
    charge = UnitCharge.objects.get(submission_id=unit)
    # The unit settles a day later, the pound 2 % weaker: its worst case, converted then.
    risen = (charge.reserved_usd * RATE * Decimal("1.02")).quantize(Decimal("0.000001"))

    assert charge.reserved >= risen
