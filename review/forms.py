"""Input of the review screens. Anything that fails here is refused before the ledger is touched."""

from django import forms
from django.core.validators import RegexValidator

from ledger.actions.reviewing import MAX_COMMENT_LENGTH
from ledger.models import Job
from ledger.money.budgets import budget_amount_problem
from ledger.states import ItemState

from .ids import INVALID_ID, IdField, parse_id

# The limits of a decision, for the review screens and the API alike.
MAX_CONTENT_LENGTH = 65536
MAX_NOTE_LENGTH = 2000


class BudgetField(forms.DecimalField):
    """A budget in the business currency, on the start screen, the job page and in the API's bodies:
    refused with its rule's words (SPEC §9) when it has more than two decimal places or is below 0.01."""

    def __init__(self, **kwargs):
        super().__init__(max_digits=14, **kwargs)

    def validate(self, value) -> None:
        super().validate(value)
        if value is not None and (problem := budget_amount_problem(value)):
            raise forms.ValidationError(problem + ".", code="budget_rule")


sha256_hex = RegexValidator(r"^[0-9a-f]{64}$", "The draft's content hash must be 64 hexadecimal characters.")


class ApproveForm(forms.Form):
    version_id = IdField(error_messages={"required": "Say which draft is approved."})
    version_hash = forms.CharField(
        validators=[sha256_hex], error_messages={"required": "The draft's hash is missing."}
    )
    # The edited final text, sent only by the forms that edit: absent means "publish the draft as it
    # is", while an edit box sent empty is an empty edit, which the ledger refuses (rule 15). Not
    # stripped: whitespace is text.
    content = forms.CharField(
        required=False, strip=False, max_length=MAX_CONTENT_LENGTH, widget=forms.Textarea
    )
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH)

    def clean_content(self) -> str | None:
        if "content" not in self.data:
            return None
        return self.cleaned_data["content"].replace("\r\n", "\n")  # browsers send CRLF


class JobReferenceField(forms.CharField):
    """A job named by its reference, typed by a person: the job, None when left empty, refused when no
    job has it."""

    def __init__(self, **kwargs):
        super().__init__(required=False, max_length=200, label="Job reference", **kwargs)

    def clean(self, value) -> Job | None:
        reference = super().clean(value).strip()
        if not reference:
            return None
        job = Job.objects.filter(reference=reference).first()
        if job is None:
            raise forms.ValidationError("No job has this reference.")
        return job


class ReasonOrCode(forms.Form):
    """A rejection's reason: a code from the drafts' prompt versions' lists (checked by the ledger,
    which knows the lists), words of the reviewer's own, or both; one of the two is required."""

    reason = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH)
    reason_code = forms.CharField(required=False, max_length=64)
    missing_reason = "Say why the draft is rejected: pick a reason or write one."

    def clean(self) -> dict:
        cleaned = super().clean()
        if not cleaned.get("reason") and not cleaned.get("reason_code") and not self.errors:
            raise forms.ValidationError(self.missing_reason)
        return cleaned


class RejectForm(ReasonOrCode):
    version_id = IdField(error_messages={"required": "Say which draft is rejected."})


class CommentForm(forms.Form):
    """A comment on a draft; its one-time token makes the same form sent twice add it once."""

    text = forms.CharField(
        max_length=MAX_COMMENT_LENGTH, error_messages={"required": "Write the comment first."}
    )
    version_id = IdField(required=False)
    form_token = forms.UUIDField(error_messages={"required": "The form is incomplete; reload the page."})


class RegenerateForm(forms.Form):
    prompt_version = IdField(error_messages={"required": "Choose the prompt version to ask with."})


class ItemFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "Every state"), *ItemState.choices])
    sku = forms.CharField(required=False, max_length=64, label="SKU contains")


# --- the review desk -----------------------------------------------------------------------

# Drafts on one page of the review list, and the most that one bulk approval may name.
LIST_PAGE_SIZE = 50


class ReviewPlaceForm(forms.Form):
    """Where a reviewer is: focus or list mode, a job filter, and a draft by position (1 = oldest, with
    the cursor of the draft before it once past the first) or item.
    Read from the address (GET) and from the hidden fields of a decision (POST); bad values are ignored."""

    mode = forms.ChoiceField(required=False, choices=[("focus", "One draft at a time"), ("list", "List")])
    job = IdField(required=False)
    pos = IdField(required=False)
    item = IdField(required=False)
    # The draft before the one at `pos`, as a signed cursor (review/paging.py): the draft shown is the
    # first one after it, found from the queue's index whatever the position.
    after = forms.CharField(required=False, max_length=1000)
    # List mode's filters beside the job: the product's category as its source revision states it,
    # and whether the draft passed its checks.
    category = forms.CharField(required=False, max_length=200)
    validity = forms.ChoiceField(
        required=False, choices=[("", "Valid or not"), ("valid", "Valid"), ("invalid", "Invalid")]
    )
    # "mine": the drafts assigned to the reviewer (review/assignments.py); "all": every waiting draft.
    # Absent: the reviewer's own queue first, when they have one.
    queue = forms.ChoiceField(required=False, choices=[("mine", "My queue"), ("all", "Every draft")])


class DraftsField(forms.Field):
    """The ticked rows: every value of a repeated `draft` parameter, each `<version id>:<content hash>`,
    as (version id, content hash) pairs, each once. A tick names the very draft its row showed."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> list[tuple[int, str]]:
        pairs = []
        for text in value or []:
            version, _, digest = text.partition(":") if isinstance(text, str) else ("", "", "")
            version_id = parse_id(version)
            try:
                sha256_hex(digest)
            except forms.ValidationError:
                version_id = None
            if version_id is None:
                raise forms.ValidationError(
                    "Each ticked draft is named by its version id and content hash "
                    f"(<id>:<64 hexadecimal characters>). {INVALID_ID}"
                )
            pairs.append((version_id, digest))
        return list(dict.fromkeys(pairs))

    def validate(self, value: list[tuple[int, str]]) -> None:
        super().validate(value)
        if len(value) > LIST_PAGE_SIZE:
            raise forms.ValidationError(f"Approve at most {LIST_PAGE_SIZE} drafts at once.")


class ApproveSelectedForm(forms.Form):
    """Ticked rows of the review list, each naming the version and content hash of the draft shown,
    so that only the text the reviewer saw is approved."""

    draft = DraftsField(error_messages={"required": "Tick the drafts to approve."})


class RejectSelectedForm(ReasonOrCode, ApproveSelectedForm):
    """Ticked rows to reject, all for one reason."""

    missing_reason = "Say why the ticked drafts are rejected: pick a reason or write one."


# The most drafts one "all matching" decision takes: the oldest this many; the rest wait for another.
MATCHING_LIMIT = 500


class DecideMatchingForm(forms.Form):
    """A decision on every draft matching the list's filters, as the reviewer confirmed it: how many
    there were and which (`fingerprint`), so that a set changed since is asked about again."""

    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    count = forms.IntegerField(min_value=1, max_value=MATCHING_LIMIT)
    fingerprint = forms.CharField(validators=[sha256_hex])
    reason = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH)
    reason_code = forms.CharField(required=False, max_length=64)

    def clean(self) -> dict:
        cleaned = super().clean()
        if cleaned.get("decision") == "reject" and not (cleaned.get("reason") or "").strip():
            if not cleaned.get("reason_code"):
                raise forms.ValidationError("Say why the drafts are rejected: pick a reason or write one.")
        return cleaned
