"""The providers' batch webhooks (SPEC §6 `/hooks/openai`, `/hooks/gemini`) as hints: a correctly
signed event naming a batch makes that unit be polled now, instead of at its next poll. Polling
stays the fallback, and for a provider whose webhook secret is set it may be slower
(`BATCHDESK_HOOKED_POLL_SECONDS`, see `ledger.tasks.claim_due_submissions`).

The body is trusted for nothing but the batch's id, and that only to find one of our units of
that provider: the unit's state comes from the poll, as it always does.
- OpenAI (reference/providers.md §8.4): `{"id": "evt_…", "object": "event", "created_at": …,
  "type": "batch.completed", "data": {"id": "batch_…"}}`.
- Gemini: its events (`batch.succeeded`, `batch.failed`, `batch.expired`, `batch.cancelled`) carry
  the batch in `data`; its resource name `batches/…` (`data.name`, what `batches.get` takes and
  what we keep as the unit's reference), or its bare id (`data.id`), which is read as `batches/<id>`.
"""

import os
from datetime import datetime, timedelta
from typing import Any

from django.core import checks
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_q.tasks import async_task

from ..drafts.json_values import text_problem
from ..models import HintOutcome, ProviderHint, Submission
from ..states import SubmissionState
from .signed_webhooks import signer

# Each provider that sends batch webhooks, and the environment variable holding its signing secret
# (`whsec_<base64>`, as the provider shows it once when the endpoint is made). Unset: no hook.
SECRET_ENV = {"openai": "OPENAI_WEBHOOK_SECRET", "gemini": "GEMINI_WEBHOOK_SECRET"}
# A provider's event is a few hundred bytes; anything much larger is not one.
MAX_BODY_BYTES = 8 * 1024
# How long a webhook-id is kept to drop a repeat: providers deliver again for up to 72 hours (OpenAI;
# Gemini 24), and a repeat after that would only have the unit polled once more.
HINTS_KEPT = timedelta(days=7)
# The longest batch id and webhook-id kept (a provider's are a few dozen characters).
MAX_REF_LENGTH = 256


def secret(provider: str) -> str:
    """The provider's webhook signing secret, read from the environment only; "" when unset."""
    return os.environ.get(SECRET_ENV[provider], "").strip()


def hooked_providers() -> list[str]:
    """Providers whose webhooks this deployment receives: their units need polling less often."""
    return [provider for provider in SECRET_ENV if secret(provider)]


def check_webhook_secrets(app_configs=None, **kwargs) -> list[checks.Error]:
    """A secret that is set but cannot sign would refuse every webhook, silently: refused at startup
    (`check`, `runserver`, `migrate`, `qcluster`). The secret itself is never repeated."""
    errors = []
    for provider, name in SECRET_ENV.items():
        value = secret(provider)
        if not value:
            continue
        try:
            signer(value)
        except ValueError:
            errors.append(
                checks.Error(
                    f"{name} is not a webhook signing secret: it reads whsec_ followed by base64",
                    hint=f"Copy the secret {provider} showed when the webhook endpoint was made, or unset {name}.",
                    id="batchdesk.E006",
                )
            )
    return errors


def batch_ref(provider: str, event: Any) -> str:
    """The batch the event names, as our units keep it (`Submission.provider_ref`); "" when the body
    names none we could have sent."""
    data = event.get("data") if isinstance(event, dict) else None
    if not isinstance(data, dict):
        return ""
    ref = gemini_batch(data) if provider == "gemini" else data.get("id")
    # A NUL or a lone surrogate ("\u0000", "\ud800") is valid JSON but no text column can hold it:
    # such an id names none of our units.
    if not isinstance(ref, str) or text_problem(ref):
        return ""
    ref = ref.strip()
    return ref if 0 < len(ref) <= MAX_REF_LENGTH else ""


def gemini_batch(data: dict) -> Any:
    """Gemini names a batch by its resource name, `batches/…` (`data.name`); a bare id (`data.id`)
    is read as `batches/<id>`."""
    if "name" in data:
        return data["name"]
    bare = data.get("id")
    return f"batches/{bare.strip()}" if isinstance(bare, str) and bare.strip() else None


def event_type(event: Any) -> str:
    kind = event.get("type") if isinstance(event, dict) else None
    return kind[:64] if isinstance(kind, str) and not text_problem(kind[:64]) else ""


def take_hint(*, provider: str, webhook_id: str, event: Any) -> HintOutcome | None:
    """Record a correctly signed webhook once and act on it: the named open unit is claimed and its
    poll queued once this commits. None when this `webhook-id` was taken before (nothing changes).

    The claim is taken as a collector pass takes it (`Submission.objects.claim`): a unit a pass or
    a worker already holds is being polled or collected, and is left to it; should that poll have
    asked just before the batch ended, it asks again once it has let the unit go
    (`ledger.tasks.poll_submission`), and failing that (its cluster stopping) the next pass sees a
    hint newer than the unit's last observation and polls it (`claim_due_submissions`)."""
    ref = batch_ref(provider, event)
    with transaction.atomic():
        hint = ProviderHint(
            provider=provider, webhook_id=webhook_id, event_type=event_type(event), batch_ref=ref
        )
        unit = (
            Submission.objects.filter(provider=provider, provider_ref=ref).values_list("pk", "state").first()
            if ref
            else None
        )
        claim = None
        if not ref:
            hint.outcome = HintOutcome.UNREADABLE
        elif unit is None:
            hint.outcome = HintOutcome.UNKNOWN_UNIT
        else:
            hint.submission_id, state = unit
            if state != SubmissionState.OPEN:
                hint.outcome = HintOutcome.NOT_OPEN
            else:
                claim = Submission.objects.claim(hint.submission_id, states=[SubmissionState.OPEN])
                hint.outcome = HintOutcome.POLL_QUEUED if claim else HintOutcome.POLL_UNDER_WAY
        try:
            with transaction.atomic():
                hint.save()
        except IntegrityError:
            # The same webhook-id again (the unique constraint): a repeat, and the claim is undone.
            transaction.set_rollback(True)
            return None
        if claim:
            unit_id = hint.submission_id
            # Robust: a broker that refuses the task must not fail the answer. The claim then runs out
            # and the next pass polls the unit, its hint being newer than its last observation.
            transaction.on_commit(
                lambda: async_task("ledger.tasks.poll_submission", unit_id, claim), robust=True
            )
    return hint.outcome


def hinted_since(submission_id: int, moment: datetime) -> bool:
    """Whether a webhook about this unit came at or after `moment`."""
    return ProviderHint.objects.filter(submission_id=submission_id, received_at__gte=moment).exists()


def forget_old_hints(now: datetime | None = None) -> int:
    """Drop the webhooks received more than HINTS_KEPT ago (the daily retention pass): how many."""
    cutoff = (now or timezone.now()) - HINTS_KEPT
    return ProviderHint.objects.filter(received_at__lt=cutoff).delete()[0]
