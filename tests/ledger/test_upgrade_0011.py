"""Upgrading to provider-neutral submissions (migration 0011) keeps what the old columns said."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def back_to_the_latest_schema():
    """The tests after this one, on this database, need every migration: put them all back."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


BEFORE = [("ledger", "0010_backfill_reason_codes")]
AFTER = [("ledger", "0011_provider_neutral_submissions")]


def test_an_uncollected_refused_batch_stays_refused_and_counts_are_in_the_ledgers_words():
    job = JobFactory()
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    OldSubmission = executor.loader.project_state(BEFORE).apps.get_model("ledger", "Submission")
    common = {"job_id": job.pk, "provider": "openai", "model": "gpt-4o-mini", "state": "ended"}
    refused = OldSubmission.objects.create(
        **common, intent_key="bd_refused", last_observed_status="failed", request_counts={}
    )
    with_files = OldSubmission.objects.create(
        **common,
        intent_key="bd_files",
        last_observed_status="failed",
        error_file_ref="file-err",
        request_counts={"total": 3, "completed": 1, "failed": 2},
    )

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    # Read as 0011 left the table: later migrations add columns today's model would ask for.
    UpgradedSubmission = executor.loader.project_state(AFTER).apps.get_model("ledger", "Submission")

    assert UpgradedSubmission.objects.get(pk=refused.pk).refused is True
    # A failed batch that wrote an error file ran: its lines say what happened to each request.
    upgraded = UpgradedSubmission.objects.get(pk=with_files.pk)
    assert upgraded.refused is False
    assert upgraded.request_counts == {"total": 3, "succeeded": 1, "failed": 2}
