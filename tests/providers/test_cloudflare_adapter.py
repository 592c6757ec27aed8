"""The Cloudflare Workers AI adapter against its emulator, over real HTTP; the apportioning of a
unit's usage over many shapes of answer."""

import json
import random

import httpx
import pytest

from ledger.emulators.clock import TestClock
from ledger.emulators.cloudflare import CloudflareEmulator
from ledger.providers import get_provider
from ledger.providers.base import (
    AnswerLost,
    Delivery,
    Finding,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnreadableLine,
)
from ledger.providers.cloudflare import (
    ENVELOPE,
    PAYLOAD_LIMIT,
    CloudflareBatchProvider,
    apportion,
    split_ref,
)
from ledger.states import ReasonCode

ACCOUNT = "smoke0123"
MODEL = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
TOKEN = "cf-token-Zq8wL3vN5xT1yR7u"
SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}


def requests(n: int, prefix: str = "bd", model: str = MODEL) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"{prefix}-{i}-1",
            model=model,
            system_message="You write product descriptions.",
            user_message=f"Write a description.\nTitle: Beech spoon {i}\nFacts:\n- material: beech\n- length: {20 + i} cm",
            output_schema=SCHEMA,
            max_output_tokens=300,
        )
        for i in range(n)
    ]


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with CloudflareEmulator(per_request_ms=1, queued_ms=10, seed=3, clock=clock) as running:
        yield running


@pytest.fixture
def provider(emulator, settings, monkeypatch):
    """Built as the ledger builds it: from settings and the environment."""
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "cloudflare": {**settings.PROVIDERS["cloudflare"], "base_url": emulator.base_url},
    }
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT)
    adapter = get_provider("cloudflare")
    yield adapter
    adapter.client.close()


def run_to_end(clock, provider, ref):
    """The unit's status once the emulator's clock has moved past its queue and every request."""
    clock.advance(seconds=60)
    status = provider.status(ref)
    assert status.ended, status
    return status


def shares(lines) -> tuple[int, int]:
    """Input and output tokens over the lines, each custom_id once (as the ledger records them)."""
    first = {}
    for line in lines:
        if isinstance(line, ResultLine):
            first.setdefault(line.custom_id, line)
    return sum(line.input_tokens for line in first.values()), sum(
        line.output_tokens for line in first.values()
    )


# --- the round trip ----------------------------------------------------------------------------


def test_submit_poll_and_read_results_matched_by_external_reference(clock, emulator, provider):
    sent = requests(12)
    ref = provider.submit(requests=sent, intent_key="bd_intent_1", metadata={"job": "j"})

    queued = provider.status(ref)
    clock.advance(ms=10)  # out of the queue: no request has run yet
    running = provider.status(ref)
    status = run_to_end(clock, provider, ref)
    lines = list(provider.results(ref))

    # The adapter built from settings and the environment reached this emulator, once.
    assert emulator.stats()["creates"] == 1
    assert (queued.provider_status, queued.ended) == ("queued", False)
    assert (running.provider_status, running.ended) == ("running", False)
    assert status.provider_status == "done" and not status.refused
    assert status.counts.as_dict() == {"total": 12, "succeeded": 12, "failed": 0}
    assert sorted(line.custom_id for line in lines) == sorted(r.custom_id for r in sent)
    assert all(isinstance(line, ResultLine) and line.succeeded and line.apportioned for line in lines)
    for line in lines:
        draft = json.loads(line.content)
        assert set(draft) == {"headline", "description"}
        assert f"Beech spoon {line.custom_id.split('-')[1]}" in draft["headline"] + draft["description"]
    # Our custom_ids travelled as external_reference: the emulator counts inferences by them.
    assert emulator.stats()["inferences"] == {r.custom_id: 1 for r in sent}


def test_the_reference_carries_the_model_needed_to_poll(provider):
    ref = provider.submit(requests=requests(1), intent_key="bd_intent", metadata={})

    model, request_id = split_ref(ref)

    assert ref == f"{MODEL}|{request_id}" and model == MODEL and len(ref) <= 128
    with pytest.raises(ProviderError) as raised:  # the same id under another model is not found
        provider.status(f"@cf/meta/llama-3.1-8b-instruct|{request_id}")
    assert raised.value.status == 404 and not raised.value.transient
    with pytest.raises(ProviderError) as raised:  # an adapter raises nothing else from a call
        provider.status(request_id)
    assert not raised.value.transient


def test_the_batch_usage_is_apportioned_and_its_total_kept_on_every_line(clock, emulator, provider):
    ref = provider.submit(requests=requests(7), intent_key="bd_usage", metadata={})
    run_to_end(clock, provider, ref)

    lines = list(provider.results(ref))
    again = list(provider.results(ref))

    total = lines[0].usage["unit_total"]
    assert total["prompt_tokens"] > 0 and total["completion_tokens"] > 0
    assert all(line.usage["unit_total"] == total and line.apportioned for line in lines)
    assert shares(lines) == (total["prompt_tokens"], total["completion_tokens"])
    assert all(
        line.usage["share"]
        == {
            "prompt_tokens": line.input_tokens,
            "completion_tokens": line.output_tokens,
            "total_tokens": line.input_tokens + line.output_tokens,
        }
        for line in lines
    )
    # Collecting twice gives the same shares.
    assert {line.custom_id: line.usage for line in again} == {line.custom_id: line.usage for line in lines}


def test_request_bytes_count_the_body_as_it_is_sent(emulator, settings, monkeypatch):
    sent_bodies = []
    client = httpx.Client(
        base_url=emulator.base_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        event_hooks={"request": [lambda request: sent_bodies.append(request.read())]},
    )
    adapter = CloudflareBatchProvider(client=client, account_id=ACCOUNT)
    sent = requests(5)
    sent[2] = InferenceRequest("bd-x-1", MODEL, "Système", "Titre : Cuillère — hêtre ✓", None, 50)

    adapter.submit(requests=sent, intent_key="bd_bytes", metadata={})

    # Each request's bytes and a comma, plus the envelope, less the comma the last one lacks.
    assert len(sent_bodies[0]) == sum(adapter.request_bytes(r) for r in sent) + len(ENVELOPE) - 1
    assert CloudflareBatchProvider.capabilities.max_bytes + len(ENVELOPE) == PAYLOAD_LIMIT


def test_a_unit_over_the_payload_limit_is_refused_permanently(provider):
    huge = InferenceRequest("bd-huge-1", MODEL, "s", "x" * PAYLOAD_LIMIT, None, 10)

    with pytest.raises(ProviderError) as raised:
        provider.submit(requests=[huge], intent_key="bd_huge", metadata={})

    assert raised.value.status == 413 and not raised.value.transient
    assert not isinstance(raised.value, AnswerLost)
    assert provider.request_bytes(huge) > provider.capabilities.max_bytes


def test_capabilities_say_what_cloudflare_cannot_do(provider):
    capabilities = provider.capabilities

    assert capabilities.finding == Finding.NOT_AT_ALL
    assert capabilities.can_cancel is False
    assert capabilities.delivery == Delivery.INLINE
    assert capabilities.usage_per_request is False
    assert 0 < capabilities.max_requests <= 10_000
    # Never "nothing found": that would let a lost unit be sent, and paid for, twice.
    with pytest.raises(NotImplementedError):
        provider.find_units(intent_key="bd_lost", sent_at=None, request_count=1)
    with pytest.raises(NotImplementedError):
        provider.cancel(f"{MODEL}|some-id")


# --- failures ----------------------------------------------------------------------------------


def test_failed_responses_arrive_classified(clock, emulator, provider):
    emulator.configure(fail_rate=1.0)
    ref = provider.submit(requests=requests(3), intent_key="bd_fail", metadata={})
    status = run_to_end(clock, provider, ref)

    lines = list(provider.results(ref))

    assert status.counts.as_dict() == {"total": 3, "succeeded": 0, "failed": 3}
    assert {
        (line.succeeded, line.error_code, line.reason, line.transient, line.http_status) for line in lines
    } == {(False, "3040", ReasonCode.RATE_LIMITED, True, 429)}
    assert all("data centers" in line.error_message for line in lines)
    assert emulator.stats()["inferences"] == {}


def test_a_request_the_model_cannot_take_fails_permanently(clock, emulator, provider):
    # Sent by hand: the adapter never sends an entry without messages.
    with httpx.Client(base_url=emulator.base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as raw:
        answer = raw.post(
            f"/accounts/{ACCOUNT}/ai/run/{MODEL}",
            params={"queueRequest": "true"},
            json={"requests": [{"max_tokens": 5, "external_reference": "bd-bad-1"}]},
        ).json()
    ref = f"{MODEL}|{answer['result']['request_id']}"
    run_to_end(clock, provider, ref)

    [line] = provider.results(ref)

    assert (line.custom_id, line.succeeded, line.error_code) == ("bd-bad-1", False, "5004")
    assert (line.reason, line.transient) == (ReasonCode.REQUEST_INVALID, False)


@pytest.mark.parametrize(
    ("error", "reason", "transient"),
    [
        ({"code": 3007, "message": "Request timeout"}, ReasonCode.TIMED_OUT, True),
        ({"code": 3008, "message": "Request was aborted"}, ReasonCode.TIMED_OUT, True),
        ({"code": 3040, "message": "No more data centers"}, ReasonCode.RATE_LIMITED, True),
        ({"code": 3036, "message": "daily free allocation used up"}, ReasonCode.RATE_LIMITED, False),
        ({"code": 5007, "message": "No such model"}, ReasonCode.REQUEST_INVALID, False),
        ({"code": 3006, "message": "Request is too large"}, ReasonCode.REQUEST_INVALID, False),
        ({"code": 9999, "message": "something new"}, ReasonCode.MODEL_FAILED, False),
        (None, ReasonCode.MODEL_FAILED, False),
    ],
)
def test_each_failure_code_is_classified(error, reason, transient):
    adapter = CloudflareBatchProvider(client=httpx.Client(), account_id=ACCOUNT)
    response = {"id": 0, "result": None, "success": False, "external_reference": "bd-1-1"}
    if error:
        response["errors"] = [error]

    [line] = adapter.read_responses([response], {})

    assert (line.succeeded, line.reason, line.transient) == (False, reason, transient)
    assert line.error_code == (str(error["code"]) if error else "error")


def test_a_success_without_a_response_is_unreadable_and_never_resent():
    adapter = CloudflareBatchProvider(client=httpx.Client(), account_id=ACCOUNT)

    [line] = adapter.read_responses([{"id": 0, "result": {}, "success": True, "external_reference": "a"}], {})

    assert (line.succeeded, line.reason, line.transient) == (False, ReasonCode.UNREADABLE_RESULT, False)


def test_responses_are_matched_by_external_reference_never_by_id_or_place():
    adapter = CloudflareBatchProvider(client=httpx.Client(), account_id=ACCOUNT)
    responses = [
        {"id": 0, "result": {"response": "for b"}, "success": True, "external_reference": "bd-b-1"},
        {"id": 0, "result": {"response": "for a"}, "success": True, "external_reference": "bd-a-1"},
        {"id": 1, "result": {"response": {"headline": "c"}}, "success": True, "external_reference": "bd-c-1"},
        {"id": 2, "result": {"response": "whose?"}, "success": True},
        {"id": 3, "result": {"response": "whose?"}, "success": True, "external_reference": None},
        "not even an object",
    ]

    lines = list(adapter.read_responses(responses, {"prompt_tokens": 9, "completion_tokens": 9}))

    matched = {line.custom_id: line.content for line in lines if isinstance(line, ResultLine)}
    assert matched == {"bd-b-1": "for b", "bd-a-1": "for a", "bd-c-1": '{"headline": "c"}'}
    unreadable = [line for line in lines if isinstance(line, UnreadableLine)]
    assert [line.line_number for line in unreadable] == [4, 5, 6]
    assert all("external_reference" in line.problem for line in unreadable)


def test_repeated_unknown_and_unreadable_responses_from_the_emulator(clock, emulator, provider):
    emulator.configure(duplicate_lines=1.0, unknown_lines=2, malformed_lines=3)
    sent = requests(4)
    ref = provider.submit(requests=sent, intent_key="bd_spoiled", metadata={})
    status = run_to_end(clock, provider, ref)

    lines = list(provider.results(ref))

    readable = [line for line in lines if isinstance(line, ResultLine)]
    assert sorted(line.custom_id for line in readable) == sorted(
        [r.custom_id for r in sent] * 2 + ["unknown-1", "unknown-2"]
    )
    assert len([line for line in lines if isinstance(line, UnreadableLine)]) == 3
    # Counted from the responses: each custom_id once, the unreadable ones not at all.
    assert status.counts.as_dict() == {"total": 6, "succeeded": 6, "failed": 0}
    total = readable[0].usage["unit_total"]
    assert shares(lines) == (total["prompt_tokens"], total["completion_tokens"])


def test_a_create_whose_answer_is_lost_is_reported_as_lost(emulator, provider):
    emulator.configure(lose_create_responses=[1])

    with pytest.raises(AnswerLost) as raised:
        provider.submit(requests=requests(2), intent_key="bd_lost", metadata={})

    assert raised.value.transient
    stats = emulator.stats()
    assert (stats["creates"], stats["units"]) == (1, 1)  # it was queued all the same


def test_a_create_answered_without_a_request_id_is_as_good_as_lost():
    def queued_but_unreadable(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"result": {"status": "queued"}, "success": True})

    client = httpx.Client(
        base_url="http://cf.test/client/v4", transport=httpx.MockTransport(queued_but_unreadable)
    )
    with pytest.raises(AnswerLost):
        CloudflareBatchProvider(client=client, account_id=ACCOUNT).submit(
            requests=requests(1), intent_key="bd_x", metadata={}
        )


def test_a_create_that_never_left_is_an_ordinary_error():
    client = httpx.Client(base_url="http://127.0.0.1:9/client/v4", headers={"Authorization": "Bearer t"})
    with pytest.raises(ProviderError) as raised:
        CloudflareBatchProvider(client=client, account_id=ACCOUNT).submit(
            requests=requests(1), intent_key="bd_x", metadata={}
        )
    assert not isinstance(raised.value, AnswerLost)


def test_429_is_transient_with_its_retry_after_and_nothing_is_queued(emulator, provider):
    emulator.configure(rate_limit_calls=1, retry_after=7)

    with pytest.raises(ProviderError) as raised:
        provider.submit(requests=requests(1), intent_key="bd_429", metadata={})

    assert (raised.value.status, raised.value.transient, raised.value.retry_after) == (429, True, 7)
    assert not isinstance(raised.value, AnswerLost)
    assert emulator.stats()["units"] == 0
    provider.submit(requests=requests(1), intent_key="bd_429", metadata={})  # the next one goes through


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_while_polling_are_transient(clock, emulator, provider, status):
    ref = provider.submit(requests=requests(1), intent_key="bd_5xx", metadata={})
    emulator.configure(server_errors=1, server_error_status=status)

    with pytest.raises(ProviderError) as raised:
        provider.status(ref)

    assert (raised.value.status, raised.value.transient) == (status, True)
    assert run_to_end(clock, provider, ref).ended


def test_missing_account_id_is_said_plainly(emulator, settings, monkeypatch):
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "cloudflare": {**settings.PROVIDERS["cloudflare"], "base_url": emulator.base_url},
    }
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.delenv("CLOUDFLARE_ACCOUNT_ID", raising=False)

    with pytest.raises(ProviderError, match="account id"):
        get_provider("cloudflare").submit(requests=requests(1), intent_key="bd_x", metadata={})
    assert emulator.stats()["creates"] == 0


# --- credentials -------------------------------------------------------------------------------


def test_the_token_never_appears_in_what_is_kept():
    def echo(request: httpx.Request) -> httpx.Response:
        said = f"bad call with {request.headers['authorization']} (token {TOKEN})"
        return httpx.Response(
            400, json={"result": None, "success": False, "errors": [{"code": 3003, "message": said}]}
        )

    client = httpx.Client(
        base_url="http://cf.test/client/v4",
        headers={"Authorization": f"Bearer {TOKEN}"},
        transport=httpx.MockTransport(echo),
    )
    adapter = CloudflareBatchProvider(client=client, account_id=ACCOUNT)
    with pytest.raises(ProviderError) as raised:
        adapter.submit(requests=requests(1), intent_key="bd_x", metadata={})
    failed = {
        "id": 0,
        "success": False,
        "external_reference": "a",
        "errors": [{"code": 1, "message": f"k={TOKEN}"}],
    }
    unreadable = {"id": 1, "success": True, "result": {"response": f"Bearer {TOKEN}"}}

    kept = [
        str(raised.value),
        *(
            getattr(line, "error_message", "") or line.text
            for line in adapter.read_responses([failed, unreadable], {})
        ),
    ]

    assert len(kept) == 3 and all(TOKEN not in text for text in kept)


def test_the_token_never_appears_in_a_transport_error(emulator, provider):
    emulator.configure(lose_create_responses=[1])
    with pytest.raises(AnswerLost) as raised:
        provider.submit(requests=requests(1), intent_key="bd_x", metadata={})
    assert TOKEN not in str(raised.value)


# --- apportioning ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_apportioned_shares_sum_exactly_to_the_total(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 1, 2, 3, 7, 50, 333])
    total = rng.choice([0, 1, n - 1, n, n + 1, rng.randrange(10**6), 10**12 + 7])
    weights = {f"bd-{i}-1": rng.choice([0, 0, 1, rng.randrange(1, 10**4)]) for i in range(n)}

    result = apportion(total, weights)

    assert set(result) == set(weights)
    assert sum(result.values()) == total
    weight_sum = sum(weights.values()) or n
    for key, share in result.items():
        exact = total * (weights[key] if sum(weights.values()) else 1) / weight_sum
        assert share >= 0 and abs(share - exact) < 1


def test_apportioning_edge_cases():
    assert apportion(10, {}) == {}
    assert apportion(0, {"a": 5, "b": 0}) == {"a": 0, "b": 0}
    assert apportion(7, {"only": 0}) == {"only": 7}
    assert apportion(5, {"b": 0, "a": 0}) == {"a": 3, "b": 2}  # equal; the spare token to the smaller id
    assert apportion(10, {"a": 1, "b": 3}) == {"a": 3, "b": 7}  # 2.5 and 7.5: the spare token to "a"


def response(ref, text, success=True):
    if success:
        return {"id": 0, "result": {"response": text}, "success": True, "external_reference": ref}
    return {"id": 0, "result": None, "success": False, "external_reference": ref, "errors": [{"code": 3040}]}


@pytest.mark.parametrize(
    ("responses", "usage"),
    [
        ([response("a", "one")], {"prompt_tokens": 13, "completion_tokens": 4, "total_tokens": 17}),
        ([response("a", "one")], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
        ([response(f"r{i}", "x" * i) for i in range(10)], {"prompt_tokens": 101, "completion_tokens": 997}),
        ([response(f"r{i}", "") for i in range(3)], {"prompt_tokens": 2, "completion_tokens": 5}),
        (
            [response("a", "long text here"), response("b", "", success=False)],
            {"prompt_tokens": 9, "completion_tokens": 3},
        ),
        (
            [response("a", "", success=False), response("b", "", success=False)],
            {"prompt_tokens": 9, "completion_tokens": 1},
        ),
        (
            [response("a", "abc"), response("a", "abc"), response("b", "de"), {"id": 9}],
            {"prompt_tokens": 7, "completion_tokens": 11},
        ),
        ([response("a", "abc")] * 3, {}),
    ],
)
def test_shares_of_whole_answers_sum_exactly_to_the_batch_usage(responses, usage):
    adapter = CloudflareBatchProvider(client=httpx.Client(), account_id=ACCOUNT)

    lines = list(adapter.read_responses(responses, usage))
    shuffled = list(responses)
    random.Random(1).shuffle(shuffled)
    reordered = list(adapter.read_responses(shuffled, usage))

    assert shares(lines) == (usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))
    assert all(
        line.apportioned and line.usage["unit_total"] == usage
        for line in lines
        if isinstance(line, ResultLine)
    )
    # Order never changes a share.
    assert {line.custom_id: line.usage for line in reordered if isinstance(line, ResultLine)} == {
        line.custom_id: line.usage for line in lines if isinstance(line, ResultLine)
    }


def test_failed_responses_carry_no_share_while_some_succeeded():
    adapter = CloudflareBatchProvider(client=httpx.Client(), account_id=ACCOUNT)

    lines = {
        line.custom_id: line
        for line in adapter.read_responses(
            [response("a", "x" * 30), response("b", "x" * 10), response("c", "", success=False)],
            {"prompt_tokens": 10, "completion_tokens": 8},
        )
    }

    assert (lines["a"].input_tokens, lines["a"].output_tokens) == (5, 6)
    assert (lines["b"].input_tokens, lines["b"].output_tokens) == (5, 2)
    assert (lines["c"].input_tokens, lines["c"].output_tokens) == (0, 0)
    assert lines["c"].usage["unit_total"] == {"prompt_tokens": 10, "completion_tokens": 8}
