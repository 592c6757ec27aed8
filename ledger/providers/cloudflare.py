"""Cloudflare Workers AI asynchronous batch over httpx (reference/providers.md §3).

One unit is one queued request: `POST /accounts/{account_id}/ai/run/{model}?queueRequest=true`
with `{"requests": [...]}` answers a `request_id`; POSTing `{"request_id": ...}` to the same
address answers `queued` or `running` until the responses are ready, then the responses
themselves. Polling needs the model as well as the id, so the provider reference this adapter
hands the ledger is `<model>|<request_id>` (model ids contain `@` and `/`, never `|`).

Each request carries our custom_id as its `external_reference`; a response is matched by that
alone, never by its `id` (the request's index) or its place in the answer. A response without
one is an `UnreadableLine`. Nothing lists queued requests, so a lost create answer cannot be
looked for: the ledger leaves it to an operator (SPEC rule 13). There is no cancel.

Failed responses: Cloudflare documents none. This adapter reads `"success": false` with
`"errors": [{"code", "message"}]`, the shape of Cloudflare's own API envelope, and classifies
the code (`RESPONSE_ERRORS`; unknown codes are permanent model failures, never re-sent blindly).

How the model stopped: Workers AI's text-generation output is `{response, tool_calls?, usage?}`,
with no stop reason and no refusal field (unlike OpenAI's `finish_reason`, Anthropic's
`stop_reason`, Gemini's `finishReason`), and usage only for the whole unit, so a draft cut off at
`max_tokens` or a refusal cannot be told apart here: it reaches validation as what it reads like
(most often `not_json`). A JSON answer in a Markdown code fence is read by validation as for any
provider.

Usage comes only for the whole unit (`result.usage`: prompt, completion, total tokens). It is
apportioned to the responses by this rule (`APPORTIONING_RULE`), so the shares recorded on the
items add up EXACTLY to the provider's totals:
- the tokens are shared among the responses that succeeded (a failed request produced nothing
  to pay for); when none succeeded, among every readable response, so no token goes unrecorded;
- input tokens equally (the prompts are not in the answer, and `results` is not given them);
- output tokens in proportion to the length in characters of each response's text;
  if every text is empty, equally;
- whole tokens by the largest-remainder method: each gets the floor of its exact share, and the
  tokens left over go one each to the largest fractional parts, ties to the smaller custom_id.
  The shares depend only on the set of responses, not on their order, so collecting the same
  unit twice gives the same numbers (a repeated custom_id is shared once, as its first response);
- an unreadable response (no `external_reference`) gets no share: the readable ones carry its
  tokens, so what the ledger records still adds up to the bill.
Every line's `usage` keeps the provider's own total (`unit_total`) beside its `share`, so the
exact bill is never lost, and each line is marked `apportioned`.
"""

import json
import os
from collections.abc import Iterable
from datetime import datetime
from urllib.parse import quote

import httpx

from ..drafts.schema_dialects import Dialect, sent_schema
from ..drafts.scrubbing import scrub_credentials, stored_text
from ..states import ReasonCode
from . import base
from .http import PARSE_ERRORS, HttpBatchProvider, configured_key, parse_failure, provider_client
from .model_names import check_model_name

REF_SEPARATOR = "|"
QUEUE = {"queueRequest": "true"}
# Words Cloudflare might use for a queued request that will never answer; none is documented.
REFUSED_STATUSES = {"failed", "error", "errored", "cancelled", "canceled", "expired"}
DONE_STATUS = "done"  # shown when the responses came: Cloudflare sends no word with them
# The JSON encoding of a unit's body; `request_bytes` counts each request the same way.
SEPARATORS = (",", ":")
ENVELOPE = '{"requests":[]}'
PAYLOAD_LIMIT = 10_000_000  # "under 10 MB" read as the smaller, decimal megabyte
# Workers AI's JSON mode takes any JSON Schema: the model is guided by all of it (rule 17).
SCHEMA_DIALECT = Dialect.AS_IS
APPORTIONING_RULE = (
    "input tokens equally, output tokens by response length, among the responses that succeeded; "
    "largest remainder"
)
# Error codes of a failed response, in the ledger's words: (reason, transient, the HTTP status the
# same error has as an answer to a call). The codes and statuses are Workers AI's documented ones
# for synchronous calls (developers.cloudflare.com/workers-ai/platform/errors); that a failed
# batch response carries them is an assumption. Unknown codes are permanent model failures.
RESPONSE_ERRORS = {
    "3003": (ReasonCode.REQUEST_INVALID, False, 400),  # incomplete request
    "5004": (ReasonCode.REQUEST_INVALID, False, 400),  # invalid data
    "5007": (ReasonCode.REQUEST_INVALID, False, 400),  # no such model
    "3042": (ReasonCode.REQUEST_INVALID, False, 404),  # invalid model id
    "5016": (ReasonCode.REQUEST_INVALID, False, 403),  # model terms not agreed
    "5018": (ReasonCode.REQUEST_INVALID, False, 403),  # account not allowed this model
    "3041": (ReasonCode.REQUEST_INVALID, False, 403),  # account not allowed this model
    "3023": (ReasonCode.REQUEST_INVALID, False, 403),  # account blocked
    "3006": (ReasonCode.REQUEST_INVALID, False, 413),  # request too large
    "3007": (ReasonCode.TIMED_OUT, True, 408),  # timeout
    "3008": (ReasonCode.TIMED_OUT, True, 408),  # aborted
    "3040": (ReasonCode.RATE_LIMITED, True, 429),  # out of capacity: another try may find some
    # The daily free allocation is used up: more tries only fail until a person upgrades the plan
    # or the day turns (as OpenAI's `insufficient_quota`).
    "3036": (ReasonCode.RATE_LIMITED, False, None),
}


def queued_request(request: base.InferenceRequest) -> dict:
    """One entry of a unit's `requests`: Workers AI's text-generation input and our custom_id."""
    entry = {
        "messages": [
            {"role": "system", "content": request.system_message},
            {"role": "user", "content": request.user_message},
        ],
        "max_tokens": request.max_output_tokens,
    }
    if request.output_schema:
        # Workers AI's JSON mode takes the schema itself as `json_schema` (no name, no wrapper).
        schema = sent_schema(request.output_schema, SCHEMA_DIALECT).schema
        entry["response_format"] = {"type": "json_schema", "json_schema": schema}
    entry["external_reference"] = request.custom_id
    return entry


def encode(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=SEPARATORS).encode("utf-8")


def provider_ref(model: str, request_id: str) -> str:
    return f"{model}{REF_SEPARATOR}{request_id}"


def split_ref(ref: str) -> tuple[str, str]:
    """(model, request_id) of a reference made by `provider_ref`."""
    model, separator, request_id = ref.rpartition(REF_SEPARATOR)
    if not (separator and model and request_id):
        raise ValueError(f"not a Cloudflare unit reference (<model>|<request_id>): {ref!r}")
    return model, request_id


def apportion(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` split among the keys of `weights` in proportion to them, in whole units that add
    up to `total` exactly (largest remainder, ties to the smaller key). All-zero weights share
    equally."""
    keys = sorted(weights)
    if not keys:
        return {}
    if sum(weights.values()) <= 0:
        weights = dict.fromkeys(keys, 1)
    weight_sum = sum(weights.values())
    exact = {key: total * weights[key] for key in keys}  # each over weight_sum
    shares = {key: exact[key] // weight_sum for key in keys}
    left = total - sum(shares.values())  # fewer than len(keys): each remainder is below 1
    for key in sorted(keys, key=lambda key: (-(exact[key] % weight_sum), key))[:left]:
        shares[key] += 1
    return shares


def tokens(usage: dict, name: str) -> int:
    return base.token_count(usage.get(name))


def response_text(result: object) -> str | None:
    """The draft in a response's `result`: `response` as it is when text, as JSON when JSON mode
    gave an object; None when there is none."""
    if not isinstance(result, dict) or "response" not in result:
        return None
    response = result["response"]
    if isinstance(response, str):
        return response
    if isinstance(response, dict | list):
        return json.dumps(response, ensure_ascii=False)
    return None


def response_failure(
    response: dict, *, secrets: Iterable[str] = ()
) -> tuple[str, str, str, bool, int | None]:
    """(error_code, error_message, reason, transient, http_status) of a failed response."""
    errors = response.get("errors")
    first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else {}
    code = str(first.get("code") or "error")
    message = scrub_credentials(str(first.get("message") or ""), secrets)[:1000]
    reason, transient, status = RESPONSE_ERRORS.get(code, (ReasonCode.MODEL_FAILED, False, None))
    return code, message, reason, transient, status


class CloudflareBatchProvider(HttpBatchProvider):
    name = "cloudflare"
    schema_dialect = SCHEMA_DIALECT
    capabilities = base.Capabilities(
        finding=base.Finding.NOT_AT_ALL,  # nothing lists queued requests
        can_cancel=False,
        # Cloudflare states no count, only the payload limit. 1,000 keeps one poll answer (all the
        # responses at once, inline) a few megabytes, and bounds what an operator must weigh
        # when a create answer is lost and the unit cannot be looked for.
        max_requests=1_000,
        max_bytes=PAYLOAD_LIMIT - len(ENVELOPE),
        delivery=base.Delivery.INLINE,
        usage_per_request=False,
    )

    def __init__(self, *, client: httpx.Client, account_id: str):
        super().__init__(client=client)
        self.account_id = account_id
        # The last poll answer that carried the responses, by provider reference.
        self._finished: dict[str, dict] = {}

    @classmethod
    def from_settings(cls, config: dict) -> "CloudflareBatchProvider":
        # Without a token Cloudflare refuses every call, shown as such.
        client = provider_client(config, headers={"Authorization": f"Bearer {configured_key(config)}"})
        return cls(client=client, account_id=os.environ.get(config["account_id_env"]) or "")

    def request_bytes(self, request: base.InferenceRequest) -> int:
        # Its JSON inside the `requests` array, and the comma after it; `max_bytes` leaves room
        # for the envelope around the array.
        return len(encode(queued_request(request))) + 1

    def _path(self, model: str) -> str:
        if not self.account_id:
            raise base.NotSent("no Cloudflare account id: set the variable the settings name")
        check_model_name("cloudflare", model)
        # `@cf/<author>/<model>` is a path under /ai/run/ (the API takes its slashes as they are):
        # each of its three segments is quoted on its own.
        segments = "/".join(quote(segment, safe="@") for segment in model.split("/"))
        return f"/accounts/{quote(self.account_id, safe='')}/ai/run/{segments}"

    def _queue(self, model: str, body: bytes, *, answer_may_be_lost: bool = False) -> dict:
        """One POST to the model's queue address (the base `_call`: a request that never left is
        an ordinary error, one whose answer may be lost is AnswerLost when `answer_may_be_lost`);
        the `result` of Cloudflare's envelope."""
        response = self._call(
            "POST",
            self._path(model),
            params=QUEUE,
            content=body,
            headers={"content-type": "application/json"},
            answer_may_be_lost=answer_may_be_lost,
        )
        return self._result(response, answer_may_be_lost=answer_may_be_lost)

    def _result(self, response: httpx.Response, *, answer_may_be_lost: bool = False) -> dict:
        """The `result` object of Cloudflare's envelope `{"success", "errors", "result"}`. Without
        one, a ProviderError; on a create, AnswerLost: Cloudflare answered, so it may be queued."""
        answer = self._json(response, answer_may_be_lost=answer_may_be_lost)
        result = answer.get("result")
        if not isinstance(result, dict):
            said = scrub_credentials(response.text, self.secrets)[:300]
            problem = (
                f"POST {response.request.url.path} answered {response.status_code} without a result: {said}"
            )
            raise (base.AnswerLost if answer_may_be_lost else base.ProviderError)(
                problem, secrets=self.secrets
            )
        return result

    def submit(self, *, requests: list[base.InferenceRequest], intent_key: str, metadata: dict) -> str:
        # A queued request carries no metadata: the intent key stays with the ledger.
        models = {request.model for request in requests}
        if len(models) != 1:
            raise base.ProviderError(f"one model per Cloudflare unit, got {sorted(models)}", status=400)
        model = models.pop()
        body = encode({"requests": [queued_request(request) for request in requests]})
        result = self._queue(model, body, answer_may_be_lost=True)
        request_id = result.get("request_id")
        if not isinstance(request_id, str) or not request_id:
            # Queued or not, we cannot tell which request is ours: as if the answer were lost.
            raise base.AnswerLost(f"the queue answered without a request_id: {str(result)[:200]}")
        return provider_ref(model, request_id)

    def find_units(self, *, intent_key: str, sent_at: datetime, request_count: int) -> list[str]:
        # Returning "none found" would let a lost unit be sent (and paid for) twice.
        raise NotImplementedError("Cloudflare lists no queued requests: an operator decides (rule 13)")

    def _poll(self, provider_ref: str) -> dict:
        try:
            model, request_id = split_ref(provider_ref)
        except ValueError as exc:
            raise base.ProviderError(str(exc), status=400) from exc
        return self._queue(model, encode({"request_id": request_id}))

    def status(self, provider_ref: str) -> base.UnitStatus:
        result = self._poll(provider_ref)
        if isinstance(result.get("responses"), list):
            # Kept for `results` (the ledger collects with this same adapter): Cloudflare may
            # give the responses only once, and asking again could find them gone.
            self._finished[provider_ref] = result
            # Cloudflare gives no counts: they are the responses' own, each custom_id once.
            responses = [
                r
                for r in result["responses"]
                if isinstance(r, dict) and isinstance(r.get("external_reference"), str)
            ]
            succeeded = {r["external_reference"] for r in responses if r.get("success") is True}
            everyone = {r["external_reference"] for r in responses}
            return base.UnitStatus(
                provider_status=DONE_STATUS,
                ended=True,
                counts=base.UnitCounts(
                    total=len(everyone), succeeded=len(succeeded), failed=len(everyone - succeeded)
                ),
            )
        word = str(result.get("status") or "")
        if word in REFUSED_STATUSES:
            errors = result.get("errors") if isinstance(result.get("errors"), list) else []
            problem = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
            return base.UnitStatus(
                provider_status=word,
                ended=True,
                refused=True,
                problem=stored_text(
                    scrub_credentials(problem or f"the queued request is {word}", self.secrets)
                ),
            )
        # `queued`, `running`, or a word nobody documented: keep polling, show the word.
        return base.UnitStatus(provider_status=word[:32] or "unknown", ended=False)

    def ended_results(self, provider_ref: str) -> base.Results:
        result = self._finished.get(provider_ref) or self._poll(provider_ref)
        responses = result.get("responses")
        if not isinstance(responses, list):
            raise base.ProviderError(f"unit {provider_ref} has no responses yet ({result.get('status')})")
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        # `skip` is not applied: the shares are computed over every response, so a re-collection
        # gives the same numbers, and the ledger ignores lines it has recorded.
        yield from self.read_responses(responses, usage)

    def read_responses(self, responses: list, usage: dict) -> base.Results:
        """Each response as a line, with its share of `usage` (the module's rule)."""
        readable: dict[str, tuple[dict, str | None]] = {}  # custom_id: (response, its text)
        for response in responses:
            reference = response.get("external_reference") if isinstance(response, dict) else None
            if isinstance(reference, str) and reference and reference not in readable:
                text = response_text(response.get("result")) if response.get("success") is True else None
                readable[reference] = (response, text)
        billed = {ref: text for ref, (_, text) in readable.items() if text is not None}
        if not billed:
            billed = {ref: "" for ref in readable}
        input_shares = apportion(tokens(usage, "prompt_tokens"), dict.fromkeys(billed, 1))
        output_shares = apportion(
            tokens(usage, "completion_tokens"), {ref: len(text or "") for ref, text in billed.items()}
        )
        unit_total = {key: value for key, value in usage.items() if key.endswith("tokens")}
        for number, response in enumerate(responses, start=1):
            reference = response.get("external_reference") if isinstance(response, dict) else None
            if not isinstance(reference, str) or not reference:
                text = scrub_credentials(json.dumps(response, ensure_ascii=False), self.secrets)[:500]
                yield base.UnreadableLine(number, text, "no external_reference: it cannot be matched")
                continue
            share_in, share_out = input_shares.get(reference, 0), output_shares.get(reference, 0)
            line_usage = {
                "unit_total": unit_total,
                "share": {
                    "prompt_tokens": share_in,
                    "completion_tokens": share_out,
                    "total_tokens": share_in + share_out,
                },
                "shared_among": len(billed),
                "rule": APPORTIONING_RULE,
            }
            try:
                yield self._line(number, reference, response, line_usage, share_in, share_out)
            except PARSE_ERRORS as exc:
                yield parse_failure(number, "", reference, exc, secrets=self.secrets)

    def _line(
        self, number: int, custom_id: str, response: dict, usage: dict, input_tokens: int, output_tokens: int
    ) -> base.ResultLine:
        counted = {"usage": usage, "input_tokens": input_tokens, "output_tokens": output_tokens}
        if response.get("success") is True:
            text = response_text(response.get("result"))
            if text is None:
                # Paid for but unusable: a permanent failure of that request, never an automatic re-send.
                return base.ResultLine(
                    custom_id=custom_id,
                    succeeded=False,
                    apportioned=True,
                    error_code="unreadable_result",
                    error_message=f"response {number}: a success without result.response",
                    reason=ReasonCode.UNREADABLE_RESULT,
                    **counted,
                )
            return base.ResultLine(
                custom_id=custom_id, succeeded=True, content=text, apportioned=True, **counted
            )
        code, message, reason, transient, status = response_failure(response, secrets=self.secrets)
        return base.ResultLine(
            custom_id=custom_id,
            succeeded=False,
            apportioned=True,
            http_status=status,
            error_code=code,
            error_message=message,
            reason=reason,
            transient=transient,
            **counted,
        )

    def cancel(self, provider_ref: str) -> str:
        raise NotImplementedError("Cloudflare cannot cancel a queued request")
