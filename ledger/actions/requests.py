"""The requests a unit sends its provider: one for each of its items still waiting, rendered from the
job's prompt version and each item's source revision, and the `max_tokens` each is sent with (rule
18: lowered for a job with a budget to what was measured)."""

import math
from decimal import Decimal

from django.db.models import Max, TextField
from django.db.models.functions import Cast

from ..drafts.validation import read_json, render_prompt
from ..models import Job, Submission, UnitCharge
from ..providers import capabilities
from ..providers.base import Delivery, InferenceRequest
from ..states import ItemState, ReasonCode

# A job with a budget asks for at most the largest output measured for its prompt version, provider
# and model, a quarter more and 16 tokens besides: answers vary around what was measured (a product
# with more facts says more), and the 16 tokens give a very short largest answer room for its
# closing JSON. A draft the lowered limit cuts off all the same is drafted again at the prompt's own
# `max_output_tokens` (`redraft_cut_off`).
MEASURED_OUTPUT_MARGIN = Decimal("1.25")
MEASURED_OUTPUT_SPARE_TOKENS = 16


def output_cap(job: Job) -> int:
    """The `max_tokens` the requests of `job` are sent with (rule 18): the prompt version's
    `max_output_tokens`, lowered for a job with a budget to the largest output its own drafts, and
    drafts of other jobs of the same prompt version, provider and model (a pilot among them),
    produced, with a margin; never above the prompt version's, and not lowered before anything was
    measured. One query, for a job with a budget only. Not lowered where a draft's output cannot be
    measured or its cut-off told (usage only for the whole unit), nor where requests are sent as the
    unit is collected (a server answering each request: the cap would be judged twice). Read from the
    settled units' longest answers (`UnitCharge.largest_output`), one row a unit: not every draft of
    every such job, which a million-item job would read again for each unit it sends."""
    prompt_cap = job.prompt_version.max_output_tokens
    if job.budget is None:
        return prompt_cap
    provider = capabilities(job.provider)
    if not provider.usage_per_request or provider.delivery == Delivery.PER_REQUEST:
        return prompt_cap
    largest = UnitCharge.objects.filter(
        job__prompt_version_id=job.prompt_version_id,
        job__provider=job.provider,
        job__model=job.model,
        largest_output__gt=0,
    ).aggregate(largest=Max("largest_output"))["largest"]
    if largest is None:
        return prompt_cap
    lowered = math.ceil(largest * MEASURED_OUTPUT_MARGIN) + MEASURED_OUTPUT_SPARE_TOKENS
    return min(prompt_cap, lowered)


def build_requests(submission: Submission, state: str = ItemState.PREPARED, *, limit: int | None = None):
    """The unit's requests for its items still in `state` (the first `limit` of them): when sending,
    only items still waiting to be sent (one withdrawn, revised or cancelled since planning is not
    paid for). Sent with the `max_tokens` of `output_cap`, lowered for a job with a budget,
    but for an item a lowered limit cut off before, which is sent with the prompt version's own."""
    prompt = submission.job.prompt_version
    cap = output_cap(submission.job)
    # Read as values: a unit's thousands of entries, items and revisions made no model objects. The
    # fields are read as their JSON text, by read_json (Django's JSONField reads each by the json
    # module, several times slower).
    entries = (
        submission.entries.filter(item__state=state)
        .order_by("id")
        .annotate(fields_text=Cast("item__source_revision__fields", TextField()))
        .values_list("custom_id", "item__source_revision__title", "fields_text", "item__reason_code")
    )
    return [
        InferenceRequest(
            custom_id=custom_id,
            model=submission.model,
            system_message=prompt.system_message,
            user_message=render_prompt(prompt, title=title, fields=read_json(fields)),
            output_schema=prompt.output_schema,
            max_output_tokens=prompt.max_output_tokens if code == ReasonCode.TRUNCATED else cap,
        )
        for custom_id, title, fields, code in (entries[:limit] if limit else entries)
    ]
