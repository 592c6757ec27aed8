"""The one interface every batch provider sits behind.

The ledger speaks only these types and never reads a provider's own words except to show them.
An adapter turns them into its provider's wire format and translates back: statuses into
`UnitStatus.ended` / `refused`, counts into `UnitCounts`, error codes into a ledger
`ReasonCode` and a transient flag. What an adapter can and cannot do is in its `Capabilities`,
which the ledger reads instead of asking which provider it is talking to.
"""

import functools
import math
import re
import ssl
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import httpx

from ..drafts.answers import ResultLine
from ..drafts.scrubbing import scrub_credentials
from ..retrying import is_transient_status
from ..states import ReasonCode


class Finding(StrEnum):
    """How a unit whose create answer was lost is found again (SPEC rules 3 and 13)."""

    BY_KEY = "by_key"  # the provider keeps our intent key on the unit (metadata, display name)
    BY_LISTING = "by_listing"  # only candidates: same time window, same request count
    NOT_AT_ALL = "not_at_all"  # no listing: an operator decides, seeing the risk of paying twice


class Delivery(StrEnum):
    """How results arrive."""

    FILE = "file"  # a results file is downloaded once the unit has ended
    INLINE = "inline"  # the results come inside the provider's answer about the unit
    PER_REQUEST = "per_request"  # a synchronous server answers each request as it is made
    # Small units inline, larger ones in a file the unit names once it has ended (Gemini).
    INLINE_OR_FILE = "inline_or_file"


class CountedFrom(StrEnum):
    """From when a provider counts how long it keeps a unit's results (reference/providers.md §8.3)."""

    CREATION = "creation"  # the unit's creation: known when it is sent
    END = "end"  # the unit's end (its results file's creation): known when the end is observed


@dataclass(frozen=True)
class ResultsKept:
    """How long the provider keeps a unit's results before deleting them: its `collect_by`."""

    keeps_for: timedelta
    counted_from: CountedFrom


@dataclass(frozen=True)
class Capabilities:
    finding: Finding
    can_cancel: bool
    max_requests: int  # requests in one unit
    max_bytes: int  # bytes of one unit's payload, as `request_bytes` counts them
    delivery: Delivery
    usage_per_request: bool = True  # False: usage comes only for the whole unit and is apportioned
    # None: nothing waits at the provider to be collected, or its retention is not known.
    results_kept: ResultsKept | None = None
    # The provider lets its unit's files (input, results) be deleted once collected (`delete_files`).
    deletes_files: bool = False


@dataclass(frozen=True)
class InferenceRequest:
    custom_id: str
    model: str
    system_message: str
    user_message: str
    output_schema: dict | None
    max_output_tokens: int


@dataclass(frozen=True)
class UnitCounts:
    """How many of a unit's requests the provider says succeeded, failed or are still pending."""

    total: int = 0
    succeeded: int = 0
    failed: int = 0

    def as_dict(self) -> dict:
        return {"total": self.total, "succeeded": self.succeeded, "failed": self.failed}


@dataclass(frozen=True)
class UnitStatus:
    """What the provider last said about a submitted unit, in the ledger's words."""

    provider_status: str  # the provider's own word, shown to operators as is
    ended: bool  # no more results will arrive
    refused: bool = False  # the provider refused the whole unit (its input): no results at all
    counts: UnitCounts | None = None  # None when the provider does not say
    problem: str = ""  # why the provider refused the whole unit, when it did
    # Set when the provider says why requests with no result went unanswered (a unit that
    # expired before running them): they are recorded with this `ReasonCode`, as transient.
    # Otherwise a request without a result is the ledger's `missing_result`.
    unanswered_reason: str = ""
    # When the provider says the unit ended, where it says so (else its end is when it was seen).
    ended_at: datetime | None = None

    def __post_init__(self):
        # The provider's words are stored and shown: scrubbed here, whichever adapter read them.
        object.__setattr__(self, "provider_status", scrub_credentials(str(self.provider_status)))
        if self.problem:
            object.__setattr__(self, "problem", scrub_credentials(str(self.problem)))


# Characters of a model's refusal kept as its item's reason: evidence, not a second copy of an answer.
REFUSAL_SHOWN = 1000


def refused_by_model(
    custom_id: str, *, said: str, words: str, secrets: Iterable[str] = (), **counted
) -> ResultLine:
    """A request the model (or the provider's filter on it) declined to answer: no draft, and
    permanent (rule 8): the same prompt would be declined again. `said` is the provider's word for
    it, `words` the model's own, kept scrubbed and capped; `counted` its usage and tokens."""
    words = scrub_credentials(words, secrets)[:REFUSAL_SHOWN].strip()
    return ResultLine(
        custom_id=custom_id,
        succeeded=False,
        error_code=said,
        error_message=words or "the model gave no words with its refusal",
        reason=ReasonCode.REFUSED_BY_MODEL,
        transient=False,
        **counted,
    )


@dataclass(frozen=True)
class UnreadableLine:
    """A line that is not what the provider promised (not JSON, no custom_id, ...)."""

    line_number: int
    text: str
    problem: str


def classify_http_status(status: int | None) -> tuple[str, bool]:
    """The ledger's reason for one request answered with this HTTP status, and whether it is
    transient (SPEC rule 8): 408, 429 and 5xx retry by themselves, any other 4xx never does."""
    if status == 429:
        return ReasonCode.RATE_LIMITED, True
    if status == 408:
        return ReasonCode.TIMED_OUT, True
    if status is not None and status >= 500:
        return ReasonCode.MODEL_SERVER_ERROR, True
    if status is not None and 400 <= status < 500:
        return ReasonCode.REQUEST_INVALID, False
    return ReasonCode.MODEL_FAILED, False


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time of an API (`2024-08-20T18:37:24.100435Z`), None if unreadable."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def token_count(value: object) -> int:
    """A token count as a provider wrote it: an int, a float or a numeric string (proto JSON
    writes int64 as text). 0 for anything else: absent, negative, not finite, a bool, a list."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return max(0, int(text))
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return int(value)
    return 0


class ProviderError(Exception):
    """A provider call failed. `transient` failures may be retried; others may not. Its message is
    stored and shown, so it is scrubbed of credentials: `secrets` are the ones the adapter sent."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        secrets: Iterable[str] = (),
        billing: bool = False,
    ):
        super().__init__(scrub_credentials(message, secrets))
        self.status = status
        self.retry_after = retry_after
        # The provider will not bill the account (no credit, a spend limit): the job is paused,
        # since retrying cannot help until someone pays (rule 18).
        self.billing = billing

    @property
    def transient(self) -> bool:
        return not self.billing and (self.status is None or is_transient_status(self.status))


# How each provider says it will not bill the account (reference/providers.md): OpenAI's 429
# `insufficient_quota` (and `billing_hard_limit_reached`, `billing_not_active`), Anthropic's
# `billing_error` and a 429 with `enforced_spend_limit_reached`, Cloudflare's neuron allocation used
# up (error 4006), Google's "enable billing" precondition, and any 402 Payment Required.
BILLING_WORDS = re.compile(
    r"insufficient_quota|billing_hard_limit_reached|billing_not_active|billing_error"
    r"|enforced_spend_limit_reached|credit balance is too low|\"code\":\s*4006\b|enable billing",
    re.IGNORECASE,
)


def is_billing_refusal(status: int, body: str) -> bool:
    """Whether an error answer is the provider refusing to bill the account, not a passing limit."""
    return status == 402 or (400 <= status < 500 and bool(BILLING_WORDS.search(body[:4000])))


class NotSent(ProviderError):
    """The request never left this machine (no connection, no address): nothing can exist at the
    provider because of it."""


class AnswerLost(ProviderError):
    """The request left us but its answer did not arrive: the provider may or may not have it."""


# What `results` yields: each result as it is read, or a line that could not be read.
Results = Iterator[ResultLine | UnreadableLine]


class BatchProvider:
    name: str = ""
    capabilities: Capabilities

    @classmethod
    def from_settings(cls, config: dict) -> "BatchProvider":
        """Build the adapter and its HTTP client from `settings.PROVIDERS[name]`; keys are read
        from the environment variables that entry names, never stored."""
        raise NotImplementedError

    def request_bytes(self, request: InferenceRequest) -> int:
        """What one request adds to a unit's payload, counted as `capabilities.max_bytes` is."""
        raise NotImplementedError

    def submit(self, *, requests: list[InferenceRequest], intent_key: str, metadata: dict) -> str:
        """Send one unit; return the provider's reference. Raise AnswerLost if unsure."""
        raise NotImplementedError

    def find_units(self, *, intent_key: str, sent_at: datetime, request_count: int) -> list[str]:
        """Units that may be the one sent under this intent key, oldest first. `Finding.BY_KEY`:
        exactly those carrying the key (more than one is a duplicate). `Finding.BY_LISTING`:
        candidates created from `sent_at` on with `request_count` requests, to be confirmed or
        ruled out by the custom_ids of their results. `Finding.NOT_AT_ALL`: never called."""
        raise NotImplementedError

    def status(self, provider_ref: str) -> UnitStatus:
        raise NotImplementedError

    def results(
        self, provider_ref: str, *, skip: Container[str] = (), requests: Iterable[InferenceRequest] = ()
    ) -> Results:
        """Every result of an ended unit, streamed, in the provider's order (or, per request, in
        the order answers arrive). `skip` holds the custom_ids already recorded. A synchronous
        server (`Delivery.PER_REQUEST`) is asked here, for each of `requests` not in `skip`, so
        a killed worker loses only the requests in flight; the other deliveries ignore both."""
        raise NotImplementedError

    def cancel(self, provider_ref: str) -> str:
        """Ask the provider to stop a unit (only when `capabilities.can_cancel`); returns what it
        says the unit's status now is."""
        raise NotImplementedError

    def delete_files(self, provider_ref: str) -> list[str]:
        """Delete a collected unit's files at the provider (only when `capabilities.deletes_files`):
        its input, output and error files. Returns the names of those gone now, including any that
        were gone already, so running it twice is harmless; raises ProviderError when one could not
        be deleted (the rest are tried again later)."""
        raise NotImplementedError


@functools.cache
def tls_context() -> ssl.SSLContext:
    """What every provider's client checks servers' certificates with, as httpx sets it up by
    default, set up once a process: httpx loads the certificate bundle for each new client (30-50 ms
    of CPU), and a client is made for each task that calls a provider."""
    return httpx.create_ssl_context()
