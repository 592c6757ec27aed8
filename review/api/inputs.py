"""What a request's body says: JSON read once for every endpoint, then checked by a Django form (as
the screens' `ApproveForm` and `RejectForm` check theirs) whose fields are the body's keys. A bad
field is a 400 `invalid` naming it; a key no field reads is refused, since a misspelt optional field
must not silently mean "use the default". The body of `POST /api/jobs` is `review.job_forms.ApiJobForm`."""

import json
from collections.abc import Iterable
from typing import Any, Self

from django import forms
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from ledger.actions.reviewing import MAX_COMMENT_LENGTH
from ledger.drafts.json_values import refuse_json_constant, text_problem, unique_json_keys
from ledger.models import MAX_DECISION_NOTE_LENGTH, PilotVerdict

from ..forms import MAX_CONTENT_LENGTH, MAX_NOTE_LENGTH, BudgetField
from .errors import ApiError, invalid

# A prompt version number is a PostgreSQL integer.
MAX_PROMPT_VERSION = 2**31 - 1
RETRY_UNITS = ("inference", "destination")


def read_json(request: HttpRequest, *, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """The body as a JSON object ({} when empty). With `allowed`, any other key is refused."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(400, "too_large", "The request body is too large") from None
    if not raw.strip():
        data: object = {}
    else:
        try:
            data = json.loads(raw, object_pairs_hook=unique_json_keys, parse_constant=refuse_json_constant)
        except (ValueError, RecursionError) as error:
            raise ApiError(400, "malformed_json", f"The body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "malformed_json", "The body must be a JSON object")
    if unstorable := unstorable_text(data):
        raise invalid(unstorable)
    if allowed is not None:
        allowed = set(allowed)
        unknown = {key: "not a known field" for key in data if key not in allowed}
        if unknown:
            raise invalid(unknown)
    return data


def unstorable_text(data: dict) -> dict[str, str]:
    """Each field of the body holding, anywhere inside it, a text PostgreSQL cannot store: a NUL, or a
    lone surrogate (JSON lets `"\\ud800"` be written; it is no character). Checked once for every
    endpoint, before any field is used; a bad key is named `body`, since it cannot be shown as itself."""
    problems: dict[str, str] = {}
    for name, value in data.items():
        field = "body" if text_problem(name) else name
        pending = [name, value]
        while pending:
            found = pending.pop()
            if isinstance(found, dict):
                pending += [*found.keys(), *found.values()]
            elif isinstance(found, list):
                pending += found
            elif isinstance(found, str) and (problem := text_problem(found)):
                problems[field] = problem
                break
    return problems


def read_raw_body(request: HttpRequest, *, limit: int) -> bytes | None:
    """The raw body, or None when it is larger than `limit`: refused by its declared length before
    anything is read, and never read past the limit.

    A body sent in chunks has no Content-Length, and Django's WSGI request reads such a body as empty:
    a correctly signed webhook would fail its signature. Where the server has read the chunks to their
    end (`wsgi.input_terminated`, as WSGI servers such as gunicorn say), the body is read from the
    server's stream itself. Under ASGI (`make serve`) the whole body has been read before the view runs
    (batchdesk/asgi.py) and is read as it is."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    if not request.META.get("CONTENT_LENGTH") and request.META.get("wsgi.input_terminated"):
        body = request.META["wsgi.input"].read(limit + 1)
    else:
        body = request.read(limit + 1)
    return None if len(body) > limit else body


# --- the fields of a JSON body -------------------------------------------------------------


class JsonText(forms.Field):
    """Text as JSON sent it, not stripped (whitespace is text); None when absent or null."""

    default_error_messages = {
        "required": "required",
        "not_text": "must be text",
        "blank": "must not be blank",
        "too_long": "at most %(limit)d characters",
    }

    def __init__(self, *, max_length: int, blank: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.max_length, self.blank = max_length, blank

    def to_python(self, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise forms.ValidationError(self.error_messages["not_text"], code="not_text")
        return value

    def validate(self, value: str | None) -> None:
        if value is None:
            if self.required:
                raise forms.ValidationError(self.error_messages["required"], code="required")
        elif not self.blank and not value.strip():
            raise forms.ValidationError(self.error_messages["blank"], code="blank")
        elif len(value) > self.max_length:
            raise forms.ValidationError(
                self.error_messages["too_long"], code="too_long", params={"limit": self.max_length}
            )


class JsonChoice(forms.Field):
    """One of `choices`, exactly as JSON sent it (no conversion to text); anything else, absence
    included, is refused with the one message."""

    def __init__(self, *, choices: Iterable[Any], message: str, **kwargs):
        super().__init__(required=False, **kwargs)
        self.choices, self.message = tuple(choices), message

    def validate(self, value: Any) -> None:
        if value not in self.choices:
            raise forms.ValidationError(self.message, code="invalid_choice")


class JsonWhole(forms.Field):
    """A whole number within bounds, as a JSON number (true is no number, "1" is text)."""

    def __init__(self, *, lowest: int, highest: int, message: str, optional: bool = False, **kwargs):
        super().__init__(required=False, **kwargs)
        self.lowest, self.highest, self.message, self.optional = lowest, highest, message, optional

    def validate(self, value: Any) -> None:
        if value is None and self.optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not self.lowest <= value <= self.highest:
            raise forms.ValidationError(self.message, code="invalid")


# --- the bodies ----------------------------------------------------------------------------


class JsonBody(forms.Form):
    """A JSON body read through a form. `read` refuses what is no JSON object and any key no field
    reads (400 at once); `checked` is the cleaned data, or the 400 naming each bad field. Two steps,
    so a view may answer 404 or 403 between them as it always has."""

    @classmethod
    def read(cls, request: HttpRequest) -> Self:
        return cls(read_json(request, allowed=cls.base_fields))

    def checked(self) -> dict[str, Any]:
        if not self.is_valid():
            raise invalid({name: " ".join(errors) for name, errors in self.errors.items()})
        return self.cleaned_data


class ApproveBody(JsonBody):
    """`{content?, note?}`: absent content publishes the draft as it is (SPEC §6, rule 15)."""

    content = JsonText(required=False, max_length=MAX_CONTENT_LENGTH, blank=True)
    note = JsonText(required=False, max_length=MAX_NOTE_LENGTH, blank=True)


class RejectBody(JsonBody):
    """`{reason, reason_code?}` (SPEC §6): a code from the draft's prompt version's list, words of the
    reviewer's own, or both; one of the two is required."""

    reason = JsonText(required=False, max_length=MAX_NOTE_LENGTH, blank=True)
    reason_code = JsonText(required=False, max_length=64)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if not (cleaned.get("reason") or "").strip() and not cleaned.get("reason_code") and not self.errors:
            raise invalid({"reason": "required: a reason, a reason_code, or both"})
        return cleaned


class CommentBody(JsonBody):
    """`{text, version?}`: a comment on an item's draft."""

    text = JsonText(max_length=MAX_COMMENT_LENGTH)
    version = JsonWhole(
        lowest=1, highest=2**63 - 1, message="must be a version id of this item", optional=True
    )


class RetryBody(JsonBody):
    unit = JsonChoice(choices=RETRY_UNITS, message="required: inference or destination")


class BudgetBody(JsonBody):
    """`{budget}` in the business currency."""

    budget = BudgetField()


class PilotDecisionBody(JsonBody):
    """`{decision: "go"|"no_go", note?, budget?}` (SPEC §6): go may name the full job's budget."""

    decision = JsonChoice(choices=PilotVerdict.values, message="required: go or no_go")
    note = JsonText(required=False, max_length=MAX_DECISION_NOTE_LENGTH, blank=True)
    budget = BudgetField(required=False)


class PromptChoiceBody(JsonBody):
    """`{version}`: the version number within the task to make current."""

    version = JsonWhole(
        lowest=1,
        highest=MAX_PROMPT_VERSION,
        message="required: the version number within the task, a whole number from 1",
    )
