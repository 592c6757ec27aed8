"""A hostile answer fails alone (issue 17, point 2). The OpenAI emulator serves a results file that
Hypothesis writes, line by line, from good drafts and the worst a provider could return: NUL and
lone surrogates in drafts and errors, token counts no column holds, answers larger than the ledger
keeps, nesting deeper than Python reads, values of the wrong type anywhere, half lines, bytes that
are not UTF-8, repeated and unknown custom_ids. The real collection (`collect_submission`, chunks
of three recorded by the overlapping recorders, COPY into PostgreSQL) records it; whatever the
file holds, nothing is raised, every item is in exactly one state, every good line is recorded as
it would be alone, and every bad line is a failure or an anomaly of its own."""

import json
import math

import httpx
import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ledger.actions.collecting import collect_submission
from ledger.emulators.openai import Emulator
from ledger.models import Event, GeneratedVersion, Item, Submission, SubmissionItem
from ledger.providers.base import InferenceRequest
from ledger.providers.openai import OpenAIBatchProvider, request_line
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.factories import JobFactory, ProductFactory

pytestmark = pytest.mark.django_db(transaction=True)

# A key the provider echoes back: configured, so it must appear in no row afterwards.
API_KEY = "sk-proj-Hx7Qm2Vz9Lr4Tb8Wc3Nd6Kf1Yg5Js0Pa"
MOST_BYTES = 4096  # BATCHDESK_MAX_ANSWER_BYTES for these tests: a "huge" answer stays cheap to make
PRODUCTS = 6
GOOD = {
    "headline": "Oak chopping board",
    "description": "A chopping board made from oak. It measures 40 x 25 cm and is ready for daily use.",
}


def draft(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def success_line(custom_id, content, *, usage=None, status_code=200) -> dict:
    usage = {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140} if usage is None else usage
    return {
        "id": "batch_req_1",
        "custom_id": custom_id,
        "response": {
            "status_code": status_code,
            "request_id": "req_1",
            "body": {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            },
        },
        "error": None,
    }


def error_line(custom_id, code, message) -> dict:
    return {
        "id": "batch_req_2",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def as_line(value: dict) -> bytes:
    """One JSONL line as a provider writes it: non-ASCII escaped, so a lone surrogate is `\\ud800`."""
    return json.dumps(value).encode()


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"more": [value]}
    return value


# Text of any kind a provider might return, NUL, lone surrogates and line separators included.
nasty_text = st.text(
    alphabet=st.one_of(
        st.characters(codec=None),
        st.sampled_from(["\x00", "\ud800", "\udfff", "\u2028", "\n", "\r", "\t", "\\", '"', "\ufeff"]),
    ),
    max_size=40,
)
# Token counts no integer column holds, as numbers and as text.
huge_numbers = st.sampled_from([1e30, 10**30, "1e30", 2**31, 2**63, 2**64 + 1, 1e308])
wrong_types = st.sampled_from([None, 42, 1.5, True, [], ["a"], {}, {"text": "x"}])


# Each story: (what the file holds for one request, what the ledger must make of it). The outcome
# is (state, reason code, kept draft) or a set of states a random answer may lead to.
@st.composite
def story(draw):
    kind = draw(
        st.sampled_from(
            [
                "good",
                "nul in draft",
                "surrogate in draft",
                "escaped nul in the text field",
                "huge tokens",
                "answer too large",
                "non-ASCII answer too large",
                "deeply nested draft",
                "deeply nested usage",
                "deeply nested line",
                "draft of the wrong type",
                "usage of the wrong type",
                "random draft",
                "hostile error",
                "huge error",
                "key echoed in the error",
                "half a line",
                "not UTF-8",
                "no line",
                "repeated, bad second",
            ]
        )
    )
    extra = {}
    if kind == "huge tokens":
        extra["tokens"] = draw(huge_numbers)
    if kind == "draft of the wrong type":
        extra["content"] = draw(wrong_types)
    if kind == "usage of the wrong type":
        extra["usage"] = draw(wrong_types)
    if kind in ("random draft", "hostile error"):
        extra["text"] = draw(nasty_text)
        extra["code"] = draw(st.one_of(nasty_text, wrong_types))
    return kind, extra


def lines_for(custom_id: str, kind: str, extra: dict) -> list[bytes]:
    good = as_line(success_line(custom_id, draft()))
    match kind:
        case "good":
            return [good]
        case "nul in draft":
            # The answer's own text holds the NUL (the line writes it as an escape).
            return [as_line(success_line(custom_id, draft().replace("Oak chopping", "Oak\x00chopping")))]
        case "surrogate in draft":
            return [as_line(success_line(custom_id, draft().replace("Oak chopping", "Oak \ud800 chopping")))]
        case "escaped nul in the text field":
            # The draft is clean text; the JSON inside it writes a NUL in its description.
            content = draft().replace("A chopping board", "A chopping\\u0000board")
            return [as_line(success_line(custom_id, content))]
        case "huge tokens":
            usage = {"prompt_tokens": extra["tokens"], "completion_tokens": 40}
            return [as_line(success_line(custom_id, draft(), usage=usage))]
        case "answer too large":
            return [as_line(success_line(custom_id, draft(description="oak " * MOST_BYTES)))]
        case "non-ASCII answer too large":
            return [as_line(success_line(custom_id, draft(description="ü" * (MOST_BYTES - 100))))]
        case "deeply nested draft":
            return [as_line(success_line(custom_id, "[" * 1500 + "]" * 1500))]
        case "deeply nested usage":
            return [as_line(success_line(custom_id, draft(), usage=nested(200)))]
        case "deeply nested line":
            line = success_line(custom_id, draft())
            return [json.dumps(line).replace('"error": null', '"error": ' + "[" * 3000 + "]" * 3000).encode()]
        case "draft of the wrong type":
            return [as_line(success_line(custom_id, extra["content"]))]
        case "usage of the wrong type":
            return [as_line(success_line(custom_id, draft(), usage=extra["usage"]))]
        case "random draft":
            return [as_line(success_line(custom_id, extra["text"]))]
        case "hostile error":
            return [as_line(error_line(custom_id, extra["code"], extra["text"] + "\x00\ud800"))]
        case "huge error":
            return [as_line(error_line(custom_id, "server_error" * 50, "x" * 1_000_000))]
        case "key echoed in the error":
            return [as_line(error_line(custom_id, f"bad_key_{API_KEY}", f"key%3D{API_KEY} refused"))]
        case "half a line":
            return [good[: len(good) // 2]]
        case "not UTF-8":
            return [good.replace(b"Oak chopping", b"Oak \xff\xfe chopping")]
        case "no line":
            return []
        case "repeated, bad second":
            return [good, as_line(success_line(custom_id, draft().replace("Oak", "\x00")))]
    raise AssertionError(kind)


# The item's state, and its reason code, after a collection of each story (None: any code).
EXPECTED = {
    "good": (ItemState.AWAITING_REVIEW, ""),
    "nul in draft": (ItemState.INFERENCE_FAILED, ReasonCode.GARBLED_ANSWER),
    "surrogate in draft": (ItemState.INFERENCE_FAILED, ReasonCode.GARBLED_ANSWER),
    "escaped nul in the text field": (ItemState.VALIDATION_FAILED, ReasonCode.GARBLED_ANSWER),
    "huge tokens": (ItemState.AWAITING_REVIEW, ""),
    "answer too large": (ItemState.INFERENCE_FAILED, ReasonCode.ANSWER_TOO_LARGE),
    "non-ASCII answer too large": (ItemState.INFERENCE_FAILED, ReasonCode.ANSWER_TOO_LARGE),
    "deeply nested draft": (ItemState.VALIDATION_FAILED, ReasonCode.NOT_JSON),
    "deeply nested usage": (ItemState.AWAITING_REVIEW, ""),
    # Unreadable without its custom_id: its request has no result, and is sent again.
    "deeply nested line": (ItemState.PREPARED, ""),
    "usage of the wrong type": (ItemState.AWAITING_REVIEW, ""),
    "huge error": (ItemState.INFERENCE_FAILED, ReasonCode.MODEL_FAILED),
    "key echoed in the error": (ItemState.INFERENCE_FAILED, ReasonCode.MODEL_FAILED),
    "half a line": (ItemState.PREPARED, ""),
    "not UTF-8": (ItemState.AWAITING_REVIEW, ""),
    "no line": (ItemState.PREPARED, ""),
    "repeated, bad second": (ItemState.AWAITING_REVIEW, ""),
}
# Stories whose outcome depends on what Hypothesis drew: any of these states.
POSSIBLE = {
    # A non-text content is unreadable; an empty one (null, false, []) is a draft that is not JSON.
    "draft of the wrong type": {ItemState.INFERENCE_FAILED, ItemState.VALIDATION_FAILED},
    "random draft": {ItemState.VALIDATION_FAILED, ItemState.INFERENCE_FAILED},
    "hostile error": {ItemState.INFERENCE_FAILED},
}
# The anomaly each story leaves, by kind.
ANOMALY = {
    "deeply nested line": "unreadable_line",
    "half a line": "unreadable_line",
    "huge tokens": "implausible_usage",
    "deeply nested usage": "implausible_usage",
    "repeated, bad second": "repeated_line",
}
UNKNOWN_IDS = st.lists(
    st.one_of(
        st.just("bd-someone-else"),
        st.just("x" * 10_000),
        st.just("bd-\x00-1"),
        st.just("bd-\ud800"),
        st.just(""),
    ),
    max_size=3,
)


@pytest.fixture
def collection(settings, monkeypatch):
    """A completed batch at the OpenAI emulator, whose results file each example rewrites, and the
    OpenAI adapter sending (and configured with) API_KEY."""
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    settings.BATCHDESK_COLLECT_CHUNK = 3
    settings.BATCHDESK_MAX_ANSWER_BYTES = MOST_BYTES
    products = [ProductFactory() for _ in range(PRODUCTS)]
    with (
        Emulator(per_request_ms=1, validating_ms=1, finalizing_ms=1, seed=5) as emulator,
        httpx.Client(base_url=emulator.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as client,
    ):
        provider = OpenAIBatchProvider(client=client)
        request = InferenceRequest("bd-0", "gpt-4o-mini", "system", "user", None, 50)
        assert request_line(request)
        batch_id = provider.submit(requests=[request], intent_key="hostile", metadata={})
        while not provider.status(batch_id).ended:
            pass
        yield emulator, provider, batch_id, products


def serve(emulator: Emulator, batch_id: str, lines: list[bytes]) -> None:
    """The batch's results file is now these lines (its error file gone)."""
    with emulator.lock:
        batch = emulator._batches[batch_id]
        emulator._files[batch.output_file_id].content = b"".join(line + b"\n" for line in lines)
        batch.error_file_id = None


def submitted_job(products, batch_id: str):
    job = JobFactory(provider="openai")
    submission = Submission.objects.create(
        job=job,
        provider="openai",
        model="gpt-4o-mini",
        intent_key=f"hostile-{job.pk}",
        provider_ref=batch_id,
        state=SubmissionState.ENDED,
    )
    items = []
    for product in products:
        item = Item.objects.create(
            job=job,
            product=product,
            source_revision=product.current_revision,
            state=ItemState.SUBMITTED,
            submission=submission,
        )
        SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
        items.append(item)
    return job, submission, items


def stored_text(job) -> list[str]:
    """Every text the ledger keeps for the job, as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.reason FROM ledger_item i WHERE i.job_id = %s "
            "UNION ALL SELECT e.reason || e.data::text FROM ledger_event e WHERE e.job_id = %s "
            "UNION ALL SELECT s.error || s.last_observed_status || s.anomalies::text FROM ledger_submission s "
            "WHERE s.job_id = %s "
            "UNION ALL SELECT v.content || v.raw_output || v.validation_reasons::text || v.usage::text "
            "FROM ledger_generatedversion v JOIN ledger_item i ON i.id = v.item_id WHERE i.job_id = %s",
            [job.pk] * 4,
        )
        return [text for (text,) in cursor.fetchall()]


@hypothesis_settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    stories=st.lists(story(), min_size=PRODUCTS, max_size=PRODUCTS),
    unknown=UNKNOWN_IDS,
    shuffle=st.randoms(use_true_random=False),
)
def test_whatever_the_results_file_holds_each_bad_line_fails_alone(collection, stories, unknown, shuffle):
    emulator, provider, batch_id, products = collection
    job, submission, items = submitted_job(products, batch_id)
    lines = []
    for item, (kind, extra) in zip(items, stories, strict=True):
        lines += lines_for(item.custom_id, kind, extra)
    lines += [as_line(success_line(custom_id, draft())) for custom_id in unknown]
    shuffle.shuffle(lines)
    # A repeated line's first copy is the good one: it keeps its place before the bad one.
    for item, (kind, _) in zip(items, stories, strict=True):
        if kind == "repeated, bad second":
            copies = [n for n, line in enumerate(lines) if item.custom_id.encode() in line]
            good, bad = sorted(copies, key=lambda n: b"\\u0000" in lines[n])
            lines[min(copies)], lines[max(copies)] = lines[good], lines[bad]
    serve(emulator, batch_id, lines)

    assert collect_submission(submission.pk, provider=provider, seconds=math.inf) == "collected"

    submission.refresh_from_db()
    assert submission.state == SubmissionState.COLLECTED
    # Rule 1: every item in exactly one state, the counts adding up.
    states = dict(Item.objects.filter(job=job).values_list("pk", "state"))
    assert len(states) == PRODUCTS and set(states.values()) <= set(ItemState.values)
    anomalies = submission.anomalies
    for item, (kind, _) in zip(items, stories, strict=True):
        item.refresh_from_db()
        if kind in POSSIBLE:
            assert item.state in POSSIBLE[kind], (kind, item.state, item.reason)
        else:
            state, code = EXPECTED[kind]
            assert (item.state, item.reason_code) == (state, code), (kind, item.reason)
        versions = list(GeneratedVersion.objects.filter(item=item))
        if item.state in (ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED):
            [version] = versions
            if kind in ("good", "repeated, bad second"):
                assert version.content == GOOD["description"] and version.input_tokens == 100
        else:
            assert versions == []
        if kind in ANOMALY:
            assert any(
                a["kind"] == ANOMALY[kind] and a.get("custom_id", item.custom_id) == item.custom_id
                for a in anomalies
            ), (kind, anomalies)
    unknown_shown = [a["custom_id"] for a in anomalies if a["kind"] == "unknown_custom_id"]
    assert len(unknown_shown) == len(set(unknown))
    # Nothing kept is larger than the ledger keeps, and the key is nowhere.
    for text in stored_text(job):
        assert len(text.encode()) <= 3 * MOST_BYTES
        assert API_KEY not in text and "sk-proj" not in text
    assert Event.objects.filter(job=job).count() >= PRODUCTS
