"""Input of the jobs, catalogue and prompt screens. Anything that fails here is refused before the
ledger is touched. The ledger's verbs check again: a form is here for clear, per-field messages."""

import json
import re

from django import forms
from django.db.models import QuerySet

from ledger.actions import (
    MAX_PROMPT_OUTPUT_TOKENS,
    PROMPT_TASK_PATTERN,
    output_schema_problems,
    prompt_rules_problems,
    prompt_template_problems,
    rejection_reasons_problems,
)
from ledger.models import (
    MAX_NAMED_SKUS,
    Job,
    Product,
    ProductStatus,
    PromptVersion,
    category_text,
    compact_json,
)
from ledger.money.pricing import priced_models
from ledger.pilots.sample import sample_products
from ledger.providers import default_model, provider_names
from ledger.providers.model_names import model_name_problem
from ledger.states import JobState, default_rejection_reasons

from .job_forms import JobForm, active_products, too_many_skus_message, unknown_skus_message
from .pilot_forms import ScreenPilotForm


def with_category(products: QuerySet[Product]) -> QuerySet[Product]:
    """Annotated with `category`: the current revision's `category` field as text (5 and "5" alike)."""
    return products.annotate(category=category_text("current_revision__fields"))


def categories() -> list[str]:
    """The distinct `category` fields of active products' current revisions, as text; products
    without one, or with null, have none."""
    values = (
        with_category(active_products())
        .exclude(current_revision__fields__category=None)
        .exclude(category__isnull=True)
        .exclude(category="")
        .order_by("category")
        .values_list("category", flat=True)
        .distinct()
    )
    return list(values)


def split_skus(text: str) -> list[str]:
    """SKUs separated by commas, spaces or line breaks, first occurrence kept."""
    return list(dict.fromkeys(part for part in re.split(r"[\s,;]+", text) if part))


class JobStartForm(JobForm):
    """The start screen: `JobForm`'s checks, a reference that may be left empty, the prompt
    version picked from a list, and the products chosen by category or as a pasted list."""

    ALL, CATEGORY, SKUS = "all", "category", "skus"

    reference = forms.CharField(
        required=False,
        max_length=200,
        help_text="Unique. Leave empty to use the task and the time, e.g. product_description-20250101-120000.",
    )
    task = forms.ChoiceField()
    # One list of every task's versions, so the screen names a version by its id.
    prompt_version = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Prompt version"
    )
    scope = forms.ChoiceField(
        label="Products",
        initial=ALL,
        widget=forms.RadioSelect,
        choices=[
            (ALL, "Every active product"),
            (CATEGORY, "The active products of one category"),
            (SKUS, "A list of SKUs"),
        ],
    )
    category = forms.ChoiceField(required=False)
    skus = forms.CharField(
        required=False,
        label="SKUs",
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Separated by commas, spaces or line breaks.",
    )
    pilot = forms.BooleanField(
        required=False,
        label="A pilot: a stratified sample of these products",
        help_text="Its report projects the whole scope's cost and review hours from the sample's.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pilot_form = ScreenPilotForm(self.data if self.is_bound else None, prefix="pilot")
        tasks = sorted(set(PromptVersion.objects.values_list("task", flat=True)))
        self.fields["task"].choices = [(task, task) for task in tasks]
        if "product_description" in tasks:
            self.fields["task"].initial = "product_description"
        self.fields["prompt_version"].choices = [
            ("", "The current version of the task"),
            *(
                (str(p.pk), f"{p} (current)" if p.is_current else str(p))
                for p in PromptVersion.objects.with_current().order_by("task", "-version")
            ),
        ]
        self.fields["category"].choices = [("", "Choose a category"), *((c, c) for c in categories())]
        self.fields["model"].widget.attrs["list"] = "priced-models"
        self.priced_models = priced_models()
        self.products: QuerySet[Product] = active_products().none()
        # The products chosen; `products` is what the job works on: these, or a pilot's sample of them.
        self.scope: QuerySet[Product] = self.products

    def find_prompt(self, task: str, version_id) -> PromptVersion | None:
        """The screen picks a prompt version by its id, from one list of every task's versions."""
        if not version_id:
            return PromptVersion.objects.for_job(task)
        return PromptVersion.objects.filter(task=task, pk=version_id).first()

    def clean_reference(self) -> str:
        reference = self.cleaned_data["reference"].strip()
        if reference and Job.objects.filter(reference=reference).exists():
            raise forms.ValidationError(f"A job with reference “{reference}” exists already.")
        return reference

    def clean(self) -> dict:
        data = super().clean()
        scope = data.get("scope")
        if scope == self.ALL:
            self.products = active_products()
            if not self.products.exists():
                self.add_error("scope", "There are no active products.")
        elif scope == self.CATEGORY:
            if not data.get("category"):
                self.add_error("category", "Choose a category.")
            else:
                self.products = with_category(active_products()).filter(category=data["category"])
        elif scope == self.SKUS:
            skus = split_skus(data.get("skus", ""))
            if not skus:
                self.add_error("skus", "List at least one SKU.")
            elif len(skus) > MAX_NAMED_SKUS:
                self.add_error("skus", too_many_skus_message(len(skus)))
            else:
                self.products = active_products().filter(sku__in=skus)
                found = set(self.products.values_list("sku", flat=True))
                missing = [sku for sku in skus if sku not in found]
                if missing:
                    self.add_error("skus", unknown_skus_message(missing))
        self.scope = self.products
        if data.get("pilot") and not self.errors:
            self.judge_pilot()
        return data

    def judge_pilot(self) -> None:
        """The pilot's settings, judged against the products chosen; the job works on its sample."""
        if self.pilot_form.is_valid():
            self.pilot_form.check_scope(self.scope)
        if self.pilot_form.errors:
            self.add_error(
                "pilot",
                [
                    f"{self.pilot_form[name].label}: {error}"
                    for name, errors in self.pilot_form.errors.items()
                    for error in errors
                ],
            )
        else:
            self.products = sample_products(self.pilot_form.plan, self.scope)

    def job_fields(self) -> dict:
        pilot = self.pilot_form.plan if self.cleaned_data.get("pilot") else None
        return {**super().job_fields(), "pilot": pilot}

    def job_skus(self) -> list[str] | None:
        """What `create_job` is given: None means every active product."""
        if self.cleaned_data["scope"] == self.ALL:
            return None
        return list(self.scope.order_by("sku").values_list("sku", flat=True))


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "Every state"), *JobState.choices])
    reference = forms.CharField(required=False, max_length=200, label="Reference contains")


class ProductFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=300, label="SKU or title contains")
    status = forms.ChoiceField(required=False, choices=[("", "Every status"), *ProductStatus.choices])


class CatalogueImportForm(forms.Form):
    file = forms.FileField(
        label="Catalogue file",
        help_text="JSONL or CSV, UTF-8. Products missing from the file are left alone.",
    )
    skip_invalid = forms.BooleanField(
        required=False,
        label="Skip invalid rows",
        help_text="Import the valid rows even when others are rejected. Otherwise a single rejected row "
        "stops the whole import.",
    )


class PromptPreviewForm(forms.Form):
    DEFAULT_PROVIDER = "openai"

    sku = forms.CharField(max_length=64, label="SKU")
    provider = forms.ChoiceField(
        choices=[(name, name) for name in provider_names()], required=False, initial=DEFAULT_PROVIDER
    )
    model = forms.CharField(
        max_length=128,
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "the provider's default"}),
    )

    def clean_provider(self) -> str:
        return self.cleaned_data["provider"] or self.DEFAULT_PROVIDER

    def clean(self) -> dict:
        data = super().clean()
        provider = data.get("provider")
        if provider and not data.get("model"):
            data["model"] = default_model(provider)
        elif provider and (problem := model_name_problem(provider, data["model"])):
            self.add_error("model", problem[0].upper() + problem[1:])
        return data


class JSONObjectField(forms.CharField):
    """A JSON text area whose value is the parsed JSON (any JSON value; the verbs check its shape and
    what it holds: no NaN, no NUL)."""

    widget = forms.Textarea

    def prepare_value(self, value):
        if isinstance(value, dict | list):
            return json.dumps(value, indent=2, ensure_ascii=False)
        return value

    def to_python(self, value):
        text = super().to_python(value)
        if text in self.empty_values:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from exc
        except RecursionError:
            raise forms.ValidationError("Not usable JSON: it is nested too deeply") from None


class ReasonsField(forms.CharField):
    """The rejection reasons reviewers pick from, one a line: `code: label` (SPEC §8)."""

    widget = forms.Textarea

    def prepare_value(self, value):
        if isinstance(value, list):
            return "\n".join(f"{r['code']}: {r['label']}" for r in value)
        return value

    def to_python(self, value):
        text = super().to_python(value) or ""
        reasons = []
        for number, line in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
            if not line.strip():
                continue
            code, colon, label = line.partition(":")
            if not colon:
                raise forms.ValidationError(f"Line {number}: write “code: label”, e.g. “tone: Wrong tone”.")
            reasons.append({"code": code.strip(), "label": label.strip()})
        return reasons

    def validate(self, value) -> None:
        if value and (problems := rejection_reasons_problems(value)):
            raise forms.ValidationError(problems)


class PromptVersionForm(forms.Form):
    task = forms.RegexField(
        regex=rf"^{PROMPT_TASK_PATTERN}$",
        max_length=64,
        error_messages={"invalid": "Lower-case letters, digits and _, starting with a letter."},
        help_text="A new task starts at version 1; an existing one gets its next number.",
    )
    system_message = forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), label="System message")
    template = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6}),
        strip=False,
        help_text="Filled with {title} and {facts} (one “- name: value” line per field). "
        "Write {{ and }} for literal braces.",
    )
    output_schema = JSONObjectField(
        label="Output schema",
        help_text='A JSON Schema with "type": "object".',
        widget=forms.Textarea(attrs={"rows": 12}),
    )
    rules = JSONObjectField(
        required=False,
        help_text="JSON: min_length, max_length, text_field (a property of the schema), claim_words.",
        widget=forms.Textarea(attrs={"rows": 8}),
    )
    max_output_tokens = forms.IntegerField(
        min_value=1, max_value=MAX_PROMPT_OUTPUT_TOKENS, initial=600, label="Max output tokens"
    )
    rejection_reasons = ReasonsField(
        required=False,
        label="Rejection reasons",
        initial=default_rejection_reasons,
        help_text="What reviewers pick from when they reject a draft, one a line: “code: label”. "
        "The desk's keys 1–9 pick them in this order; /quality/ and the exports count by code.",
        widget=forms.Textarea(attrs={"rows": 6}),
    )

    def __init__(self, *args, source: PromptVersion | None = None, **kwargs):
        self.source = source
        if source is not None and "data" not in kwargs and not args:
            kwargs["initial"] = {
                "task": source.task,
                "system_message": source.system_message,
                "template": source.template,
                "output_schema": source.output_schema,
                "rules": source.rules,
                "max_output_tokens": source.max_output_tokens,
                "rejection_reasons": source.rejection_reasons,
            }
        super().__init__(*args, **kwargs)

    def clean_system_message(self) -> str:
        return self.cleaned_data["system_message"].replace("\r\n", "\n")

    def clean_template(self) -> str:
        template = self.cleaned_data["template"].replace("\r\n", "\n")  # browsers send CRLF
        if problems := prompt_template_problems(template):
            raise forms.ValidationError(problems)
        return template

    def clean_output_schema(self) -> dict:
        schema = self.cleaned_data["output_schema"]
        if problems := output_schema_problems(schema):
            raise forms.ValidationError(problems)
        return schema

    def clean(self) -> dict:
        data = super().clean()
        if data.get("rules") is None:
            data["rules"] = {}
        if not data.get("rejection_reasons") and "rejection_reasons" not in self.errors:
            # Left empty: the version it starts from keeps its reasons; a new task has the default's.
            data["rejection_reasons"] = (
                self.source.rejection_reasons if self.source is not None else default_rejection_reasons()
            )
        if "output_schema" in data and (
            problems := prompt_rules_problems(data["rules"], data["output_schema"])
        ):
            self.add_error("rules", problems)
        if self.source is not None and not self.errors and self.same_as_source(data):
            raise forms.ValidationError(f"Nothing changed: this would be a copy of {self.source}.")
        return data

    def same_as_source(self, data: dict) -> bool:
        source = self.source
        return (
            data["task"] == source.task
            and data["system_message"] == source.system_message
            and data["template"] == source.template
            # In order: the order of a schema's properties is the order a model writes them in.
            and compact_json(data["output_schema"]) == compact_json(source.output_schema)
            and data["rules"] == source.rules
            and data["max_output_tokens"] == source.max_output_tokens
            and data.get("rejection_reasons") == source.rejection_reasons
        )
