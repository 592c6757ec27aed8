"""Input of the review screens. Anything that fails here is refused before the ledger is touched."""

from django import forms
from django.core.validators import RegexValidator

from ledger.states import ItemState

sha256_hex = RegexValidator(r"^[0-9a-f]{64}$", "The draft's content hash must be 64 hexadecimal characters.")


class ApproveForm(forms.Form):
    version_id = forms.IntegerField(min_value=1, error_messages={"required": "Say which draft is approved."})
    version_hash = forms.CharField(
        validators=[sha256_hex], error_messages={"required": "The draft's hash is missing."}
    )
    # The edited final text; empty means "publish the draft as it is". Not stripped: whitespace is text.
    content = forms.CharField(required=False, strip=False, max_length=65536, widget=forms.Textarea)
    note = forms.CharField(required=False, max_length=2000)

    def clean_content(self) -> str | None:
        content = self.cleaned_data["content"].replace("\r\n", "\n")  # browsers send CRLF
        return content if content.strip() else None


class RejectForm(forms.Form):
    version_id = forms.IntegerField(min_value=1, error_messages={"required": "Say which draft is rejected."})
    reason = forms.CharField(max_length=2000, error_messages={"required": "Say why the draft is rejected."})


class ItemFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "Every state"), *ItemState.choices])
    sku = forms.CharField(required=False, max_length=64, label="SKU contains")
