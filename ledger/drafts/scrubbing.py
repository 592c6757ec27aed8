"""Credentials out of what others say to us (SPEC §4: keys and tokens are never stored or shown).

A provider or a destination may echo a request back in its error: the `Authorization` header, an
API key in a query string, in an error's code or type, URL-encoded (`key%3Dsk-…`) or JSON-escaped
(`sk\\u002d…`). Whatever of their words BatchDesk keeps (a submission's error, an item's reason, an
event, a destination attempt's response) or logs passes through `scrub_credentials` first: the
types those words arrive in scrub themselves (`ProviderError`, `UnitStatus`, `DestinationResult`),
result lines are scrubbed where collection makes them storable (`ledger.drafts.answers`), and log records
by `ScrubbingFilter`. Every key and token the deployment is configured with is looked for, in
every spelling, whichever provider or destination is speaking.
"""

import functools
import logging
import os
import re
from collections.abc import Iterable, Mapping

from django.conf import settings

REDACTED = "[redacted]"
# A configured secret shorter than this is looked for only as a whole word: a short test token
# would otherwise eat the letters of ordinary words.
SHORTEST_SECRET_ANYWHERE = 8

# `=` and `:` as they stand in a query string, a header, JSON, or URL-encoded.
EQUALS = r"(?:[:=]|%3[aAdD])"
# `Bearer <token>` and `Basic <user:password in base64>`, wherever they appear.
SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)(?!\[redacted\])[A-Za-z0-9._~+/=%-]+")
# `api_key: ...`, `"x-api-key": "..."`, `password=...`: a name that says "secret", then its value.
NAMED_CREDENTIAL = re.compile(
    rf"""(?ix)
    \b(
        (?:proxy-)?authorization | x-api-key | x-goog-api-key | api[-_]?key | access[-_]?token
        | auth[-_]?token | refresh[-_]?token | client[-_]?secret | secret | password | token
    )
    (\\?["']?\s*{EQUALS}\s*\\?["']?)
    (?!\[redacted\]|bearer\b|basic\b)
    [^\s"'\\,;&{{}}]+
    """
)
# `?key=...` in an address (Gemini takes its key that way), also URL-encoded (`%3Fkey%3D...`).
QUERY_KEY = re.compile(
    rf"(?i)((?:[?&]|%3F|%26)(?:key|api_key|apikey|token|access_token){EQUALS})(?:(?!%26)[^&\s\"'#])+"
)
# Keys recognisable by their shape: OpenAI and Anthropic (`sk-...`), Google (`AIza...`), also after
# a URL-encoded `=` and with the dash JSON-escaped.
KEY_SHAPES = re.compile(
    r"(?:(?<![A-Za-z0-9])|(?<=%3[dD]))(?:sk(?:-|\\u002[dD])[A-Za-z0-9_-]{16,}|AIza[0-9A-Za-z_-]{30,})"
)


def scrub_credentials(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every credential replaced by "[redacted]": the `secrets` given, every key and
    token configured (`configured_secrets`), each however it is spelt, and anything shaped like a
    credential. What others say is kept, so it also comes back fit to keep (`fit_to_keep`)."""
    pattern = secrets_pattern(tuple(sorted({*secrets, *configured_secrets()})))
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    text = NAMED_CREDENTIAL.sub(rf"\1\2{REDACTED}", text)
    text = SCHEME_CREDENTIAL.sub(rf"\1\2{REDACTED}", text)
    text = QUERY_KEY.sub(rf"\1{REDACTED}", text)
    return fit_to_keep(KEY_SHAPES.sub(REDACTED, text))


def fits_text(text: str) -> bool:
    """Whether a text column can hold `text` as it is: no NUL, no lone surrogate (no UTF-8)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def fit_to_keep(text: str) -> str:
    """`text` with each NUL and each lone surrogate replaced (U+FFFD, "?"), as a column can hold it."""
    if fits_text(text):
        return text
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode()


# How much of what others say (an exception, a provider's or a destination's words) a stored text
# keeps: enough to tell what went wrong, bounded so a page of HTML does not fill the ledger.
STORED_TEXT_CHARS = 2000
# A destination's answer is kept longer: its words are what an operator reads to fix the draft.
ATTEMPT_RESPONSE_CHARS = 4000


def stored_text(text: str, *, limit: int = STORED_TEXT_CHARS) -> str:
    """The start of `text` that the ledger keeps: its first `limit` characters."""
    return text[:limit]


def configured_secrets() -> list[str]:
    """Every key and token this deployment sends to a provider, a destination or the company sign-in, read from the
    environment variables the settings name (SPEC §4): any of them may come back in any answer."""
    names = [config["api_key_env"] for config in settings.PROVIDERS.values() if config.get("api_key_env")]
    names += [
        name for name in os.environ if name.startswith("BATCHDESK_WEBHOOK_") and name.endswith("_TOKEN")
    ]
    # The company sign-in's client secret (review/company_sign_in.py).
    names.append("BATCHDESK_OIDC_CLIENT_SECRET")
    return [value for name in names if (value := os.environ.get(name, "").strip())]


def secret_spellings(secret: str) -> str:
    """A pattern for `secret` however an answer spells it: each character as itself, JSON-escaped
    (`\\u002d`, with any number of backslashes, `\\/`) or URL-encoded (`%2D`)."""
    parts = []
    for char in secret:
        code = ord(char)
        options = [re.escape(char)]
        if code < 0x10000:
            options.append(r"\\+u" + any_case(f"{code:04x}"))
        if code < 0x80:
            options.append("%" + any_case(f"{code:02x}"))
        if char == "/":
            options.append(r"\\+/")
        parts.append("(?:" + "|".join(options) + ")")
    return "".join(parts)


def any_case(digits: str) -> str:
    """Hexadecimal digits as a pattern that takes them in either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in digits)


@functools.lru_cache(maxsize=32)
def secrets_pattern(secrets: tuple[str, ...]) -> re.Pattern | None:
    """One pattern for all these secrets in all their spellings; a short one only as a whole word."""
    alternatives = []
    for secret in sorted(secrets, key=len, reverse=True):
        if not secret:
            continue
        spelt = secret_spellings(secret)
        alternatives.append(
            spelt if len(secret) >= SHORTEST_SECRET_ANYWHERE else rf"(?<![\w-]){spelt}(?![\w-])"
        )
    return re.compile("|".join(alternatives)) if alternatives else None


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


class ScrubbingFormatter(logging.Formatter):
    """Log lines leave the process scrubbed, traceback included (an exception's text may quote what
    a provider said, an address with its key). The record itself is left as it is, for any other
    handler that reads it."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub_credentials(super().format(record))
