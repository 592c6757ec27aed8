"""What the screens themselves keep: each person's preferences, the job start form's one-time
tokens, and who a person is at the company's sign-in (the ledger's own records live in
ledger/models.py)."""

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.db import models

from ledger.models import Job

DEFAULT_TIME_ZONE = "UTC"


class Preferences(models.Model):
    """A person's own choices: the time zone every time on the screens is shown in, and whether the
    review desk's single-key shortcuts are on. A person without a row has the defaults."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="preferences"
    )
    time_zone = models.CharField(max_length=64, default=DEFAULT_TIME_ZONE)
    keyboard_shortcuts = models.BooleanField(default=True)

    class Meta:
        verbose_name_plural = "preferences"

    def __str__(self) -> str:
        return f"Preferences of {self.user}"

    @classmethod
    def of(cls, user) -> "Preferences":
        """The person's saved preferences, or the defaults (not saved) for one who has none yet."""
        if user is None or not user.is_authenticated:
            return cls()
        return cls.objects.filter(user=user).first() or cls(user=user)

    @property
    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            return ZoneInfo(DEFAULT_TIME_ZONE)


class JobStartToken(models.Model):
    """The one-time token a job start form carries (SPEC rule 15: a form sent twice acts once).

    The first send of the form writes its token and starts its job in one transaction; the token is
    unique, so a second send (a double click, Back then Start, a refresh) waits for the first to
    commit, cannot write it again and is shown the job already started. In the database, so every web
    process agrees. `job` is empty only inside that first transaction."""

    token = models.UUIDField(unique=True)
    person = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return str(self.token)


class ReviewAssignment(models.Model):
    """Drafts a catalogue owner gave a reviewer to decide: a job's, a category's, or those whose product
    has a field of a value (SPEC §8, "my queue"); any of them, the job and the field together. The
    reviewer's desk opens on their queue first; others may still decide these drafts."""

    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    # A product field of the item's source revision, and its value as text ("category", "Lighting").
    field = models.CharField(max_length=64, blank=True)
    value = models.CharField(max_length=200, blank=True)
    assigned_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    assigned_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["reviewer", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(job__isnull=False) | ~models.Q(field=""), name="assignment_names_something"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} ← {self.words()}"

    def words(self) -> str:
        parts = []
        if self.job_id:
            parts.append(f"job {self.job.reference}")
        if self.field:
            parts.append(f"{self.field} “{self.value}”")
        return ", ".join(parts)


class CompanyIdentity(models.Model):
    """The person a company sign-in names (SPEC §8, review/company_sign_in.py): the issuer's `sub`,
    which never changes, not the user name or address, which may. A person renamed in the directory
    signs in to the same account; a local account of the same name is never taken over."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="company_identity"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "company identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_account_per_company_identity")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
