"""Work that outlives its process is picked up again: a task the broker could not take, an import
whose worker died, an import that waits for another. The ledger is the truth, the queue a wake-up
call (issue 17, point 8)."""

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DatabaseError, connection
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.conf import Conf
from django_q.models import OrmQ

from ledger import catalogue, tasks
from ledger.actions.collecting import observe_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.catalogue import importing
from ledger.models import (
    CatalogueImport,
    GeneratedVersion,
    ImportState,
    Job,
    Product,
    SourceRevision,
    Submission,
)
from ledger.providers import get_provider
from ledger.states import ItemState, SubmissionState
from ledger.workers import stopping
from tests.api.conftest import ApiClient, token_for
from tests.factories import ProductFactory, UserFactory
from tests.ledger.test_provider_faults import emulator, job_with_items  # noqa: F401 - fixtures
from tests.processes import free_port, wait_until
from tests.provider_emulators import BY_NAME

CSV = b"sku,title,colour\nNEW-1,Linen tea towel,blue\nNEW-2,Ash bread board,\n"


@pytest.fixture
def broker_down(monkeypatch):
    """The broker pointed at a Redis nobody serves (a closed port), as when a deployment's Redis is
    down: every task queued fails in the broker itself."""
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", f"redis://127.0.0.1:{free_port()}/0")


def queued_tasks() -> list[tuple[str, tuple]]:
    """What the database broker holds (the suite's broker when REDIS_URL is unset)."""
    return [(task.func(), task.args()) for task in OrmQ.objects.order_by("pk")]


def run_queued_tasks() -> list:
    """Run, here, each task the broker holds, as a worker would take it."""
    done = [import_string(func)(*args) for func, args in queued_tasks()]
    OrmQ.objects.all().delete()
    return done


def upload(owner, content: bytes = CSV) -> CatalogueImport:
    file = SimpleUploadedFile("catalogue.csv", content, content_type="text/csv")
    return catalogue.store_upload(file, uploaded_by=owner, skip_invalid=False)


def other_connection(**options: str) -> psycopg.Connection:
    """A connection of its own to the test database, as another process would have."""
    database = connection.settings_dict
    return psycopg.connect(
        host=database["HOST"] or "127.0.0.1",
        port=database["PORT"] or 5432,
        dbname=database["NAME"],
        user=database["USER"] or None,
        options=" ".join(f"-c {name}={value}" for name, value in options.items()),
    )


def silent_for(stored: CatalogueImport, quiet: timedelta) -> None:
    CatalogueImport.objects.filter(pk=stored.pk).update(progress_at=timezone.now() - quiet)


# --- a task the broker could not take ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_task_the_broker_refused_is_accepted_and_the_collectors_pass_plans_it(
    broker_down, monkeypatch, client
):
    ProductFactory.create_batch(2)
    owner = UserFactory(roles=["catalogue_owner"])
    body = {"reference": "spring", "task": "product_description", "provider": "emulator"}

    response = client.post(
        "/api/jobs",
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token_for(owner)}"},
    )

    assert response.status_code == 202, response.content
    job = Job.objects.get()
    assert set(job.items.values_list("state", flat=True)) == {ItemState.PREPARED}
    assert not OrmQ.objects.exists()

    monkeypatch.undo()  # the broker is back
    started = []
    tasks.poll_everything(start=lambda func, *args: started.append((func, args)))
    assert started == [("ledger.tasks.submit_job", (job.pk,))]


@pytest.mark.django_db(transaction=True)
def test_an_upload_queued_while_the_broker_was_down_is_queued_again_and_imported(
    broker_down, monkeypatch, client, settings
):
    owner = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)

    response = client.post(reverse("catalogue_import"), {"file": SimpleUploadedFile("c.csv", CSV)})

    stored = CatalogueImport.objects.get()
    assert (response.status_code, stored.state) == (302, ImportState.QUEUED)
    assert not OrmQ.objects.exists()
    monkeypatch.undo()  # the broker is back
    assert catalogue.queue_lost_imports() == 0  # its task may yet come: a lease's patience

    silent_for(stored, timedelta(seconds=settings.BATCHDESK_LEASE_SECONDS + 1))
    tasks.poll_everything(start=lambda *task: None)

    assert queued_tasks() == [("ledger.tasks.import_catalogue_file", (stored.pk,))]
    assert catalogue.queue_lost_imports() == 0  # queued once, not at every pass
    assert run_queued_tasks() == [ImportState.DONE]
    assert set(Product.objects.values_list("sku", flat=True)) == {"NEW-1", "NEW-2"}


# --- an import whose worker died -----------------------------------------------------------


@pytest.mark.django_db
def test_an_import_whose_worker_died_is_queued_again_and_imports_once(owner):
    ProductFactory(sku="NEW-1", revision__title="Linen tea towel", revision__fields={"colour": "blue"})
    stored = upload(owner)
    # Its worker claimed it, then died: its transaction rolled back, its claim fell silent.
    CatalogueImport.objects.filter(pk=stored.pk).update(state=ImportState.RUNNING, claimed_by="dead")
    silent_for(stored, catalogue.IMPORT_STALE_AFTER - timedelta(seconds=5))
    assert catalogue.queue_lost_imports() == 0  # a long silence, not yet a dead worker

    silent_for(stored, catalogue.IMPORT_STALE_AFTER + timedelta(seconds=5))
    assert catalogue.queue_lost_imports() == 1

    stored.refresh_from_db()
    assert (stored.state, stored.claimed_by) == (ImportState.QUEUED, "")
    # Two deliveries of the task (the one queued when it was uploaded may come after all): one
    # imports, the other finds nothing to claim.
    assert tasks.import_catalogue_file(stored.pk) == ImportState.DONE
    assert tasks.import_catalogue_file(stored.pk) == "not claimed"
    stored.refresh_from_db()
    assert stored.counts == {
        "created": 1,
        "revised": 0,
        "unchanged": 1,
        "withdrawn": 0,
        "reactivated": 0,
        "rejected": 0,
    }
    assert SourceRevision.objects.filter(product__sku="NEW-1").count() == 1
    assert catalogue.queue_lost_imports() == 0


@pytest.mark.django_db
def test_an_import_whose_cluster_is_stopping_is_rolled_back_and_queued_again(owner, monkeypatch):
    stored = upload(owner)
    monkeypatch.setattr(stopping.STOP_FLAG, "value", 1)  # SIGTERM reached this worker's cluster

    assert tasks.import_catalogue_file(stored.pk) == ImportState.QUEUED

    stored.refresh_from_db()
    assert (stored.state, stored.claimed_by, stored.finished_at) == (ImportState.QUEUED, "", None)
    assert not Product.objects.exists() and stored.chunks.exists()
    monkeypatch.undo()
    assert tasks.import_catalogue_file(stored.pk) == ImportState.DONE
    assert Product.objects.count() == 2


# --- an import that waits for another ------------------------------------------------------


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_screen_upload_during_another_import_is_answered_at_once_and_its_task_waits_alive(client, owner):
    # Another import, writing: it holds the import lock until it commits. PostgreSQL ends it after
    # a minute idle, so that without this change (the screen importing in the request, waiting for
    # the lock) the test fails there rather than hangs.
    other = other_connection(idle_in_transaction_session_timeout="60s")
    other.execute("SELECT pg_advisory_xact_lock(%s)", [importing.IMPORT_LOCK])
    client.force_login(owner)

    response = client.post(reverse("catalogue_import"), {"file": SimpleUploadedFile("c.csv", CSV)})

    stored = CatalogueImport.objects.get()
    assert (response.status_code, stored.state) == (302, ImportState.QUEUED)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(tasks.import_catalogue_file(stored.pk)))
    worker.start()
    try:
        running = wait_until(
            lambda: CatalogueImport.objects.filter(pk=stored.pk, state=ImportState.RUNNING).first(),
            timeout=30,
            what="the task to claim the import",
        )
        # While it waits for the lock, it shows it is alive: no pass takes it for a dead worker's.
        wait_until(
            lambda: CatalogueImport.objects.get(pk=stored.pk).progress_at > running.progress_at,
            timeout=30,
            what="a sign of life while waiting",
        )
        page = client.get(response.url).content.decode()
        assert "Importing" in page and 'hx-trigger="every 2s"' in page
        assert not Product.objects.exists()
    finally:
        other.rollback()
        other.close()
        worker.join()
    assert outcome == [ImportState.DONE]
    assert "created 2, revised 0, unchanged 0" in client.get(response.url).content.decode()


# --- a collection that failed on a database error ------------------------------------------


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_collection_that_failed_on_a_database_error_gives_its_claim_back_at_once(emulator):  # noqa: F811
    job = job_with_items(BY_NAME["emulator"], 4, unit_size=4)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    provider = get_provider("emulator")
    while observe_submission(submission_id, provider=provider) != "ended":
        time.sleep(0.05)
    database = connection.settings_dict["NAME"]
    # The database fails the collection: the drafts' table is locked by another connection, and
    # every connection of the collection gives up waiting for a lock after a second.
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{database}" SET lock_timeout = 1000')
    connection.close()
    holder = other_connection()
    try:
        holder.execute("LOCK TABLE ledger_generatedversion IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(DatabaseError):
            tasks.collect_submission(submission_id)
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{database}" RESET lock_timeout')

    submission = Submission.objects.get(pk=submission_id)
    assert (submission.state, submission.claimed_until) == (SubmissionState.ENDED, None)
    # The next pass collects it now, not when the failed task's lease runs out.
    started = []
    tasks.poll_everything(start=lambda func, *args: started.append((func, args)))
    assert [func for func, _ in started] == ["ledger.tasks.collect_submission"]
    assert tasks.collect_submission(*started[0][1]) == "collected"
    assert GeneratedVersion.objects.filter(item__job=job).count() == 4


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_unit_whose_recording_keeps_failing_is_shown_on_operations_and_in_health(emulator, client):  # noqa: F811
    """Not retried in silence: after a few failed collections in a row the unit is shown with the
    last failure's words, and once one ends well it is no longer."""
    job = job_with_items(BY_NAME["emulator"], 3, unit_size=3)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    provider = get_provider("emulator")
    while observe_submission(submission_id, provider=provider) != "ended":
        time.sleep(0.05)
    # Every draft refused by the database, as a full disk or a broken extension would.
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_version() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER refuse_version BEFORE INSERT ON ledger_generatedversion "
            "FOR EACH ROW EXECUTE FUNCTION refuse_version()"
        )
    operator = UserFactory(roles=["operator"])
    client.force_login(operator)
    try:
        for failure in range(1, 4):
            with pytest.raises((DatabaseError, psycopg.Error)):
                tasks.collect_submission(submission_id)
            submission = Submission.objects.get(pk=submission_id)
            assert (submission.collect_failures, submission.recording_stuck) == (failure, failure >= 3)
            health = client.get("/api/health").json()
            assert health["collector"]["units_failing_to_record"] == (1 if failure >= 3 else 0)
        page = client.get(reverse("operations")).content.decode()
        assert 'data-testid="recording-stuck"' in page
        assert "could not be recorded 3 times in a row" in page and "No space left on device" in page
        scraped = ApiClient(token_for(operator)).get("/metrics").content.decode()
        assert "batchdesk_units_failing_to_record 1" in scraped
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_version ON ledger_generatedversion")
            cursor.execute("DROP FUNCTION refuse_version()")

    assert tasks.collect_submission(submission_id) == "collected"
    submission = Submission.objects.get(pk=submission_id)
    assert (submission.collect_failures, submission.collect_problem) == (0, "")
    assert GeneratedVersion.objects.filter(item__job=job).count() == 3
    assert client.get("/api/health").json()["collector"]["units_failing_to_record"] == 0
