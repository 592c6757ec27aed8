"""A local emulator of the Gemini API's Batch Mode (reference/providers.md §4), at the real REST
paths under `/v1beta`, with the shapes the `google-genai` SDK sends and reads (camelCase; proto
JSON also accepts snake_case on input, so both are read).

- `POST /v1beta/models/{model}:batchGenerateContent` with
  `{"batch": {"displayName", "inputConfig": {"requests": {"requests": [{"request", "metadata": {"key"}}]}}}}`
  or `"inputConfig": {"fileName": "files/…"}` answers a long-running Operation
  `{"name": "batches/…", "metadata": GenerateContentBatch}`.
- `GET /v1beta/batches/{id}` the Operation; once ended `done: true`, and the results both in
  `metadata.output` (where the SDK reads them) and in `response` (where the REST guide reads
  them): inline batches `inlinedResponses.inlinedResponses`, each `{"response":
  GenerateContentResponse | "error": google.rpc.Status, "metadata": {"key"}}`; file batches
  `responsesFile: "files/batch-…"`, a JSONL file of `{"key", "response" | "error"}` lines.
- `GET /v1beta/batches?pageSize&pageToken` `{"operations": [...], "nextPageToken"}`, newest first;
  `GET /v1beta/files?pageSize&pageToken` `{"files": [...], "nextPageToken"}` likewise. A `pageSize`
  of 0 or none is the default, one above the maximum the maximum, a negative one a 400 (AIP-158).
- `POST /v1beta/batches/{id}:cancel` `{}`; `DELETE /v1beta/batches/{id}` `{}`.
- Errors in Google's envelope `{"error": {"code", "message", "status"}}`.
- An inline request without `metadata` is answered like any other, in its place in the
  `inlinedResponses`, without `metadata`; a file line without `key` likewise, without `key`.

Nothing runs in the background: a batch is brought up to date from timestamps whenever it is
read (with a `webhook_url`, also by a thread that posts the signed `batch.succeeded`,
`batch.failed`, `batch.expired` or `batch.cancelled` event `{"id", "type", "create_time",
"data": {"name": "batches/…", "state"}}` when one ends). It is `BATCH_STATE_PENDING` for `pending_ms`, then `RUNNING`, one request per
`per_request_ms` of simulated time, then `SUCCEEDED` with every response. A cancelled batch keeps
the responses of the requests that ran before the cancel; an expired batch (48 h on the real
service: here `expire_after_ms`, or `expire_rate` of batches) has none at all.

`cut_downloads` cuts the download of a responses file; inline results have no download to cut.
Per-request expiry does not exist on Gemini either: `expire_rate` picks whole batches that
expire. `keyless_responses` writes every response without its request's key (inline: no
`metadata`; file: no `key`), as users report the service answering inline requests
(googleapis/python-genai#2008, googleapis/js-genai#1191), though the REST reference and the SDK's
`InlinedResponse` have the field.
"""

import base64
import hashlib
import json
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from werkzeug.wrappers import Request

from ledger.emulators import spoiling, textgen
from ledger.emulators.gemini_files import FilesApi, proto_get, timestamp
from ledger.emulators.knobs import GeminiKnobs
from ledger.emulators.server import ApiError, Fault, LoseAnswer
from ledger.emulators.units import Attempts, jsonl_lines

MAX_INLINE_BYTES = 20 * 1024 * 1024  # inline requests in one create call [GEM-GUIDE]
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
ENDED = {"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED"}
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"
# HTTP status -> the canonical google.rpc.Code name Google puts in `error.status`.
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# google.rpc.Code numbers, as a per-request `error.code` carries them.
INVALID_ARGUMENT, INTERNAL = 3, 13
UNREGISTERED_CALLER = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)


# Why a candidate withheld for `SAFETY` was withheld.
WITHHELD_RATING = {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}


def _texts(content: Any) -> str:
    parts = proto_get(content, "parts")
    if not isinstance(parts, list):
        return ""
    return "".join(
        part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str)
    )


def _lower_types(schema: Any) -> Any:
    """An OpenAPI-style `responseSchema` (types in capitals) as the JSON schema textgen reads."""
    if isinstance(schema, dict):
        return {
            key: value.lower() if key == "type" and isinstance(value, str) else _lower_types(value)
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_lower_types(value) for value in schema]
    return schema


def chat_body(model: str, request: dict) -> dict:
    """A GenerateContentRequest as the chat-completions body `textgen` answers."""
    messages = []
    system = _texts(proto_get(request, "systemInstruction"))
    if system:
        messages.append({"role": "system", "content": system})
    for content in proto_get(request, "contents") or []:
        role = "assistant" if proto_get(content, "role") == "model" else "user"
        messages.append({"role": role, "content": _texts(content)})
    body: dict = {"model": model, "messages": messages}
    config = proto_get(request, "generationConfig") or {}
    if isinstance(proto_get(config, "maxOutputTokens"), int):
        body["max_completion_tokens"] = proto_get(config, "maxOutputTokens")
    schema = proto_get(config, "responseJsonSchema")
    if schema is None and proto_get(config, "responseSchema") is not None:
        schema = _lower_types(proto_get(config, "responseSchema"))
    if isinstance(schema, dict) and proto_get(config, "responseMimeType") == "application/json":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return body


@dataclass
class _Request:
    key: Any  # metadata.key as sent (a string from any well-behaved client)
    request: dict
    attempt: int  # how many earlier batches carried this key
    outcome: str = ""  # once it has run: "ok", "failed" (a server error) or "invalid"
    answer: dict | None = None  # its inlined response, once the batch has ended


@dataclass
class _Batch:
    id: str
    model: str
    display_name: str
    created: float
    requests: list[_Request]
    refusal: str = ""  # why the whole batch fails when it would start running
    state: str = "BATCH_STATE_PENDING"
    updated: float = 0.0
    ended: float | None = None
    ran: int = 0  # requests[:ran] have run
    clock: float = 0.0  # the simulated time up to which requests have run
    expiring: bool = False  # picked by `expire_rate`: runs nothing, ends EXPIRED
    inlined: list[dict] | None = None  # the inlined responses, written when the batch ends
    stats: dict = field(default_factory=dict)
    input_file: str = ""  # `files/…` when the requests came in a file: the responses go in one too
    responses_file: str = ""  # `files/batch-…`, written when a file batch ends with responses

    @property
    def name(self) -> str:
        return f"batches/{self.id}"


class GeminiEmulator(FilesApi):
    protocol = "gemini"
    base_path = "/v1beta"
    api_prefix = "/v1beta/"
    create_rule = ("POST", r"/v1beta/models/[^/]+:batchGenerateContent")
    knobs_class = GeminiKnobs

    def __init__(self, *, pending_ms: float = 50, **kwargs: Any) -> None:
        """`pending_ms`: how long a batch waits before it starts running; `kwargs`: host, port,
        seed and any of the `FaultKnobs`."""
        self.pending_ms = pending_ms
        self._batches: dict[str, _Batch] = {}
        self._attempts = Attempts()
        self._inferences: Counter = Counter()
        self._intents: Counter = Counter()  # batches created per display name, deleted ones too
        super().__init__(**kwargs)

    # --- the protocol's plumbing ------------------------------------------------------------

    routes = (
        "POST /v1beta/models/<model>:batchGenerateContent create_batch",
        "GET /v1beta/batches list_batches",
        "GET /v1beta/batches/<batch_id> get_batch",
        "DELETE /v1beta/batches/<batch_id> delete_batch",
        "POST /v1beta/batches/<batch_id>:cancel cancel_batch",
    ) + FilesApi.routes

    def envelope(self, fault: Fault) -> ApiError:
        status = fault.status
        name = fault.code or STATUS_NAMES.get(status) or ("INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
        body: dict = {"error": {"code": status, "message": fault.message, "status": name}}
        retry_after = fault.headers.get("retry-after")
        if status == 429 and retry_after:
            # Google says when to come back in a RetryInfo detail; the header is kept as well.
            body["error"]["details"] = [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after}s"}
            ]
        return ApiError(status, body, fault.headers)

    def billing_refusal(self) -> ApiError:
        return self.error(
            400,
            "Gemini API free tier is not available in your country. Please enable billing on your "
            "project in Google AI Studio.",
            code="FAILED_PRECONDITION",
        )

    def authenticate(self, request: Request) -> None:
        if not (request.headers.get("x-goog-api-key") or request.args.get("key")):
            raise self.error(403, UNREGISTERED_CALLER, kind="authentication")

    def evidence(self) -> dict:
        return {
            "inferences": dict(self._inferences),
            "batches": len(self._batches),
            "batches_by_intent": dict(self._intents),
            "files": {file.name: file.source for file in self._files.values()},
        }

    def advance(self) -> None:
        now = self.clock.now()
        for batch in self._batches.values():
            self._advance(batch, now)

    # --- endpoints ----------------------------------------------------------------------------

    def create_batch(self, request: Request, model: str) -> dict:
        """Create a batch; raises `LoseAnswer` after creating it when `lose_create_responses` says so."""
        if request.content_length and request.content_length > MAX_INLINE_BYTES:
            raise self.error(400, f"Request payload size exceeds the limit: {MAX_INLINE_BYTES} bytes.")
        body = self.json_body(request)
        batch_body = proto_get(body, "batch")
        if not isinstance(batch_body, dict):
            raise self.error(400, "Invalid JSON payload: 'batch' must be an object.")
        display_name = proto_get(batch_body, "displayName")
        if not isinstance(display_name, str) or not display_name:
            raise self.error(
                400, "* BatchGenerateContentRequest.batch.display_name: display_name is required"
            )
        input_config = proto_get(batch_body, "inputConfig")
        file_name = proto_get(input_config, "fileName")
        unreadable = ""
        if file_name is not None:
            # The lines are read when the batch is created; one that cannot be read fails the
            # whole batch when it would start, as repeated keys do.
            entries, unreadable = self._file_entries(file_name)
        else:
            entries = proto_get(proto_get(input_config, "requests"), "requests")
            if not isinstance(entries, list) or not entries:
                raise self.error(
                    400, "* BatchGenerateContentRequest.batch.input_config: requests are required"
                )
            for number, entry in enumerate(entries):
                if not isinstance(proto_get(entry, "request"), dict):
                    raise self.error(
                        400, f"* requests[{number}].request: a GenerateContentRequest is required"
                    )
                if not isinstance(proto_get(entry, "metadata") or {}, dict):
                    raise self.error(400, f"* requests[{number}].metadata: must be a map of strings")
        keys = Counter((proto_get(entry, "metadata") or {}).get("key") for entry in entries)
        repeated = sorted(str(key) for key, times in keys.items() if key is not None and times > 1)
        refusal = unreadable or (
            f"Duplicate request keys in the batch: {', '.join(repeated)[:500]}" if repeated else ""
        )
        with self.lock:
            now = self.clock.now()
            requests = []
            for entry in entries:
                key = (proto_get(entry, "metadata") or {}).get("key")
                requests.append(_Request(key, proto_get(entry, "request"), attempt=self._attempts.next(key)))
            batch = _Batch(
                id=uuid.uuid4().hex + uuid.uuid4().hex[:8],
                model=model if model.startswith("models/") else f"models/{model}",
                display_name=display_name,
                created=now,
                updated=now,
                requests=requests,
                # Accepted, then failed as a whole: the service checks keys when it runs the batch.
                refusal=refusal,
                input_file=file_name or "",
            )
            self._batches[batch.id] = batch
            self._intents[display_name] += 1
            answer = self._operation(batch)
        if self.take_lost_create():
            raise LoseAnswer(batch.name)
        return answer

    def get_batch(self, request: Request, batch_id: str) -> dict:
        with self.lock:
            return self._operation(self._batch(batch_id))

    def list_batches(self, request: Request) -> dict:
        start, size = self._page(request, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        with self.lock:
            now = self.clock.now()
            newest_first = list(reversed(self._batches.values()))  # kept in the order they were created
            page = newest_first[start : start + size]
            for batch in page:
                self._advance(batch, now)
            answer: dict = {"operations": [self._operation(batch) for batch in page]}
        return self._paged(answer, start + size, len(newest_first))

    def cancel_batch(self, request: Request, batch_id: str) -> dict:
        with self.lock:
            batch = self._batch(batch_id)
            if batch.state in ENDED:
                raise self.error(
                    400, f"Batch {batch.name} is already in state {batch.state}.", code="FAILED_PRECONDITION"
                )
            self._end(batch, "BATCH_STATE_CANCELLED", self.clock.now())
            return {}

    def delete_batch(self, request: Request, batch_id: str) -> dict:
        with self.lock:
            self._batch(batch_id)
            del self._batches[batch_id]
            return {}

    def _file_entries(self, file_name: Any) -> tuple[list[dict], str]:
        """The requests of an uploaded JSONL file as inline entries, and why the batch will fail
        when one of its lines cannot be read ("" when all can)."""
        file_id = file_name.removeprefix("files/") if isinstance(file_name, str) else ""
        with self.lock:
            stored = self._files.get(file_id)
        if stored is None or not file_id:
            raise self.error(
                400, f"* BatchGenerateContentRequest.batch.input_config.file_name: {file_name} not found"
            )
        entries: list[dict] = []
        problems: list[str] = []
        for number, text in jsonl_lines(stored.content):
            try:
                line = json.loads(text)
            except ValueError:
                problems.append(f"line {number}: not JSON")
                continue
            if not isinstance(line, dict) or not isinstance(proto_get(line, "request"), dict):
                problems.append(f"line {number}: no GenerateContentRequest in 'request'")
                continue
            entry: dict = {"request": proto_get(line, "request")}
            if line.get("key") is not None:
                entry["metadata"] = {"key": line["key"]}
            entries.append(entry)
        if not entries and not problems:
            raise self.error(
                400,
                f"* BatchGenerateContentRequest.batch.input_config.file_name: {file_name} has no requests",
            )
        return entries, ("Invalid input file: " + "; ".join(problems)[:500]) if problems else ""

    # --- the simulation (callers hold the lock) ------------------------------------------

    def _batch(self, batch_id: str) -> _Batch:
        batch = self._batches.get(batch_id)
        if batch is None:
            raise self.error(404, f"Batch batches/{batch_id} not found.", kind="not_found")
        self._advance(batch, self.clock.now())
        return batch

    def _operation(self, batch: _Batch) -> dict:
        """The batch as the long-running Operation Google answers with."""
        metadata: dict = {
            "@type": BATCH_TYPE,
            "model": batch.model,
            "displayName": batch.display_name,
            "createTime": timestamp(batch.created),
            "updateTime": timestamp(batch.updated),
            "batchStats": self._batch_stats(batch),
            "state": batch.state,
            "name": batch.name,
        }
        if batch.input_file:
            metadata["inputConfig"] = {"fileName": batch.input_file}
        operation: dict = {"name": batch.name, "metadata": metadata}
        if batch.ended is not None:
            metadata["endTime"] = timestamp(batch.ended)
            operation["done"] = True
            if batch.state == "BATCH_STATE_FAILED":
                operation["error"] = {"code": INVALID_ARGUMENT, "message": batch.refusal}
            elif batch.responses_file:
                metadata["output"] = {"responsesFile": batch.responses_file}
                operation["response"] = {"@type": OUTPUT_TYPE, **metadata["output"]}
            elif batch.inlined is not None:
                metadata["output"] = {"inlinedResponses": {"inlinedResponses": batch.inlined}}
                operation["response"] = {"@type": OUTPUT_TYPE, **metadata["output"]}
        return operation

    def _batch_stats(self, batch: _Batch) -> dict:
        """Proto3 JSON: int64 as strings, zeros left out."""
        if batch.ended is not None and batch.stats:
            counts = batch.stats
        else:
            ran = batch.requests[: batch.ran]
            counts = {
                "requestCount": len(batch.requests),
                "successfulRequestCount": sum(r.outcome == "ok" for r in ran),
                "failedRequestCount": sum(r.outcome == "failed" for r in ran),
                "pendingRequestCount": 0 if batch.ended is not None else len(batch.requests) - batch.ran,
            }
        return {name: str(value) for name, value in counts.items() if value}

    def _advance(self, batch: _Batch, now: float) -> None:
        """Replay what would have happened to `batch` up to `now`."""
        if batch.state in ENDED:
            return
        knobs = self.knobs
        step = knobs.per_request_ms / 1000
        start = batch.created + self.pending_ms / 1000
        deadline = math.inf if knobs.expire_after_ms is None else batch.created + knobs.expire_after_ms / 1000
        if batch.state == "BATCH_STATE_PENDING" and now >= start and start < deadline:
            if batch.refusal:
                self._end(batch, "BATCH_STATE_FAILED", start)
                return
            batch.state, batch.updated, batch.clock = "BATCH_STATE_RUNNING", start, start
            key = spoiling.requests_key((r.key, r.attempt) for r in batch.requests)
            batch.expiring = self.chance(knobs.expire_rate, "expire", key)
        if batch.state == "BATCH_STATE_RUNNING" and not batch.expiring:
            while batch.ran < len(batch.requests) and batch.clock + step <= min(now, deadline):
                batch.clock += step
                self._run(batch.requests[batch.ran])
                batch.ran += 1
                batch.updated = batch.clock
            if batch.ran == len(batch.requests):
                self._end(batch, "BATCH_STATE_SUCCEEDED", batch.clock)
                return
        if batch.expiring and math.isinf(deadline):
            # Picked to expire with no deadline set: it expires when it would have finished.
            deadline = start + step * len(batch.requests)
        if now >= deadline:
            self._end(batch, "BATCH_STATE_EXPIRED", deadline)

    def _run(self, request: _Request) -> None:
        """Decide how one request turns out (its answer is written when the batch ends)."""
        if not any(_texts(content).strip() for content in proto_get(request.request, "contents") or []):
            request.outcome = "invalid"
        elif self.chance(self.knobs.fail_rate, "fail", request.key, request.attempt):
            request.outcome = "failed"
        else:
            request.outcome = "ok"

    def _end(self, batch: _Batch, state: str, at: float) -> None:
        batch.state, batch.updated, batch.ended = state, at, at
        if state in ("BATCH_STATE_SUCCEEDED", "BATCH_STATE_CANCELLED"):
            ran = batch.requests[: batch.ran]
            for request in ran:
                request.answer = self._written_answer(batch, request, at)
            succeeded = sum(r.outcome == "ok" for r in ran)
            batch.stats = {
                "requestCount": len(batch.requests),
                "successfulRequestCount": succeeded + self.knobs.count_mismatch,
                "failedRequestCount": len(ran) - succeeded,
            }
            spoiled = self._spoil(batch, ran, at)
            if batch.input_file:
                content = b"".join(_file_line(answer) + b"\n" for answer in spoiled)
                # Named after the batch, as Google's are (`files/batch-…`; a file id is at most 40
                # lowercase letters, digits and dashes).
                stored = self._store(
                    f"{batch.name}-responses",
                    "application/jsonl",
                    content,
                    source="GENERATED",
                    file_id=f"batch-{batch.id[:32]}",
                )
                batch.responses_file = stored.name
            else:
                batch.inlined = spoiled
        else:
            batch.stats = {"requestCount": len(batch.requests)}
        # The event Gemini posts to a project's webhook (ledger/notices/provider_hooks.py says what BatchDesk
        # reads of it: the batch's resource name).
        kind = "batch." + state.removeprefix("BATCH_STATE_").lower()
        event = {
            "id": f"evt_{uuid.uuid4().hex}",
            "type": kind,
            "create_time": timestamp(at),
            "data": {"name": batch.name, "state": state},
        }
        self.webhooks.announce(self.knobs, kind, batch.name, event)

    def _written_answer(self, batch: _Batch, request: _Request, at: float) -> dict:
        answer: dict
        if request.outcome == "ok":
            self._inferences[request.key] += 1
            shape = self.answer_shape(request.key, request.attempt)
            answer = {"response": self._response(batch, request.request, at, shape)}
        elif request.outcome == "invalid":
            message = "Unable to submit request because it has an empty text parameter."
            answer = {"error": {"code": INVALID_ARGUMENT, "message": message}}
        else:
            answer = {"error": {"code": INTERNAL, "message": "Internal error encountered."}}
        if request.key is not None and not self.knobs.keyless_responses:
            answer["metadata"] = {"key": request.key}
        return answer

    def _response(self, batch: _Batch, request: dict, at: float, shape: str = "") -> dict:
        """A GenerateContentResponse answering `request` (shaped as `textgen.answer` says: cut off
        at `MAX_TOKENS`, or withheld for `SAFETY` with no content, as Gemini withholds one)."""
        body = chat_body(batch.model.removeprefix("models/"), request)
        content, usage, stopped = textgen.answer(body, shape, self.knobs.optional_properties)
        digest = hashlib.sha256(f"{batch.id}:{content}:{at}".encode()).digest()
        candidate = {
            "content": {"parts": [{"text": content}], "role": "model"},
            "finishReason": "MAX_TOKENS" if stopped == "truncated" else "STOP",
            "index": 0,
        }
        if stopped == "refused":
            candidate = {"finishReason": "SAFETY", "index": 0, "safetyRatings": [WITHHELD_RATING]}
        return {
            "candidates": [candidate],
            "usageMetadata": {
                "promptTokenCount": usage["prompt_tokens"],
                "candidatesTokenCount": usage["completion_tokens"],
                "totalTokenCount": usage["total_tokens"],
            },
            "modelVersion": batch.model.removeprefix("models/"),
            "responseId": base64.urlsafe_b64encode(digest[:16]).decode().rstrip("="),
        }

    def _spoil(self, batch: _Batch, ran: list[_Request], at: float) -> list[dict]:
        """The inlined responses with the repeated, unknown and malformed entries the knobs ask
        for, at places drawn from the seed and the batch's requests."""
        knobs = self.knobs
        rng = spoiling.hashed_order(self.seed, ((r.key, r.attempt) for r in batch.requests))
        succeeded = ((r.answer, r.key, r.attempt) for r in ran if r.outcome == "ok")
        extra = spoiling.repeated(self.seed, knobs.duplicate_lines, succeeded)
        # Made-up answers read like their neighbours; they are not inferences anyone asked for.
        prompt = {"contents": [{"role": "user", "parts": [{"text": spoiling.UNASKED_TITLE}]}]}

        def malformed(n: int) -> dict:
            # No usable key: an answer whose metadata went missing, or a key that is not a string.
            return {"response": self._response(batch, prompt, at)} if n % 2 else {"metadata": {"key": n}}

        extra += spoiling.made_up(
            knobs,
            lambda n: {"response": self._response(batch, prompt, at), "metadata": {"key": f"unknown-{n}"}},
            malformed,
        )
        return spoiling.scattered([request.answer for request in ran], extra, rng)


def _file_line(answer: dict) -> bytes:
    """An inlined response as a line of a responses file: `{"key", "response" | "error"}`. An answer
    whose key is not a string is written as the broken line it stands for (not JSON)."""
    line = {name: value for name, value in answer.items() if name != "metadata"}
    metadata = answer.get("metadata")
    if isinstance(metadata, dict):
        key = metadata.get("key")
        if not isinstance(key, str):
            return f'{{"key": {json.dumps(key)}, "response": {{"candidates": ['.encode()
        line = {"key": key, **line}
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
