"""Answers are read as each provider writes them (reference/providers.md §1.7, §2, §4, §5, §8): an
answer cut off at the output-token limit, a refusal, JSON in a Markdown code fence and plain prose,
each produced by the emulator of the provider's own wire protocol (its answer knobs), sent and
collected over real HTTP by the collector's round as a worker runs it."""

import pytest
from django.test import Client

from ledger.emulators.textgen import REFUSAL
from ledger.models import GeneratedVersion, Item
from ledger.states import DraftNote, ItemState, ReasonCode
from tests.api.conftest import ApiClient, token_for
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory
from tests.provider_emulators import PROVIDERS, serving

pytestmark = pytest.mark.django_db

# Workers AI's text output has no stop reason and no refusal field (providers.md §3): a cut-off or
# refused answer is only its text there, which is not the JSON the prompt asked for.
SAYS_HOW_IT_STOPPED = [provider for provider in PROVIDERS if provider.name != "cloudflare"]
CLOUDFLARE = [provider for provider in PROVIDERS if provider.name == "cloudflare"]
# What each protocol's refusal leaves to read: the model's words, or the filter's word for them.
REFUSAL_SHOWN = {"gemini": "SAFETY"}
SETTLED = {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED, ItemState.INFERENCE_FAILED}


@pytest.fixture
def emulator(request, settings, monkeypatch):
    """The emulator of the provider under test (the `provider` parameter), BatchDesk pointed at it."""
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    with serving(request.node.callspec.params["provider"], settings, monkeypatch, seed=5) as running:
        yield running


def job_with_items(provider, n: int = 3):
    job = JobFactory(provider=provider.name, model=provider.model, unit_size=n)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def settle(job, rounds_after: int = 3) -> dict:
    """Collector rounds until every item has settled, then a few more: nothing retries by itself."""
    for _ in range(400):
        poll_everything()
        if set(job.items.counts_by_state()) <= SETTLED:
            break
    else:
        raise AssertionError(f"not settled: {job.items.counts_by_state()}")
    for _ in range(rounds_after):
        poll_everything()
    return job.items.counts_by_state()


@pytest.mark.parametrize("provider", SAYS_HOW_IT_STOPPED, ids=str)
def test_an_answer_cut_off_at_the_token_limit_is_truncated_kept_and_not_retried(emulator, provider):
    emulator.configure(truncate_rate=1.0)
    job = job_with_items(provider)

    assert settle(job) == {ItemState.VALIDATION_FAILED: 3}

    for item in job.items.all():
        assert item.reason_code == ReasonCode.TRUNCATED
        assert "max_output_tokens" in item.reason
        # The cut-off draft is kept as evidence (its tokens were paid for), and not sent again.
        [version] = item.versions.all()
        assert version.valid is False and version.answer
        assert item.inference_attempt == 1
    assert set(emulator.stats()["inferences"].values()) == {1}


@pytest.mark.parametrize("provider", SAYS_HOW_IT_STOPPED, ids=str)
def test_a_refusal_is_refused_by_model_with_its_words_and_not_retried(emulator, provider):
    emulator.configure(refuse_rate=1.0)
    job = job_with_items(provider)

    assert settle(job) == {ItemState.INFERENCE_FAILED: 3}

    shown = REFUSAL_SHOWN.get(provider.name, REFUSAL)
    for item in job.items.all():
        assert item.reason_code == ReasonCode.REFUSED_BY_MODEL
        assert shown in item.reason
        [failure] = item.events.filter(to_state=ItemState.INFERENCE_FAILED)
        assert failure.data["transient"] is False and shown in failure.reason
        assert not item.versions.exists()
        assert item.inference_attempt == 1
    assert set(emulator.stats()["inferences"].values()) == {1}


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_json_in_a_code_fence_is_read_without_the_fence_and_the_version_notes_it(emulator, provider):
    emulator.configure(fence_rate=1.0)
    job = job_with_items(provider)

    assert settle(job) == {ItemState.AWAITING_REVIEW: 3}

    for version in GeneratedVersion.objects.filter(item__job=job):
        assert version.valid is True
        assert version.raw_output.startswith("```json\n")
        assert "```" not in version.content
        assert version.validation_notes == [DraftNote.READ_FROM_CODE_FENCE]


@pytest.mark.parametrize("provider", PROVIDERS, ids=str)
def test_an_answer_in_prose_is_still_not_the_json_asked_for(emulator, provider):
    emulator.configure(prose_rate=1.0)
    job = job_with_items(provider)

    assert settle(job) == {ItemState.VALIDATION_FAILED: 3}

    assert set(job.items.values_list("reason_code", flat=True)) == {ReasonCode.NOT_JSON}
    assert not GeneratedVersion.objects.filter(item__job=job).exclude(validation_notes=[]).exists()


@pytest.mark.parametrize("provider", CLOUDFLARE, ids=str)
@pytest.mark.parametrize("knob", ["truncate_rate", "refuse_rate"])
def test_workers_ai_says_neither_cut_off_nor_refused_so_such_an_answer_is_not_json(emulator, provider, knob):
    emulator.configure(**{knob: 1.0})
    job = job_with_items(provider)

    assert settle(job) == {ItemState.VALIDATION_FAILED: 3}

    assert set(job.items.values_list("reason_code", flat=True)) == {ReasonCode.NOT_JSON}


@pytest.mark.parametrize("provider", [PROVIDERS[0]], ids=str)
def test_the_screens_and_the_api_show_the_new_reasons_and_the_fence_note_in_words(
    emulator, provider, operator
):
    emulator.configure(fence_rate=1.0)
    fenced = job_with_items(provider, 1)
    settle(fenced)
    emulator.configure(fence_rate=0.0, truncate_rate=1.0)
    truncated = job_with_items(provider, 1)
    settle(truncated)
    emulator.configure(truncate_rate=0.0, refuse_rate=1.0)
    refused = job_with_items(provider, 1)
    settle(refused)
    [version] = GeneratedVersion.objects.filter(item__job=fenced)

    api = ApiClient(token_for(operator)).get(f"/api/items/{version.item_id}").json()
    assert api["versions"][0]["validation"] == {
        "valid": True,
        "reasons": [],
        "notes": [DraftNote.READ_FROM_CODE_FENCE],
    }
    screens = Client()
    screens.force_login(operator)
    page = screens.get(f"/items/{version.item_id}/").content.decode()
    assert DraftNote.READ_FROM_CODE_FENCE.label in page
    # The operations page groups the failures by their code, in its words.
    operations = screens.get("/operations/").content.decode()
    assert ReasonCode.REFUSED_BY_MODEL.label in operations
    assert ReasonCode.TRUNCATED.label.replace("'", "&#x27;") in operations
