"""What a request to a model is expected to cost before it is sent: its tokens, guessed from the size
of its prompt, at the batch price (`ledger.money.pricing`). Used wherever paid work is about to be queued
(SPEC §9, rule 16): an import that queues products again, and a job before it starts."""

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from ..drafts.validation import render_prompt
from ..models import PromptVersion
from .pricing import PLACES, Price, price_for, unknown_price

# About four characters of English text make a token.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class RequestEstimate:
    """Tokens per request, from the prompt's system message, output schema and the rendered user
    message of each sampled product; output tokens: half the prompt's `max_output_tokens` (drafts
    rarely use it all)."""

    input_tokens: int
    output_tokens: int


def request_estimate(prompt: PromptVersion, contents: Iterable[tuple[str, dict]]) -> RequestEstimate:
    """`contents`: a sample of the products' (title, fields)."""
    fixed = len(prompt.system_message) + len(json.dumps(prompt.output_schema, ensure_ascii=False))
    sizes = [fixed + len(render_prompt(prompt, title=title, fields=fields)) for title, fields in contents]
    return RequestEstimate(
        input_tokens=math.ceil(sum(sizes) / len(sizes) / CHARS_PER_TOKEN) if sizes else 0,
        output_tokens=prompt.max_output_tokens // 2,
    )


def work_cost(price: Price | None, requests: int, per_request: RequestEstimate) -> Decimal | None:
    """The cost of `requests` requests at `price` (the provider's currency), None without a price."""
    if price is None:
        return None
    return price.cost(requests * per_request.input_tokens, requests * per_request.output_tokens).quantize(
        PLACES
    )


def price_note(provider: str, model: str) -> str:
    price = price_for(provider, model)
    return unknown_price(provider, model) if price is None else price.note
