"""A worker killed while it collects, at a chunk's boundary and inside a chunk: a real `qcluster`
records a real emulator's results file a chunk at a time (BATCHDESK_COLLECT_CHUNK=5, as a
deployment may set it). The test holds a row the worker needs, so the kill comes exactly where it
should: after two chunks are committed, with the third not begun or half written (and the fourth,
recorded beside it, committed or not). A fresh cluster then finishes from the ledger: no result
lost, none recorded twice, every item's story once."""

import json

import httpx
import psycopg
import pytest
from django.db import connection
from django_q.tasks import async_task

from ledger.actions.jobs import create_job
from ledger.models import Event, GeneratedVersion, Item, Submission, SubmissionItem
from ledger.states import ItemState, SubmissionState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

PRODUCTS = 20
CHUNK = 5
UNDISTURBED_STORY = ["prepared", "submitted", "returned", "awaiting_review"]


def output_order(emulator_url: str, provider_ref: str) -> list[str]:
    """The custom_ids of the provider's results file, in its order (the emulator shuffles it)."""
    headers = {"Authorization": "Bearer test"}
    batch = wait_until(
        lambda: (
            answer
            if (answer := httpx.get(f"{emulator_url}/batches/{provider_ref}", headers=headers).json())[
                "status"
            ]
            == "completed"
            else None
        ),
        timeout=60,
        what="the batch to complete at the provider",
        every=0.1,
    )
    content = httpx.get(f"{emulator_url}/files/{batch['output_file_id']}/content", headers=headers)
    return [json.loads(line)["custom_id"] for line in content.text.splitlines()]


def waiting_on_a_lock(database: psycopg.Connection, table: str) -> bool:
    """A worker's statement on `table` is waiting for a lock this test holds."""
    row = database.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query ILIKE %s",
        [f"%{table}%"],
    ).fetchone()
    return row[0] > 0


def recorded_now(job, order: list[str]) -> tuple[set[int], int]:
    """The lines of the results file (numbered from 0) whose requests are recorded, and how many
    drafts the job has, read by one statement: one snapshot, while a chunk may commit beside it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ARRAY(SELECT e.custom_id FROM ledger_submissionitem e JOIN ledger_item i ON i.id = e.item_id "
            "WHERE i.job_id = %s AND e.outcome <> ''), (SELECT count(*) FROM ledger_generatedversion v "
            "JOIN ledger_item i ON i.id = v.item_id WHERE i.job_id = %s)",
            [job.pk, job.pk],
        )
        custom_ids, drafts = cursor.fetchone()
    recorded = set(custom_ids)
    return {number for number, custom_id in enumerate(order) if custom_id in recorded}, drafts


# The first chunk is committed and the third is not. The third is handed to a recording thread once
# the first has committed, so the second, recorded beside it by the other thread, may still be in
# flight when the third waits (seen under load) and be lost with the killed worker; the fourth is
# handed over only once the second has committed, and may then be recorded beside the third.
WHOLE_CHUNKS_AROUND_THE_THIRD = ({*range(5)}, {*range(10)}, {*range(10), *range(15, 20)})


@pytest.mark.parametrize("where", ["at a chunk boundary", "inside a chunk"])
def test_a_worker_killed_while_collecting_loses_and_repeats_nothing(processes, where):
    emulator_url = processes.emulator("--per-request-ms", "50", "--seed", "1")
    make_catalogue(PRODUCTS)
    job = create_job(
        reference="collect-faults",
        owner=UserFactory(roles=["catalogue_owner"]),
        task="product_description",
        provider="emulator",
        unit_size=PRODUCTS,
    )
    url = processes.env["DATABASE_URL"]
    with psycopg.connect(url) as gate, psycopg.connect(url, autocommit=True) as watcher:
        cluster = processes.start("qcluster", BATCHDESK_COLLECT_CHUNK=str(CHUNK))
        async_task("ledger.tasks.collect_round")
        submission = wait_until(
            lambda: Submission.objects.filter(job=job).exclude(provider_ref="").first(),
            timeout=60,
            what="the unit to be sent",
            every=0.05,
        )
        # No worker observes the unit's end until the test knows the order of its results file.
        gate.execute("SELECT id FROM ledger_submission WHERE id = %s FOR UPDATE", [submission.pk])
        order = output_order(emulator_url, submission.provider_ref)
        assert len(order) == PRODUCTS
        with psycopg.connect(url) as holder:
            # The third chunk holds the results file's lines 11 to 15.
            if where == "at a chunk boundary":
                # Its first statement, locking its requests, waits: nothing of it is written.
                holder.execute(
                    "SELECT id FROM ledger_submissionitem WHERE custom_id = %s FOR UPDATE", [order[10]]
                )
                table = "ledger_submissionitem"
            else:
                # Its requests are locked and marked, and its versions wait for the version of line
                # 13 this test is writing (the same custom_id) to commit or roll back.
                entry = SubmissionItem.objects.get(custom_id=order[12])
                holder.execute(
                    "INSERT INTO ledger_generatedversion (item_id, number, custom_id, submission_id, content, "
                    "raw_output, content_hash, input_tokens, output_tokens, usage, valid, validation_reasons, "
                    "created_at) VALUES (%s, 1, %s, %s, '', '', '', 0, 0, '{}', true, '[]', now())",
                    [entry.item_id, entry.custom_id, submission.pk],
                )
                table = "ledger_generatedversion"
            gate.commit()
            wait_until(
                lambda: waiting_on_a_lock(watcher, table),
                timeout=60,
                what="the third chunk to wait",
                every=0.05,
            )
            # Whole chunks are committed, and none of the third.
            lines, drafts = recorded_now(job, order)
            assert lines in WHOLE_CHUNKS_AROUND_THE_THIRD
            assert drafts == len(lines)
            processes.kill(cluster)
            holder.rollback()
    lines, drafts = recorded_now(job, order)
    assert lines in WHOLE_CHUNKS_AROUND_THE_THIRD
    assert drafts == len(lines)

    # A fresh cluster, each of whose collection tasks hands over after one chunk.
    processes.start("qcluster", BATCHDESK_COLLECT_CHUNK=str(CHUNK), BATCHDESK_COLLECT_SECONDS="0")
    async_task("ledger.tasks.collect_round")
    wait_until(
        lambda: Submission.objects.filter(pk=submission.pk, state=SubmissionState.COLLECTED).exists(),
        timeout=120,
        what="the unit to be collected after the kill",
    )

    submission.refresh_from_db()
    assert Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == PRODUCTS
    assert submission.anomalies == []
    for item in Item.objects.filter(job=job):
        assert item.versions.count() == 1
        story = list(Event.objects.filter(item=item).order_by("id").values_list("to_state", flat=True))
        assert story == UNDISTURBED_STORY
    entries = SubmissionItem.objects.filter(item__job=job)
    assert set(entries.values_list("outcome", flat=True)) == {"returned"}
    assert sorted(entries.values_list("custom_id", flat=True)) == sorted(
        GeneratedVersion.objects.filter(item__job=job).values_list("custom_id", flat=True)
    )
    assert sorted(entries.values_list("custom_id", flat=True)) == sorted(order)
    # Each request ran once at the provider: collecting again asks for nothing to be run.
    assert max(emulator_stats(emulator_url)["inferences"].values()) == 1
