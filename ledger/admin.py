"""The ledger in Django's admin, read-only: it is changed only through the ledger's verbs, which keep
states, events and invariants together. Admins (the `admin` group, or superusers) look here without
per-model permissions; exchange rates are the one thing they add (never change). People, roles and
the machine (django-q's schedules and tasks) are `review/admin.py`."""

from django import forms
from django.contrib import admin
from django.db.models.functions import Length

from .models import (
    ApiToken,
    Approval,
    ArmPreference,
    CatalogueImport,
    CatalogueImportChunk,
    CollectorHeartbeat,
    Comment,
    CurrentPromptChoice,
    DestinationAttempt,
    DraftTally,
    DrillStep,
    Event,
    ExchangeRate,
    GeneratedVersion,
    Item,
    ItemTally,
    Job,
    JobNotification,
    NotificationAttempt,
    Pilot,
    PilotDecision,
    PilotProduct,
    PilotStratum,
    Product,
    PromptVersion,
    ProviderHint,
    Publication,
    ReviewClaim,
    SourceRevision,
    Submission,
    SubmissionItem,
    UnitCharge,
)
from .money.currency import business_currency, per_usd_problem, rate_date_problem
from .roles import ADMIN, has_role


class LedgerAdmin(admin.ModelAdmin):
    """Look, never touch. Admins (the group, or superusers) may look without per-model permissions."""

    # Counting a large table twice per page is the slowest part of a changelist.
    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return has_role(request.user, ADMIN) or super().has_view_permission(request, obj)

    def has_module_permission(self, request) -> bool:
        return has_role(request.user, ADMIN) or super().has_module_permission(request)


@admin.register(Product)
class ProductAdmin(LedgerAdmin):
    list_display = ("sku", "status", "current_revision", "published_revision", "published_at", "updated_at")
    list_filter = ("status",)
    list_select_related = ("current_revision__product",)
    search_fields = ("sku",)


@admin.register(SourceRevision)
class SourceRevisionAdmin(LedgerAdmin):
    list_display = ("product", "number", "title", "short_hash", "created_at")
    list_select_related = ("product",)
    search_fields = ("product__sku", "title")

    @admin.display(description="content hash")
    def short_hash(self, revision: SourceRevision) -> str:
        return revision.content_hash[:12]


@admin.register(PromptVersion)
class PromptVersionAdmin(LedgerAdmin):
    list_display = ("task", "version", "max_output_tokens", "created_at")
    list_filter = ("task",)


@admin.register(CurrentPromptChoice)
class CurrentPromptChoiceAdmin(LedgerAdmin):
    list_display = ("task", "prompt_version", "replaced", "actor_name", "made_at")
    list_filter = ("task",)
    list_select_related = ("prompt_version", "replaced")


@admin.register(Job)
class JobAdmin(LedgerAdmin):
    list_display = ("reference", "state", "owner", "provider", "model", "destination", "created_at")
    list_filter = ("state", "provider", "destination")
    list_select_related = ("owner",)
    search_fields = ("reference",)
    date_hierarchy = "created_at"


@admin.register(Item)
class ItemAdmin(LedgerAdmin):
    list_display = (
        "id",
        "job",
        "sku",
        "revision",
        "state",
        "short_reason",
        "inference_attempt",
        "updated_at",
    )
    list_filter = ("state",)
    list_select_related = ("job", "product", "source_revision")
    search_fields = ("product__sku", "job__reference")

    @admin.display(description="SKU", ordering="product__sku")
    def sku(self, item: Item) -> str:
        return item.product.sku

    @admin.display(description="revision")
    def revision(self, item: Item) -> int:
        return item.source_revision.number

    @admin.display(description="reason")
    def short_reason(self, item: Item) -> str:
        return item.reason if len(item.reason) <= 80 else item.reason[:79] + "…"


@admin.register(Submission)
class SubmissionAdmin(LedgerAdmin):
    list_display = (
        "id",
        "job",
        "provider",
        "provider_ref",
        "state",
        "last_observed_at",
        "last_observed_status",
        "anomaly_count",
    )
    list_filter = ("state", "provider")
    list_select_related = ("job",)
    search_fields = ("provider_ref", "intent_key", "job__reference")

    @admin.display(description="anomalies")
    def anomaly_count(self, submission: Submission) -> int:
        return len(submission.anomalies)


@admin.register(SubmissionItem)
class SubmissionItemAdmin(LedgerAdmin):
    list_display = ("custom_id", "submission", "item", "outcome")
    list_filter = ("outcome",)
    list_select_related = ("submission", "item")
    search_fields = ("custom_id",)


@admin.register(GeneratedVersion)
class GeneratedVersionAdmin(LedgerAdmin):
    list_display = (
        "id",
        "item",
        "number",
        "valid",
        "short_hash",
        "input_tokens",
        "output_tokens",
        "created_at",
    )
    list_filter = ("valid",)
    list_select_related = ("item",)
    search_fields = ("custom_id", "item__product__sku")

    @admin.display(description="content hash")
    def short_hash(self, version: GeneratedVersion) -> str:
        return version.content_hash[:12]


@admin.register(Approval)
class ApprovalAdmin(LedgerAdmin):
    list_display = ("id", "item", "version", "approved_by", "approved_at", "edited", "undone_at")
    list_filter = ("edited",)
    list_select_related = ("item", "version", "approved_by")
    search_fields = ("item__product__sku", "approved_by__username")
    date_hierarchy = "approved_at"


@admin.register(Comment)
class CommentAdmin(LedgerAdmin):
    list_display = ("id", "item", "version", "author", "at")
    list_select_related = ("item", "author")
    search_fields = ("item__product__sku", "author__username")
    date_hierarchy = "at"


@admin.register(ReviewClaim)
class ReviewClaimAdmin(LedgerAdmin):
    list_display = ("item", "reviewer", "until")
    list_select_related = ("item", "reviewer")


@admin.register(DestinationAttempt)
class DestinationAttemptAdmin(LedgerAdmin):
    list_display = ("id", "item", "destination", "outcome", "operation_key", "started_at", "finished_at")
    list_filter = ("outcome", "destination")
    list_select_related = ("item",)
    search_fields = ("operation_key", "item__product__sku")


@admin.register(Publication)
class PublicationAdmin(LedgerAdmin):
    list_display = ("id", "product", "version", "operation_key", "published_at")
    list_select_related = ("product", "version")
    search_fields = ("product__sku", "operation_key")


@admin.register(ItemTally)
class ItemTallyAdmin(LedgerAdmin):
    """The differences the database's triggers append, per job and state (summed on the screens)."""

    list_display = ("id", "job", "state", "items", "pending_input", "approved_drafts", "all_input")
    list_filter = ("state",)
    list_select_related = ("job",)


@admin.register(DraftTally)
class DraftTallyAdmin(LedgerAdmin):
    """The drafts' tokens the database's triggers append, per job and quarter hour (the day's spend)."""

    list_display = ("id", "job", "received", "input_tokens", "output_tokens")
    list_select_related = ("job",)


@admin.register(Event)
class EventAdmin(LedgerAdmin):
    list_display = ("id", "at", "item", "submission", "job", "from_state", "to_state", "actor_name", "reason")
    list_filter = ("to_state",)
    list_select_related = ("item", "submission", "job")
    search_fields = ("actor_name",)


@admin.register(CollectorHeartbeat)
class CollectorHeartbeatAdmin(LedgerAdmin):
    list_display = ("name", "last_poll_at", "lease_until", "lease_holder")


@admin.register(CatalogueImport)
class CatalogueImportAdmin(LedgerAdmin):
    list_display = (
        "id",
        "file_name",
        "state",
        "imported",
        "uploaded_by",
        "size",
        "error_count",
        "created_at",
    )
    list_filter = ("state",)
    list_select_related = ("uploaded_by",)
    search_fields = ("file_name",)


@admin.register(CatalogueImportChunk)
class CatalogueImportChunkAdmin(LedgerAdmin):
    """A piece of an upload waiting for its worker: how big, never the bytes (a megabyte each)."""

    list_display = ("id", "catalogue_import", "number", "byte_count")
    exclude = ("data",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("data").annotate(byte_count=Length("data"))

    @admin.display(description="bytes")
    def byte_count(self, chunk: CatalogueImportChunk) -> int:
        return chunk.byte_count


@admin.register(Pilot)
class PilotAdmin(LedgerAdmin):
    """A pilot's settings; its report is at /jobs/{id}/pilot."""

    list_display = ("id", "job", "per_stratum", "strata", "seed", "drawn_at")
    list_select_related = ("job",)
    search_fields = ("job__reference",)


@admin.register(PilotStratum)
class PilotStratumAdmin(LedgerAdmin):
    list_display = ("id", "pilot", "number", "values", "scope_products", "sample_products")
    list_select_related = ("pilot__job",)


@admin.register(PilotProduct)
class PilotProductAdmin(LedgerAdmin):
    list_display = ("id", "pilot", "stratum", "product")
    list_select_related = ("pilot__job", "product")


@admin.register(DrillStep)
class DrillStepAdmin(LedgerAdmin):
    """A pilot's acceptance drill, step by step; its checks are on the pilot's report."""

    list_display = ("id", "pilot", "kind", "submission", "item", "taken_at", "done_at")
    list_select_related = ("pilot__job", "submission", "item")


@admin.register(PilotDecision)
class PilotDecisionAdmin(LedgerAdmin):
    """Who decided go or no-go on a pilot, when, with which figures, and the full job go started."""

    list_display = ("id", "pilot", "decision", "by", "at", "full_job", "accuracy_at")
    list_select_related = ("pilot__job", "by", "full_job")
    search_fields = ("pilot__job__reference",)


@admin.register(ArmPreference)
class ArmPreferenceAdmin(LedgerAdmin):
    """Who compared which two arms' drafts of a product, blind, and what they preferred; counted on the
    pilot's report."""

    list_display = ("id", "pilot", "product", "arm_a", "arm_b", "reviewer", "preference", "decided_at")
    list_select_related = ("pilot__job", "product", "reviewer")


@admin.register(ApiToken)
class ApiTokenAdmin(LedgerAdmin):
    """The one ledger row an admin may delete: a token is a key, not evidence, and deleting it locks its
    holder out at once (`manage.py revoke_api_token` keeps the row and records when)."""

    list_display = ("prefix", "user", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_select_related = ("user",)
    # Only a hash is stored, but it has no use to anyone reading this page.
    exclude = ("token_hash",)

    def has_delete_permission(self, request, obj=None) -> bool:
        return has_role(request.user, ADMIN) or request.user.has_perm("ledger.delete_apitoken")


@admin.register(UnitCharge)
class UnitChargeAdmin(LedgerAdmin):
    list_display = (
        "submission",
        "job",
        "requests",
        "reserved",
        "cost",
        "currency",
        "rate",
        "rate_date",
        "settled_at",
    )
    list_select_related = ("job", "submission")


@admin.register(JobNotification)
class JobNotificationAdmin(LedgerAdmin):
    """A job's events to tell (`ledger.notices.notifications`); the job page lists them with their attempts."""

    list_display = ("id", "job", "event_type", "channel", "attempts", "delivered_at", "gave_up_at")
    list_select_related = ("job",)
    exclude = ("body",)


@admin.register(NotificationAttempt)
class NotificationAttemptAdmin(LedgerAdmin):
    list_display = ("id", "notification", "at", "delivered", "status", "error")
    list_select_related = ("notification__job",)


@admin.register(ProviderHint)
class ProviderHintAdmin(LedgerAdmin):
    """The providers' batch webhooks received (`/hooks/<provider>`), once per webhook-id, and what
    each led to: for an operator asking why a unit was polled early, or why it was not."""

    list_display = ("id", "provider", "event_type", "batch_ref", "outcome", "submission", "received_at")
    list_filter = ("provider", "outcome")


class ExchangeRateForm(forms.ModelForm):
    """An admin's rate, held to the rate file's rule (`ledger.money.currency`)."""

    class Meta:
        model = ExchangeRate
        fields = ("currency", "valid_from", "per_usd", "source")

    def clean_per_usd(self):
        per_usd = self.cleaned_data["per_usd"]
        if problem := per_usd_problem(per_usd):
            raise forms.ValidationError(
                f"The rate {problem} (what one US dollar is worth in the currency), not {per_usd}.",
                code="per_usd",
            )
        return per_usd

    def clean_valid_from(self):
        valid_from = self.cleaned_data["valid_from"]
        if problem := rate_date_problem(valid_from):
            raise forms.ValidationError(f"{valid_from.isoformat()} {problem}.", code="valid_from")
        return valid_from


@admin.register(ExchangeRate)
class ExchangeRateAdmin(admin.ModelAdmin):
    """Rates an admin enters beside BATCHDESK_FX_FILE (SPEC §9): added, never changed or deleted, as a
    rate is evidence of how costs were converted (each cost keeps its own copy as well). A wrong rate
    is corrected by entering the right one for the same date and currency: the last entered is in
    force from then on, and the list shows both, the first marked as corrected."""

    form = ExchangeRateForm
    list_display = ("valid_from", "currency", "per_usd", "in_force", "source", "entered_by", "created_at")
    list_select_related = ("entered_by",)
    ordering = ("-valid_from", "currency", "-pk")
    fieldsets = (
        (
            None,
            {
                "fields": ("currency", "valid_from", "per_usd", "source"),
                "description": (
                    "A rate above 0 and below 1,000,000, dated from 2000-01-01 to today. To correct a rate, "
                    "enter the right one for the same date and currency: it is used from then on, the one "
                    "it corrects is kept, and costs already settled keep the rate they were settled at."
                ),
            },
        ),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).with_corrections()

    @admin.display(description="in force")
    def in_force(self, rate: ExchangeRate) -> str:
        if rate.corrected_by is None:
            return "yes"
        return f"no: corrected by entry {rate.corrected_by}"

    def get_changeform_initial_data(self, request) -> dict:
        return {"currency": business_currency()}

    def save_model(self, request, obj, form, change) -> None:
        obj.entered_by = request.user
        super().save_model(request, obj, form, change)

    def has_module_permission(self, request) -> bool:
        return has_role(request.user, ADMIN) or super().has_module_permission(request)

    def has_view_permission(self, request, obj=None) -> bool:
        return has_role(request.user, ADMIN) or super().has_view_permission(request, obj)

    def has_add_permission(self, request) -> bool:
        return has_role(request.user, ADMIN)

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
