"""Credentials out of what others say to us (SPEC §4: keys and tokens are never stored or shown).

A provider or a destination may echo a request back in its error: the `Authorization` header, an
API key in a query string. Whatever of their words BatchDesk keeps (a submission's error, an
item's reason, a destination attempt's response) passes through `scrub_credentials` first.
"""

import re
from collections.abc import Iterable, Mapping

REDACTED = "[redacted]"

# `Bearer <token>` and `Basic <user:password in base64>`, wherever they appear.
SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+(?!\[redacted\])[A-Za-z0-9._~+/=-]+")
# `api_key: ...`, `"x-api-key": "..."`, `password=...`: a name that says "secret", then its value.
NAMED_CREDENTIAL = re.compile(
    r"""(?ix)
    \b(
        (?:proxy-)?authorization | x-api-key | x-goog-api-key | api[-_]?key | access[-_]?token
        | auth[-_]?token | refresh[-_]?token | client[-_]?secret | secret | password | token
    )
    (\\?["']?\s*[:=]\s*\\?["']?)
    (?!\[redacted\]|bearer\b|basic\b)
    [^\s"'\\,;&{}]+
    """
)
# `?key=...` in an address (Gemini takes its key that way).
QUERY_KEY = re.compile(r"(?i)([?&](?:key|api_key|apikey|token|access_token)=)[^&\s\"'#]+")
# Keys recognisable by their shape: OpenAI and Anthropic (`sk-...`), Google (`AIza...`).
KEY_SHAPES = re.compile(r"\b(?:sk-[A-Za-z0-9_-]{16,}|AIza[0-9A-Za-z_-]{30,})")


def scrub_credentials(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every credential replaced by "[redacted]": the `secrets` we sent (wherever they
    stand as a whole word) and anything shaped like a credential."""
    for secret in secrets:
        if secret:
            text = re.sub(rf"(?<![\w-]){re.escape(secret)}(?![\w-])", REDACTED, text)
    text = NAMED_CREDENTIAL.sub(rf"\1\2{REDACTED}", text)
    text = SCHEME_CREDENTIAL.sub(rf"\1 {REDACTED}", text)
    text = QUERY_KEY.sub(rf"\1{REDACTED}", text)
    return KEY_SHAPES.sub(REDACTED, text)


# Headers that carry a credential: the whole value, or what follows the scheme (`Bearer <token>`).
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "x-goog-api-key", "api-key")


def header_credentials(headers: Mapping[str, str]) -> list[str]:
    """The credentials a client sends with every request, as `scrub_credentials` wants them."""
    found = []
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name, "").strip()
        scheme, _, rest = value.partition(" ")
        found.append(rest.strip() if rest and scheme.lower() in ("bearer", "basic") else value)
    return [value for value in found if value]
