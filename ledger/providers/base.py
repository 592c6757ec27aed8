"""The one interface every batch provider sits behind.

The ledger speaks only these types. An adapter turns them into its provider's wire format:
OpenAI uploads a JSONL file and creates a batch; Anthropic would send the requests inline and
read `results_url`; Cloudflare would queue with `queueRequest` and poll its `request_id`; a
self-hosted synchronous server would answer each request at once and report the unit ended.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..retrying import is_transient_status
from ..scrubbing import scrub_credentials


@dataclass(frozen=True)
class InferenceRequest:
    custom_id: str
    model: str
    system_message: str
    user_message: str
    output_schema: dict | None
    max_output_tokens: int


@dataclass(frozen=True)
class UnitStatus:
    """What the provider last said about a submitted unit."""

    provider_status: str  # the provider's own word, shown to operators as is
    ended: bool  # no more results will arrive
    counts: dict = field(default_factory=dict)
    output_ref: str = ""
    error_ref: str = ""
    problem: str = ""  # why the provider refused the whole unit, when it did


@dataclass(frozen=True)
class ResultLine:
    """One line of a provider's results, matched to a request by `custom_id` only."""

    custom_id: str
    succeeded: bool
    content: str = ""
    usage: dict = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    http_status: int | None = None
    error_code: str = ""
    error_message: str = ""
    retry_after: float | None = None


@dataclass(frozen=True)
class UnreadableLine:
    """A line that is not what the provider promised (not JSON, no custom_id, ...)."""

    line_number: int
    text: str
    problem: str


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
    ):
        super().__init__(scrub_credentials(message, secrets))
        self.status = status
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        return self.status is None or is_transient_status(self.status)


class AnswerLost(ProviderError):
    """The request left us but its answer did not arrive: the provider may or may not have it."""


class BatchProvider:
    name: str = ""

    def submit(self, *, requests: list[InferenceRequest], intent_key: str, metadata: dict) -> str:
        """Send one unit; return the provider's reference. Raise AnswerLost if unsure."""
        raise NotImplementedError

    def find_units(self, *, intent_key: str) -> list[str]:
        """Every unit the provider holds that was sent with this intent key, oldest first
        (reconciling a lost answer; more than one means a duplicate was created)."""
        raise NotImplementedError

    def status(self, provider_ref: str) -> UnitStatus:
        raise NotImplementedError

    def results(self, status: UnitStatus) -> Iterator[ResultLine | UnreadableLine]:
        """Every result line of an ended unit, streamed, in the provider's order."""
        raise NotImplementedError

    def cancel(self, provider_ref: str) -> str:
        """Ask the provider to stop a unit; returns what it says the unit's status now is."""
        raise NotImplementedError
