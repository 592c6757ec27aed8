"""Spend never passes a job's budget with two clusters sending at once (rule 18, issue 19 point 5):
two real `qcluster` processes on Redis, a real emulator, and a budget that holds about one unit's
worst case of six units: what is spent or held never passes it, the job pauses, and raising the
budget lets it finish, still within the new budget."""

import json
import zlib
from decimal import Decimal

import pytest
from django.db import connection

from ledger.actions.jobs import create_job, set_budget
from ledger.actions.submitting import build_requests, plan_submissions
from ledger.models import Job, PauseReason, Submission, UnitCharge
from ledger.money import budgets
from ledger.money.pricing import price_for
from ledger.states import ItemState, JobState, SubmissionState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def dear_pounds(settings, tmp_path, processes):
    """Pounds at 0.8 to the dollar, and tokens dear enough that one unit's worst case is pounds:
    for this test process and for every process it starts, as a deployment sets them."""
    rates, prices = tmp_path / "rates.json", tmp_path / "prices.json"
    rates.write_text(json.dumps({"source": "test rates", "per_usd": {"2020-01-01": "0.8"}}))
    dear = {"input_per_million": "1000", "output_per_million": "4000"}
    prices.write_text(json.dumps({"openai": {"models": {"gpt-4o-mini": dear}}}))
    env = {"BATCHDESK_CURRENCY": "GBP", "BATCHDESK_FX_FILE": str(rates), "BATCHDESK_PRICE_FILE": str(prices)}
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(rates)
    settings.BATCHDESK_PRICE_FILE = str(prices)
    processes.env.update(env)


def worst_case_pounds(submission: Submission) -> Decimal:
    tokens = budgets.worst_case(build_requests(submission))
    usd = price_for("emulator", "gpt-4o-mini").cost(tokens.input_tokens, tokens.output_tokens)
    return usd.quantize(Decimal("0.000001")) * Decimal("0.8")


def test_two_clusters_never_pass_the_budget_and_a_raised_budget_lets_the_job_finish(processes, dear_pounds):
    n_products, unit_size = 30, 5
    emulator_url = processes.emulator("--per-request-ms", "20")
    redis_db = 1 + zlib.crc32(connection.settings_dict["NAME"].encode()) % 15
    redis_env = {"REDIS_URL": f"redis://127.0.0.1:6379/{redis_db}"}
    owner = UserFactory(roles=["catalogue_owner"])
    make_catalogue(n_products)
    job = create_job(
        reference="budgeted",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        unit_size=unit_size,
        budget=Decimal("1000000"),
    )
    # The units as the workers would plan them, to know what one could cost at worst.
    units = plan_submissions(job.pk)
    worst = max(worst_case_pounds(Submission.objects.get(pk=pk)) for pk in units)
    budget = (worst * Decimal("1.05")).quantize(Decimal("0.01"))
    Job.objects.filter(pk=job.pk).update(budget=budget)
    Submission.objects.filter(pk__in=units).update(claimed_until=None)
    for _ in range(2):
        processes.start("qcluster", **redis_env)

    highest = Decimal(0)

    def paused_and_settled() -> bool:
        nonlocal highest
        highest = max(highest, budgets.committed(job.pk))
        job.refresh_from_db()
        in_flight = Submission.objects.filter(
            job=job, state__in=[SubmissionState.OPEN, SubmissionState.ENDED, SubmissionState.UNCERTAIN]
        )
        return job.state == JobState.PAUSED and not in_flight.exists()

    wait_until(paused_and_settled, timeout=120, every=0.2, what="the job to pause at its budget")

    assert job.pause_reason == PauseReason.BUDGET_REACHED
    assert highest <= budget
    sent = Submission.objects.filter(job=job).exclude(state=SubmissionState.INTENT)
    assert 1 <= sent.count() < len(units)
    assert emulator_stats(emulator_url)["creates"] == sent.count()
    assert budgets.committed(job.pk) <= budget
    assert job.items.filter(state=ItemState.PREPARED).exists()

    set_budget(job.pk, worst * len(units), actor=owner)
    new_budget = Job.objects.get(pk=job.pk).budget

    def finished() -> bool:
        nonlocal highest
        highest = max(highest, budgets.committed(job.pk))
        return (
            not job.items.filter(
                state__in=[ItemState.PREPARED, ItemState.SUBMITTED, ItemState.RETURNED]
            ).exists()
            and not UnitCharge.objects.filter(job=job, settled_at__isnull=True).exists()
        )

    wait_until(finished, timeout=120, every=0.2, what="the job to finish within its raised budget")

    assert highest <= new_budget
    assert UnitCharge.objects.filter(job=job).count() == len(units) == emulator_stats(emulator_url)["creates"]
    assert Job.objects.get(pk=job.pk).state == JobState.IN_REVIEW
