"""OpenAI Files + Batch API over httpx (reference/providers.md §1). The built-in emulator
(provider `emulator`) speaks the same protocol."""

import functools
import io
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import orjson

from ..drafts.schema_dialects import Dialect, sent_schema
from ..drafts.scrubbing import scrub_credentials, stored_text
from ..models import compact_json
from ..states import ReasonCode
from . import base
from .http import HttpBatchProvider, configured_key, provider_client, read_jsonl_result, unreadable_result

ENDPOINT = "/v1/chat/completions"
# What an output schema is sent as: strict Structured Outputs take only OpenAI's subset (rule 17).
SCHEMA_DIALECT = Dialect.OPENAI_STRICT
ENDED_STATUSES = {"completed", "failed", "expired", "cancelled"}
# The batch's timestamp of each ended status (Unix seconds).
ENDED_STAMPS = {status: f"{status}_at" for status in ENDED_STATUSES}
INTENT_METADATA_KEY = "batchdesk_intent"
METADATA_VALUE_LIMIT = 512
# Error codes of a result line (its `error.code`, or the code of the envelope in its body), in
# the ledger's words: (reason, transient). Anything else is classified by its HTTP status.
LINE_ERRORS = {
    "batch_expired": (ReasonCode.BATCH_EXPIRED, True),
    "batch_cancelled": (ReasonCode.MODEL_FAILED, False),
    "server_error": (ReasonCode.MODEL_SERVER_ERROR, True),
    "rate_limit_exceeded": (ReasonCode.RATE_LIMITED, True),
    "timeout": (ReasonCode.TIMED_OUT, True),
    "insufficient_quota": (ReasonCode.RATE_LIMITED, False),
    "invalid_request_error": (ReasonCode.REQUEST_INVALID, False),
}


def chat_body(request: base.InferenceRequest, *, max_tokens_key: str, dialect: str) -> dict:
    """`request` as a chat-completions body: its system and user messages, its output-token limit
    under `max_tokens_key`, and its output schema, if any, as a `response_format` in `dialect`."""
    body = {
        "model": request.model,
        "messages": [
            {"role": "system", "content": request.system_message},
            {"role": "user", "content": request.user_message},
        ],
        max_tokens_key: request.max_output_tokens,
    }
    if request.output_schema:
        body["response_format"] = response_format(request.output_schema, dialect)
    return body


def request_line(request: base.InferenceRequest) -> dict:
    body = chat_body(request, max_tokens_key="max_completion_tokens", dialect=SCHEMA_DIALECT)
    return {"custom_id": request.custom_id, "method": "POST", "url": ENDPOINT, "body": body}


def response_format(schema: dict, dialect: str) -> dict:
    """A chat completion's `response_format` for an output schema: strict Structured Outputs in
    OpenAI's strict dialect (SPEC rule 17), or, for a server that takes the whole schema, the schema
    as it is and no `strict`."""
    json_schema = {"name": "output", "schema": sent_schema(schema, dialect).schema}
    if dialect == Dialect.OPENAI_STRICT:
        json_schema["strict"] = True
    return {"type": "json_schema", "json_schema": json_schema}


def request_json(request: base.InferenceRequest) -> bytes:
    """One request's line of the input file (UTF-8, no newline): a unit's thousands of lines are
    each written twice (sized, then sent). What a unit's lines share (the model, the system message,
    the output-token limit and the response format) is written once (`line_frame`), and each line
    writes only its custom_id and user message into it; a line orjson cannot write whole (a lone
    surrogate) is written as `compact_json` writes it."""
    try:
        schema = orjson.dumps(request.output_schema) if request.output_schema else b""
        custom_id, user_message = orjson.dumps(request.custom_id), orjson.dumps(request.user_message)
    except TypeError:  # orjson.JSONEncodeError is one
        frame = None
    else:
        frame = line_frame(request.model, request.system_message, request.max_output_tokens, schema)
    if frame is None:
        return compact_json(request_line(request)).encode()
    start, middle, end = frame
    return start + custom_id + middle + user_message + end


# Stand-ins for a request's custom_id and user message in a line written once (`line_frame`).
CUSTOM_ID_MARK, USER_MESSAGE_MARK = "\x00custom_id\x00", "\x00user_message\x00"


@functools.lru_cache(maxsize=16, typed=True)
def line_frame(
    model: str, system_message: str, max_output_tokens: int, schema: bytes
) -> tuple[bytes, ...] | None:
    """A line of these shared parts (`schema`: the output schema as orjson writes it, empty for none) as
    orjson writes it, cut where the custom_id and the user message go: the same bytes `request_line`
    gives once they are put back. None when orjson cannot write the shared parts, or they hold a
    stand-in."""
    stand_in = base.InferenceRequest(
        custom_id=CUSTOM_ID_MARK,
        model=model,
        system_message=system_message,
        user_message=USER_MESSAGE_MARK,
        output_schema=orjson.loads(schema) if schema else None,
        max_output_tokens=max_output_tokens,
    )
    try:
        line = orjson.dumps(request_line(stand_in))
    except TypeError:
        return None
    start, rest = _cut(line, orjson.dumps(CUSTOM_ID_MARK))
    middle, end = _cut(rest, orjson.dumps(USER_MESSAGE_MARK))
    return None if start is None or middle is None else (start, middle, end)


def _cut(line: bytes, mark: bytes) -> tuple[bytes | None, bytes]:
    """The bytes before and after the only `mark` in `line`; (None, line) unless it is there once."""
    if line.count(mark) != 1:
        return None, line
    before, _, after = line.partition(mark)
    return before, after


# `finish_reason`s of a chat completion that say the provider's content filter withheld the answer.
FILTERED = {"content_filter"}


def read_completion(
    custom_id: str, completion: dict, *, http_status: int | None, secrets: Iterable[str] = ()
) -> base.ResultLine | None:
    """A chat completion's first choice in the ledger's words (reference/providers.md §5, §8.1):
    a draft, cut off when `finish_reason` is `length`; or the model's refusal (`message.refusal`,
    content null) or the content filter's (`finish_reason: content_filter`), with their words.
    None when it holds neither text nor a refusal. Raises what reading another shape raises."""
    choice = completion["choices"][0]
    message = choice["message"]
    usage = completion.get("usage") if isinstance(completion.get("usage"), dict) else {}
    counted = {
        "usage": usage,
        "input_tokens": base.token_count(usage.get("prompt_tokens")),
        "output_tokens": base.token_count(usage.get("completion_tokens")),
        "http_status": http_status,
    }
    content = message.get("content")
    content = "" if content is None else content
    refusal = message.get("refusal")
    finish = choice.get("finish_reason")
    if isinstance(refusal, str) and refusal:
        return base.refused_by_model(custom_id, said="refusal", words=refusal, secrets=secrets, **counted)
    if not isinstance(content, str):
        return None
    if finish in FILTERED:
        return base.refused_by_model(custom_id, said=finish, words=content, secrets=secrets, **counted)
    return base.ResultLine(
        custom_id=custom_id, succeeded=True, content=content, truncated=finish == "length", **counted
    )


def parse_result_line(
    line_number: int, text: str, *, secrets: Iterable[str] = ()
) -> base.ResultLine | base.UnreadableLine:
    """One line of a results file. What is kept of a line that failed (its error, or the text of
    an unreadable line) is scrubbed of credentials; a draft is the model's text and kept whole."""
    return read_jsonl_result(line_number, text, _parse_line, secrets=secrets)


def _parse_line(line_number: int, line: dict, *, secrets: Iterable[str]) -> base.ResultLine:
    custom_id = line["custom_id"]
    response = line.get("response") if isinstance(line.get("response"), dict) else {}
    error = line.get("error")
    status_code = response.get("status_code")
    body = response.get("body") if isinstance(response.get("body"), dict) else {}
    if status_code == 200 and not error:
        try:
            answer = read_completion(custom_id, body, http_status=200, secrets=secrets)
        except (KeyError, IndexError, TypeError, AttributeError):
            answer = None
        if answer is None:
            # Paid for but unusable: a permanent failure of that request, never an automatic re-send.
            return unreadable_result(
                custom_id,
                f"line {line_number}: a success line without a text choices[0].message.content",
                http_status=200,
            )
        return answer
    if isinstance(error, dict):
        code = str(error.get("code") or "error")
        reason, transient = LINE_ERRORS.get(code, (ReasonCode.MODEL_FAILED, False))
        return base.ResultLine(
            custom_id=custom_id,
            succeeded=False,
            error_code=code,
            error_message=scrub_credentials(str(error.get("message") or ""), secrets),
            reason=reason,
            transient=transient,
        )
    envelope = body.get("error")
    envelope = envelope if isinstance(envelope, dict) else {}
    code = str(envelope.get("code") or envelope.get("type") or f"http_{status_code}")
    status = status_code if isinstance(status_code, int) else None
    reason, transient = base.classify_http_status(status)
    if code in LINE_ERRORS and code != "invalid_request_error":
        reason, transient = LINE_ERRORS[code]
    return base.ResultLine(
        custom_id=custom_id,
        succeeded=False,
        http_status=status,
        error_code=code,
        error_message=scrub_credentials(str(envelope.get("message") or error or ""), secrets),
        reason=reason,
        transient=transient,
    )


def unix_time(value: object) -> datetime | None:
    """A batch's timestamp (Unix seconds), or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 2**37:
        return None
    return datetime.fromtimestamp(value, tz=UTC)


class OpenAIBatchProvider(HttpBatchProvider):
    name = "openai"
    schema_dialect = SCHEMA_DIALECT
    capabilities = base.Capabilities(
        finding=base.Finding.BY_KEY,  # `metadata.batchdesk_intent`
        can_cancel=True,
        max_requests=50_000,
        max_bytes=200 * 1024 * 1024,
        delivery=base.Delivery.FILE,
        # Output and error files expire 30 days after they are written, at the batch's end, unless
        # `output_expires_after` says otherwise (never sent); `DELETE /files/{id}` deletes one.
        results_kept=base.ResultsKept(timedelta(days=30), base.CountedFrom.END),
        deletes_files=True,
    )

    @classmethod
    def from_settings(cls, config: dict) -> "OpenAIBatchProvider":
        # The emulator takes any key; a real provider without one answers 401, shown as such.
        api_key = configured_key(config) or ("emulator-key" if not config["required_env"] else "")
        client = provider_client(config, headers={"Authorization": f"Bearer {api_key}"})
        return cls(client=client)

    def request_bytes(self, request: base.InferenceRequest) -> int:
        return len(request_json(request)) + 1

    def submit(self, *, requests: list[base.InferenceRequest], intent_key: str, metadata: dict) -> str:
        payload = b"".join(request_json(r) + b"\n" for r in requests)
        # Uploading twice is harmless (an unused file); creating a batch twice is not.
        upload = self._json(
            self._call(
                "POST",
                "/files",
                files={"file": (f"{intent_key}.jsonl", io.BytesIO(payload), "application/jsonl")},
                data={"purpose": "batch"},
            )
        )
        file_id = upload.get("id")
        if not isinstance(file_id, str) or not file_id:
            # Nothing is created yet: an unused file at most, so the upload may simply be tried again.
            raise base.ProviderError("POST /files answered without a file id", secrets=self.secrets)
        body = {
            "input_file_id": file_id,
            "endpoint": ENDPOINT,
            "completion_window": "24h",
            "metadata": {
                **{key: str(value)[:METADATA_VALUE_LIMIT] for key, value in metadata.items()},
                INTENT_METADATA_KEY: intent_key,
            },
        }
        response = self._call("POST", "/batches", json=body, answer_may_be_lost=True)
        batch_id = self._json(response, answer_may_be_lost=True).get("id")
        if not isinstance(batch_id, str) or not batch_id:
            # Created or not, we cannot tell which batch: reconcile as if the answer were lost.
            raise base.AnswerLost("POST /batches answered without a batch id", secrets=self.secrets)
        return batch_id

    def find_units(
        self, *, intent_key: str, sent_at: datetime | None = None, request_count: int = 0
    ) -> list[str]:
        found = []
        after = None
        while True:
            params = {"limit": 100, **({"after": after} if after else {})}
            page = self._json(self._call("GET", "/batches", params=params))
            data = page.get("data") if isinstance(page.get("data"), list) else []
            batches = [batch for batch in data if isinstance(batch, dict)]
            found += [
                batch["id"]
                for batch in batches
                if isinstance(batch.get("id"), str)
                and isinstance(batch.get("metadata"), dict)
                and batch["metadata"].get(INTENT_METADATA_KEY) == intent_key
            ]
            if not page.get("has_more") or not batches:
                # The listing is newest first.
                return list(reversed(found))
            after = batches[-1].get("id")
            if not isinstance(after, str) or not after:
                raise base.ProviderError("GET /batches says it has more but gives no id to go on from")

    def status(self, provider_ref: str) -> base.UnitStatus:
        batch = self._json(self._call("GET", f"/batches/{provider_ref}"))
        errors = batch.get("errors") if isinstance(batch.get("errors"), dict) else {}
        errors = errors.get("data") if isinstance(errors.get("data"), list) else []
        errors = [error for error in errors if isinstance(error, dict)]
        counts = batch.get("request_counts")
        word = batch.get("status") if isinstance(batch.get("status"), str) else ""
        return base.UnitStatus(
            # A batch without a status word is shown as such and polled again.
            provider_status=word or "unknown",
            ended=word in ENDED_STATUSES,
            # `failed` with no file at all: the batch itself was refused (its input, a limit).
            refused=word == "failed" and not (batch.get("output_file_id") or batch.get("error_file_id")),
            counts=base.UnitCounts(
                total=base.token_count(counts.get("total")),
                succeeded=base.token_count(counts.get("completed")),
                failed=base.token_count(counts.get("failed")),
            )
            if isinstance(counts, dict)
            else None,
            problem=stored_text(
                scrub_credentials(
                    "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors), self.secrets
                )
            ),
            ended_at=unix_time(batch.get(ENDED_STAMPS[word])) if word in ENDED_STAMPS else None,
        )

    def ended_results(self, provider_ref: str) -> base.Results:
        batch = self._json(self._call("GET", f"/batches/{provider_ref}"))
        for file_ref in (batch.get("output_file_id"), batch.get("error_file_id")):
            if file_ref and isinstance(file_ref, str):
                yield from self._stream_file(file_ref)

    def _stream_file(self, file_ref: str) -> base.Results:
        path = f"/files/{file_ref}/content"
        return self._stream_results(path, what=path, parse=parse_result_line)

    def delete_files(self, provider_ref: str) -> list[str]:
        batch = self._json(self._call("GET", f"/batches/{provider_ref}"))
        gone = []
        for key in ("input_file_id", "output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if not file_id or not isinstance(file_id, str):
                continue
            try:
                self._call("DELETE", f"/files/{file_id}")
            except base.ProviderError as exc:
                if exc.status != 404:  # a file already gone is what was asked for
                    raise
            gone.append(file_id)
        return gone

    def cancel(self, provider_ref: str) -> str:
        response = self._call("POST", f"/batches/{provider_ref}/cancel")
        try:
            return str(response.json().get("status", ""))
        except (ValueError, AttributeError):  # accepted, but the answer says nothing readable
            return ""
