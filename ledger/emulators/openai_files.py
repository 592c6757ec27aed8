"""The OpenAI Files API as the OpenAI emulator serves it (reference/providers.md §1.1): uploads
with `purpose=batch`, the listing, a file's object and bytes, deletion, and expiry (§8.3). The
batch emulator (`openai.Emulator`) builds on it and stores its output and error files here."""

import random
from dataclasses import dataclass
from typing import Any

from werkzeug.wrappers import Request

from ledger.emulators.server import ApiError, Download, EmulatorServer
from ledger.emulators.units import forget_expired

DAY = 86400
FILE_TTL = 30 * DAY
MAX_FILES_PAGE = 10_000  # `GET /files`: its largest and default `limit` [OAI-SDK]


def openai_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> ApiError:
    """OpenAI's `{"error": {message, type, param, code}}` envelope."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return ApiError(status, body, headers)


def new_id(prefix: str) -> str:
    """24 random hex digits, as OpenAI's ids have: from Python's generator, not the system's (three
    a result line; a uuid4 each cost a tenth of the emulator's time per request)."""
    return f"{prefix}{random.getrandbits(96):024x}"


@dataclass
class StoredFile:
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


def list_page(page: list[dict], *, has_more: bool) -> dict:
    """One page of a list call, as OpenAI answers it."""
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": has_more,
    }


class FilesApi(EmulatorServer):
    """The Files API's routes and store (`_files`, in upload order)."""

    routes = (
        "POST /v1/files upload",
        "GET /v1/files file_listing",
        "GET /v1/files/<file_id> file",
        "DELETE /v1/files/<file_id> file_deletion",
        "GET /v1/files/<file_id>/content content",
    )

    def __init__(self, **kwargs: Any) -> None:
        self._files: dict[str, StoredFile] = {}
        super().__init__(**kwargs)

    # --- the routes --------------------------------------------------------------------------

    def upload(self, request: Request) -> dict:
        upload = request.files.get("file")
        if upload is None or "purpose" not in request.form:
            raise openai_error(
                400, "Missing required parameter: 'file' and 'purpose' are required.", param="file"
            )
        seconds = request.form.get("expires_after[seconds]") or None
        if seconds is not None and not (seconds.isdigit() and 3600 <= int(seconds) <= 30 * DAY):
            raise openai_error(400, "expires_after[seconds] must be 3600-2592000.", param="expires_after")
        return self.create_file(
            filename=upload.filename or "upload.jsonl",
            purpose=request.form["purpose"],
            content=upload.read(),
            ttl=int(seconds) if seconds else None,
        )

    def file_listing(self, request: Request) -> dict:
        limit = request.args.get("limit", str(MAX_FILES_PAGE))
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_FILES_PAGE:
            raise openai_error(400, f"limit must be from 1 to {MAX_FILES_PAGE}.", param="limit")
        order = request.args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise openai_error(
                400, f"Invalid value: '{order}'. Supported values are: 'asc' and 'desc'.", param="order"
            )
        return self.list_files(
            after=request.args.get("after"),
            limit=int(limit),
            order=order,
            purpose=request.args.get("purpose"),
        )

    def file(self, request: Request, file_id: str) -> dict:
        return self.get_file(file_id)

    def file_deletion(self, request: Request, file_id: str) -> dict:
        return self.delete_file(file_id)

    def content(self, request: Request, file_id: str) -> Download:
        return self.download_file(file_id)

    # --- the API -------------------------------------------------------------------------

    def create_file(self, *, filename: str, purpose: str, content: bytes, ttl: int | None = None) -> dict:
        if purpose != "batch":
            raise openai_error(
                400, f"Invalid purpose {purpose!r}: the emulator accepts 'batch'.", param="purpose"
            )
        now = int(self.clock.now())
        file = StoredFile(new_id("file-"), filename, purpose, content, now, now + (ttl or FILE_TTL))
        with self.lock:
            self._files[file.id] = file
        return file.as_json()

    def _file(self, file_id: str) -> StoredFile:
        self._forget_expired()
        if file_id not in self._files:
            raise openai_error(404, f"No such File object: {file_id}", param="id")
        return self._files[file_id]

    def _forget_expired(self) -> None:
        """Files past their `expires_at` are deleted, as OpenAI deletes them (reference §8.3): an
        output file 30 days after its batch ended, unless `output_expires_after` said otherwise."""
        forget_expired(self._files, self.clock.now())

    def get_file(self, file_id: str) -> dict:
        with self.lock:
            return self._file(file_id).as_json()

    def list_files(
        self,
        *,
        after: str | None = None,
        limit: int = MAX_FILES_PAGE,
        order: str = "desc",
        purpose: str | None = None,
    ) -> dict:
        """Newest first unless `order` is "asc"; `after` is the id of the last file of the previous page."""
        with self.lock:
            self.advance()  # result files written by now are listed
            self._forget_expired()
            files = [file for file in self._files.values() if purpose is None or file.purpose == purpose]
            if order == "desc":
                files.reverse()
            if after is not None:
                ids = [file.id for file in files]
                if after not in ids:
                    raise openai_error(400, f"No such File object: {after}", param="after")
                files = files[ids.index(after) + 1 :]
            page = [file.as_json() for file in files[:limit]]
        return list_page(page, has_more=len(files) > limit)

    def delete_file(self, file_id: str) -> dict:
        """The file is gone; a batch made from it keeps what it read."""
        with self.lock:
            self._file(file_id)
            del self._files[file_id]
        return {"id": file_id, "object": "file", "deleted": True}

    def download_file(self, file_id: str) -> Download:
        """A file's content, counted; cut short while `cut_downloads` says so."""
        with self.lock:
            return self.download(file_id, self._file(file_id).content)
