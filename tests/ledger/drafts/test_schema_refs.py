"""Nothing a catalogue owner types reaches out (issue 17, point 4): an output schema's `$ref` may
only point inside the schema, and the validator never retrieves anything, even for a schema stored
before that rule. Checked against a real HTTP server that records every request it gets."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest
from django.urls import reverse

from ledger.actions.collecting import poll_submission
from ledger.actions.core import NotAllowed
from ledger.actions.prompts import create_prompt_version
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.bootstrap import DEFAULT_PROMPT
from ledger.drafts.validation import DraftChecker
from ledger.models import Item, PromptVersion, Submission
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.factories import JobFactory, ProductFactory

pytestmark = pytest.mark.django_db


class RecordingServer:
    """An HTTP server on this machine that answers every GET with a schema any string passes, and
    remembers the paths it was asked for."""

    def __init__(self):
        self.paths: list[str] = []
        recorded = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                recorded.append(self.path)
                body = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/schema+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def server():
    with RecordingServer() as running:
        yield running


def schema_referring_to(ref: str) -> dict:
    return {
        "type": "object",
        "properties": {"headline": {"$ref": ref}, "description": {"type": "string"}},
        "required": ["headline", "description"],
    }


def make_version(schema: dict) -> PromptVersion:
    return create_prompt_version(
        task="product_description",
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=schema,
        rules={"text_field": "description"},
        max_output_tokens=300,
    )


def test_the_server_would_be_fetched_by_jsonschema_left_to_itself(server):
    """What the rule guards against: jsonschema's default registry fetches a remote $ref."""
    schema = schema_referring_to(f"{server.url}/headline.json")
    with pytest.warns(DeprecationWarning):
        jsonschema.validators.validator_for(schema)(schema).is_valid({"headline": "x", "description": "y"})
    assert server.paths == ["/headline.json"]


@pytest.mark.parametrize(
    "ref",
    [
        "{server}/headline.json",
        "file:///etc/passwd",
        "headline.json",
        "urn:example:headline",
        "//127.0.0.1/headline.json",
        "#headline",
    ],
)
def test_a_reference_outside_the_schema_is_refused_when_the_version_is_made(server, ref):
    ref = ref.format(server=server.url)
    with pytest.raises(NotAllowed) as refused:
        make_version(schema_referring_to(ref))

    assert "refers outside itself" in str(refused.value) and ref in str(refused.value)
    assert PromptVersion.objects.count() == 1  # the default prompt only
    assert server.paths == []


def test_a_dynamic_reference_outside_the_schema_is_refused_too(server):
    schema = {"type": "object", "properties": {"headline": {"$dynamicRef": f"{server.url}/h.json"}}}
    with pytest.raises(NotAllowed, match="refers outside itself"):
        make_version(schema)
    assert server.paths == []


def test_a_reference_inside_the_schema_to_nothing_is_refused():
    with pytest.raises(NotAllowed, match='refers to "#/\\$defs/headline", which is nowhere inside it'):
        make_version(schema_referring_to("#/$defs/headline"))


def test_references_inside_the_schema_are_accepted():
    schema = {
        "type": "object",
        "$defs": {"line": {"type": "string", "maxLength": 120}},
        "properties": {
            "headline": {"$ref": "#/$defs/line"},
            "description": {"type": "string"},
            "same": {"$ref": "#"},
        },
        "required": ["headline", "description"],
        # Data is not a reference: an example holding "$ref" is never followed.
        "examples": [{"$ref": "http://example.com/not-a-schema"}],
    }
    assert make_version(schema).output_schema == schema


def test_the_new_version_form_shows_the_refusal_and_makes_nothing(client, owner, server):
    v1 = PromptVersion.objects.get(task="product_description", version=1)
    client.force_login(owner)
    data = {
        "task": v1.task,
        "system_message": v1.system_message,
        "template": v1.template,
        "output_schema": json.dumps(schema_referring_to(f"{server.url}/headline.json")),
        "rules": json.dumps(v1.rules),
        "max_output_tokens": str(v1.max_output_tokens),
    }

    response = client.post(f"{reverse('prompt_new')}?from={v1.pk}", data)

    assert response.status_code == 400
    errors = response.context["form"].errors["output_schema"]
    assert any("a $ref may only point inside the schema" in error for error in errors), errors
    assert PromptVersion.objects.count() == 1
    assert server.paths == []


def stored_before_the_rule(schema: dict) -> PromptVersion:
    """A version saved before references were checked: straight into the table."""
    return PromptVersion.objects.create(
        task="product_description",
        version=2,
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=schema,
        rules={"text_field": "description"},
        max_output_tokens=300,
    )


@pytest.mark.parametrize("where", ["{server}/headline.json", "file:///etc/passwd", "#/$defs/nowhere"])
def test_a_stored_reference_is_never_fetched_and_fails_the_draft_with_a_reason(server, where):
    schema = schema_referring_to(where.format(server=server.url))
    checker = DraftChecker(schema, {"text_field": "description"})

    checked = checker.check(json.dumps({"headline": "Oak board", "description": "A solid oak board."}))

    assert [reason.code for reason in checked.reasons] == [ReasonCode.SCHEMA_MISMATCH]
    assert (
        "cannot be followed" in checked.reasons[0]
        and "nothing outside it is ever fetched" in checked.reasons[0]
    )
    assert server.paths == []


def test_collecting_drafts_for_a_stored_outside_reference_fetches_nothing_and_finishes(
    server, clock, emulator, provider
):
    # A server that takes the schema as it is (OpenAI itself refuses a request whose strict schema
    # points outside, as the emulator does by default): the drafts reach the ledger's check.
    emulator.configure(strict_schemas=False)
    prompt = stored_before_the_rule(schema_referring_to(f"{server.url}/headline.json"))
    job = JobFactory(prompt_version=prompt)
    for _ in range(3):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id, provider=provider)

    for _ in range(200):
        poll_submission(submission_id, provider=provider)
        if Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED:
            break
        clock.advance(ms=50)

    assert Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED
    items = Item.objects.filter(job=job)
    assert {item.state for item in items} == {ItemState.VALIDATION_FAILED}
    assert all("cannot be followed" in item.reason for item in items)
    assert server.paths == []
