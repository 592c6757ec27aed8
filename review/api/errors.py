"""The API's one error shape: `{"error": {"code", "message", "fields"}}` (SPEC §6).

400 for bad input (each bad field named in `fields`), 401, 403, 404, 405, 409 when the ledger refuses a
change in the current state or a job reference is reused for different work, 500 `internal_error` for
a fault of ours, whose traceback is logged and never sent. Django's handler400 and handler500 answer
in this shape under /api/, and any address under /api/ that names nothing is a JSON 404.
"""

from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt


class ApiError(Exception):
    """An answer in the error shape, raised anywhere behind the door; `headers` go with it (`Allow`,
    `WWW-Authenticate`)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        fields: dict[str, str] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.fields = status, code, message, fields or {}
        self.headers = headers or {}

    def response_body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "fields": self.fields}}

    def response(self) -> JsonResponse:
        return JsonResponse(self.response_body(), status=self.status, headers=self.headers)


def invalid(fields: dict[str, str]) -> ApiError:
    return ApiError(400, "invalid", "Some fields are not valid: " + ", ".join(fields), fields)


def not_found_error(request: HttpRequest, what: str = "Nothing") -> ApiError:
    return ApiError(404, "not_found", f"{what} found at {request.path}")


def not_found(request: HttpRequest, what: str = "Nothing") -> JsonResponse:
    return not_found_error(request, what).response()


def found_or_404[M: Model](request: HttpRequest, rows: QuerySet[M], what: str) -> M:
    """The first of `rows` (the one the address names), or else the 404 of `not_found`, raised."""
    found = rows.first()
    if found is None:
        raise not_found_error(request, what)
    return found


def server_error_response() -> JsonResponse:
    return ApiError(500, "internal_error", "Something went wrong on our side; it has been logged.").response()


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's handler500: a fault outside an API view (in a middleware, say) still answers the
    API's callers in JSON. Django has logged it already."""
    if request.path_info.startswith("/api/"):
        return server_error_response()
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's handler400, for a request Django itself refuses before any view reads it (more form
    fields than DATA_UPLOAD_MAX_NUMBER_FIELDS, a form body over DATA_UPLOAD_MAX_MEMORY_SIZE, a Host
    not in ALLOWED_HOSTS): JSON under /api/, the application's page (400.html) elsewhere."""
    if request.path_info.startswith("/api/"):
        return ApiError(400, "bad_request", "The request could not be read; nothing was changed.").response()
    return defaults.bad_request(request, exception)


@csrf_exempt
def unknown(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """Any other address under /api/, whatever the method and whoever calls: a JSON 404 rather than an
    HTML page. No door: there is nothing behind it."""
    return not_found(request)
