"""The Gemini API's Files API as the Gemini emulator serves it (reference/providers.md §4), and
the proto JSON and list paging every Gemini call shares. The batch emulator
(`gemini.GeminiEmulator`) builds on it: a batch's input file is read from here and its responses
file is stored here.

The Files API as the SDK and the REST guide use it: a resumable upload started with
`POST /upload/v1beta/files` (`X-Goog-Upload-Protocol: resumable`, `X-Goog-Upload-Command: start`,
`X-Goog-Upload-Header-Content-Length`, body `{"file": {"displayName"}}`), answered with an
`X-Goog-Upload-URL`; the bytes are posted there (`X-Goog-Upload-Command: upload[, finalize]`,
`X-Goog-Upload-Offset`), the last answer `X-Goog-Upload-Status: final` and `{"file": File}`.
`GET /v1beta/files/{id}`; a generated file's bytes at `GET /download/v1beta/files/{id}:download?alt=media`
(the REST guide) or `GET /v1beta/files/{id}:download?alt=media` (the SDK).
"""

import base64
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from ledger.emulators.server import Download, EmulatorServer
from ledger.emulators.units import forget_expired

MAX_FILE_BYTES = 2_000_000_000  # an input file, "2 GB" read as the smaller figure [GEM-GUIDE]
FILE_LIFETIME = 48 * 3600  # the Files API keeps a file 48 hours (unconfirmed for batch output)
UPLOAD_GRANULARITY = 8 * 1024 * 1024  # X-Goog-Upload-Chunk-Granularity, as the SDK's chunks
DEFAULT_FILES_PAGE_SIZE = 10  # files.list [Gemini API reference]
MAX_FILES_PAGE_SIZE = 100


def proto_get(mapping: Any, camel: str) -> Any:
    """A field of a proto JSON object, spelled camelCase or snake_case."""
    if not isinstance(mapping, dict):
        return None
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return mapping.get(camel, mapping.get(snake))


def timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class StoredFile:
    id: str
    display_name: str
    mime_type: str
    content: bytes
    created: float
    source: str  # UPLOADED (by a client) or GENERATED (a batch's responses)

    @property
    def name(self) -> str:
        return f"files/{self.id}"

    @property
    def expires_at(self) -> float:
        """The Files API keeps a file FILE_LIFETIME: an uploaded input file from its upload, a
        responses file from its batch's end."""
        return self.created + FILE_LIFETIME


@dataclass
class Upload:
    display_name: str
    mime_type: str
    declared: int | None  # X-Goog-Upload-Header-Content-Length, when the start said it
    data: bytearray = field(default_factory=bytearray)


class FilesApi(EmulatorServer):
    """The Files API's routes, its uploads in progress and its store (`_files`, in upload order)."""

    routes = (
        "POST /upload/v1beta/files upload_file",
        "GET /v1beta/files list_files",
        "GET /v1beta/files/<file_id> get_file",
        "DELETE /v1beta/files/<file_id> delete_file",
        "GET /v1beta/files/<file_id>:download download_file",
        "GET /download/v1beta/files/<file_id>:download download_file",
    )

    def __init__(self, **kwargs: Any) -> None:
        self._files: dict[str, StoredFile] = {}
        self._uploads: dict[str, Upload] = {}
        super().__init__(**kwargs)

    def _page(self, request: Request, default: int, maximum: int) -> tuple[int, int]:
        """Where a list call's page starts and how long it is: a `pageSize` of 0 or none is the
        default, one above the maximum the maximum, a negative one refused (AIP-158)."""
        try:
            size = int(request.args.get("pageSize") or 0)
        except ValueError:
            raise self.error(400, "Invalid value at 'page_size' (TYPE_INT32)") from None
        if size < 0:
            raise self.error(400, "page_size must not be negative.")
        start = 0
        token = request.args.get("pageToken")
        if token:
            try:
                start = int(base64.urlsafe_b64decode(token.encode()).decode())
            except ValueError:
                raise self.error(400, "Invalid page token.") from None
        return start, min(size or default, maximum)

    @staticmethod
    def _paged(answer: dict, end: int, total: int) -> dict:
        if end < total:
            answer["nextPageToken"] = base64.urlsafe_b64encode(str(end).encode()).decode()
        return answer

    # --- the Files API ------------------------------------------------------------------------

    def _outside_api(self, request: Request) -> None:
        """Calls under `/upload/` and `/download/` are not under `/v1beta/`: checked and admitted
        (fault knobs) here as the shared plumbing does for the rest."""
        if not request.path.startswith(self.api_prefix):
            self.authenticate(request)
            self.admit(request.method, request.path)

    def upload_file(self, request: Request) -> Response:
        """The resumable upload: a start (no `upload_id`), then the bytes to the upload URL."""
        upload_id = request.args.get("upload_id")
        if upload_id is None:
            return self._start_upload(request)
        # The upload URL is its own credential (the SDK sends no key there); faults still apply.
        self.admit(request.method, request.path)
        command = {part.strip() for part in request.headers.get("X-Goog-Upload-Command", "").split(",")}
        with self.lock:
            upload = self._uploads.get(upload_id)
            if upload is None:
                raise self.error(404, "No upload session with this id (finished, or never started).")
            if "query" in command:
                return self._upload_answer("active", received=len(upload.data))
            if "upload" not in command:
                raise self.error(400, "X-Goog-Upload-Command must be upload, finalize or query.")
            try:
                offset = int(request.headers.get("X-Goog-Upload-Offset", ""))
            except ValueError:
                raise self.error(400, "X-Goog-Upload-Offset is required.") from None
            if offset != len(upload.data):
                raise self.error(400, f"Offset {offset} does not continue the upload at {len(upload.data)}.")
            upload.data += request.get_data()
            if len(upload.data) > MAX_FILE_BYTES:
                del self._uploads[upload_id]
                raise self.error(400, f"The file is larger than {MAX_FILE_BYTES} bytes.")
            if "finalize" not in command:
                return self._upload_answer("active", received=len(upload.data))
            if upload.declared is not None and upload.declared != len(upload.data):
                del self._uploads[upload_id]
                raise self.error(400, f"Received {len(upload.data)} bytes, {upload.declared} were announced.")
            del self._uploads[upload_id]
            stored = self._store(upload.display_name, upload.mime_type, bytes(upload.data), source="UPLOADED")
            body = {"file": self._file_resource(stored, request)}
        return self._upload_answer("final", body=body)

    def _start_upload(self, request: Request) -> Response:
        self._outside_api(request)
        if request.headers.get("X-Goog-Upload-Protocol", "").lower() != "resumable":
            raise self.error(400, "Only the resumable upload protocol is served (X-Goog-Upload-Protocol).")
        if request.headers.get("X-Goog-Upload-Command", "").strip().lower() != "start":
            raise self.error(400, "A resumable upload starts with X-Goog-Upload-Command: start.")
        declared_text = request.headers.get("X-Goog-Upload-Header-Content-Length")
        try:
            declared = None if declared_text is None else int(declared_text)
        except ValueError:
            raise self.error(400, "X-Goog-Upload-Header-Content-Length must be a number.") from None
        if declared is not None and declared > MAX_FILE_BYTES:
            raise self.error(400, f"The file is larger than {MAX_FILE_BYTES} bytes.")
        body = self.json_body(request) if request.get_data() else {}
        file_body = proto_get(body, "file") or {}
        display_name = proto_get(file_body, "displayName")
        upload = Upload(
            display_name=display_name if isinstance(display_name, str) else "",
            mime_type=request.headers.get("X-Goog-Upload-Header-Content-Type")
            or str(proto_get(file_body, "mimeType") or "application/octet-stream"),
            declared=declared,
        )
        upload_id = uuid.uuid4().hex + uuid.uuid4().hex
        with self.lock:
            self._uploads[upload_id] = upload
        url = f"{request.host_url.rstrip('/')}/upload/v1beta/files?upload_id={upload_id}&upload_protocol=resumable"
        response = self._upload_answer("active")
        response.headers["X-Goog-Upload-URL"] = url
        response.headers["X-Goog-Upload-Chunk-Granularity"] = str(UPLOAD_GRANULARITY)
        return response

    @staticmethod
    def _upload_answer(status: str, *, body: dict | None = None, received: int | None = None) -> Response:
        response = Response(
            json.dumps(body) if body is not None else b"",
            mimetype="application/json" if body is not None else "text/plain",
        )
        response.headers["X-Goog-Upload-Status"] = status
        if received is not None:
            response.headers["X-Goog-Upload-Size-Received"] = str(received)
        return response

    def get_file(self, request: Request, file_id: str) -> dict:
        with self.lock:
            return self._file_resource(self._file(file_id), request)

    def list_files(self, request: Request) -> dict:
        """Uploaded and generated files, newest first."""
        start, size = self._page(request, DEFAULT_FILES_PAGE_SIZE, MAX_FILES_PAGE_SIZE)
        with self.lock:
            self.advance()  # responses files written by now are listed
            self._forget_expired()
            newest_first = list(reversed(self._files.values()))  # kept in the order they came
            page = [self._file_resource(stored, request) for stored in newest_first[start : start + size]]
        # Proto3 JSON leaves an empty list out, as Google's answer for no files is `{}`.
        return self._paged({"files": page} if page else {}, start + size, len(newest_first))

    def delete_file(self, request: Request, file_id: str) -> dict:
        with self.lock:
            self._file(file_id)
            del self._files[file_id]
            return {}

    def download_file(self, request: Request, file_id: str) -> Download:
        self._outside_api(request)
        if request.args.get("alt") != "media":
            raise self.error(400, "Downloading a file's bytes takes alt=media.")
        with self.lock:
            stored = self._file(file_id)
            if stored.source != "GENERATED":
                # As the SDK says: only generated files can be downloaded.
                raise self.error(
                    400, f"File {stored.name} was uploaded; only generated files can be downloaded."
                )
        return self.download(stored.name, stored.content, "application/jsonl")

    def _file(self, file_id: str) -> StoredFile:
        self._forget_expired()
        stored = self._files.get(file_id)
        if stored is None:
            raise self.error(
                403,
                f"You do not have permission to access the File {file_id} or it may not exist.",
                code="PERMISSION_DENIED",
            )
        return stored

    def _forget_expired(self) -> None:
        """Files past their lifetime are deleted, as the Files API deletes them (callers hold the lock)."""
        forget_expired(self._files, self.clock.now())

    def _store(
        self, display_name: str, mime_type: str, content: bytes, *, source: str, file_id: str = ""
    ) -> StoredFile:
        """Keep a file (callers hold the lock)."""
        stored = StoredFile(
            id=file_id or uuid.uuid4().hex[:12],
            display_name=display_name,
            mime_type=mime_type,
            content=content,
            created=self.clock.now(),
            source=source,
        )
        self._files[stored.id] = stored
        return stored

    def _file_resource(self, stored: StoredFile, request: Request) -> dict:
        root = request.host_url.rstrip("/")
        resource = {
            "name": stored.name,
            "displayName": stored.display_name,
            "mimeType": stored.mime_type,
            "sizeBytes": str(len(stored.content)),
            "createTime": timestamp(stored.created),
            "updateTime": timestamp(stored.created),
            "expirationTime": timestamp(stored.created + FILE_LIFETIME),
            "sha256Hash": base64.b64encode(hashlib.sha256(stored.content).hexdigest().encode()).decode(),
            "uri": f"{root}/v1beta/{stored.name}",
            "state": "ACTIVE",
            "source": stored.source,
        }
        if stored.source == "GENERATED":
            resource["downloadUri"] = f"{root}/download/v1beta/{stored.name}:download?alt=media"
        return {key: value for key, value in resource.items() if value != ""}
