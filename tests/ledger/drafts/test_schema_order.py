"""A schema keeps its author's order of properties everywhere (SPEC rule 19): the order a model writes
them in. Stored as written (a `json` column on PostgreSQL, not `jsonb`, which sorts keys shorter
names first), sent to every provider in that order, and so answered in it."""

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from ledger.actions.prompts import create_prompt_version
from ledger.bootstrap import DEFAULT_PROMPT
from ledger.drafts.schema_dialects import Dialect, sent_schema
from ledger.drafts.validation import DraftChecker
from ledger.models import GeneratedVersion, Item, PromptVersion
from ledger.states import ItemState
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory
from tests.provider_emulators import PROVIDERS, serving

# jsonb would give "tone, headline, description".
AUTHORED = {
    "type": "object",
    "properties": {
        "headline": {"type": "string"},
        "description": {"type": "string"},
        "tone": {"type": "string", "enum": ["warm", "plain"]},
    },
    "required": ["headline", "description", "tone"],
    "additionalProperties": False,
}
ORDER = ["headline", "description", "tone"]


def authored_prompt(task: str = "ordered") -> PromptVersion:
    """A version made as a person makes one, read back from the database."""
    prompt = create_prompt_version(
        task=task,
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=AUTHORED,
        rules={},
        max_output_tokens=600,
    )
    return PromptVersion.objects.get(pk=prompt.pk)


@pytest.mark.django_db
def test_a_schema_is_stored_and_read_back_in_its_authors_order():
    prompt = authored_prompt()

    assert list(prompt.output_schema["properties"]) == ORDER
    assert list(
        PromptVersion.objects.filter(pk=prompt.pk).values_list("output_schema", flat=True)[0]
    ) == list(AUTHORED)
    for dialect in Dialect:
        assert list(sent_schema(prompt.output_schema, dialect).schema["properties"]) == ORDER, dialect


@pytest.fixture
def emulator(request, settings, monkeypatch):
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    with serving(request.node.callspec.params["provider"], settings, monkeypatch, seed=5) as running:
        yield running


@pytest.mark.django_db
@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_every_provider_is_sent_the_schema_in_its_authors_order_and_answers_in_it(emulator, provider):
    """The emulator's model writes the properties in the order it was sent them, as a model does."""
    prompt = authored_prompt()
    job = JobFactory(task=prompt.task, prompt_version=prompt, provider=provider.name, model=provider.model)
    product = ProductFactory()
    Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    for _ in range(400):
        poll_everything()
        if job.items.filter(state=ItemState.AWAITING_REVIEW).exists():
            break

    [version] = GeneratedVersion.objects.filter(item__job=job)
    assert list(json.loads(version.content)) == ORDER


# --- versions stored before ------------------------------------------------------------------------

BEFORE = [("ledger", "0046_pilot_decision_accuracy")]
AFTER = [("ledger", "0047_output_schema_as_written")]


@pytest.fixture
def back_to_the_latest_schema():
    """The tests after this one, on this database, need every migration: put them all back."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_a_version_stored_as_jsonb_keeps_working_in_the_order_jsonb_gave_it(back_to_the_latest_schema):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    OldPrompt = executor.loader.project_state(BEFORE).apps.get_model("ledger", "PromptVersion")
    old = OldPrompt.objects.create(
        task="stored_before", version=1, system_message="s", template="{title}", output_schema=AUTHORED
    )

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)

    # Read as the schema stands at AFTER: columns later migrations add are not there yet.
    stored = PromptVersion.objects.defer("rejection_reasons").get(pk=old.pk)
    # The same schema; its order is jsonb's (shorter names first): nothing can recover the author's.
    assert stored.output_schema == AUTHORED
    assert list(stored.output_schema["properties"]) == ["tone", "headline", "description"]
    # It goes on sending what it sent before, and its drafts are checked as before.
    sent = sent_schema(stored.output_schema, Dialect.OPENAI_STRICT).schema
    assert list(sent["properties"]) == ["tone", "headline", "description"]
    checker = DraftChecker.of(stored)
    assert checker.check(json.dumps({"headline": "H", "description": "D", "tone": "warm"})).reasons == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_name = 'ledger_promptversion' AND column_name = 'output_schema'"
        )
        assert cursor.fetchone() == ("json",)
