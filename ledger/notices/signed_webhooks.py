"""Standard Webhooks signatures (https://www.standardwebhooks.com/): the ones BatchDesk puts on the
job events it sends (`notify_url`, SPEC §6) and the ones it checks on the providers' batch webhooks
(`/hooks/openai`, `/hooks/gemini`). The signing itself is the standard's own library; this module
only says how BatchDesk calls it."""

from datetime import datetime

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

# The standard's window: a signed call older or newer than this is refused (replays, skewed clocks).
TOLERANCE_SECONDS = 5 * 60


class BadSignature(Exception):
    """The call is not signed with our secret, lacks the headers, or is outside the window."""


def signer(secret: str) -> Webhook:
    """The signer of a `whsec_<base64>` secret (the prefix is optional). ValueError when the
    secret is empty or not base64: a setting to refuse at startup, never a request to fail."""
    try:
        return Webhook(secret)
    except Exception as error:
        raise ValueError("a webhook secret reads whsec_ followed by base64") from error


def signed_headers(secret: str, *, message_id: str, at: datetime, body: bytes) -> dict[str, str]:
    """The three headers a receiver checks: `webhook-signature` is `v1,<base64 HMAC-SHA256 of
    "id.timestamp.body">`, keyed by the base64 part of the secret."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signer(secret).sign(message_id, at, body),
    }


def check_signature(secret: str, body: bytes, headers) -> str:
    """The `webhook-id` of a call signed with `secret` over exactly these body bytes, within the
    window; BadSignature otherwise. `headers` is any mapping (Django's `request.headers` too)."""
    lowered = {str(name).lower(): str(value) for name, value in headers.items()}
    try:
        signer(secret).verify(body, lowered, json_parse=False)
    except (WebhookVerificationError, ValueError) as error:
        raise BadSignature(str(error)) from error
    return lowered["webhook-id"]
