"""Starting a job: one set of checks for the start screen and for `POST /api/jobs`.

`JobForm` holds every rule about what a job may be (a provider configured here and a known destination,
a task with a prompt, a unit size within the provider's limit). The screen's `JobStartForm` adds how people pick products;
the API's `ApiJobForm` adds the JSON list of SKUs and requires a reference. `create_job` checks
again in its transaction: a form is here for clear, per-field messages. `StartTokenForm` is the start
screen's one-time token: the API's reference plays that part for machines."""

import uuid

from django import forms
from django.conf import settings
from django.db.models import QuerySet

from ledger.catalogue import SKU_PATTERN
from ledger.database.setwise import among
from ledger.destinations import destination_names
from ledger.models import (
    DEFAULT_DESTINATION,
    MAX_NAMED_SKUS,
    Product,
    ProductStatus,
    PromptVersion,
    no_prompt_for_job,
)
from ledger.money.budgets import budget_problem
from ledger.money.currency import business_currency
from ledger.notices.receivers import MAX_URL_LENGTH, notify_url_problem
from ledger.providers import (
    capabilities,
    configured_provider_names,
    default_model,
    default_unit_size,
    provider_names,
)
from ledger.providers.model_names import model_name_problem

from .forms import BudgetField
from .pilot_forms import ApiPilotForm, PilotObjectField

# Unknown SKUs are listed in an error up to this many; the rest are counted.
SHOWN_SKUS = 20
# A field of a request that could not be read, in `ApiJobForm.wanted()`.
UNREADABLE = object()


def active_products() -> QuerySet[Product]:
    return Product.objects.filter(status=ProductStatus.ACTIVE)


def too_many_skus_message(count: int) -> str:
    return f"{count:,} SKUs named; at most {MAX_NAMED_SKUS:,}, or leave them out for every active product."


def unknown_skus_message(missing: list[str]) -> str:
    shown = ", ".join(missing[:SHOWN_SKUS])
    more = f" and {len(missing) - SHOWN_SKUS} more" if len(missing) > SHOWN_SKUS else ""
    return f"Unknown SKUs, or products not active: {shown}{more}."


def provider_limit(provider: str) -> tuple[int | None, str]:
    """The most requests one unit of `provider` may hold, or None and why it cannot be known."""
    try:
        return capabilities(provider).max_requests, ""
    except ImportError:
        return None, f"BatchDesk has no adapter for {provider} in this version yet."


class ProviderField(forms.ChoiceField):
    """The providers configured here (their credentials are in the environment). A known provider
    that is not configured is refused with the environment variables it needs. The environment is
    read each time a form is made (`refresh`), since keys may be set without a release."""

    def refresh(self) -> None:
        self.choices = [(name, name) for name in configured_provider_names()]

    def validate(self, value) -> None:
        if value in provider_names() and not self.valid_value(value):
            needed = settings.PROVIDERS[value]["required_env"]
            raise forms.ValidationError(
                f"The provider {value} is not configured here: set {' and '.join(needed)}.",
                code="not_configured",
            )
        super().validate(value)


class JobForm(forms.Form):
    reference = forms.CharField(max_length=200)
    task = forms.CharField(max_length=64)
    # The version number within the task; empty means the task's current version.
    prompt_version = forms.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    provider = ProviderField()
    # Empty: the provider's default model, and the usual unit size within its limit.
    model = forms.CharField(max_length=128, required=False, help_text="Empty: the provider's default model.")
    destination = forms.ChoiceField(initial=DEFAULT_DESTINATION)
    # At most the chosen provider's limit (checked in `clean`): no one number fits every provider.
    unit_size = forms.IntegerField(
        required=False,
        min_value=1,
        label="Unit size",
        help_text="Requests per provider batch.",
    )

    budget = BudgetField(
        required=False,
        help_text="Spend never passes it: the job pauses first (empty: no budget).",
    )
    notify_url = forms.CharField(
        required=False,
        max_length=MAX_URL_LENGTH,
        label="Notify URL",
        help_text="Optional: the job's events are posted to this address, signed as Standard Webhooks do.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["budget"].label = f"Budget ({business_currency()})"
        self.fields["budget"].currency = business_currency()
        self.fields["provider"].refresh()
        limits = [(name, provider_limit(name)[0]) for name, _ in self.fields["provider"].choices]
        if limits := [(name, limit) for name, limit in limits if limit is not None]:
            shown = ", ".join(f"{name} {limit:,}" for name, limit in limits)
            self.fields["unit_size"].help_text = f"Requests per provider batch; at most {shown}."
            # The browser's own check lets the largest through; `clean` holds each provider to its own.
            self.fields["unit_size"].widget.attrs["max"] = max(limit for _, limit in limits)
        self.fields["destination"].choices = [(name, name) for name in destination_names()]
        self.prompt: PromptVersion | None = None

    def clean_notify_url(self) -> str:
        url = self.cleaned_data.get("notify_url") or ""
        if url and (problem := notify_url_problem(url)):
            raise forms.ValidationError(problem, code="notify_url")
        return url

    def find_prompt(self, task: str, version) -> PromptVersion | None:
        return PromptVersion.objects.for_job(task, version)

    def clean(self) -> dict:
        data = super().clean()
        if provider := data.get("provider"):
            limit, problem = provider_limit(provider)
            if problem:
                self.add_error("provider", problem)
            elif data.get("unit_size") and data["unit_size"] > limit:
                self.add_error("unit_size", f"At most {limit:,} requests: {provider}'s limit for one batch.")
            else:
                if "model" in data and not data["model"]:
                    data["model"] = default_model(provider)
                if "unit_size" in data and not data["unit_size"]:
                    data["unit_size"] = default_unit_size(provider)
        if provider and data.get("model") and (problem := model_name_problem(provider, data["model"])):
            self.add_error("model", problem)
        elif provider and data.get("model") and data.get("budget") is not None:
            if problem := budget_problem(data["budget"], provider, data["model"]):
                self.add_error("budget", problem + ".")
        task = data.get("task")
        if task:
            if not PromptVersion.objects.filter(task=task).exists():
                self.add_error("task", f"There is no prompt for the task “{task}”.")
            else:
                self.prompt = self.find_prompt(task, data.get("prompt_version"))
                if self.prompt is None and data.get("prompt_version"):
                    self.add_error("prompt_version", f"That prompt version is not one of the task {task}.")
                elif self.prompt is None:
                    self.add_error("prompt_version", no_prompt_for_job(task) + ".")
        return data

    def job_fields(self) -> dict:
        """What `create_job` is given, besides the owner and the products."""
        data = self.cleaned_data
        return {
            "reference": data["reference"],
            "task": data["task"],
            "provider": data["provider"],
            "model": data["model"],
            "prompt_version": self.prompt.version,
            "destination": data["destination"],
            "unit_size": data["unit_size"],
            "budget": data.get("budget"),
            "notify_url": data.get("notify_url") or "",
        }


class SkuListField(forms.Field):
    """A JSON list of SKUs: at least one, each valid; returned sorted without repeats."""

    def to_python(self, value):
        if value in (None, ""):
            return None
        if not isinstance(value, list) or not all(isinstance(sku, str) for sku in value):
            raise forms.ValidationError("must be a list of SKUs")
        if not value:
            raise forms.ValidationError("name at least one SKU, or leave skus out for every active product")
        if len(value) > MAX_NAMED_SKUS:
            raise forms.ValidationError(too_many_skus_message(len(value)))
        if bad := [sku for sku in value if not SKU_PATTERN.fullmatch(sku)]:
            raise forms.ValidationError("not valid SKUs: " + ", ".join(bad[:10]))
        return sorted(set(value))


class ApiJobForm(JobForm):
    """The body of `POST /api/jobs`, decoded from JSON. Omitted optional fields take their defaults."""

    skus = SkuListField(required=False)
    pilot = PilotObjectField(required=False)

    # JSON types each field must arrive as; "1" is not a version number, true is not a size.
    JSON_TYPES = {"prompt_version": int, "unit_size": int, "skus": list, "pilot": dict}
    # An amount may arrive as text ("12.50", as SPEC §6 writes it) or as a JSON number.
    AMOUNTS = ("budget",)
    WRONG_TYPE = {
        int: "must be a whole number",
        list: "must be a list of SKUs",
        dict: "must be an object: {per_stratum, strata, seed, drill}",
    }

    DEFAULTS = {"destination": DEFAULT_DESTINATION}

    def __init__(self, data: dict, **kwargs):
        given = {name: value for name, value in data.items() if value is not None}
        super().__init__(data={**self.DEFAULTS, **given}, **kwargs)
        self.pilot_form: ApiPilotForm | None = None
        self.pilot_asked: dict | object = UNREADABLE
        self.wrong_types = {
            name: self.WRONG_TYPE[kind]
            for name, kind in self.JSON_TYPES.items()
            if name in given and (isinstance(given[name], bool) or not isinstance(given[name], kind))
        }
        self.wrong_types.update(
            (name, "must be text")
            for name, field in self.fields.items()
            if name in given
            and name not in self.JSON_TYPES
            and name not in self.AMOUNTS
            and not isinstance(given[name], str)
        )
        self.wrong_types.update(
            (name, 'must be an amount such as "12.50"')
            for name in self.AMOUNTS
            if name in given
            and (isinstance(given[name], bool) or not isinstance(given[name], str | int | float))
        )
        if given.get("model") == "":
            self.wrong_types.setdefault("model", "must not be empty; leave it out for the provider's default")

    def full_clean(self) -> None:
        super().full_clean()
        for name, message in self.wrong_types.items():
            self.cleaned_data.pop(name, None)
            self._errors[name] = self.error_class([message])

    def clean(self) -> dict:
        data = super().clean()
        # Unknown SKUs are bad input; a withdrawn product is refused by `create_job` (409).
        if skus := data.get("skus"):
            found = set(Product.objects.filter(sku__in=skus).values_list("sku", flat=True))
            if missing := [sku for sku in skus if sku not in found]:
                self.add_error("skus", "unknown SKUs: " + ", ".join(missing[:SHOWN_SKUS]))
        if (pilot := data.get("pilot")) is not None:
            self.pilot_form = ApiPilotForm(pilot)
            if self.pilot_form.is_valid():
                self.pilot_asked = self.pilot_form.asked()
                if not self.errors:
                    scope = active_products()
                    self.pilot_form.check_scope(scope.filter(among("sku", skus)) if skus else scope)
                    self.check_arms(data)
            if self.pilot_form.errors:
                self.add_error("pilot", "see the pilot's fields")
        return data

    def check_arms(self, data: dict) -> None:
        """Each other arm of a pilot as a job of its own would be checked: its provider configured
        here, its model a name the provider takes, its prompt version one of the task's."""
        for number, arm in enumerate(self.pilot_form.cleaned_data.get("arms") or [], start=2):
            provider = arm.provider or data["provider"]
            if arm.provider is not None and arm.provider not in configured_provider_names():
                self.pilot_form.add_error(
                    "arms", f"arm {number}: {arm.provider} is not a provider configured here"
                )
                continue
            model = arm.model or (default_model(provider) if arm.provider else data["model"])
            if problem := model_name_problem(provider, model):
                self.pilot_form.add_error("arms", f"arm {number}: {problem}")
            if arm.prompt_version is not None and self.find_prompt(data["task"], arm.prompt_version) is None:
                self.pilot_form.add_error("arms", f"arm {number}: that prompt version is not one of the task")
            if (provider, model, arm.prompt_version or self.prompt.version) == (
                data["provider"],
                data["model"],
                self.prompt.version,
            ):
                self.pilot_form.add_error(
                    "arms", f"arm {number}: changes nothing from the job's own settings"
                )

    @property
    def arms(self) -> list:
        return (self.pilot_form.cleaned_data.get("arms") or []) if self.pilot_form else []

    def job_fields(self) -> dict:
        return {**super().job_fields(), "pilot": self.pilot_form.plan if self.pilot_form else None}

    def wanted(self) -> dict:
        """What the request asks for, as this form read it (defaults filled in, text stripped);
        a field it could not read is UNREADABLE, which differs from anything a job holds."""
        wanted = {name: self.cleaned_data.get(name, UNREADABLE) for name in self.fields}
        if self.pilot_form is not None:
            wanted["pilot"] = self.pilot_asked
        return wanted

    def problems(self) -> dict[str, str]:
        """Each bad field's words; a pilot's own fields are named `pilot.<field>`."""
        problems = {name: " ".join(errors) for name, errors in self.errors.items()}
        if self.pilot_form is not None and self.pilot_form.errors:
            problems.pop("pilot", None)
            problems.update(
                (f"pilot.{name}", " ".join(errors)) for name, errors in self.pilot_form.errors.items()
            )
        return problems


class StartTokenForm(forms.Form):
    """The start screen's one-time token (`review.models.JobStartToken`): a new one with each new start
    form, carried through the estimate step, so that the form sent again shows the job it started."""

    start_token = forms.UUIDField(widget=forms.HiddenInput, initial=uuid.uuid4)

    def token(self) -> uuid.UUID | None:
        """The token the form was sent with, or None when it came without a valid one."""
        return self.cleaned_data["start_token"] if self.is_valid() else None
