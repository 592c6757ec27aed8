"""A local emulator of Anthropic's Message Batches API (reference/providers.md §2).

It answers at the real paths under a base URL without `/v1` (as the SDK's base URL is), so the
adapter and the official `anthropic` SDK talk to it unchanged; `textgen` stands in for the
model. A batch is brought up to date from timestamps whenever it is read, under the lock:
requests run one after another, `per_request_ms` of simulated time each, and every count
stays in `processing` until the whole batch has ended, as Anthropic's do.

Knobs (knobs.FaultKnobs) shape the results: `fail_rate` (errored `api_error`), `expire_rate`
and `expire_after_ms` (expired), `duplicate_lines` / `unknown_lines` / `malformed_lines` in
the results file, `count_mismatch` in `request_counts`, `cut_downloads` of the results;
`lose_create_responses`, 429 storms (with `retry-after`) and 5xx storms (529 answers
`overloaded_error`) come from the shared plumbing. The answer knobs (`truncate_rate`, `refuse_rate`,
`fence_rate`, `prose_rate`) shape messages: `stop_reason` `max_tokens` or `refusal`, or a text block
instead of the tool call. A cancel moves a batch to `canceling`,
then `ended` with every request not yet run `canceled`.
"""

import json
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from werkzeug.wrappers import Request

from ledger.emulators import spoiling, textgen
from ledger.emulators.knobs import AnthropicKnobs
from ledger.emulators.server import ApiError, Download, EmulatorServer, Fault, LoseAnswer
from ledger.emulators.units import Attempts, SentRequest, jsonl

DAY = 86400
# A batch's results are available for 29 days after its creation (reference §8.3).
RESULTS_KEPT = 29 * DAY
MAX_REQUESTS = 100_000
MAX_BATCH_BYTES = 256 * 1024 * 1024
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "rate_limit": "rate_limit_error",
    "server_error": "api_error",
    "overloaded": "overloaded_error",
    "request_too_large": "request_too_large",
}
SERVER_ERROR_MESSAGE = "Internal server error"
RESULT_TYPES = ("succeeded", "errored", "canceled", "expired")
UNASKED = {"role": "user", "content": spoiling.UNASKED_TITLE}


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def rfc3339(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def envelope(error_type: str, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": _new_id("req_")}


@dataclass
class _Batch:
    id: str
    created: float
    requests: list[SentRequest]
    processing_status: str = "in_progress"
    ran: int = 0  # requests[:ran] have run
    clock: float = 0.0  # the simulated time up to which requests have run
    cancel_initiated: float | None = None
    ended: float | None = None
    results: bytes = b""  # the results file, written once the batch ends
    miscounted: bool = False  # `count_mismatch` was on when it ended
    counts: Counter = field(default_factory=Counter)

    def as_json(self, results_url: str) -> dict:
        if self.ended is None:
            counts = {
                "processing": len(self.requests),
                "succeeded": 0,
                "errored": 0,
                "canceled": 0,
                "expired": 0,
            }
        else:
            counts = {"processing": 0, **{kind: self.counts[kind] for kind in RESULT_TYPES}}
            counts["succeeded"] += self.miscounted
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.processing_status,
            "request_counts": counts,
            "ended_at": rfc3339(self.ended),
            "created_at": rfc3339(self.created),
            "expires_at": rfc3339(self.created + DAY),
            "archived_at": None,
            "cancel_initiated_at": rfc3339(self.cancel_initiated),
            "results_url": results_url if self.ended else None,
        }


class AnthropicEmulator(EmulatorServer):
    knobs_class = AnthropicKnobs
    protocol = "anthropic"
    base_path = ""  # the SDK's base URL has no /v1: paths carry it
    create_rule = ("POST", r"/v1/messages/batches/?")
    # Where results are served; clients must read it from `results_url`, never build it.
    results_path = "/v1/messages/batches/<batch_id>/results"

    def __init__(self, **kwargs) -> None:
        self._batches: dict[str, _Batch] = {}  # in creation order
        self._inferences: Counter = Counter()
        self._attempts = Attempts()
        super().__init__(**kwargs)

    @property
    def routes(self) -> tuple[str, ...]:
        """A property, not a table: the results are served wherever `results_path` says."""
        return (
            "POST /v1/messages/batches create_batch",
            "GET /v1/messages/batches list_batches",
            "GET /v1/messages/batches/<batch_id> get_batch",
            "DELETE /v1/messages/batches/<batch_id> delete_batch",
            "POST /v1/messages/batches/<batch_id>/cancel cancel_batch",
            f"GET {self.results_path} batch_results",
        )

    def envelope(self, fault: Fault) -> ApiError:
        body = envelope(ERROR_TYPES.get(fault.kind, "api_error"), fault.message)
        return ApiError(fault.status, body, {"request-id": body["request_id"], **fault.headers})

    def billing_refusal(self) -> ApiError:
        return self.error(
            400,
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing "
            "to upgrade or purchase credits.",
        )

    def answer_headers(self) -> dict[str, str]:
        return {"request-id": _new_id("req_")}

    def authenticate(self, request: Request) -> None:
        # The key as `x-api-key`, or (as SDK 2.x sends it) `Authorization: Bearer <key>`.
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not request.headers.get("x-api-key") and not bearer:
            raise self.error(401, "x-api-key header is required", kind="authentication")
        if not request.headers.get("anthropic-version"):
            raise self.error(400, "anthropic-version: header is required")

    def evidence(self) -> dict:
        return {
            "inferences": dict(self._inferences),
            "batches": len(self._batches),
            # Anthropic keeps no metadata of ours on a batch.
            "batches_by_intent": {},
        }

    def advance(self) -> None:
        with self.lock:
            now = self.clock.now()
            for batch in self._batches.values():
                self._advance(batch, now)

    # --- the API ---------------------------------------------------------------------------

    def _results_url(self, request: Request, batch: _Batch) -> str:
        """Absolute, as Anthropic's is."""
        return request.host_url.rstrip("/") + self.results_path.replace("<batch_id>", batch.id)

    def create_batch(self, request: Request) -> dict:
        """Validate the whole batch first (any fault refuses all of it, changing nothing), then
        create it; raises `LoseAnswer` after creating it when `lose_create_responses` says so."""
        if request.content_length and request.content_length > MAX_BATCH_BYTES:
            raise self.error(
                413, f"Request exceeds the maximum size of {MAX_BATCH_BYTES} bytes.", kind="request_too_large"
            )
        body = self.json_body(request)
        requests = self._checked_requests(body)
        with self.lock:
            now = self.clock.now()
            batch = _Batch(id=_new_id("msgbatch_"), created=now, requests=[], clock=now)
            for custom_id, params in requests:
                batch.requests.append(SentRequest(custom_id, params, self._attempts.next(custom_id)))
            self._batches[batch.id] = batch
            answer = batch.as_json(self._results_url(request, batch))
        if self.take_lost_create():
            raise LoseAnswer(batch.id)
        return answer

    def _checked_requests(self, body: object) -> list[tuple[str, dict]]:
        if not isinstance(body, dict):
            raise self.error(400, "The request body must be a JSON object.")
        requests = body.get("requests")
        if not isinstance(requests, list):
            raise self.error(400, "requests: Field required")
        if not 1 <= len(requests) <= MAX_REQUESTS:
            raise self.error(
                400, f"requests: List should have at least 1 item and at most {MAX_REQUESTS} items"
            )
        checked, seen = [], set()
        for number, entry in enumerate(requests):
            where = f"requests.{number}"
            if not isinstance(entry, dict):
                raise self.error(400, f"{where}: Input should be a valid dictionary")
            custom_id = entry.get("custom_id")
            if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
                raise self.error(
                    400, f"{where}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
                )
            if custom_id in seen:
                raise self.error(400, f"{where}.custom_id: Duplicate custom_id '{custom_id}' in this batch")
            seen.add(custom_id)
            params = entry.get("params")
            if not isinstance(params, dict):
                raise self.error(400, f"{where}.params: Field required")
            if not isinstance(params.get("model"), str) or not params["model"]:
                raise self.error(400, f"{where}.params.model: Field required")
            max_tokens = params.get("max_tokens")
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise self.error(
                    400, f"{where}.params.max_tokens: Field required (a whole number of at least 1)"
                )
            if params.get("stream"):
                raise self.error(400, f"{where}.params.stream: streaming is not supported in batches")
            checked.append((custom_id, params))
        return checked

    def _batch(self, batch_id: str) -> _Batch:
        """The batch, brought up to date; callers hold the lock."""
        if batch_id not in self._batches:
            raise self.error(404, f"No batch found with id '{batch_id}'.", kind="not_found")
        batch = self._batches[batch_id]
        self._advance(batch, self.clock.now())
        return batch

    def get_batch(self, request: Request, batch_id: str) -> dict:
        with self.lock:
            batch = self._batch(batch_id)
            return batch.as_json(self._results_url(request, batch))

    def list_batches(self, request: Request) -> dict:
        """Newest first. `after_id`: the page just older than that batch; `before_id`: the page
        just newer than it."""
        limit_text = request.args.get("limit", "20")
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= 1000:
            raise self.error(400, "limit: Input should be between 1 and 1000")
        limit = int(limit_text)
        after_id, before_id = request.args.get("after_id"), request.args.get("before_id")
        if after_id and before_id:
            raise self.error(400, "Only one of after_id and before_id may be given.")
        with self.lock:
            ids = list(reversed(self._batches))
            cursor = after_id or before_id
            if cursor is not None and cursor not in self._batches:
                raise self.error(400, f"Invalid cursor: no batch found with id '{cursor}'.")
            if after_id:
                rest = ids[ids.index(after_id) + 1 :]
                chosen, has_more = rest[:limit], len(rest) > limit
            elif before_id:
                rest = ids[: ids.index(before_id)]
                chosen, has_more = rest[-limit:], len(rest) > limit
            else:
                chosen, has_more = ids[:limit], len(ids) > limit
            batches = [self._batch(batch_id) for batch_id in chosen]
            page = [batch.as_json(self._results_url(request, batch)) for batch in batches]
        return {
            "data": page,
            "has_more": has_more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    def cancel_batch(self, request: Request, batch_id: str) -> dict:
        with self.lock:
            batch = self._batch(batch_id)
            if batch.processing_status == "ended":
                raise self.error(400, f"Batch '{batch_id}' has already ended and cannot be canceled.")
            if batch.processing_status == "in_progress":
                batch.processing_status = "canceling"
                batch.cancel_initiated = self.clock.now()
            return batch.as_json(self._results_url(request, batch))

    def delete_batch(self, request: Request, batch_id: str) -> dict:
        with self.lock:
            batch = self._batch(batch_id)
            if batch.processing_status != "ended":
                raise self.error(
                    400, f"Batch '{batch_id}' is still processing; cancel it and wait for it to end first."
                )
            del self._batches[batch_id]
        return {"id": batch_id, "type": "message_batch_deleted"}

    def batch_results(self, request: Request, batch_id: str) -> Download:
        with self.lock:
            batch = self._batch(batch_id)
            if batch.ended is None:
                raise self.error(
                    404,
                    f"Results for batch '{batch_id}' are not available until it has ended.",
                    kind="not_found",
                )
            if self.clock.now() >= batch.created + RESULTS_KEPT:
                raise self.error(
                    404,
                    f"Results for batch '{batch_id}' have expired (kept 29 days from its creation).",
                    kind="not_found",
                )
            content = batch.results
        return self.download(batch_id, content, "application/binary")

    # --- the simulation (callers hold the lock) --------------------------------------------

    def _advance(self, batch: _Batch, now: float) -> None:
        """Replay what would have happened to `batch` up to `now`."""
        if batch.ended is not None:
            return
        step = self.knobs.per_request_ms / 1000
        expire_after = self.knobs.expire_after_ms
        deadline = batch.created + expire_after / 1000 if expire_after is not None else float("inf")
        stop = batch.cancel_initiated if batch.cancel_initiated is not None else now
        while batch.ran < len(batch.requests) and batch.clock + step <= min(stop, deadline):
            batch.clock += step
            self._run(batch.requests[batch.ran], batch.clock)
            batch.ran += 1
        if batch.ran == len(batch.requests):
            self._end(batch, batch.clock)
        elif now >= deadline and (batch.cancel_initiated is None or batch.cancel_initiated >= deadline):
            # Out of time part-way: what ran stays, the rest expires unrun.
            for pending in batch.requests[batch.ran :]:
                pending.result = {"type": "expired"}
            self._end(batch, deadline)
        elif (
            batch.cancel_initiated is not None and now >= batch.cancel_initiated + self.knobs.cancel_ms / 1000
        ):
            for pending in batch.requests[batch.ran :]:
                pending.result = {"type": "canceled"}
            self._end(batch, batch.cancel_initiated + self.knobs.cancel_ms / 1000)

    def _run(self, request: SentRequest, at: float) -> None:
        """Answer one request at simulated time `at`."""
        params = request.body
        if not isinstance(params.get("messages"), list) or not params["messages"]:
            request.result = self._errored("invalid_request_error", "messages: Field required")
        elif self.chance(self.knobs.expire_rate, "expire", request.custom_id, request.attempt):
            request.result = {"type": "expired"}
        elif self.chance(self.knobs.fail_rate, "fail", request.custom_id, request.attempt):
            request.result = self._errored("api_error", SERVER_ERROR_MESSAGE)
        else:
            shape = self.answer_shape(request.custom_id, request.attempt)
            request.result = {"type": "succeeded", "message": self._message(params, shape)}
            self._inferences[request.custom_id] += 1

    @staticmethod
    def _errored(error_type: str, message: str) -> dict:
        return {"type": "errored", "error": envelope(error_type, message)}

    def _message(self, params: dict, shape: str = "") -> dict:
        """The Messages API answer to `params`, written by textgen (shaped as `textgen.answer`
        says: a refusal stops with `refusal`, a cut-off with `max_tokens`; fenced JSON and prose
        come as a text block where the model was made to call the tool)."""
        system = params.get("system")
        messages = [{"role": "system", "content": system}] if system else []
        messages += [m for m in params.get("messages") or [] if isinstance(m, dict)]
        body = {"model": params["model"], "messages": messages, "max_completion_tokens": params["max_tokens"]}
        tool = AnthropicEmulator._forced_tool(params)
        if tool is not None:
            schema = tool.get("input_schema") or {}
            body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        text, usage, stopped = textgen.answer(body, shape, self.knobs.optional_properties)
        stop_reason = {"truncated": "max_tokens", "refused": "refusal"}.get(stopped, "end_turn")
        if tool is None or stopped == "refused" or shape in (textgen.FENCED, textgen.PROSE):
            content = [{"type": "text", "text": text}]
        else:
            try:
                tool_input = json.loads(text)
            except ValueError:  # cut short at max_tokens: the tool call is incomplete
                tool_input = {}
            content = [
                {"type": "tool_use", "id": _new_id("toolu_"), "name": tool.get("name"), "input": tool_input}
            ]
            stop_reason = "max_tokens" if stop_reason == "max_tokens" else "tool_use"
        return {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": params["model"],
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "service_tier": "batch",
            },
        }

    @staticmethod
    def _forced_tool(params: dict) -> dict | None:
        """The tool `tool_choice` makes the model call, if it makes it call one."""
        tools = [tool for tool in params.get("tools") or [] if isinstance(tool, dict)]
        choice = params.get("tool_choice") if isinstance(params.get("tool_choice"), dict) else {}
        if choice.get("type") == "tool":
            return next((tool for tool in tools if tool.get("name") == choice.get("name")), None)
        if choice.get("type") == "any" and tools:
            return tools[0]
        return None

    def _end(self, batch: _Batch, at: float) -> None:
        batch.processing_status = "ended"
        batch.ended = at
        batch.counts = Counter(request.result["type"] for request in batch.requests)
        batch.miscounted = self.knobs.count_mismatch
        batch.results = self._results_file(batch)

    def _results_file(self, batch: _Batch) -> bytes:
        """The JSONL results, shuffled and spoiled as the knobs say; seeded by the batch's
        requests, not its random id, so a rerun writes the same file."""
        rng = spoiling.seeded(
            self.seed, spoiling.requests_key((r.custom_id, r.attempt) for r in batch.requests)
        )
        requests = list(batch.requests)
        rng.shuffle(requests)  # order is never promised
        texts = [json.dumps({"custom_id": r.custom_id, "result": r.result}) for r in requests]
        knobs = self.knobs
        succeeded = (
            (text, r.custom_id, r.attempt)
            for r, text in zip(requests, texts, strict=True)
            if r.result["type"] == "succeeded"
        )
        extra = spoiling.repeated(self.seed, knobs.duplicate_lines, succeeded)
        # Made-up lines read like their neighbours; they are not inferences anyone asked for.
        prompt = {"model": "claude-emulator", "max_tokens": 200, "messages": [UNASKED]}

        def made_up(custom_id: str) -> str:
            result = {"type": "succeeded", "message": self._message(prompt)}
            return json.dumps({"custom_id": custom_id, "result": result})

        extra += spoiling.made_up_lines(knobs, made_up)
        return jsonl(spoiling.scattered(texts, extra, rng))
