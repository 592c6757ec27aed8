"""A local emulator of OpenAI's Files + Batch API (reference/providers.md §1 and §7).

It speaks the real wire protocol, so the OpenAI adapter and the official SDK talk to it
unchanged, and it answers with `textgen` instead of a model. Batches move through the real
statuses as time passes: nothing runs in the background; a batch is brought up to date
whenever it is read, from timestamps, under one lock. With a `webhook_url` (`knobs.FaultKnobs`)
a thread also brings them up to date and posts OpenAI's signed `batch.<status>` event when one ends.

Fault knobs (`knobs.FaultKnobs`) make it misbehave the ways a real provider does: requests that fail or
expire, batches that expire part-way, calls answered 429 or 500, a create call whose answer
is lost, downloads cut short, output files with repeated, unknown or malformed lines, and answers
cut off (`finish_reason: length`), refused (`message.refusal`), fenced or in prose.
Whatever involves chance is drawn from the seed (per request: seed + custom_id + attempt;
per file: seed + the batch's requests), so a run is reproducible while a retried custom_id
gets a fresh roll of the dice.

A request whose `response_format` is a strict json_schema outside OpenAI's subset (providers.md
§8.1) fails with OpenAI's 400, as the real API refuses it (`strict_schema`), unless the
`strict_schemas` knob (`OpenAIKnobs`) is turned off.
"""

import json
import logging
import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from werkzeug.wrappers import Request

from ledger.drafts.validation import read_json
from ledger.emulators import spoiling, strict_schema, textgen
from ledger.emulators.knobs import OpenAIKnobs
from ledger.emulators.openai_files import DAY, FILE_TTL, FilesApi, StoredFile, list_page, new_id, openai_error
from ledger.emulators.server import (
    ApiError,
    Fault,
    LoseAnswer,
)
from ledger.emulators.units import Attempts, SentRequest, jsonl, jsonl_lines
from ledger.models import compact_json
from ledger.providers.openai import INTENT_METADATA_KEY

log = logging.getLogger(__name__)

ENDPOINT = "/v1/chat/completions"  # the only endpoint the emulator can answer
MAX_REQUESTS = 50_000
COMPLETION_WINDOW = "24h"  # the only one OpenAI takes
# Requests run at a time when time is kept in the background (`advance_a_little`): tens of milliseconds
# under the lock, where a unit of 5,000 held it, and every upload and poll with it, a third of a second.
REQUESTS_AT_A_TIME = 500
TERMINAL = {"failed", "completed", "expired", "cancelled"}
STAMPS = ["in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"]
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
# The error `type` OpenAI uses for each kind of failure the shared plumbing raises.
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "invalid_request_error",
    "not_found": "invalid_request_error",
    "rate_limit": "requests",
    "server_error": "server_error",
    "overloaded": "server_error",
}
# The `code` OpenAI gives the errors of these kinds when the caller names none.
DEFAULT_CODES = {"rate_limit": "rate_limit_exceeded", "authentication": "invalid_api_key"}


# How a chat completion says the model stopped (reference/providers.md §5, §8.1); a refusal
# stops normally, its words in `message.refusal` and `content` null.
FINISH_REASONS = {"complete": "stop", "truncated": "length", "refused": "stop"}


def completion_message(content: str, stopped: str) -> dict:
    """A chat completion's `message` for what `textgen.answer` wrote."""
    refused = stopped == "refused"
    return {
        "role": "assistant",
        "content": None if refused else content,
        "refusal": content if refused else None,
        "annotations": [],
    }


@dataclass
class _Request(SentRequest):
    """One input line of a batch and, once it has run, its output or error line (`result`), kept as
    the JSON text its file will hold: a unit's 50,000 lines kept as dicts were half a million objects
    that every garbage collection read again, a quarter of the emulator's time."""

    succeeded: bool = False


@dataclass
class _Batch:
    id: str
    input_file: StoredFile
    endpoint: str
    completion_window: str
    metadata: dict | None
    output_ttl: int
    created: float
    status: str = "validating"
    stamps: dict[str, float] = field(default_factory=dict)
    errors: list[dict] | None = None
    model: str | None = None
    requests: list[_Request] = field(default_factory=list)
    ran: int = 0  # requests[:ran] have run
    clock: float = 0.0  # the simulated time up to which requests have run
    output_file_id: str | None = None
    error_file_id: str | None = None
    usage: Counter = field(default_factory=Counter)
    some_expired: bool = False  # a request drew `expire_rate` as it ran: the batch ends expired
    miscounted: bool = False  # `count_mismatch` was on when its files were written
    # (total, completed, failed) once its files are written: its requests are then let go.
    tally: tuple[int, int, int] | None = None

    def counts(self) -> tuple[int, int, int]:
        if self.tally is not None:
            return self.tally
        return (
            len(self.requests),
            sum(r.succeeded for r in self.requests),
            sum(r.result is not None and not r.succeeded for r in self.requests),
        )

    def as_json(self) -> dict:
        total, completed, failed = self.counts()
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file.id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created),
            "expires_at": int(self.created) + DAY,
            **{f"{name}_at": _int_or_none(self.stamps.get(name)) for name in STAMPS},
            "request_counts": {"total": total, "completed": completed + self.miscounted, "failed": failed},
            "usage": {
                "input_tokens": self.usage["input"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.usage["output"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.usage["input"] + self.usage["output"],
            },
            "metadata": self.metadata,
        }


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _error_line(custom_id: str, status: int, message: str, type: str, param: str | None = None) -> str:
    """The error file's line of a request the API answered with an HTTP error (its `error` is null)."""
    body = openai_error(status, message, type=type, param=param).body
    response = {"status_code": status, "request_id": new_id("req_"), "body": body}
    return compact_json(
        {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}
    )


def _failure_line(custom_id: str, code: str, message: str) -> str:
    """The error file's line of a request that never ran (expired or cancelled)."""
    error = {"code": code, "message": message}
    return compact_json(
        {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}
    )


def _shared(formats: dict[str, dict], response_format: dict) -> dict:
    """The response_format kept for one equal to `response_format` (the first of them met): a unit's
    requests carry the same one, and 50,000 copies of it were 350,000 objects that every garbage
    collection read again."""
    kept = formats.setdefault(compact_json(response_format), response_format)
    # Equal as Python values too: JSON text alone writes NaN and null alike.
    return kept if kept == response_format else response_format


class Emulator(FilesApi):
    """The emulated OpenAI Files + Batch API: its files, its batches and their clock."""

    protocol = "openai"
    create_rule = ("POST", r"/v1/batches")
    knobs_class = OpenAIKnobs

    def __init__(self, *, validating_ms: float = 200, finalizing_ms: float = 50, **kwargs: Any) -> None:
        """`kwargs`: host, port, seed and any of the `FaultKnobs`."""
        self.validating_ms, self.finalizing_ms = validating_ms, finalizing_ms
        self._batches: dict[str, _Batch] = {}  # in creation order
        self._inferences: Counter = Counter()
        self._attempts = Attempts()
        # `strict_schema.refusal` of each response_format seen, by its JSON (`_refusal`).
        self._refusals: dict[str, str | None] = {}
        super().__init__(**kwargs)

    routes = FilesApi.routes + (
        "POST /v1/batches create",
        "GET /v1/batches listing",
        "GET /v1/batches/<batch_id> batch",
        "POST /v1/batches/<batch_id>/cancel cancel",
    )

    def envelope(self, fault: Fault) -> ApiError:
        code = fault.code or DEFAULT_CODES.get(fault.kind, fault.code)
        error_type = ERROR_TYPES[fault.kind]
        return openai_error(
            fault.status, fault.message, type=error_type, param=fault.param, code=code, headers=fault.headers
        )

    def billing_refusal(self) -> ApiError:
        # reference/providers.md §1.9: quota exhaustion is a 429 that must not be retried.
        return self.error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            kind="rate_limit",
            code="insufficient_quota",
        )

    def authenticate(self, request: Request) -> None:
        if not request.headers.get("Authorization", "").startswith("Bearer "):
            raise self.error(
                401, "You didn't provide an API key (Authorization: Bearer <key>).", kind="authentication"
            )

    def answer_headers(self) -> dict[str, str]:
        return {"x-request-id": new_id("req_")}

    def evidence(self) -> dict:
        """`inferences`: how often each custom_id was generated (= paid for); `batches_by_intent`:
        batches per `metadata.batchdesk_intent`."""
        intents = Counter(
            batch.metadata[INTENT_METADATA_KEY]
            for batch in self._batches.values()
            if batch.metadata and INTENT_METADATA_KEY in batch.metadata
        )
        return {
            "inferences": dict(self._inferences),
            "batches": len(self._batches),
            "files": len(self._files),
            "batches_by_intent": dict(intents),
        }

    def advance(self) -> None:
        self._advance_all()

    def advance_a_little(self) -> bool:
        now, left = self.clock.now(), REQUESTS_AT_A_TIME
        for batch in self._batches.values():
            left -= self._advance(batch, now, most=left)
            if left <= 0:
                return True
        return False

    # --- the routes --------------------------------------------------------------------------

    def create(self, request: Request) -> dict:
        return self.create_batch(self.json_body(request))

    def listing(self, request: Request) -> dict:
        limit = request.args.get("limit", "20")
        if not limit.isdigit():
            raise openai_error(400, "limit must be from 1 to 100.", param="limit")
        return self.list_batches(after=request.args.get("after"), limit=int(limit))

    def batch(self, request: Request, batch_id: str) -> dict:
        return self.get_batch(batch_id)

    def cancel(self, request: Request, batch_id: str) -> dict:
        return self.cancel_batch(batch_id)

    # --- the API -------------------------------------------------------------------------

    def create_batch(self, body: Any) -> dict:
        """Create a batch; raises `LoseAnswer` after creating it when `lose_create_responses` says so."""
        if not isinstance(body, dict):
            raise openai_error(400, "The request body must be a JSON object.")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise openai_error(400, f"Missing required parameter: '{name}'.", param=name)
        if body["endpoint"] != ENDPOINT:
            raise openai_error(400, f"The emulator only serves endpoint {ENDPOINT}.", param="endpoint")
        if body["completion_window"] != COMPLETION_WINDOW:
            raise openai_error(
                400,
                f"Invalid value: '{body['completion_window']}'. Supported values are: '{COMPLETION_WINDOW}'.",
                param="completion_window",
                code="invalid_value",
            )
        metadata = body.get("metadata")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and len(metadata) <= 16
            and all(isinstance(k, str) and len(k) <= 64 for k in metadata)
            and all(isinstance(v, str) and len(v) <= 512 for v in metadata.values())
        ):
            raise openai_error(
                400, "metadata takes at most 16 string pairs (keys ≤64, values ≤512).", param="metadata"
            )
        expires_after = body.get("output_expires_after") or {}
        output_ttl = expires_after.get("seconds", FILE_TTL) if isinstance(expires_after, dict) else None
        if not isinstance(output_ttl, int) or not 3600 <= output_ttl <= 30 * DAY:
            raise openai_error(
                400, "output_expires_after.seconds must be 3600-2592000.", param="output_expires_after"
            )
        with self.lock:
            input_file = self._file(body["input_file_id"])
            if input_file.purpose != "batch":
                raise openai_error(400, "The input file must have purpose 'batch'.", param="input_file_id")
            batch = _Batch(
                id=new_id("batch_"),
                input_file=input_file,
                endpoint=body["endpoint"],
                completion_window=body["completion_window"],
                metadata=metadata,
                output_ttl=output_ttl,
                created=self.clock.now(),
            )
            self._batches[batch.id] = batch
            if self.take_lost_create():
                log.info("losing the answer to the create call of %s", batch.id)
                raise LoseAnswer(batch.id)
            return batch.as_json()

    def _batch(self, batch_id: str) -> _Batch:
        if batch_id not in self._batches:
            raise openai_error(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        batch = self._batches[batch_id]
        self._advance(batch, self.clock.now())
        return batch

    def get_batch(self, batch_id: str) -> dict:
        with self.lock:
            return self._batch(batch_id).as_json()

    def list_batches(self, *, after: str | None = None, limit: int = 20) -> dict:
        """Newest first; `after` is the id of the last batch of the previous page."""
        if not 1 <= limit <= 100:
            raise openai_error(400, "limit must be from 1 to 100.", param="limit")
        with self.lock:
            ids = list(reversed(self._batches))
            if after is not None:
                if after not in self._batches:
                    raise openai_error(400, f"No batch found with id '{after}'.", param="after")
                ids = ids[ids.index(after) + 1 :]
            page = [self._batch(batch_id).as_json() for batch_id in ids[:limit]]
        return list_page(page, has_more=len(ids) > limit)

    def cancel_batch(self, batch_id: str) -> dict:
        with self.lock:
            batch = self._batch(batch_id)
            if batch.status in TERMINAL:
                raise openai_error(
                    400, f"Cannot cancel a batch with status '{batch.status}'.", param="batch_id"
                )
            if batch.status != "cancelling":
                batch.status = "cancelling"
                batch.stamps["cancelling"] = self.clock.now()
            return batch.as_json()

    # --- the simulation (callers hold the lock) ------------------------------------------

    def _advance_all(self) -> None:
        now = self.clock.now()
        for batch in self._batches.values():
            self._advance(batch, now)

    def _advance(self, batch: _Batch, now: float, most: float = math.inf) -> int:
        """Replay what would have happened to `batch` up to `now`, stamping each step, or only as far
        as its next `most` requests. Returns how many requests ran."""
        ran = 0
        settle = self.finalizing_ms / 1000
        if batch.status == "validating" and now >= batch.created + self.validating_ms / 1000:
            self._validate(batch, batch.created + self.validating_ms / 1000)
        if batch.status == "in_progress":
            step = self.knobs.per_request_ms / 1000
            expire_after = self.knobs.expire_after_ms
            deadline = math.inf if expire_after is None else batch.stamps["in_progress"] + expire_after / 1000
            while batch.ran < len(batch.requests) and batch.clock + step <= min(now, deadline):
                if ran >= most:
                    return ran  # the rest another time
                batch.clock += step
                self._run(batch, batch.requests[batch.ran], batch.clock)
                batch.ran += 1
                ran += 1
            if batch.ran < len(batch.requests) and now >= deadline:
                # Out of time part-way: what ran stays, the rest expires unrun (§1.7).
                for request in batch.requests[batch.ran :]:
                    request.result = _failure_line(request.custom_id, "batch_expired", EXPIRED_MESSAGE)
                batch.ran, batch.clock = len(batch.requests), max(batch.clock, deadline)
                self._enter(batch, "expired", batch.clock)
            elif batch.ran == len(batch.requests):
                self._enter(batch, "expired" if batch.some_expired else "finalizing", batch.clock)
        if batch.status == "finalizing" and now >= batch.stamps["finalizing"] + settle:
            self._enter(batch, "completed", batch.stamps["finalizing"] + settle)
        if batch.status == "cancelling" and now >= batch.stamps["cancelling"] + settle:
            for request in batch.requests[batch.ran :]:
                request.result = _failure_line(
                    request.custom_id, "batch_cancelled", "The batch was cancelled."
                )
            self._enter(batch, "cancelled", batch.stamps["cancelling"] + settle)
        return ran

    def _enter(self, batch: _Batch, status: str, at: float) -> None:
        batch.status = status
        batch.stamps[status] = at
        if status in TERMINAL:
            # Seeded by the batch's requests, not its random id, so a rerun writes the same files.
            rng = spoiling.hashed_order(self.seed, ((r.custom_id, r.attempt) for r in batch.requests))
            finished = [r for r in batch.requests if r.result is not None]
            rng.shuffle(finished)  # order is never promised
            succeeded = [r for r in finished if r.succeeded]
            output = [r.result for r in succeeded]
            if batch.requests:  # a batch that failed validation wrote nothing to spoil
                output = self._spoil(batch, succeeded, output, rng, at)
                batch.miscounted = self.knobs.count_mismatch
            batch.output_file_id = self._result_file(batch, "output", output, at)
            failures = [r.result for r in finished if not r.succeeded]
            batch.error_file_id = self._result_file(batch, "error", failures, at)
            # What it was asked and answered now lives in its files: a million requests kept as
            # parsed bodies and result lines held gigabytes, and every garbage collection read them.
            batch.tally, batch.requests = batch.counts(), []
            # OpenAI's thin event (reference/providers.md §8.4): the batch is fetched again.
            event = {
                "id": new_id("evt_"),
                "object": "event",
                "created_at": int(at),
                "type": f"batch.{status}",
                "data": {"id": batch.id},
            }
            self.webhooks.announce(self.knobs, event["type"], batch.id, event)

    def _spoil(
        self, batch: _Batch, succeeded: list[_Request], output: list[str], rng: random.Random, at: float
    ) -> list[str]:
        """`output` with the repeated, unknown and malformed lines the knobs ask for, placed by `rng`."""
        knobs = self.knobs
        pairs = zip(succeeded, output, strict=True)
        extra = spoiling.repeated(
            self.seed, knobs.duplicate_lines, ((t, r.custom_id, r.attempt) for r, t in pairs)
        )
        # Made-up lines read like their neighbours; they are not inferences anyone asked for.
        prompt = {"role": "user", "content": spoiling.UNASKED_TITLE}
        bodies = [r.body for r in succeeded] or [{"model": batch.model or "emulator", "messages": [prompt]}]

        def made_up(custom_id: str) -> str:
            return json.dumps(self._completion_line(custom_id, rng.choice(bodies), at)[0])

        extra += spoiling.made_up_lines(knobs, made_up)
        return spoiling.scattered(output, extra, rng)

    def _result_file(self, batch: _Batch, kind: str, lines: list[str], at: float) -> str | None:
        if not lines:
            return None
        name = f"{batch.id}_{kind}.jsonl"
        file = StoredFile(
            new_id("file-"), name, "batch_output", jsonl(lines), int(at), int(at) + batch.output_ttl
        )
        self._files[file.id] = file
        return file.id

    def _validate(self, batch: _Batch, at: float) -> None:
        """The checks of §7.3; any failure fails the whole batch, as OpenAI does."""
        errors = []

        def error(code: str, message: str, line: int | None = None, param: str | None = None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        requests, models, seen = [], set(), set()
        formats: dict[str, dict] = {}  # each response_format met, by its JSON
        for number, raw in jsonl_lines(batch.input_file.content):
            try:
                line = read_json(raw)
            except ValueError:
                error("invalid_json_line", f"Line {number} is not valid JSON.", number)
                continue
            if not (
                isinstance(line, dict)
                and isinstance(line.get("custom_id"), str)
                and isinstance(line.get("body"), dict)
            ):
                error("invalid_request", f"Line {number} needs custom_id, method, url and body.", number)
                continue
            custom_id = line["custom_id"]
            if line.get("method") != "POST":
                error("invalid_method", f"Line {number}: method must be POST.", number, "method")
            if line.get("url") != batch.endpoint:
                error("mismatched_url", f"Line {number}: url must be {batch.endpoint}.", number, "url")
            if custom_id in seen:
                error("duplicate_custom_id", f"Line {number}: custom_id {custom_id!r} is repeated.", number)
            body = line["body"]
            if isinstance(body.get("model"), str):
                models.add(body["model"])
            if isinstance(body.get("response_format"), dict):
                body["response_format"] = _shared(formats, body["response_format"])
            seen.add(custom_id)
            requests.append(_Request(custom_id, body, attempt=0))
        # Read: the batch keeps the file's name, not its megabytes (the file itself is deleted apart).
        batch.input_file = replace(batch.input_file, content=b"")
        if len(models) > 1:
            error(
                "mismatched_model",
                f"One model per file, found {len(models)}: {sorted(models)}.",
                param="model",
            )
        if not requests and not errors:
            error("empty_file", "The input file has no requests.")
        if len(requests) > MAX_REQUESTS:
            error("too_many_requests", f"At most {MAX_REQUESTS} requests per batch.")
        if errors:
            batch.errors = errors[:100]
            self._enter(batch, "failed", at)
            return
        for request in requests:
            request.attempt = self._attempts.next(request.custom_id)
        batch.requests, batch.model, batch.clock = requests, next(iter(models), None), at
        self._enter(batch, "in_progress", at)

    def _chance(self, knob: str, request: _Request, rate: float) -> bool:
        return self.chance(rate, knob, request.custom_id, request.attempt)

    def _run(self, batch: _Batch, request: _Request, at: float) -> None:
        """Answer one request at simulated time `at`."""
        body, custom_id = request.body, request.custom_id
        missing = next((name for name in ("model", "messages") if not body.get(name)), None)
        refused = self.knobs.strict_schemas and self._refusal(body.get("response_format"))
        if missing:
            message = f"Missing required parameter: '{missing}'."
            request.result = _error_line(custom_id, 400, message, "invalid_request_error", missing)
        elif refused:
            request.result = _error_line(custom_id, 400, refused, "invalid_request_error", "response_format")
        elif self._chance("expire", request, self.knobs.expire_rate):
            request.result = _failure_line(custom_id, "batch_expired", EXPIRED_MESSAGE)
            batch.some_expired = True
        elif self._chance("fail", request, self.knobs.fail_rate):
            message = "The server had an error while processing your request. Sorry about that!"
            request.result = _error_line(custom_id, 500, message, "server_error")
        else:
            shape = self.answer_shape(custom_id, request.attempt)
            line, usage = self._completion_line(custom_id, body, at, shape)
            request.result = compact_json(line)
            self._inferences[custom_id] += 1
            # Added key by key: Counter.update(**counts) costs an abstract-class check a call.
            batch.usage["input"] += usage["prompt_tokens"]
            batch.usage["output"] += usage["completion_tokens"]
            request.succeeded = True

    def _refusal(self, response_format: Any) -> str | None:
        """`strict_schema.refusal`, judged once for each response_format: a unit's thousands of
        requests carry the same one, and judging it again for each was an eighth of a request's time."""
        key = compact_json(response_format)
        if key not in self._refusals:
            self._refusals[key] = strict_schema.refusal(response_format)
        return self._refusals[key]

    def _completion_line(self, custom_id: str, body: dict, at: float, shape: str = "") -> tuple[dict, dict]:
        """A success line answering `body` at simulated time `at` (shaped as `textgen.answer`
        says), and its usage."""
        content, usage, stopped = textgen.answer(body, shape, self.knobs.optional_properties)
        message = completion_message(content, stopped)
        completion = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(at),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": FINISH_REASONS[stopped]}
            ],
            "usage": {
                **usage,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            },
            "service_tier": "default",
            "system_fingerprint": None,
        }
        response = {"status_code": 200, "request_id": new_id("req_"), "body": completion}
        line = {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}
        return line, usage
