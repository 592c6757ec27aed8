"""A pilot's settings (SPEC §6 `POST /api/jobs` with `pilot`; the start screen's pilot option): one
set of checks for both. `PilotForm` reads them; `check_scope` judges them against the products the
job would work on (a field no product there has, too many strata or products) and draws the strata
the estimate shows. `create_job` checks again in its transaction: a form is here for clear,
per-field messages."""

import re
import secrets

from django import forms
from django.db.models import QuerySet

from ledger.actions.jobs import MAX_ARMS, Arm
from ledger.models import MAX_DECISION_NOTE_LENGTH, Pilot, PilotVerdict, Product
from ledger.pilots.sample import (
    MAX_PER_STRATUM,
    MAX_STRATA_FIELDS,
    SOURCE_LENGTH,
    PilotPlan,
    Stratum,
    default_strata,
    sample_problem,
    strata_of,
    unknown_fields,
)

from .forms import BudgetField

# A seed is stored as a PostgreSQL bigint.
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1
# A product field's name is any text; one this long is no field.
MAX_FIELD_NAME = 200


def new_seed() -> int:
    return secrets.randbelow(1_000_000)


class StrataField(forms.Field):
    """Product field names: a JSON list (the API) or names separated by commas (the screen). None
    when not given (the default strata); an empty list: the whole scope is one stratum."""

    def to_python(self, value) -> tuple[str, ...] | None:
        if value is None or value == "":
            return None
        if isinstance(value, str):
            value = [name for name in re.split(r"[,\n]", value) if name.strip()]
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise forms.ValidationError("must be a list of product field names")
        names = tuple(name.strip() for name in value)
        if not all(names):
            raise forms.ValidationError("a field name is empty")
        if any(len(name) > MAX_FIELD_NAME for name in names):
            raise forms.ValidationError(f"a field name is at most {MAX_FIELD_NAME} characters")
        if len(set(names)) < len(names):
            raise forms.ValidationError("a field is named twice")
        if len(names) > MAX_STRATA_FIELDS:
            raise forms.ValidationError(f"at most {MAX_STRATA_FIELDS} fields")
        return names


class PilotForm(forms.Form):
    per_stratum = forms.IntegerField(
        min_value=1,
        max_value=MAX_PER_STRATUM,
        initial=10,
        label="Products per stratum",
        help_text="A stratum with fewer products gives all of them.",
    )
    strata = StrataField(
        required=False,
        label="Strata",
        help_text=f"Product fields, separated by commas; {SOURCE_LENGTH} is the length band of the source "
        "text (shortest third, middle, longest). Empty: category (where products have one) and "
        f"{SOURCE_LENGTH}.",
    )
    seed = forms.IntegerField(
        required=False,
        min_value=MIN_SEED,
        max_value=MAX_SEED,
        help_text="The same seed draws the same sample from the same products.",
    )
    # SPEC §6: the acceptance drill, in the pilot's own run (`ledger.pilots.drill`).
    drill = forms.BooleanField(
        required=False,
        label="Acceptance drill",
        help_text="During the pilot's own run: interrupt a collection mid-chunk, deliver a unit's results "
        "twice, and lose the answer to a first destination call; the report shows what held.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.strata_drawn: list[Stratum] = []
        self.plan: PilotPlan | None = None

    def check_scope(self, scope: QuerySet[Product]) -> None:
        """Judge the valid settings against the scope; when they hold, `plan` is what `create_job`
        is given (a seed drawn now when none was given) and `strata_drawn` what it would draw (not
        `strata`: a template reads that name as the form's field)."""
        data = self.cleaned_data
        names = data["strata"] if data["strata"] is not None else default_strata(scope)
        if unknown := unknown_fields(names, scope):
            self.add_error(
                "strata", f"No product to work on has the field {', '.join(f'“{name}”' for name in unknown)}."
            )
            return
        plan = PilotPlan(
            per_stratum=data["per_stratum"],
            strata=names,
            seed=new_seed() if data["seed"] is None else data["seed"],
            drill=data["drill"],
            same_sample=bool(data.get("same_sample")),
        )
        self.strata_drawn = strata_of(plan, scope)
        if problem := sample_problem(self.strata_drawn):
            self.add_error("per_stratum", problem + ".")
            return
        self.plan = plan

    @property
    def scope_products(self) -> int:
        return sum(stratum.scope_products for stratum in self.strata_drawn)

    def asked(self) -> dict:
        """What was asked for, as a repeated request is compared with a pilot: a strata or seed left
        out is not compared (the default strata follow the catalogue; the seed was drawn)."""
        data = self.cleaned_data
        asked = {name: data[name] for name in ("per_stratum", "strata", "seed", "drill")}
        asked["arms"] = data.get("arms", [])
        asked["same_sample"] = bool(data.get("same_sample"))
        return asked


class ScreenPilotForm(PilotForm):
    """The start screen's: the seed is shown (a new one with each new form) and sent back, so the
    estimate and the start draw the same sample."""

    seed = forms.IntegerField(
        min_value=MIN_SEED,
        max_value=MAX_SEED,
        initial=new_seed,
        help_text="The same seed draws the same sample from the same products.",
    )


ARM_KEYS = ("provider", "model", "prompt_version")


class ArmsField(forms.Field):
    """`arms`: the pilot's other arms, each `{provider?, model?, prompt_version?}` changing at least one
    of the job's settings (SPEC §6 leaves their shape to us). Checked against what is configured by
    `ApiJobForm`, which knows the job's own settings."""

    def to_python(self, value) -> list[Arm]:
        if value in (None, []):
            return []
        if not isinstance(value, list) or not all(isinstance(arm, dict) for arm in value):
            raise forms.ValidationError("must be a list of objects: {provider?, model?, prompt_version?}")
        if len(value) >= MAX_ARMS:
            raise forms.ValidationError(f"at most {MAX_ARMS - 1} arms besides the job itself")
        arms = []
        for number, arm in enumerate(value, start=2):
            if unknown := sorted(set(arm) - set(ARM_KEYS)):
                raise forms.ValidationError(
                    f"arm {number}: {unknown[0]!r} is not one of {', '.join(ARM_KEYS)}"
                )
            if not arm:
                raise forms.ValidationError(f"arm {number}: name a provider, a model or a prompt version")
            for key in ("provider", "model"):
                if key in arm and not (
                    isinstance(arm[key], str) and arm[key].strip() and len(arm[key]) <= 128
                ):
                    raise forms.ValidationError(f"arm {number}: {key} must be text")
            version = arm.get("prompt_version")
            if "prompt_version" in arm and (
                isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**31
            ):
                raise forms.ValidationError(f"arm {number}: prompt_version must be a whole number")
            arms.append(Arm(arm.get("provider"), arm.get("model"), version))
        return arms


class ApiPilotForm(PilotForm):
    """`pilot` in the body of `POST /api/jobs`, decoded from JSON: each value of its JSON type ("5" is
    not a number of products, 1 is not true), and no other key."""

    JSON_TYPES = {"per_stratum": int, "seed": int, "drill": bool, "strata": list, "same_sample": bool}

    arms = ArmsField(required=False)
    # Every arm drafts the whole sample (the same products), so that their drafts can be compared blind.
    same_sample = forms.BooleanField(required=False)
    WRONG_TYPE = {
        int: "must be a whole number",
        bool: "must be true or false",
        list: "must be a list of product field names",
    }

    def __init__(self, data: dict, **kwargs):
        given = {name: value for name, value in data.items() if value is not None}
        super().__init__(data=given, **kwargs)
        self.wrong_types = {
            name: self.WRONG_TYPE[kind]
            for name, kind in self.JSON_TYPES.items()
            if name in given
            and (not isinstance(given[name], kind) or (kind is int and isinstance(given[name], bool)))
        }
        self.wrong_types.update((name, "not a known field") for name in given if name not in self.fields)

    def clean(self) -> dict:
        data = super().clean()
        if data.get("same_sample") and not data.get("arms"):
            self.add_error("same_sample", "only a pilot of several arms can give each arm the same sample")
        return data

    def full_clean(self) -> None:
        super().full_clean()
        for name, message in self.wrong_types.items():
            self.cleaned_data.pop(name, None)
            self._errors[name] = self.error_class([message])


class PilotObjectField(forms.Field):
    """The JSON object of a pilot's settings, checked by `ApiPilotForm`."""

    def to_python(self, value):
        if value in (None, ""):
            return None
        if not isinstance(value, dict):
            raise forms.ValidationError("must be an object: {per_stratum, strata, seed, drill}")
        return value


def same_pilot(pilot: Pilot | None, asked) -> bool:
    """Whether a job's pilot (None: the job is no pilot) is the one a repeated request asks for
    (`PilotForm.asked()`; None: no pilot). Strata or a seed the request left out are not compared."""
    if pilot is None or asked is None:
        return pilot is None and asked is None
    if not isinstance(asked, dict):  # a pilot the request's form could not read
        return False
    return (
        len(asked.get("arms", [])) + 1 == pilot.arms
        and asked.get("same_sample", False) == pilot.same_sample
        and asked["per_stratum"] == pilot.per_stratum
        and asked["drill"] == pilot.drill
        and (asked["strata"] is None or list(asked["strata"]) == pilot.strata)
        and (asked["seed"] is None or asked["seed"] == pilot.seed)
    )


class PilotDecisionForm(forms.Form):
    """Go or no-go on the pilot screen (SPEC §8): the same decision as `POST /api/jobs/{id}/pilot/decision`."""

    decision = forms.ChoiceField(
        choices=PilotVerdict.choices,
        widget=forms.RadioSelect,
        error_messages={"required": "Say go or no-go."},
    )
    note = forms.CharField(
        required=False, max_length=MAX_DECISION_NOTE_LENGTH, widget=forms.Textarea(attrs={"rows": 3})
    )
    budget = BudgetField(required=False)
