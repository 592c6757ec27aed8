"""Upgrading to current prompt versions (migration 0032): each task's newest version, the one a job
naming no version used until then, is made current, so no deployment changes what its jobs use."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("ledger", "0031_collections_that_keep_failing")]
AFTER = [("ledger", "0032_current_prompt_and_job_states")]


@pytest.fixture(autouse=True)
def back_to_the_latest_schema():
    """The tests after this one, on this database, need every migration: put them all back."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_each_tasks_newest_version_becomes_current_by_the_system():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    OldPrompt = executor.loader.project_state(BEFORE).apps.get_model("ledger", "PromptVersion")
    v1 = OldPrompt.objects.get(task="product_description", version=1)
    fields = {
        "system_message": v1.system_message,
        "template": v1.template,
        "output_schema": v1.output_schema,
        "rules": v1.rules,
    }
    v2 = OldPrompt.objects.create(task="product_description", version=2, **fields)
    headline = OldPrompt.objects.create(task="headline", version=1, **fields)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    Choice = executor.loader.project_state(AFTER).apps.get_model("ledger", "CurrentPromptChoice")

    made = {(c.task, c.prompt_version_id, c.actor_id, c.actor_name) for c in Choice.objects.all()}
    assert made == {("product_description", v2.pk, None, "system"), ("headline", headline.pk, None, "system")}
