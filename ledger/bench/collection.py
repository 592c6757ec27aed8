"""Figure (d): collecting one ended OpenAI batch of up to 50,000 results, from "the provider says
completed" to every item validated and awaiting review (issue 29, point 1: ≥ 20,000 results/s, peak
memory ≤ 250 MB), beside a bare streamed download of the same results file, and the same collection's
time beside batchwizard 0.5's (`batchwizard.py`: issue 29, point 2).

It builds on the bench's job (`job_creation`): the first items of job `bench` go in one unit to the
built-in OpenAI emulator (no processing delay), which runs it; then `manage.py collect` records it,
timed, in a process of its own."""

import os
import subprocess
import sys
import time
import uuid

import httpx
import psycopg
from django.db import transaction

from ledger.actions.collecting import observe_submission
from ledger.actions.submitting import send_submission
from ledger.models import Item, Job, Submission, SubmissionItem
from ledger.providers import get_provider
from ledger.states import ItemState

from . import batchwizard
from .base import TOO_SHORT, Bench, Figure, verdict, work_seconds
from .measuring import MANAGE, CommandFailed, run_measured

RESULTS = 50_000
TARGET_RESULTS_PER_SECOND = 20_000
MEMORY_LIMIT_BYTES = 250_000_000


def measure(bench: Bench) -> list[Figure]:
    size = min(bench.products, RESULTS)
    emulator = subprocess.Popen(
        [sys.executable, str(MANAGE), "run_emulator", "--port", "0", "--per-request-ms", "0"],
        env=bench.env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        announced = emulator.stdout.readline()
        base_url = next((word for word in announced.split() if word.startswith("http://")), None)
        if base_url is None:
            raise CommandFailed(f"the emulator did not say where it serves: {announced!r}")
        env = {**bench.env, "BATCHDESK_EMULATOR_URL": base_url}
        prepared = run_measured(
            [
                sys.executable,
                str(MANAGE),
                "shell",
                "-c",
                f"from ledger.bench.collection import prepare; prepare({size})",
            ],
            env=env,
        )
        submission_id, batch_ref = prepared.output.split()[-2:]
        batch = httpx.get(f"{base_url}/batches/{batch_ref}", headers={"Authorization": "Bearer bench"}).json()
        file_url = f"{base_url}/files/{batch['output_file_id']}/content"
        bench.say(
            f"Collection: a unit of {size:,} requests sent and run by the emulator in {prepared.seconds:,.1f} s"
        )
        download = run_measured([sys.executable, "-m", "ledger.bench.download", file_url], env=env)
        lines = int(download.output.split()[-1])
        if lines != size:
            raise CommandFailed(f"the results file has {lines} lines for {size} requests")
        beside = batchwizard.watch(
            venv=batchwizard.VENV,
            pip_env=dict(os.environ),
            base_url=base_url,
            batch_ref=batch_ref,
            size=size,
            folder=bench.catalogue.parent,
            say=bench.say,
        )
        run = run_measured([sys.executable, str(MANAGE), "collect", submission_id], env=env)
        check_collected(bench, int(submission_id), size)
    finally:
        emulator.terminate()
        emulator.wait()
    # Both measured processes start Python; the collection's also starts Django, which the idle
    # run times (its connection included): counted out, so the figure is the collection's own.
    collecting, long_enough = work_seconds(run, bench.idle.seconds)
    rate, download_rate = size / collecting, download.per_second(size)
    bench.say(
        f"bare download: {size:,} lines in {download.seconds:,.2f} s = {download_rate:,.0f} lines/s, "
        f"peak {download.peak_mb:,.0f} MB"
    )
    bench.say(
        f"collect: {size:,} results in {run.seconds:,.2f} s ({collecting:,.2f} s after Django started) "
        f"= {rate:,.0f} results/s, peak {run.peak_mb:,.0f} MB"
    )
    return [
        Figure(
            name="collection of a result file",
            value=f"{rate:,.0f} results/s ({size:,})" + ("" if long_enough else TOO_SHORT),
            baseline=f"{download_rate:,.0f} lines/s bare download",
            ratio=rate / download_rate,
            target=f"≥ {TARGET_RESULTS_PER_SECOND:,} results/s",
            passed=verdict(rate >= TARGET_RESULTS_PER_SECOND, long_enough),
        ),
        Figure(
            name="collection: peak memory",
            value=f"{run.peak_mb:,.0f} MB",
            baseline=f"{bench.idle.peak_mb:,.0f} MB idle",
            ratio=run.peak_bytes / bench.idle.peak_bytes,
            target=f"≤ {MEMORY_LIMIT_BYTES // 1_000_000} MB",
            passed=run.peak_bytes <= MEMORY_LIMIT_BYTES,
        ),
        batchwizard.figure(beside, run, size),
    ]


def check_collected(bench: Bench, submission_id: int, size: int) -> None:
    with psycopg.connect(bench.database_url) as connection:
        states = dict(
            connection.execute(
                "SELECT i.state, count(*) FROM ledger_submissionitem e JOIN ledger_item i ON i.id = e.item_id "
                "WHERE e.submission_id = %s GROUP BY i.state",
                [submission_id],
            ).fetchall()
        )
        (versions,) = connection.execute(
            "SELECT count(*) FROM ledger_generatedversion WHERE submission_id = %s", [submission_id]
        ).fetchone()
    if states != {"awaiting_review": size} or versions != size:
        raise CommandFailed(f"collect left items {states} and {versions} versions for {size} results")


def prepare(size: int) -> None:
    """In the bench's database (run by `manage.py shell`): one unit of the first `size` unsent items
    of job `bench`, sent to the emulator and waited for until it has ended. Prints the submission's
    id and the provider's reference of the unit."""

    job = Job.objects.get(reference="bench")
    with transaction.atomic():
        items = list(
            Item.objects.filter(job=job, state=ItemState.PREPARED, submission__isnull=True)
            .order_by("id")
            .values_list("pk", "inference_attempt")[:size]
        )
        submission = Submission.objects.create(
            job=job, provider=job.provider, model=job.model, intent_key=f"bd_bench_{uuid.uuid4().hex}"
        )
        SubmissionItem.objects.bulk_create(
            (
                SubmissionItem(submission=submission, item_id=pk, custom_id=f"bd-{pk}-{attempt}")
                for pk, attempt in items
            ),
            batch_size=5_000,
        )
        Item.objects.filter(pk__in=[pk for pk, _ in items]).update(submission=submission)
    provider = get_provider(job.provider)
    if send_submission(submission.pk, provider=provider) != "sent":
        raise RuntimeError("the unit was not sent")
    while observe_submission(submission.pk, provider=provider) != "ended":
        time.sleep(0.5)
    submission.refresh_from_db()
    print(submission.pk, submission.provider_ref)
