"""A local emulator of OpenAI's Files + Batch API (reference/providers.md §1 and §7).

It speaks the real wire protocol, so the OpenAI adapter and the official SDK talk to it
unchanged, and it answers with `textgen` instead of a model. Batches move through the real
statuses as time passes: nothing runs in the background; a batch is brought up to date
whenever it is read, from timestamps, under one lock.

Fault knobs (`Knobs`) make it misbehave the ways a real provider does: requests that fail or
expire, batches that expire part-way, calls answered 429 or 500, a create call whose answer
is lost, downloads cut short, and output files with repeated, unknown or malformed lines.
Whatever involves chance is drawn from the seed (per request: seed + custom_id + attempt;
per file: seed + the batch's requests), so a run is reproducible while a retried custom_id
gets a fresh roll of the dice.
"""

import contextlib
import email.parser
import email.policy
import hashlib
import json
import logging
import math
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from ledger.emulators import textgen
from ledger.providers.openai import INTENT_METADATA_KEY

log = logging.getLogger(__name__)

ENDPOINT = "/v1/chat/completions"  # the only endpoint the emulator can answer
DAY = 86400
FILE_TTL = 30 * DAY
MAX_UPLOAD_BYTES = 200 * 1024 * 1024
MAX_REQUESTS = 50_000
TERMINAL = {"failed", "completed", "expired", "cancelled"}
STAMPS = ["in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"]
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


class ApiError(Exception):
    """An HTTP error answered with OpenAI's `{"error": {message, type, param, code}}` envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}
        self.headers = headers or {}


class LoseAnswer(Exception):
    """The call did its work, but a fault knob says its caller must never hear the answer."""


class Download(NamedTuple):
    """A file's bytes, and where to hang up if a fault knob cuts this download short."""

    content: bytes
    cut_at: int | None = None


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int
    expires_at: int | None

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass
class _Request:
    """One input line of a batch and, once it has run, its output or error line."""

    custom_id: str
    body: dict
    attempt: int  # how many earlier batches carried this custom_id
    result: dict | None = None
    succeeded: bool = False


@dataclass
class _Batch:
    id: str
    input_file: _File
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
    miscounted: bool = False  # `count_mismatch` was on when its files were written

    def as_json(self) -> dict:
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
            "request_counts": {
                "total": len(self.requests),
                "completed": sum(r.succeeded for r in self.requests) + self.miscounted,
                "failed": sum(r.result is not None and not r.succeeded for r in self.requests),
            },
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


def _error_line(custom_id: str, status: int, message: str, type: str, param: str | None = None) -> dict:
    body = ApiError(status, message, type=type, param=param).body
    response = {"status_code": status, "request_id": _new_id("req_"), "body": body}
    return {"id": _new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}


def _failure_line(custom_id: str, code: str, message: str) -> dict:
    error = {"code": code, "message": message}
    return {"id": _new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}


def _share(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ApiError(400, f"{name} must be a number from 0 to 1", param=name)
    return value


def _duration(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ApiError(400, f"{name} must be a number of at least 0", param=name)
    return value


def _optional_duration(name: str, value: Any) -> float | None:
    return None if value is None else _duration(name, value)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"{name} must be a whole number of at least 0", param=name)
    return value


def _call_numbers(name: str, value: Any) -> list[int]:
    if not (
        isinstance(value, list | tuple | set | frozenset)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value)
    ):
        raise ApiError(400, f"{name} must be a list of whole numbers of at least 1", param=name)
    return sorted(set(value))


def _path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    method, _, path = value.rpartition(" ") if isinstance(value, str) else ("", "", "")
    if not path.startswith("/") or method not in {"", "GET", "POST", "DELETE"}:
        raise ApiError(
            400, f"{name} must be a path prefix such as '/v1/batches' or 'POST /v1/batches'", param=name
        )
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false", param=name)
    return value


def _knob(default: Any, check: Callable[[str, Any], Any]) -> Any:
    if isinstance(default, list):
        return field(default_factory=list, metadata={"check": check})
    return field(default=default, metadata={"check": check})


@dataclass
class Knobs:
    """What `Emulator(...)`, `Emulator.configure(...)`, `POST /_emulator/config` and the flags
    of `run_emulator` set. Everything but the pace is off by default.

    Calls are counted from when their knob was set, and `GET /_emulator/config` shows what is
    still to come ("the next 2 calls", "the 3rd batch created from now"), so posting back what
    it shows changes nothing. Knobs that shape results apply to requests not yet run and to
    output files not yet written.
    """

    per_request_ms: float = _knob(100, _duration)  # simulated time to answer one request
    fail_rate: float = _knob(0.0, _share)  # share of requests answered 500 in the error file
    expire_rate: float = _knob(0.0, _share)  # share of requests written as `batch_expired`
    # A batch in progress this long expires: requests not yet run become `batch_expired`.
    expire_after_ms: float | None = _knob(None, _optional_duration)
    # The N-th batch created from now (calls answered 4xx/5xx don't count) is created, but
    # the connection is dropped instead of answering.
    lose_create_responses: list[int] = _knob([], _call_numbers)
    # The next K API calls (under /v1/, optionally only those whose path starts with the
    # prefix, itself optionally led by a method: "POST /v1/batches") are refused before doing
    # anything: 429 with `retry-after: retry_after` (seconds), or 500.
    rate_limit_calls: int = _knob(0, _count)
    rate_limit_path: str | None = _knob(None, _path)
    retry_after: float = _knob(1, _duration)
    server_errors: int = _knob(0, _count)
    server_error_path: str | None = _knob(None, _path)
    # Output files: this share of success lines written twice, this many success lines with
    # custom_ids never sent (`unknown-<n>`), this many half lines that are not JSON; all at
    # seeded places. `count_mismatch` makes `request_counts.completed` one more than the files.
    duplicate_lines: float = _knob(0.0, _share)
    unknown_lines: int = _knob(0, _count)
    malformed_lines: int = _knob(0, _count)
    count_mismatch: bool = _knob(False, _flag)
    # The first K downloads of each file's content (from when this was set) send the full
    # Content-Length, about half the bytes, then hang up.
    cut_downloads: int = _knob(0, _count)


KNOB_NAMES = [knob.name for knob in fields(Knobs)]


def _matches(prefix: str | None, method: str, path: str) -> bool:
    """Whether a call falls under a knob's path prefix ("/v1/batches" or "POST /v1/batches")."""
    if prefix is None:
        return True
    wanted_method, _, wanted_path = prefix.rpartition(" ")
    return wanted_method in ("", method) and path.startswith(wanted_path)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _mid_line(content: bytes) -> int:
    """About half of `content`, never just after a newline, so the cut splits a line."""
    cut = len(content) // 2
    return cut - 1 if cut > 1 and content[cut - 1 : cut] == b"\n" else cut


class Emulator:
    """The emulated provider: its state, its clock, and the HTTP server in front of them."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        validating_ms: float = 200,
        finalizing_ms: float = 50,
        **knobs: Any,
    ) -> None:
        """`knobs` are any of `Knobs`' fields."""
        self.host, self.port, self.seed = host, port, seed
        self.validating_ms, self.finalizing_ms = validating_ms, finalizing_ms
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}
        self._batches: dict[str, _Batch] = {}  # in creation order
        self._inferences: Counter = Counter()
        self._attempts: Counter = Counter()
        self._creates = 0
        self._rejected_calls = 0
        self._downloads: Counter = Counter()
        self._cut_downloads: Counter = Counter()  # since `cut_downloads` was last set
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.knobs = Knobs()
        self.configure(**knobs)

    # --- serving -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulator is not serving")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def _bind(self) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer((self.host, self.port), _Handler)
        # Keep-alive connections park handler threads; don't wait for them when closing.
        server.block_on_close = False
        server.emulator = self  # type: ignore[attr-defined]
        self._server = server
        return server

    def start(self) -> str:
        """Serve from a background thread; returns the base URL (`http://host:port/v1`)."""
        server = self._bind()
        # A short poll interval makes stop() quick (shutdown waits for the next poll).
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="emulator", daemon=True
        )
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve from this thread until interrupted (the `run_emulator` command).

        `on_ready` gets the base URL once the port is bound (it is only known then for port 0).
        """
        server = self._bind()
        if on_ready is not None:
            on_ready(self.base_url)
        try:
            server.serve_forever()
        finally:
            server.server_close()

    def __enter__(self) -> "Emulator":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- knobs and evidence --------------------------------------------------------------

    def configure(self, **knobs: Any) -> dict:
        """Change some of the `Knobs`; returns all of them. Nothing changes if one is invalid."""
        unknown = sorted(set(knobs) - set(KNOB_NAMES))
        if unknown:
            raise ApiError(
                400,
                f"Unknown knob(s) {', '.join(unknown)}; known: {', '.join(KNOB_NAMES)}.",
                param=unknown[0],
            )
        checks = {knob.name: knob.metadata["check"] for knob in fields(Knobs)}
        checked = {name: checks[name](name, value) for name, value in knobs.items()}
        with self._lock:
            # What would have run by now ran under the old knobs; the new ones apply from now on.
            self._advance_all()
            for name, value in checked.items():
                setattr(self.knobs, name, value)
            if "cut_downloads" in checked:
                self._cut_downloads.clear()
            return asdict(self.knobs)

    def config(self) -> dict:
        """The current knobs, as `GET /_emulator/config` shows them."""
        with self._lock:
            return asdict(self.knobs)

    def stats(self) -> dict:
        """What the emulator was asked and did: the evidence tests check.

        `inferences`: how often each custom_id was generated (= paid for); `creates`: batch-create
        calls received, refused ones included; `batches_by_intent`: batches per
        `metadata.batchdesk_intent`; `downloads`: content downloads per file id, cut ones
        included; `rejected_calls`: 429s and 500s served by the fault knobs.
        """
        with self._lock:
            self._advance_all()
            intents = Counter(
                batch.metadata[INTENT_METADATA_KEY]
                for batch in self._batches.values()
                if batch.metadata and INTENT_METADATA_KEY in batch.metadata
            )
            return {
                "inferences": dict(self._inferences),
                "batches": len(self._batches),
                "files": len(self._files),
                "creates": self._creates,
                "batches_by_intent": dict(intents),
                "downloads": dict(self._downloads),
                "rejected_calls": self._rejected_calls,
            }

    def admit(self, method: str, path: str) -> None:
        """Count one API call, and refuse it (429, then 500) while a fault knob says so."""
        with self._lock:
            knobs = self.knobs
            if (method, path) == ("POST", "/v1/batches"):
                self._creates += 1
            if knobs.rate_limit_calls and _matches(knobs.rate_limit_path, method, path):
                knobs.rate_limit_calls -= 1
                self._rejected_calls += 1
                wait = _seconds(knobs.retry_after)
                raise ApiError(
                    429,
                    "Rate limit reached for requests per min (RPM) on the emulator: Limit 1, Used 1, "
                    f"Requested 1. Please try again in {wait}s.",
                    type="requests",
                    code="rate_limit_exceeded",
                    headers={"retry-after": wait},
                )
            if knobs.server_errors and _matches(knobs.server_error_path, method, path):
                knobs.server_errors -= 1
                self._rejected_calls += 1
                raise ApiError(
                    500,
                    "The server had an error while processing your request. Sorry about that!",
                    type="server_error",
                )

    # --- the API -------------------------------------------------------------------------

    def create_file(self, *, filename: str, purpose: str, content: bytes, ttl: int | None = None) -> dict:
        if purpose != "batch":
            raise ApiError(
                400, f"Invalid purpose {purpose!r}: the emulator accepts 'batch'.", param="purpose"
            )
        now = int(time.time())
        file = _File(_new_id("file-"), filename, purpose, content, now, now + (ttl or FILE_TTL))
        with self._lock:
            self._files[file.id] = file
        return file.as_json()

    def _file(self, file_id: str) -> _File:
        if file_id not in self._files:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return self._files[file_id]

    def get_file(self, file_id: str) -> dict:
        with self._lock:
            return self._file(file_id).as_json()

    def download(self, file_id: str) -> Download:
        """A file's content, counted; `cut_at` is set while `cut_downloads` cuts this file."""
        with self._lock:
            file = self._file(file_id)
            self._downloads[file_id] += 1
            if self._cut_downloads[file_id] < self.knobs.cut_downloads and file.content:
                self._cut_downloads[file_id] += 1
                log.info("cutting download %s of %s short", self._downloads[file_id], file_id)
                return Download(file.content, _mid_line(file.content))
            return Download(file.content)

    def create_batch(self, body: Any) -> dict:
        """Create a batch; raises `LoseAnswer` after creating it when `lose_create_responses` says so."""
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise ApiError(400, f"Missing required parameter: '{name}'.", param=name)
        if body["endpoint"] != ENDPOINT:
            raise ApiError(400, f"The emulator only serves endpoint {ENDPOINT}.", param="endpoint")
        metadata = body.get("metadata")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and len(metadata) <= 16
            and all(isinstance(k, str) and len(k) <= 64 for k in metadata)
            and all(isinstance(v, str) and len(v) <= 512 for v in metadata.values())
        ):
            raise ApiError(
                400, "metadata takes at most 16 string pairs (keys ≤64, values ≤512).", param="metadata"
            )
        expires_after = body.get("output_expires_after") or {}
        output_ttl = expires_after.get("seconds", FILE_TTL) if isinstance(expires_after, dict) else None
        if not isinstance(output_ttl, int) or not 3600 <= output_ttl <= 30 * DAY:
            raise ApiError(
                400, "output_expires_after.seconds must be 3600-2592000.", param="output_expires_after"
            )
        with self._lock:
            input_file = self._file(body["input_file_id"])
            if input_file.purpose != "batch":
                raise ApiError(400, "The input file must have purpose 'batch'.", param="input_file_id")
            batch = _Batch(
                id=_new_id("batch_"),
                input_file=input_file,
                endpoint=body["endpoint"],
                completion_window=body["completion_window"],
                metadata=metadata,
                output_ttl=output_ttl,
                created=time.time(),
            )
            self._batches[batch.id] = batch
            lost = 1 in self.knobs.lose_create_responses
            self.knobs.lose_create_responses = [n - 1 for n in self.knobs.lose_create_responses if n > 1]
            if lost:
                log.info("losing the answer to the create call of %s", batch.id)
                raise LoseAnswer(batch.id)
            return batch.as_json()

    def _batch(self, batch_id: str) -> _Batch:
        if batch_id not in self._batches:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        batch = self._batches[batch_id]
        self._advance(batch, time.time())
        return batch

    def get_batch(self, batch_id: str) -> dict:
        with self._lock:
            return self._batch(batch_id).as_json()

    def list_batches(self, *, after: str | None = None, limit: int = 20) -> dict:
        """Newest first; `after` is the id of the last batch of the previous page."""
        if not 1 <= limit <= 100:
            raise ApiError(400, "limit must be from 1 to 100.", param="limit")
        with self._lock:
            ids = list(reversed(self._batches))
            if after is not None:
                if after not in self._batches:
                    raise ApiError(400, f"No batch found with id '{after}'.", param="after")
                ids = ids[ids.index(after) + 1 :]
            page = [self._batch(batch_id).as_json() for batch_id in ids[:limit]]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(ids) > limit,
        }

    def cancel_batch(self, batch_id: str) -> dict:
        with self._lock:
            batch = self._batch(batch_id)
            if batch.status in TERMINAL:
                raise ApiError(400, f"Cannot cancel a batch with status '{batch.status}'.", param="batch_id")
            if batch.status != "cancelling":
                batch.status = "cancelling"
                batch.stamps["cancelling"] = time.time()
            return batch.as_json()

    # --- the simulation (callers hold the lock) ------------------------------------------

    def _advance_all(self) -> None:
        now = time.time()
        for batch in self._batches.values():
            self._advance(batch, now)

    def _advance(self, batch: _Batch, now: float) -> None:
        """Replay what would have happened to `batch` up to `now`, stamping each step."""
        settle = self.finalizing_ms / 1000
        if batch.status == "validating" and now >= batch.created + self.validating_ms / 1000:
            self._validate(batch, batch.created + self.validating_ms / 1000)
        if batch.status == "in_progress":
            step = self.knobs.per_request_ms / 1000
            expire_after = self.knobs.expire_after_ms
            deadline = math.inf if expire_after is None else batch.stamps["in_progress"] + expire_after / 1000
            while batch.ran < len(batch.requests) and batch.clock + step <= min(now, deadline):
                batch.clock += step
                self._run(batch, batch.requests[batch.ran], batch.clock)
                batch.ran += 1
            if batch.ran < len(batch.requests) and now >= deadline:
                # Out of time part-way: what ran stays, the rest expires unrun (§1.7).
                for request in batch.requests[batch.ran :]:
                    request.result = _failure_line(request.custom_id, "batch_expired", EXPIRED_MESSAGE)
                batch.ran, batch.clock = len(batch.requests), max(batch.clock, deadline)
                self._enter(batch, "expired", batch.clock)
            elif batch.ran == len(batch.requests):
                # Only expiry writes a non-HTTP `error`; HTTP failures keep `error: null`.
                expired = any(r.result and r.result["error"] for r in batch.requests)
                self._enter(batch, "expired" if expired else "finalizing", batch.clock)
        if batch.status == "finalizing" and now >= batch.stamps["finalizing"] + settle:
            self._enter(batch, "completed", batch.stamps["finalizing"] + settle)
        if batch.status == "cancelling" and now >= batch.stamps["cancelling"] + settle:
            for request in batch.requests[batch.ran :]:
                request.result = _failure_line(
                    request.custom_id, "batch_cancelled", "The batch was cancelled."
                )
            self._enter(batch, "cancelled", batch.stamps["cancelling"] + settle)

    def _enter(self, batch: _Batch, status: str, at: float) -> None:
        batch.status = status
        batch.stamps[status] = at
        if status in TERMINAL:
            # Seeded by the batch's requests, not its random id, so a rerun writes the same files.
            key = ",".join(f"{r.custom_id}#{r.attempt}" for r in batch.requests)
            rng = random.Random(f"{self.seed}:{hashlib.sha256(key.encode()).hexdigest()}")
            finished = [r for r in batch.requests if r.result is not None]
            rng.shuffle(finished)  # order is never promised
            succeeded = [r for r in finished if r.succeeded]
            output = [json.dumps(r.result) for r in succeeded]
            if batch.requests:  # a batch that failed validation wrote nothing to spoil
                output = self._spoil(batch, succeeded, output, rng, at)
                batch.miscounted = self.knobs.count_mismatch
            batch.output_file_id = self._result_file(batch, "output", output, at)
            failures = [json.dumps(r.result) for r in finished if not r.succeeded]
            batch.error_file_id = self._result_file(batch, "error", failures, at)

    def _spoil(
        self, batch: _Batch, succeeded: list[_Request], output: list[str], rng: random.Random, at: float
    ) -> list[str]:
        """`output` with the repeated, unknown and malformed lines the knobs ask for, placed by `rng`."""
        knobs = self.knobs
        extra = [
            text
            for request, text in zip(succeeded, output, strict=True)
            if self._dice("duplicate", request) < knobs.duplicate_lines
        ]
        # Made-up lines read like their neighbours; they are not inferences anyone asked for.
        prompt = {"role": "user", "content": "Title: A product nobody asked about"}
        bodies = [r.body for r in succeeded] or [{"model": batch.model or "emulator", "messages": [prompt]}]
        for n in range(1, knobs.unknown_lines + 1):
            extra.append(json.dumps(self._completion_line(f"unknown-{n}", rng.choice(bodies), at)[0]))
        for n in range(1, knobs.malformed_lines + 1):
            whole = json.dumps(self._completion_line(f"malformed-{n}", rng.choice(bodies), at)[0])
            extra.append(whole[: len(whole) // 2])  # a JSON object's first half never parses
        spoiled = list(output)
        for text in extra:
            spoiled.insert(rng.randint(0, len(spoiled)), text)
        return spoiled

    def _result_file(self, batch: _Batch, kind: str, lines: list[str], at: float) -> str | None:
        if not lines:
            return None
        content = "".join(text + "\n" for text in lines).encode()
        name = f"{batch.id}_{kind}.jsonl"
        file = _File(_new_id("file-"), name, "batch_output", content, int(at), int(at) + batch.output_ttl)
        self._files[file.id] = file
        return file.id

    def _validate(self, batch: _Batch, at: float) -> None:
        """The checks of §7.3; any failure fails the whole batch, as OpenAI does."""
        errors = []

        def error(code: str, message: str, line: int | None = None, param: str | None = None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        if batch.completion_window != "24h":
            error("invalid_completion_window", "completion_window must be '24h'.", param="completion_window")
        requests, models, seen = [], set(), set()
        lines = batch.input_file.content.decode("utf-8", errors="replace").splitlines()
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
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
            if isinstance(line["body"].get("model"), str):
                models.add(line["body"]["model"])
            seen.add(custom_id)
            requests.append(_Request(custom_id, line["body"], attempt=0))
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
            request.attempt = self._attempts[request.custom_id]
            self._attempts[request.custom_id] += 1
        batch.requests, batch.model, batch.clock = requests, next(iter(models), None), at
        self._enter(batch, "in_progress", at)

    def _dice(self, knob: str, request: _Request) -> float:
        digest = hashlib.sha256(f"{self.seed}:{knob}:{request.custom_id}:{request.attempt}".encode()).digest()
        return int.from_bytes(digest[:8]) / 2**64

    def _run(self, batch: _Batch, request: _Request, at: float) -> None:
        """Answer one request at simulated time `at`."""
        body, custom_id = request.body, request.custom_id
        missing = next((name for name in ("model", "messages") if not body.get(name)), None)
        if missing:
            message = f"Missing required parameter: '{missing}'."
            request.result = _error_line(custom_id, 400, message, "invalid_request_error", missing)
        elif self._dice("expire", request) < self.knobs.expire_rate:
            request.result = _failure_line(custom_id, "batch_expired", EXPIRED_MESSAGE)
        elif self._dice("fail", request) < self.knobs.fail_rate:
            message = "The server had an error while processing your request. Sorry about that!"
            request.result = _error_line(custom_id, 500, message, "server_error")
        else:
            request.result, usage = self._completion_line(custom_id, body, at)
            self._inferences[custom_id] += 1
            batch.usage.update(input=usage["prompt_tokens"], output=usage["completion_tokens"])
            request.succeeded = True

    def _completion_line(self, custom_id: str, body: dict, at: float) -> tuple[dict, dict]:
        """A success line answering `body` at simulated time `at`, and its usage."""
        content, usage = textgen.generate(body)
        budget = body.get("max_completion_tokens") or body.get("max_tokens")
        stopped = "length" if budget and usage["completion_tokens"] >= budget else "stop"
        message = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
        completion = {
            "id": _new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(at),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": stopped}],
            "usage": {
                **usage,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            },
            "service_tier": "default",
            "system_fingerprint": None,
        }
        response = {"status_code": 200, "request_id": _new_id("req_"), "body": completion}
        line = {"id": _new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}
        return line, usage


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Form fields of a multipart/form-data body: {name: (filename or None, bytes)}."""
    if not content_type.startswith("multipart/form-data"):
        raise ApiError(400, "Expected a multipart/form-data body.")
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ApiError(400, "Could not read the multipart body.")
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


ROUTES = [
    ("POST", r"/v1/files", "upload"),
    ("GET", r"/v1/files/([^/]+)", "file"),
    ("GET", r"/v1/files/([^/]+)/content", "content"),
    ("POST", r"/v1/batches", "create_batch"),
    ("GET", r"/v1/batches", "list_batches"),
    ("GET", r"/v1/batches/([^/]+)", "batch"),
    ("POST", r"/v1/batches/([^/]+)/cancel", "cancel"),
    ("GET", r"/_emulator/stats", "stats"),
    ("GET", r"/_emulator/config", "show_config"),
    ("POST", r"/_emulator/config", "config"),
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
    server: ThreadingHTTPServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s " + format, self.address_string(), *args)

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        emulator: Emulator = self.server.emulator  # type: ignore[attr-defined]
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_UPLOAD_BYTES:
                self.close_connection = True
                raise ApiError(413, f"Request body is larger than {MAX_UPLOAD_BYTES} bytes.")
            self.body = self.rfile.read(length)
            if url.path.startswith("/v1/"):
                if not self.headers.get("Authorization", "").startswith("Bearer "):
                    raise ApiError(401, "You didn't provide an API key (Authorization: Bearer <key>).")
                # The control endpoints (/_emulator/) are never refused: they turn faults off.
                emulator.admit(method, url.path)
            for route_method, pattern, action in ROUTES:
                match = re.fullmatch(pattern, url.path)
                if match and route_method == method:
                    self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                    result = getattr(self, f"_{action}")(emulator, *match.groups())
                    break
            else:
                raise ApiError(404, f"Invalid URL ({method} {url.path})")
        except LoseAnswer:
            self._hang_up()
        except ApiError as error:
            self._send(error.status, json.dumps(error.body).encode(), headers=error.headers)
        except Exception:
            log.exception("emulator failed on %s %s", method, self.path)
            self._send(500, json.dumps(ApiError(500, "Emulator error.", type="server_error").body).encode())
        else:
            if isinstance(result, Download):
                self._send(200, result.content, content_type="application/octet-stream", cut_at=result.cut_at)
            else:
                self._send(200, json.dumps(result).encode())

    def _send(
        self,
        status: int,
        payload: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        cut_at: int | None = None,
    ) -> None:
        """Answer; with `cut_at`, announce all of `payload` but hang up after that many bytes."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-request-id", _new_id("req_"))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        view = memoryview(payload)[:cut_at]
        for start in range(0, len(view), 64 * 1024):  # streamed in slices, not one huge write
            self.wfile.write(view[start : start + 64 * 1024])
        if cut_at is not None:
            self._hang_up()

    def _hang_up(self) -> None:
        """Drop the connection without (the rest of) an answer: the client sees a transport error."""
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may have left first
            self.connection.shutdown(socket.SHUT_RDWR)

    def _json_body(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            raise ApiError(400, "The request body is not valid JSON.") from None

    def _upload(self, emulator: Emulator) -> dict:
        fields = parse_multipart(self.headers.get("Content-Type", ""), self.body)
        if "file" not in fields or "purpose" not in fields:
            raise ApiError(
                400, "Missing required parameter: 'file' and 'purpose' are required.", param="file"
            )
        filename, content = fields["file"]
        seconds = fields.get("expires_after[seconds]", (None, b""))[1].decode() or None
        if seconds is not None and not (seconds.isdigit() and 3600 <= int(seconds) <= 30 * DAY):
            raise ApiError(400, "expires_after[seconds] must be 3600-2592000.", param="expires_after")
        purpose = fields["purpose"][1].decode()
        ttl = int(seconds) if seconds else None
        return emulator.create_file(
            filename=filename or "upload.jsonl", purpose=purpose, content=content, ttl=ttl
        )

    def _file(self, emulator: Emulator, file_id: str) -> dict:
        return emulator.get_file(file_id)

    def _content(self, emulator: Emulator, file_id: str) -> Download:
        return emulator.download(file_id)

    def _create_batch(self, emulator: Emulator) -> dict:
        return emulator.create_batch(self._json_body())

    def _list_batches(self, emulator: Emulator) -> dict:
        limit = self.query.get("limit", "20")
        if not limit.isdigit():
            raise ApiError(400, "limit must be from 1 to 100.", param="limit")
        return emulator.list_batches(after=self.query.get("after"), limit=int(limit))

    def _batch(self, emulator: Emulator, batch_id: str) -> dict:
        return emulator.get_batch(batch_id)

    def _cancel(self, emulator: Emulator, batch_id: str) -> dict:
        return emulator.cancel_batch(batch_id)

    def _stats(self, emulator: Emulator) -> dict:
        return emulator.stats()

    def _show_config(self, emulator: Emulator) -> dict:
        return emulator.config()

    def _config(self, emulator: Emulator) -> dict:
        knobs = self._json_body()
        if not isinstance(knobs, dict):
            raise ApiError(400, f"Expected a JSON object of knobs: {', '.join(KNOB_NAMES)}.")
        return emulator.configure(**knobs)
