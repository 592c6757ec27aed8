"""What a request to a model is expected to cost before it is sent, at the batch price
(`ledger.money.pricing`). Used wherever paid work is about to be queued (SPEC §9, rule 16): a job
before it starts, an import that queues products again, a retry and a regeneration.

Tokens a request come from what was measured for the same prompt version, provider and model
(SPEC §9): the first drafts of its pilots, else of its earlier jobs. Only with nothing measured are
they guessed from the template: the rendered prompt's characters / 4 in, half of `max_tokens` out.
A measured mean is used as it is, not scaled by the size of the products about to be sent: the
products of one catalogue are alike enough, and the template's guess of their size is the weaker figure.
"""

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db import models
from django.db.models import Avg, Count, Max, Min, Q

from ..drafts.validation import render_prompt
from ..models import GeneratedVersion, Job, PromptVersion
from .pricing import PLACES, Price, price_for, unknown_price

# About four characters of English text make a token.
CHARS_PER_TOKEN = 4
# What is measured: the first drafts of the most recent jobs of the prompt version and model, and
# at most this many of them (in job and item order), so that the one aggregate query probes a
# bounded number of drafts however many millions the table holds (`item_job`, then each item's first
# draft through `version_number_unique`).
MEASURED_JOBS = 10
MEASURED_DRAFTS = 20_000


class EstimateBasis(models.TextChoices):
    PILOT = "pilot", "Measured on a pilot"
    EARLIER_JOBS = "earlier_jobs", "Measured on earlier jobs"
    TEMPLATE = "template", "From the template and max_tokens"


@dataclass(frozen=True)
class RequestEstimate:
    """Tokens per request, and what they rest on: `basis`, the number of drafts measured, and
    `source`, the same in words ("measured on 180 first drafts of pilot …")."""

    input_tokens: int
    output_tokens: int
    basis: EstimateBasis = EstimateBasis.TEMPLATE
    drafts_measured: int = 0
    source: str = ""

    @property
    def measured(self) -> bool:
        return self.basis != EstimateBasis.TEMPLATE


def request_estimate(
    prompt: PromptVersion, contents: Iterable[tuple[str, dict]], *, provider: str, model: str
) -> RequestEstimate:
    """Tokens per request of `prompt` on `provider`/`model`: measured when drafts of it were
    (`measured_estimate`), else guessed from `contents`, a sample of the products' (title, fields)."""
    return measured_estimate(prompt, provider, model) or template_estimate(prompt, contents)


def measured_estimate(prompt: PromptVersion, provider: str, model: str) -> RequestEstimate | None:
    """The mean tokens of the first drafts of the prompt version's pilots on this provider and model,
    else of its earlier jobs on them; None when none has a draft with usage yet."""
    jobs = Job.objects.filter(prompt_version=prompt, provider=provider, model=model).order_by("-id")
    for basis, chosen in (
        (EstimateBasis.PILOT, jobs.filter(pilot__isnull=False)),
        (EstimateBasis.EARLIER_JOBS, jobs),
    ):
        references = dict(chosen.values_list("id", "reference")[:MEASURED_JOBS])
        if not references:
            continue
        drafts = (
            GeneratedVersion.objects.filter(number=1, item__job_id__in=list(references))
            .filter(Q(input_tokens__gt=0) | Q(output_tokens__gt=0))
            .order_by("item__job_id", "item_id")[:MEASURED_DRAFTS]
            .aggregate(
                drafts=Count("id"),
                input_tokens=Avg("input_tokens"),
                output_tokens=Avg("output_tokens"),
                jobs=Count("item__job_id", distinct=True),
                first_job=Min("item__job_id"),
                last_job=Max("item__job_id"),
            )
        )
        if drafts["drafts"]:
            return RequestEstimate(
                input_tokens=math.ceil(drafts["input_tokens"]),
                output_tokens=math.ceil(drafts["output_tokens"]),
                basis=basis,
                drafts_measured=drafts["drafts"],
                source=measured_words(basis, drafts, references),
            )
    return None


def measured_words(basis: EstimateBasis, drafts: dict, references: dict[int, str]) -> str:
    """The basis in words: 'measured on 180 first drafts of pilot P-1', or '… of 3 jobs of this prompt
    version and model'."""
    count = drafts["drafts"]
    if drafts["first_job"] == drafts["last_job"]:
        kind = "pilot" if basis == EstimateBasis.PILOT else "job"
        measured = f"{kind} {references[drafts['first_job']]}"
    else:
        kind = "pilots" if basis == EstimateBasis.PILOT else "jobs"
        measured = f"{drafts['jobs']} {kind} of this prompt version and model"
    words = f"measured on {count:,} first draft{'s' if count != 1 else ''} of {measured}"
    if count == MEASURED_DRAFTS:
        words += f" (at most {MEASURED_DRAFTS:,} are read, from the {MEASURED_JOBS} most recent jobs)"
    return words


def template_estimate(prompt: PromptVersion, contents: Iterable[tuple[str, dict]]) -> RequestEstimate:
    """Input: the characters of the system message, the output schema and each product's rendered
    prompt, / 4, averaged; output: half the prompt's `max_output_tokens` (drafts rarely use it all)."""
    fixed = len(prompt.system_message) + len(json.dumps(prompt.output_schema, ensure_ascii=False))
    sizes = [fixed + len(render_prompt(prompt, title=title, fields=fields)) for title, fields in contents]
    return RequestEstimate(
        input_tokens=math.ceil(sum(sizes) / len(sizes) / CHARS_PER_TOKEN) if sizes else 0,
        output_tokens=prompt.max_output_tokens // 2,
        basis=EstimateBasis.TEMPLATE,
        source=(
            f"not measured yet for {prompt} on this model: guessed from the template and "
            f"max_tokens {prompt.max_output_tokens}"
        ),
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
