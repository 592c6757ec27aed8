"""Cloudflare Workers AI's asynchronous batch API (reference/providers.md §3), emulated.

`POST /client/v4/accounts/{account_id}/ai/run/{model}?queueRequest=true` with `{"requests": [...]}`
queues a unit and answers its `request_id`; POSTing `{"request_id": ...}` to the same address
answers `queued`, then `running`, then the responses with the unit's aggregated `usage`. Every
answer and error is in Cloudflare's envelope `{"result", "success", "errors", "messages"}`.
Nothing runs in the background: a unit is brought up to date from timestamps whenever it is read
(`queued_ms` in the queue, then `per_request_ms` of simulated time per request).

Responses come in a shuffled order (seeded by the unit), each with `id` = the request's index
and its `external_reference` echoed. A failed response is `"success": false` with
`"errors": [{"code", "message"}]` (Cloudflare documents none; this is the shape of its envelope):
3040 for `fail_rate` (out of capacity), 5004 for a request that is not a text-generation input.
Failed requests are not generated and add no usage.

Knobs that apply: `per_request_ms`, `queued_ms`, `fail_rate`, `lose_create_responses` (the unit
is queued, then the connection drops), the shared 429 / 5xx storms, `duplicate_lines` (that
share of successes answered twice), `unknown_lines` (successes with an `external_reference`
never sent: `unknown-<n>`), `malformed_lines` (responses without `external_reference`), the
answer knobs (`truncate_rate`, `refuse_rate`, `fence_rate`, `prose_rate`: only the `response` text
shows them, as Workers AI's output has no stop reason), and a body over 10,000,000 bytes refused
413 (code 3006).
Knobs that do not: `expire_rate`, `expire_after_ms` (Cloudflare documents no expiry: requests
are "fulfilled eventually"), `count_mismatch` (a unit has no counts to disagree with its
responses), `cut_downloads` (nothing is downloaded: the responses come in the poll's answer).

Creating and polling share one address, so the plumbing cannot tell them apart: this emulator
counts `creates` itself, when a queue call reaches it (one refused by a fault knob is not
counted), and the fault knobs' path prefixes match polls as well as creates. A body over
10,000,000 bytes is read, then refused.
"""

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from werkzeug.wrappers import Request

from ledger.emulators import spoiling, textgen
from ledger.emulators.knobs import CloudflareKnobs
from ledger.emulators.server import ApiError, EmulatorServer, Fault, LoseAnswer
from ledger.emulators.units import Attempts

PAYLOAD_LIMIT = 10_000_000
DEFAULT_MAX_TOKENS = 256  # Workers AI's default for text generation
MODEL_FAMILIES = ("@cf/", "@hf/")
# Cloudflare's numeric codes for each kind of error (Workers AI's documented codes where there is
# one; 10000 and 7003 are Cloudflare API's authentication and routing codes).
ERROR_CODES = {
    "invalid_request": 3003,
    "authentication": 10000,
    "not_found": 7003,
    "rate_limit": 3040,
    "server_error": 3043,
    "overloaded": 3040,
}
OUT_OF_CAPACITY = {"code": 3040, "message": "No more data centers to forward the request to"}


@dataclass
class _Request:
    index: int
    entry: dict  # the request as sent: Workers AI input and `external_reference`
    attempt: int  # how many earlier units carried this external_reference
    response: dict | None = None

    @property
    def reference(self) -> str | None:
        reference = self.entry.get("external_reference")
        return reference if isinstance(reference, str) else None


@dataclass
class _Unit:
    request_id: str
    account_id: str
    model: str
    created: float
    requests: list[_Request]
    clock: float | None = None  # the simulated time up to which requests have run; None: queued
    ran: int = 0  # requests[:ran] have run
    responses: list[dict] | None = None  # set when every request has run
    usage: Counter = field(default_factory=Counter)


def envelope(result: Any) -> dict:
    return {"result": result, "success": True, "errors": [], "messages": []}


def chat_body(model: str, entry: dict) -> dict:
    """A Workers AI text-generation input as the chat-completions body `textgen` reads."""
    messages = entry.get("messages")
    if not isinstance(messages, list):
        messages = [{"role": "user", "content": entry["prompt"]}]
    body = {
        "model": model,
        "messages": messages,
        "max_completion_tokens": entry.get("max_tokens") or DEFAULT_MAX_TOKENS,
    }
    response_format = entry.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        # Workers AI takes the schema itself as `json_schema`.
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": response_format.get("json_schema") or {}},
        }
    return body


def is_text_input(entry: dict) -> bool:
    messages = entry.get("messages")
    if isinstance(messages, list) and messages:
        return all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
    return isinstance(entry.get("prompt"), str) and bool(entry["prompt"])


class CloudflareEmulator(EmulatorServer):
    protocol = "cloudflare"
    base_path = "/client/v4"
    api_prefix = "/client/v4/"
    create_rule = None  # creating and polling share one address: counted in `queue`
    knobs_class = CloudflareKnobs

    def __init__(self, **kwargs: Any) -> None:
        self._units: dict[str, _Unit] = {}
        self._inferences: Counter[str] = Counter()
        self._attempts = Attempts()
        super().__init__(**kwargs)

    routes = ("POST /client/v4/accounts/<account_id>/ai/run/<path:model> run",)

    def envelope(self, fault: Fault) -> ApiError:
        number = fault.code if fault.code is not None else ERROR_CODES.get(fault.kind, 3003)
        body = {
            "result": None,
            "success": False,
            "errors": [{"code": number, "message": fault.message}],
            "messages": [],
        }
        return ApiError(fault.status, body, fault.headers)

    def authenticate(self, request: Request) -> None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise self.error(401, "Authentication error", kind="authentication")

    def evidence(self) -> dict:
        with self.lock:
            return {
                "inferences": dict(self._inferences),
                "batches_by_intent": {},  # a queued request carries no key of ours
                "units": len(self._units),
            }

    def advance(self) -> None:
        now = self.clock.now()
        for unit in self._units.values():
            self._advance(unit, now)

    # --- the API -------------------------------------------------------------------------

    def run(self, request: Request, account_id: str, model: str) -> dict:
        # Read whole even when refused, so the connection stays usable for the next call.
        if len(request.get_data()) > PAYLOAD_LIMIT:
            raise self.error(413, "Request is too large", code=3006)
        body = self.json_body(request)
        if isinstance(body, dict) and "requests" in body:
            if request.args.get("queueRequest") != "true":
                raise self.error(400, "The emulator answers queued batches only: add ?queueRequest=true.")
            return self.queue(account_id, model, body["requests"])
        if isinstance(body, dict) and "request_id" in body:
            return self.poll(account_id, model, body["request_id"])
        raise self.error(400, "Request is missing headers or body: requests or request_id")

    def queue(self, account_id: str, model: str, entries: Any) -> dict:
        if not model.startswith(MODEL_FAMILIES):
            raise self.error(400, f"No such model {model} or task", code=5007)
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise self.error(400, "Request is missing headers or body: requests must be a list of objects")
        if any("external_reference" in e and not isinstance(e["external_reference"], str) for e in entries):
            raise self.error(400, "Invalid data: external_reference must be a string", code=5004)
        if self.take_billing_refusal():
            with self.lock:
                self._creates += 1
            raise self.error(
                429,
                "you have used up your daily free allocation of 10,000 neurons, please upgrade to "
                "Cloudflare's Workers Paid plan if you would like to continue usage.",
                code=4006,
            )
        with self.lock:
            self._creates += 1  # the plumbing cannot tell a create from a poll (see the docstring)
            requests = []
            for index, entry in enumerate(entries):
                key = entry.get("external_reference") or ""
                requests.append(_Request(index, entry, attempt=self._attempts.next(key)))
            unit = _Unit(str(uuid.uuid4()), account_id, model, self.clock.now(), requests)
            self._units[unit.request_id] = unit
        if self.take_lost_create():
            raise LoseAnswer()
        return envelope({"status": "queued", "request_id": unit.request_id, "model": model})

    def poll(self, account_id: str, model: str, request_id: Any) -> dict:
        with self.lock:
            unit = self._units.get(request_id) if isinstance(request_id, str) else None
            if unit is None or unit.account_id != account_id or unit.model != model:
                raise self.error(404, f"No queued request {request_id!r} for {model}", kind="not_found")
            self._advance(unit, self.clock.now())
            if unit.responses is None:
                word = "queued" if unit.clock is None else "running"
                return envelope({"status": word, "request_id": unit.request_id, "model": model})
            usage = {
                "prompt_tokens": unit.usage["prompt"],
                "completion_tokens": unit.usage["completion"],
                "total_tokens": unit.usage["prompt"] + unit.usage["completion"],
            }
            return envelope({"responses": unit.responses, "usage": usage})

    # --- the simulation ------------------------------------------------------------------

    def _advance(self, unit: _Unit, now: float) -> None:
        """Run what would have run by `now` (under the lock)."""
        if unit.responses is not None:
            return
        if unit.clock is None:
            started = unit.created + self.knobs.queued_ms / 1000
            if now < started:
                return
            unit.clock = started
        while unit.ran < len(unit.requests):
            at = unit.clock + self.knobs.per_request_ms / 1000
            if at > now:
                return
            self._run(unit, unit.requests[unit.ran])
            unit.ran += 1
            unit.clock = at
        unit.responses = self._responses(unit)

    def _run(self, unit: _Unit, request: _Request) -> None:
        reference = request.reference
        failed = {"id": request.index, "result": None, "success": False, "external_reference": reference}
        if not is_text_input(request.entry):
            message = "Invalid data: a text-generation input needs messages or prompt"
            request.response = {**failed, "errors": [{"code": 5004, "message": message}]}
            return
        if self.chance(
            self.knobs.fail_rate, "fail", reference or f"{unit.request_id}#{request.index}", request.attempt
        ):
            request.response = {**failed, "errors": [OUT_OF_CAPACITY]}
            return
        body = chat_body(unit.model, request.entry)
        shape = self.answer_shape(reference or f"{unit.request_id}#{request.index}", request.attempt)
        # Workers AI says nothing of how the model stopped: a cut-off or refused answer is just its text.
        content, usage, _ = textgen.answer(body, shape, self.knobs.optional_properties)
        answer: Any = content
        if "response_format" in body:
            try:  # JSON mode answers the object itself; a draft cut short stays text
                answer = json.loads(content)
            except ValueError:
                answer = content
        request.response = {
            "id": request.index,
            "result": {"response": answer},
            "success": True,
            "external_reference": reference,
        }
        self._inferences[reference if reference is not None else f"{unit.request_id}#{request.index}"] += 1
        unit.usage.update(prompt=usage["prompt_tokens"], completion=usage["completion_tokens"])

    def _responses(self, unit: _Unit) -> list[dict]:
        """Every response, with the repeated, unknown and unreadable ones the knobs ask for, in an
        order shuffled by the seed and the unit."""
        knobs = self.knobs
        rng = spoiling.seeded(self.seed, unit.request_id)
        responses = [request.response for request in unit.requests if request.response]
        successes = [r for r in responses if r["success"]]
        succeeded = [r for r in unit.requests if r.response and r.response["success"]]
        extra = spoiling.repeated(
            self.seed, knobs.duplicate_lines, ((dict(r.response), r.reference, r.attempt) for r in succeeded)
        )
        # Made-up responses read like their neighbours; nobody asked for them and they add no usage.
        model_answer = successes[0]["result"] if successes else {"response": "A product nobody asked about."}
        extra += spoiling.made_up(
            knobs,
            lambda n: {
                "id": rng.randrange(len(unit.requests)),
                "result": model_answer,
                "success": True,
                "external_reference": f"unknown-{n}",
            },
            lambda n: {"id": rng.randrange(len(unit.requests)), "result": model_answer, "success": True},
        )
        everything = responses + extra
        rng.shuffle(everything)
        return everything
