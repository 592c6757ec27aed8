"""Webhook destinations (SPEC §6): POST the approved text to `BATCHDESK_WEBHOOK_<NAME>`.

Every attempt for one approved version carries the same `Idempotency-Key`, so a receiver that
honours it publishes once however often a timeout makes us ask again (SPEC §3 rule 7). This
class only delivers and classifies the answer; `actions.applying.apply_item` checks the guards before
each attempt, records it and moves the item.
"""

import json
from collections.abc import Iterable

import httpx
from django.conf import settings

from ..drafts.scrubbing import scrub_credentials
from ..models import AttemptOutcome
from ..retrying import is_transient_status, requested_wait
from .base import Destination, DestinationResult

# The receiver is told what to do with the text; BatchDesk only ever publishes approved drafts.
OPERATION = "publish"
MESSAGE_LIMIT = 500


def payload(*, item, version, approval) -> dict:
    """The request body: what was approved, for which product revision, by whom."""
    return {
        "sku": item.product.sku,
        "source_revision": item.source_revision.number,
        "generated_version": version.number,
        "generated_version_id": version.pk,
        "content": approval.final_content,
        "job_reference": item.job.reference,
        "approved_by": approval.approved_by.get_username(),
        "approved_at": approval.approved_at.isoformat(),
        "operation": OPERATION,
    }


def destination_message(response: httpx.Response, *, secrets: Iterable[str] = ()) -> str:
    """The receiver's own words: `error.message`, `message` or `detail` from JSON, else its text;
    scrubbed of credentials before it is cut short, when half a token would no longer be found."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        for said in (
            error.get("message") if isinstance(error, dict) else error,
            body.get("message"),
            body.get("detail"),
        ):
            if said:
                text = said if isinstance(said, str) else json.dumps(said, ensure_ascii=False)
                return scrub_credentials(text, secrets)[:MESSAGE_LIMIT]
    return scrub_credentials(response.text.strip(), secrets)[:MESSAGE_LIMIT] or response.reason_phrase


class WebhookDestination(Destination):
    def __init__(self, *, name: str, url: str, token: str = "", client: httpx.Client | None = None):
        self.name, self.url, self.token = name, url, token
        self.client = client

    def apply(self, *, item, version, approval, operation_key) -> DestinationResult:
        headers = {"Idempotency-Key": operation_key, "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = json.dumps(payload(item=item, version=version, approval=approval), ensure_ascii=False).encode()
        timeout = settings.BATCHDESK_WEBHOOK_TIMEOUT
        try:
            if self.client is not None:
                response = self.client.post(self.url, content=body, headers=headers, timeout=timeout)
            else:
                with httpx.Client() as client:
                    response = client.post(self.url, content=body, headers=headers, timeout=timeout)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            return self._result(AttemptOutcome.REJECTED, f"The address of {self.name} is not usable: {exc}")
        except httpx.TimeoutException:
            # It may have been applied already; the retry carries the same key, so it cannot apply twice.
            return self._result(
                AttemptOutcome.RETRYABLE,
                f"No answer from {self.name} within {timeout:g} s; will retry with the same key",
            )
        except httpx.TransportError as exc:
            return self._result(
                AttemptOutcome.RETRYABLE, f"Could not reach {self.name} ({type(exc).__name__}: {exc})"
            )
        status = response.status_code
        if 200 <= status < 300:
            return self._result(AttemptOutcome.APPLIED, f"Accepted by {self.name}: {status}")
        said = destination_message(response, secrets=[self.token])
        if is_transient_status(status):
            return self._result(
                AttemptOutcome.RETRYABLE,
                f"{status} from {self.name}: {said}",
                retry_after=requested_wait(response.headers),
            )
        # Any other answer (4xx, or a redirect we do not follow) is the destination's refusal.
        return self._result(AttemptOutcome.REJECTED, f"{status} from {self.name}: {said}")

    def _result(self, outcome: str, message: str, *, retry_after: float | None = None) -> DestinationResult:
        # A receiver may echo the Authorization header back; the token is never stored.
        return DestinationResult(outcome, scrub_credentials(message, [self.token]), retry_after=retry_after)
