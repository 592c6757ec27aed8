"""Reviewers' own queues (SPEC §8): a catalogue owner assigns a job, a category or any product field's
value to named reviewers, and each reviewer's desk opens on the drafts assigned to them ("my queue")
before every other draft. An assignment narrows where a reviewer starts, never what they may decide."""

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from .common import form_errors, refused_page
from .forms import JobReferenceField
from .ids import IdField
from .models import ReviewAssignment
from .permissions import ADMIN, APPROVERS, CATALOGUE_OWNER, VIEWERS, has_role, role_required

# A product field's name as the catalogue allows it (SPEC §7 keys are free, but an assignment names
# one a person can type): letters, digits, `_`, `-` and `.`.
# Never two underscores in a row: the ORM would read them as a lookup.
FIELD_NAME = r"^(?!.*__)[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


def assigned_to(user) -> Q | None:
    """Which items are assigned to the person: any of their assignments matches (a job's, a field's
    value, or both together). None when they have none. A field's value matches as text, whatever
    its case (5 and "5" alike); the field's name is a parameter of the JSON lookup, never SQL."""
    matches = None
    for assignment in ReviewAssignment.objects.filter(reviewer=user):
        match = Q()
        if assignment.job_id:
            match &= Q(job_id=assignment.job_id)
        if assignment.field:
            match &= Q(**{f"source_revision__fields__{assignment.field}__iexact": assignment.value})
        matches = match if matches is None else matches | match
    return matches


def reviewers():
    return (
        get_user_model()
        .objects.filter(is_active=True)
        .filter(Q(groups__name__in=[CATALOGUE_OWNER, ADMIN]) | Q(is_superuser=True))
        .distinct()
        .order_by("username")
    )


class AssignmentForm(forms.Form):
    reviewer = forms.ModelChoiceField(queryset=get_user_model().objects.none(), to_field_name="username")
    job = JobReferenceField()
    field = forms.RegexField(
        regex=FIELD_NAME,
        required=False,
        max_length=64,
        label="Product field",
        error_messages={"invalid": "A field name is letters, digits, “-”, “.” and single “_”."},
    )
    value = forms.CharField(required=False, max_length=200, label="Its value")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reviewer"].queryset = reviewers()

    def clean(self) -> dict:
        cleaned = super().clean()
        field, value = cleaned.get("field") or "", (cleaned.get("value") or "").strip()
        cleaned["value"] = value
        if field and not value:
            self.add_error("value", "Say which value of the field is assigned.")
        if value and not field:
            self.add_error("field", "Say which product field the value is of (e.g. category).")
        if not self.errors and not cleaned.get("job") and not field:
            raise forms.ValidationError("Assign a job, a product field's value, or both.")
        return cleaned


class RemoveForm(forms.Form):
    assignment = IdField()


@require_http_methods(["GET", "POST"])
@login_required
@role_required(*VIEWERS)
def assignments(request: HttpRequest) -> HttpResponse:
    """Who reviews what. Catalogue owners and admins assign; everyone sees."""
    form = AssignmentForm(request.POST or None, initial={"field": "category"})
    if request.method == "POST":
        if not has_role(request.user, *APPROVERS):
            raise PermissionDenied("Only catalogue owners assign drafts to reviewers.")
        if not form.is_valid():
            return render(request, "review_assignments.html", context_of(request, form), status=400)
        data = form.cleaned_data
        assignment, created = ReviewAssignment.objects.get_or_create(
            reviewer=data["reviewer"],
            job=data["job"],
            field=data["field"] or "",
            value=data["value"] if data["field"] else "",
            defaults={"assigned_by": request.user},
        )
        words = assignment.words()
        if created:
            messages.success(request, f"{data['reviewer'].get_username()} now reviews {words}.")
        else:
            messages.info(request, f"{data['reviewer'].get_username()} already reviews {words}.")
        return redirect("review_assignments")
    return render(request, "review_assignments.html", context_of(request, form))


def context_of(request: HttpRequest, form: AssignmentForm) -> dict:
    return {
        "form": form,
        "perms_decide": has_role(request.user, *APPROVERS),
        "assignments": ReviewAssignment.objects.select_related("reviewer", "job", "assigned_by"),
    }


@require_POST
@login_required
@role_required(*APPROVERS)
def remove_assignment(request: HttpRequest) -> HttpResponse:
    form = RemoveForm(request.POST)
    if not form.is_valid():
        return refused_page(request, form_errors(form), reverse("review_assignments"))
    removed, _ = ReviewAssignment.objects.filter(pk=form.cleaned_data["assignment"]).delete()
    if removed:
        messages.success(request, "The assignment was removed.")
    else:
        messages.info(request, "That assignment was removed already.")
    return redirect("review_assignments")
