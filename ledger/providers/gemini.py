"""Gemini API Batch Mode over httpx (reference/providers.md §4), with the REST shapes the official
`google-genai` SDK sends and reads (`google/genai/batches.py`, `files.py`, `_api_client.py`):

- create `POST /models/{model}:batchGenerateContent` with
  `{"batch": {"displayName": <intent key>, "inputConfig": {"requests": {"requests": [
  {"request": GenerateContentRequest, "metadata": {"key": <custom_id>}}]}}}}` for a unit that fits
  inline, or `"inputConfig": {"fileName": "files/…"}` for a larger one, answered with a
  long-running Operation named `batches/{id}` (our provider reference);
- a file is uploaded first through the Files API's resumable upload: `POST /upload/v1beta/files`
  (`X-Goog-Upload-Protocol: resumable`, `X-Goog-Upload-Command: start`, body `{"file":
  {"displayName"}}`) answers an `X-Goog-Upload-URL`, where the JSONL bytes go in one
  `upload, finalize` call, answered with `{"file": {"name": "files/…"}}`; each line is
  `{"key": <custom_id>, "request": GenerateContentRequest}`;
- `GET /batches/{id}`: the Operation, its `metadata` a GenerateContentBatch (`state`
  `BATCH_STATE_*`, `batchStats`, `displayName`); once ended `done: true` and the results in
  `response` (the REST guide) or `metadata.output` (where the SDK reads them): inline
  `inlinedResponses.inlinedResponses`, or `responsesFile: "files/…"`, downloaded (streamed) from
  `GET /download/v1beta/{file}:download?alt=media`, one `{"key", "response" | "error"}` a line;
- `GET /batches?pageSize&pageToken` (`operations`, `nextPageToken`); `POST /batches/{id}:cancel`.

Responses are matched to requests by their key (`metadata.key` inline, `key` in a file) only,
never by position.
"""

import json
import re
from datetime import datetime, timedelta
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from ..drafts.schema_dialects import Dialect, sent_schema
from ..drafts.scrubbing import scrub_credentials, stored_text
from ..retrying import duration_seconds, requested_wait
from ..states import ReasonCode
from . import base
from .gemini_results import (
    inlined_responses,
    parse_file_line,
    parse_inlined,
    proto_int,
    response_key,
    responses_file,
    state_word,
)
from .http import HttpBatchProvider, configured_key, provider_client
from .model_names import check_model_name

# REST says BATCH_STATE_*; the SDKs say JOB_STATE_*. Both are read by their suffix.
ENDED_STATES = {"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"}
# Batches that may end with no responses at all: the ledger reads why from `status`.
NO_RESULT_STATES = {"FAILED", "CANCELLED", "EXPIRED"}
COMPACT = (",", ":")
# What is sent inline, and what goes in a file (settings.PROVIDERS["gemini"] may lower either:
# `inline_max_requests`, `inline_max_bytes`). Inline: the create body is at most 20 MB [GEM-GUIDE],
# read as 20,000,000 bytes (the smaller reading), and every answer comes back inside one GET of
# the batch, which 5,000 requests keep to a few MB at our output sizes (about 1-2 KB each).
INLINE_MAX_REQUESTS = 5_000
INLINE_MAX_BYTES = 20_000_000
# By file: an input file is at most 2 GB [GEM-GUIDE], read as 2,000,000,000 bytes. Google states no
# request count per batch; 50,000 is BatchDesk's (OpenAI's documented figure): a batch expires
# whole on Gemini, so one unit's loss stays bounded, and its results file (about 100 MB at our
# sizes) streams in well inside a collection task.
FILE_MAX_REQUESTS = 50_000
FILE_MAX_BYTES = 2_000_000_000
UPLOAD_MIME_TYPE = "application/jsonl"
# `responseJsonSchema` takes a subset of JSON Schema, without length rules (rule 17).
SCHEMA_DIALECT = Dialect.GEMINI


# The name of a file of the Files API that BatchDesk calls by (a download, a deletion).
FILE_NAME = re.compile(r"files/[A-Za-z0-9_-]+")


def model_name(model: str) -> str:
    return model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"


def model_path(model: str) -> str:
    """`/models/{name}`: the name is one percent-quoted path segment, whatever it holds."""
    collection, _, name = model_name(model).partition("/")
    return f"/{collection}/{quote(name, safe='')}"


def inline_request(request: base.InferenceRequest) -> dict:
    """One entry of `inputConfig.requests.requests`. A JSON schema goes in `responseJsonSchema`
    (the SDK's `response_json_schema`: JSON Schema as is), not `responseSchema` (Google's
    OpenAPI subset, which would need translating)."""
    generation: dict = {"maxOutputTokens": request.max_output_tokens}
    if request.output_schema:
        generation["responseMimeType"] = "application/json"
        generation["responseJsonSchema"] = sent_schema(request.output_schema, SCHEMA_DIALECT).schema
    body: dict = {
        "contents": [{"role": "user", "parts": [{"text": request.user_message}]}],
        "generationConfig": generation,
    }
    if request.system_message:
        body["systemInstruction"] = {"parts": [{"text": request.system_message}]}
    return {"request": body, "metadata": {"key": request.custom_id}}


def file_line(request: base.InferenceRequest) -> bytes:
    """One line of an input file: `{"key": custom_id, "request": GenerateContentRequest}` and its
    newline, in the compact form the inline entry has (so it is never the larger of the two)."""
    entry = inline_request(request)
    line = {"key": request.custom_id, "request": entry["request"]}
    return json.dumps(line, ensure_ascii=False, separators=COMPACT).encode("utf-8") + b"\n"


class GeminiBatchProvider(HttpBatchProvider):
    name = "gemini"
    schema_dialect = SCHEMA_DIALECT
    capabilities = base.Capabilities(
        finding=base.Finding.BY_KEY,  # the intent key is the batch's `displayName`, found by listing
        can_cancel=True,
        # A unit too large to go inline goes in a file (see INLINE_* and FILE_* above).
        max_requests=FILE_MAX_REQUESTS,
        # Counted as inline entries, which are never smaller than the file's lines.
        max_bytes=FILE_MAX_BYTES,
        delivery=base.Delivery.INLINE_OR_FILE,
        usage_per_request=True,
        # The Files API keeps a file 48 hours: a responses file from its writing at the batch's end.
        # Inline results are said to stay "six weeks" (unconfirmed): every unit is held to the
        # responses file's 48 hours, the shorter.
        results_kept=base.ResultsKept(timedelta(hours=48), base.CountedFrom.END),
        deletes_files=True,
    )

    def __init__(
        self,
        *,
        client: httpx.Client,
        inline_max_requests: int = INLINE_MAX_REQUESTS,
        inline_max_bytes: int = INLINE_MAX_BYTES,
    ):
        super().__init__(client=client)
        self.inline_max_requests = inline_max_requests
        self.inline_max_bytes = inline_max_bytes

    @classmethod
    def from_settings(cls, config: dict) -> "GeminiBatchProvider":
        # Without a key Google answers 403, shown as such.
        client = provider_client(
            config, headers={"x-goog-api-key": configured_key(config)}, read_timeout=120.0
        )
        return cls(
            client=client,
            inline_max_requests=min(
                INLINE_MAX_REQUESTS, config.get("inline_max_requests", INLINE_MAX_REQUESTS)
            ),
            inline_max_bytes=min(INLINE_MAX_BYTES, config.get("inline_max_bytes", INLINE_MAX_BYTES)),
        )

    def request_bytes(self, request: base.InferenceRequest) -> int:
        # The entry and the comma after it, in the compact form `submit` sends inline (a line of
        # a file, with its newline, is shorter: it counts within the file's limit too).
        return (
            len(json.dumps(inline_request(request), ensure_ascii=False, separators=COMPACT).encode("utf-8"))
            + 1
        )

    def _service_url(self, kind: str, path: str) -> str:
        """An address beside the API's: `/upload/v1beta/…` or `/download/v1beta/…` for a base URL
        ending `/v1beta` (the version is the base URL's last segment)."""
        base_url = str(self.client.base_url).rstrip("/")
        root, _, version = base_url.rpartition("/")
        return f"{root}/{kind}/{version}/{path.lstrip('/')}"

    @staticmethod
    def _retry_after(response: httpx.Response) -> float | None:
        """What its headers ask (`requested_wait`), else the `retryDelay` ("37s") of a
        google.rpc.RetryInfo detail."""
        seconds = requested_wait(response.headers)
        if seconds is not None:
            return seconds
        try:
            details = response.json()["error"]["details"]
        except (ValueError, KeyError, TypeError):
            return None
        for detail in details if isinstance(details, list) else []:
            delay = detail.get("retryDelay") if isinstance(detail, dict) else None
            seconds = duration_seconds(delay) if isinstance(delay, str) else None
            if seconds is not None:
                return seconds
        return None

    def goes_inline(self, requests: list[base.InferenceRequest], intent_key: str) -> bool:
        """Whether this unit is sent inline: within the inline request count and, as sent, the
        inline byte limit. Otherwise it is sent as a file."""
        if len(requests) > self.inline_max_requests:
            return False
        envelope = {"batch": {"displayName": intent_key, "inputConfig": {"requests": {"requests": []}}}}
        size = len(json.dumps(envelope, ensure_ascii=False, separators=COMPACT).encode("utf-8")) - 1
        for request in requests:
            size += self.request_bytes(request)
            if size > self.inline_max_bytes:
                return False
        return True

    def submit(self, *, requests: list[base.InferenceRequest], intent_key: str, metadata: dict) -> str:
        """Gemini batches carry no metadata but their display name: the intent key goes there,
        and `metadata` is not sent. A unit that does not go inline is uploaded as a JSONL file
        first; the batch is created from it."""
        models = {model_name(request.model) for request in requests}
        if len(models) != 1:
            raise base.ProviderError(f"one model per Gemini batch, got {sorted(models)}", status=400)
        check_model_name("gemini", next(iter(models)))  # before any upload: the key goes with it
        if self.goes_inline(requests, intent_key):
            input_config: dict = {"requests": {"requests": [inline_request(r) for r in requests]}}
        else:
            input_config = {"fileName": self._upload(requests, intent_key)}
        body = {"batch": {"displayName": intent_key, "inputConfig": input_config}}
        path = f"{model_path(models.pop())}:batchGenerateContent"
        # Serialised as `request_bytes` counts it, so the 20 MB limit is checked on what is sent.
        payload = json.dumps(body, ensure_ascii=False, separators=COMPACT).encode("utf-8")
        headers = {"content-type": "application/json; charset=utf-8"}
        operation = self._json(
            self._call("POST", path, content=payload, headers=headers, answer_may_be_lost=True),
            answer_may_be_lost=True,
        )
        name = operation.get("name")
        if not isinstance(name, str) or not name.startswith("batches/"):
            # Created, but we cannot tell which batch it is: reconcile as if the answer were lost.
            raise base.AnswerLost(f"POST {path} answered without a batch name", secrets=self.secrets)
        return name

    def _upload(self, requests: list[base.InferenceRequest], intent_key: str) -> str:
        """Upload the unit as a JSONL file (the Files API's resumable upload, in one piece); its
        name, `files/…`. No batch exists yet: a failure here is an ordinary ProviderError, and a
        file left behind by one expires by itself (48 hours)."""
        lines = [file_line(request) for request in requests]
        size = sum(map(len, lines))
        start = self._call(
            "POST",
            self._service_url("upload", "files"),
            headers={
                "X-Goog-Upload-Protocol": "resumable",
                "X-Goog-Upload-Command": "start",
                "X-Goog-Upload-Header-Content-Length": str(size),
                "X-Goog-Upload-Header-Content-Type": UPLOAD_MIME_TYPE,
                "content-type": "application/json; charset=utf-8",
            },
            content=json.dumps({"file": {"displayName": intent_key}}, separators=COMPACT).encode(),
        )
        upload_url = start.headers.get("x-goog-upload-url")
        if not upload_url:
            raise base.ProviderError(
                "POST /upload/…/files answered without an X-Goog-Upload-URL", secrets=self.secrets
            )
        # Only ever to the API's own scheme and host (as the SDK does): our key goes nowhere else.
        api = urlsplit(str(self.client.base_url))
        upload_url = urlunsplit(urlsplit(upload_url)._replace(scheme=api.scheme, netloc=api.netloc))
        done = self._call(
            "POST",
            upload_url,
            headers={
                "X-Goog-Upload-Command": "upload, finalize",
                "X-Goog-Upload-Offset": "0",
                "content-length": str(size),
            },
            content=iter(lines),  # streamed: the lines are not joined into one more copy
        )
        status = done.headers.get("x-goog-upload-status", "")
        uploaded = self._json(done).get("file")
        name = uploaded.get("name") if isinstance(uploaded, dict) else None
        if status.lower() != "final" or not isinstance(name, str) or not name.startswith("files/"):
            raise base.ProviderError(
                f"the upload of {len(requests)} requests did not end with a file "
                f"(X-Goog-Upload-Status {status or 'missing'})",
                secrets=self.secrets,
            )
        return name

    def find_units(
        self, *, intent_key: str, sent_at: datetime | None = None, request_count: int = 0
    ) -> list[str]:
        found = []
        token = None
        while True:
            params = {"pageSize": 100, **({"pageToken": token} if token else {})}
            page = self._json(self._call("GET", "/batches", params=params))
            operations = page.get("operations") if isinstance(page.get("operations"), list) else []
            for operation in operations:
                metadata = operation.get("metadata") if isinstance(operation, dict) else None
                name = operation.get("name") if isinstance(operation, dict) else None
                if isinstance(metadata, dict) and metadata.get("displayName") == intent_key and name:
                    found.append((str(metadata.get("createTime") or ""), str(name)))
            token = page.get("nextPageToken")
            if not token or not isinstance(token, str) or not operations:
                # The listing's order is not promised: oldest first by creation time (RFC 3339
                # in UTC sorts as text).
                return [name for _, name in sorted(found)]

    def status(self, provider_ref: str) -> base.UnitStatus:
        operation = self._json(self._call("GET", f"/{provider_ref}"))
        word = state_word(operation)
        suffix = word.rsplit("_STATE_", 1)[-1]
        ended = suffix in ENDED_STATES or operation.get("done") is True
        has_results = inlined_responses(operation) is not None or bool(responses_file(operation))
        metadata = operation.get("metadata") if isinstance(operation.get("metadata"), dict) else {}
        stats = metadata.get("batchStats")
        error = operation.get("error") if isinstance(operation.get("error"), dict) else {}
        problem = str(error.get("message") or "")
        if suffix == "EXPIRED" and not problem:
            problem = "the batch expired before it finished (48 hours): no results"
        return base.UnitStatus(
            provider_status=word or ("done" if ended else "unknown"),
            ended=ended,
            refused=suffix == "FAILED" and not has_results,
            counts=base.UnitCounts(
                total=proto_int(stats.get("requestCount")),
                succeeded=proto_int(stats.get("successfulRequestCount")),
                failed=proto_int(stats.get("failedRequestCount")),
            )
            if isinstance(stats, dict)
            else None,
            problem=stored_text(scrub_credentials(problem, self.secrets)),
            # An expired batch has no results at all; its requests are retried (transient).
            unanswered_reason=ReasonCode.BATCH_EXPIRED if suffix == "EXPIRED" else "",
            ended_at=base.parse_time(metadata.get("endTime")) if ended else None,
        )

    def delete_files(self, provider_ref: str) -> list[str]:
        operation = self._json(self._call("GET", f"/{provider_ref}"))
        metadata = operation.get("metadata") if isinstance(operation.get("metadata"), dict) else {}
        config = metadata.get("inputConfig") if isinstance(metadata.get("inputConfig"), dict) else {}
        names = [config.get("fileName"), responses_file(operation)]
        gone = []
        for name in names:
            if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
                continue  # an inline unit has no file; a name of another shape is not ours to call
            try:
                self._call("DELETE", f"/{name}")
            except base.ProviderError as exc:
                # Google answers 403 ("may not exist") or 404 for a file already gone.
                if exc.status not in (403, 404):
                    raise
            gone.append(name)
        return gone

    def ended_results(self, provider_ref: str) -> base.Results:
        operation = self._json(self._call("GET", f"/{provider_ref}"))
        entries = inlined_responses(operation)
        file_name = responses_file(operation) if not entries else ""
        suffix = state_word(operation).rsplit("_STATE_", 1)[-1]
        if file_name:
            yield from self._file_results(
                provider_ref, file_name, ended_without_results=suffix in NO_RESULT_STATES
            )
            return
        if not entries and suffix not in NO_RESULT_STATES:
            # Finished (or said to be) with no answer at all: the ledger would record every
            # request missing and send again work that succeeded. Not yet readable: ask again.
            raise base.ProviderError(
                f"batch {provider_ref} ({state_word(operation) or 'no state'}) gave no responses",
                secrets=self.secrets,
            )
        if entries and not any(map(response_key, entries)):
            raise self._anonymous(provider_ref, len(entries))
        for number, entry in enumerate(entries or [], start=1):
            yield parse_inlined(number, entry, secrets=self.secrets)

    def _anonymous(self, provider_ref: str, count: int) -> base.ProviderError:
        # Users report the service answering inline requests without their metadata (a file's
        # lines without their key would be the same). Every answer is then anonymous: matching by position would be a guess (responses are
        # reported out of order too), and recording the requests as missing would send again,
        # and pay again for, work that was done. The unit waits, saying why, for an operator.
        return base.ProviderError(
            f"batch {provider_ref} answered {count} responses, none naming its request "
            "(no metadata.key or key): they are never matched by position, and their requests are "
            "not sent again (they ran, and were paid for). Nothing is recorded until the answers "
            "name their requests, or an operator cancels the job.",
            secrets=self.secrets,
        )

    def _file_results(
        self, provider_ref: str, file_name: str, *, ended_without_results: bool
    ) -> base.Results:
        """The lines of a responses file, streamed as they download. A download cut short is a
        ProviderError after the lines already read (the ledger records them; the next try reads
        the file again and skips what is recorded). Lines naming no request are unreadable, as
        inline; when no line of the whole file names one, nothing is yielded and the unit waits
        for an operator, as an inline batch does (the keyless lines are held back until a line
        with a key shows the file is not all anonymous)."""
        if not FILE_NAME.fullmatch(file_name):
            raise base.ProviderError(
                f"batch {provider_ref} names a responses file BatchDesk cannot ask for: {file_name[:200]}",
                secrets=self.secrets,
            )
        url = self._service_url("download", f"{file_name}:download") + "?alt=media"
        held: list[base.UnreadableLine] = []
        keyed = False
        for line in self._stream_results(url, what=file_name, parse=parse_file_line):
            if keyed:
                yield line
            elif isinstance(line, base.ResultLine):
                keyed = True
                yield from held
                held.clear()
                yield line
            else:
                held.append(line)
        if held:
            raise self._anonymous(provider_ref, len(held))
        if not keyed and not ended_without_results:
            # An empty file for a batch that ran: as with no inline responses, ask again.
            raise base.ProviderError(f"batch {provider_ref} gave an empty {file_name}", secrets=self.secrets)

    def cancel(self, provider_ref: str) -> str:
        try:
            self._call("POST", f"/{provider_ref}:cancel")
        except base.ProviderError as exc:
            # Already ended (Google: FAILED_PRECONDITION): nothing left to stop; say how it ended.
            if exc.status != 400 or "FAILED_PRECONDITION" not in str(exc):
                raise
        # The cancel answers `{}`; the batch says what it is now.
        try:
            return self.status(provider_ref).provider_status
        except base.ProviderError:
            return ""
