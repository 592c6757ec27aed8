"""A draft is read as its provider was asked for it (SPEC rule 19): the strict dialect sends each
property the schema leaves optional as required-or-null, so a null there is the property left out,
at every depth; a null the author allowed is kept; a null where the schema needs a value is still
refused. Each provider's emulator answers in every shape its dialect allows (each property written,
null wherever the sent schema takes null, left out wherever it is not required), sent and collected
over real HTTP by the collector's round."""

import json

import jsonschema
import pytest
from django.test import Client
from django.utils.html import escape

from ledger.actions.prompts import create_prompt_version
from ledger.actions.reviewing import EditRefused, approve_version
from ledger.bootstrap import DEFAULT_PROMPT
from ledger.drafts.schema_dialects import Dialect, answer_reader, sent_schema
from ledger.drafts.validation import DraftChecker
from ledger.models import Approval, GeneratedVersion, Item
from ledger.providers import schema_dialect
from ledger.states import DraftNote, ItemState, ReasonCode
from tests.collector import poll_everything
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version
from tests.provider_emulators import PROVIDERS, serving

pytestmark = pytest.mark.django_db

# Optional properties (an enum, one the author made nullable, an object), an optional property
# inside a required object and inside an optional one, and optional properties of an array's items.
SCHEMA = {
    "type": "object",
    "properties": {
        "headline": {"type": "string", "maxLength": 120},
        "description": {"type": "string", "minLength": 20},
        "tone": {"type": "string", "enum": ["warm", "plain"]},
        "subtitle": {"type": ["string", "null"]},
        "dimensions": {
            "type": "object",
            "properties": {
                "width_cm": {"type": "number"},
                "unit": {"enum": ["cm", "mm"]},
                "note": {"type": "string"},
            },
            "required": ["width_cm"],
            "additionalProperties": False,
        },
        "material": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "finish": {"enum": ["oiled", "raw"]}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "bullets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "emphasis": {"enum": ["bold", "none"]}},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["headline", "description", "material", "bullets"],
    "additionalProperties": False,
}
EVERY_PROPERTY = ["headline", "description", "tone", "subtitle", "dimensions", "material", "bullets"]
STRICT = {provider.name for provider in PROVIDERS if schema_dialect(provider.name) == Dialect.OPENAI_STRICT}
SETTLED = {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED, ItemState.INFERENCE_FAILED}


def test_the_strict_providers_are_the_openai_protocol_ones():
    assert STRICT == {"emulator", "openai", "openai_compatible"}


@pytest.fixture
def emulator(request, settings, monkeypatch):
    """The emulator of the provider under test (the `provider` parameter), BatchDesk pointed at it."""
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    with serving(request.node.callspec.params["provider"], settings, monkeypatch, seed=5) as running:
        yield running


def collected_drafts(provider, schema: dict = SCHEMA, n: int = 2) -> list[GeneratedVersion]:
    """A job of a prompt version with `schema` (stored as a person makes one), sent to the provider
    and collected until every item has settled; its drafts."""
    prompt = create_prompt_version(
        task="described_parts",
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=schema,
        rules={},
        max_output_tokens=600,
    )
    job = JobFactory(
        task=prompt.task, prompt_version=prompt, provider=provider.name, model=provider.model, unit_size=n
    )
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    for _ in range(400):
        poll_everything()
        if set(job.items.counts_by_state()) <= SETTLED:
            break
    assert job.items.counts_by_state() == {ItemState.AWAITING_REVIEW: n}, [
        item.reason for item in job.items.all()
    ]
    return list(GeneratedVersion.objects.filter(item__job=job).order_by("pk"))


def as_stored(version: GeneratedVersion) -> dict:
    """A draft's content: what the author's schema describes, in the author's order."""
    content = json.loads(version.content)
    assert jsonschema.Draft202012Validator(SCHEMA).is_valid(content)
    return content


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_every_property_written_is_kept_as_written(emulator, provider):
    for version in collected_drafts(provider):
        content = as_stored(version)
        assert list(content) == EVERY_PROPERTY
        assert content["tone"] == "warm" and content["dimensions"]["unit"] == "cm"
        assert version.validation_notes == [] and version.raw_output == ""


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_a_null_the_strict_dialect_asked_for_is_read_as_left_out_and_the_authors_null_is_kept(
    emulator, provider
):
    emulator.configure(optional_properties="null")

    for version in collected_drafts(provider):
        content = as_stored(version)
        # The author made `subtitle` nullable: its null is kept, whatever the dialect.
        assert content["subtitle"] is None
        if provider.name not in STRICT:
            # Sent the schema as it is (or Gemini's subset): nothing else could be null.
            assert list(content) == EVERY_PROPERTY
            assert version.validation_notes == []
            continue
        # Strict mode asked for every optional property as required-or-null, at every depth.
        answer = json.loads(version.raw_output)
        assert answer["tone"] is None and answer["dimensions"] is None
        assert answer["material"]["finish"] is None
        assert {bullet["emphasis"] for bullet in answer["bullets"]} == {None}
        assert list(content) == ["headline", "description", "subtitle", "material", "bullets"]
        assert content["material"] == {"name": answer["material"]["name"]}
        assert content["bullets"] == [{"text": bullet["text"]} for bullet in answer["bullets"]]
        assert version.validation_notes == [DraftNote.NULLS_READ_AS_LEFT_OUT]
        assert version.valid is True


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_an_optional_property_left_out_is_absent_where_the_dialect_allows_it(emulator, provider):
    emulator.configure(optional_properties="left_out")

    for version in collected_drafts(provider):
        content = as_stored(version)
        if provider.name in STRICT:
            # Strict mode requires every property: the model cannot leave one out.
            assert list(content) == EVERY_PROPERTY
            continue
        assert list(content) == ["headline", "description", "material", "bullets"]
        assert list(content["material"]) == ["name"]
        assert all(list(bullet) == ["text"] for bullet in content["bullets"])


@pytest.mark.parametrize("provider", [PROVIDERS[0]], ids=str)
def test_a_draft_read_so_is_shown_approved_and_published_as_the_schema_describes_it(
    emulator, provider, operator
):
    emulator.configure(optional_properties="null")
    version = collected_drafts(provider, n=1)[0]
    assert "null" in version.raw_output.replace('"subtitle": null', "")
    screens = Client()
    screens.force_login(operator)
    page = screens.get(f"/items/{version.item_id}/").content.decode()
    assert DraftNote.NULLS_READ_AS_LEFT_OUT.label in page
    assert escape(version.content) in page

    approve_version(
        item_id=version.item_id,
        version_id=version.pk,
        version_hash=version.content_hash,
        approver=UserFactory(roles=["catalogue_owner"]),
    )

    final = Approval.objects.get(version=version).final_content
    assert final == version.content and json.loads(final) == as_stored(version)


# --- the reading itself, at every depth the dialect reaches ----------------------------------------


def strict_checker(schema: dict = SCHEMA, rules: dict | None = None) -> DraftChecker:
    return DraftChecker(schema, rules or {}, Dialect.OPENAI_STRICT)


COMPLETE = {
    "headline": "Oak board",
    "description": "A solid oak chopping board.",
    "tone": "warm",
    "subtitle": "Oiled by hand",
    "dimensions": {"width_cm": 40, "unit": "cm", "note": "oiled"},
    "material": {"name": "oak", "finish": "oiled"},
    "bullets": [{"text": "Solid oak", "emphasis": "bold"}],
}


def test_a_null_where_the_schema_needs_a_value_is_still_refused():
    for where, answer in [
        ("headline", {**COMPLETE, "headline": None}),
        ("material/name", {**COMPLETE, "material": {"name": None}}),
        ("dimensions/width_cm", {**COMPLETE, "dimensions": {"width_cm": None, "unit": None}}),
        ("bullets/0/text", {**COMPLETE, "bullets": [{"text": None, "emphasis": None}]}),
        ("material", {**COMPLETE, "material": None}),
    ]:
        checked = strict_checker().check(json.dumps(answer))

        assert [reason.code for reason in checked.reasons] == [ReasonCode.SCHEMA_MISMATCH], where
        assert checked.reasons[0].startswith(f"Does not match the output schema at {where}: must be "), (
            checked.reasons
        )
        assert checked.reasons[0].endswith("(got null)")


def test_only_the_strict_dialect_reads_a_null_as_left_out():
    answer = json.dumps({**COMPLETE, "tone": None})

    assert strict_checker().check(answer).reasons == []
    for dialect in (Dialect.AS_IS, Dialect.GEMINI):
        # Nothing asked for that null: it breaks the schema.
        [reason] = DraftChecker(SCHEMA, {}, dialect).check(answer).reasons
        assert reason.code == ReasonCode.SCHEMA_MISMATCH and reason.startswith(
            "Does not match the output schema at tone:"
        )


def test_a_draft_without_a_null_to_read_is_the_answer_itself():
    complete = json.dumps(COMPLETE)
    checked = strict_checker().check(complete)
    assert (checked.text, checked.notes) == (complete, [])
    # Nothing optional in the schema, nothing to read: no reader at all.
    all_required = DEFAULT_PROMPT["output_schema"]
    assert answer_reader(all_required, Dialect.OPENAI_STRICT, None) is None
    assert answer_reader(SCHEMA, Dialect.AS_IS, None) is None


def test_a_text_field_answered_null_is_no_text():
    for text_field in ("subtitle", "tone"):  # the author's null, and one the dialect asked for
        checked = strict_checker(rules={"text_field": text_field, "min_length": 1}).check(
            json.dumps({**COMPLETE, text_field: None})
        )
        assert checked.text == "" and [reason.code for reason in checked.reasons] == [ReasonCode.TOO_SHORT]


REFERENCES = {
    "type": "object",
    "$defs": {
        "size": {
            "type": "object",
            "properties": {"width": {"type": "number"}, "unit": {"enum": ["cm", "mm"]}},
            "required": ["width"],
        },
        "part": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "parts": {"type": "array", "items": {"$ref": "#/$defs/part"}},
            },
            "required": ["name"],
        },
    },
    "properties": {
        "size": {"$ref": "#/$defs/size"},
        "assembly": {"$ref": "#/$defs/part"},
        "either": {
            "anyOf": [
                {"type": "object", "properties": {"kg": {"type": "number"}}, "required": ["kg"]},
                {
                    "type": "object",
                    "properties": {"lb": {"type": "number"}, "note": {"type": "string"}},
                    "required": ["lb"],
                },
            ]
        },
    },
    "required": ["size", "assembly", "either"],
}


def test_references_recursion_and_unions_are_read_as_strict_mode_was_sent_them():
    sent = sent_schema(REFERENCES, Dialect.OPENAI_STRICT).schema
    answer = {
        "size": {"width": 3, "unit": None},
        "assembly": {"name": "board", "parts": [{"name": "leg", "parts": None}]},
        "either": {"lb": 2, "note": None},
    }
    assert jsonschema.Draft202012Validator(sent).is_valid(answer)  # what strict mode could answer

    checked = DraftChecker(REFERENCES, {}, Dialect.OPENAI_STRICT).check(json.dumps(answer))

    assert (json.loads(checked.text), checked.reasons, checked.notes) == (
        {
            "size": {"width": 3},
            "assembly": {"name": "board", "parts": [{"name": "leg"}]},
            "either": {"lb": 2},
        },
        [],
        [DraftNote.NULLS_READ_AS_LEFT_OUT],
    )


def test_a_reference_that_loops_or_points_nowhere_never_stops_the_reading():
    looping = {
        "type": "object",
        "$defs": {"loop": {"$ref": "#/$defs/loop"}},
        "properties": {"odd": {"$ref": "#/$defs/loop"}, "gone": {"$ref": "#/$defs/nowhere"}},
    }
    checker = DraftChecker(looping, {}, Dialect.OPENAI_STRICT)
    for answer in ({"odd": None}, {"odd": {"deeper": None}}, {"gone": "x"}):
        # Refused with a reason, like any draft the schema cannot judge: never an exception.
        checked = checker.check(json.dumps(answer))
        assert [reason.code for reason in checked.reasons] == [ReasonCode.SCHEMA_MISMATCH], answer
    # A null for an optional property whose schema cannot say whether it takes null: left out.
    assert checker.check(json.dumps({"gone": None})) == ("{}", [], [], [DraftNote.NULLS_READ_AS_LEFT_OUT])


# --- an edit is a person's text, judged by the schema as it is -------------------------------------


def test_an_edit_is_judged_by_the_authors_schema_and_a_null_written_in_it_is_refused():
    prompt = create_prompt_version(
        task="edited_parts",
        system_message="s",
        template=DEFAULT_PROMPT["template"],
        output_schema=SCHEMA,
        rules={},
        max_output_tokens=600,
    )
    item = ItemFactory(awaiting_review=True, job=JobFactory(task=prompt.task, prompt_version=prompt))
    version = add_version(item, json.dumps(COMPLETE))
    owner = UserFactory(roles=["catalogue_owner"])

    with pytest.raises(EditRefused) as refused:
        approve_version(
            item_id=item.pk,
            version_id=version.pk,
            version_hash=version.content_hash,
            approver=owner,
            content=json.dumps({**COMPLETE, "tone": None}),
        )
    assert refused.value.reasons == ["Does not match the output schema at tone: must be a string (got null)"]

    edited = json.dumps({key: value for key, value in COMPLETE.items() if key != "tone"})
    approve_version(
        item_id=item.pk,
        version_id=version.pk,
        version_hash=version.content_hash,
        approver=owner,
        content=edited,
    )
    assert Approval.objects.get(version=version).final_content == edited
