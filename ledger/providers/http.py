"""What every adapter that speaks HTTP shares: one httpx client, its credentials kept out of every
message it stores, and one call that tells a request that never left this machine from one whose
answer was lost on the way back (SPEC rule 3)."""

import httpx

from ..retrying import retry_after_seconds
from ..scrubbing import header_credentials, scrub_credentials
from .base import AnswerLost, BatchProvider, ProviderError

# Failures that prove the request never left this machine.
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


class HttpBatchProvider(BatchProvider):
    def __init__(self, *, client: httpx.Client):
        self.client = client
        # What a provider echoes of these in an error is never kept.
        self.secrets = header_credentials(client.headers)

    def _call(self, method: str, path: str, *, answer_may_be_lost: bool = False, **kwargs) -> httpx.Response:
        """One call. With `answer_may_be_lost`, a failure after the request may have reached the
        provider is AnswerLost (the caller must reconcile), not an ordinary, retryable error."""
        try:
            response = self.client.request(method, path, **kwargs)
        except NEVER_SENT as exc:
            raise ProviderError(f"{method} {path} could not be sent: {exc}", secrets=self.secrets) from exc
        except httpx.TransportError as exc:
            if answer_may_be_lost:
                raise AnswerLost(
                    f"{method} {path} was sent but no answer arrived: {exc}", secrets=self.secrets
                ) from exc
            raise ProviderError(f"{method} {path} failed: {exc}", secrets=self.secrets) from exc
        if response.status_code >= 400:
            raise self._refusal(method, path, response)
        return response

    def _refusal(self, method: str, path: str, response: httpx.Response) -> ProviderError:
        """A 4xx/5xx answer as a ProviderError, transient or not by its status."""
        # Scrubbed before it is cut short: half a key would no longer look like one.
        said = scrub_credentials(response.text, self.secrets)[:300]
        return ProviderError(
            f"{method} {path} answered {response.status_code}: {said}",
            status=response.status_code,
            retry_after=self._retry_after(response),
        )

    @staticmethod
    def _retry_after(response: httpx.Response) -> float | None:
        return retry_after_seconds(response.headers.get("retry-after"))
