"""Estimates from what was measured (SPEC §9, issue 27): the tokens a request of a prompt version on a
provider and model are the mean of the first drafts of its pilots, else of its earlier jobs; only with
nothing measured are they guessed from the template and `max_tokens`."""

import pytest

from ledger.models import Job, Pilot, PromptVersion
from ledger.money.estimates import EstimateBasis, request_estimate
from tests.factories import ItemFactory, JobFactory, add_version

pytestmark = pytest.mark.django_db

SAMPLE = [("Oak chopping board", {"material": "oak", "dimensions": "40 x 25 cm"})]


@pytest.fixture
def prompt() -> PromptVersion:
    return PromptVersion.objects.get(task="product_description", version=1)


def drafted(tokens: list[tuple[int, int]], *, pilot: bool = False, **job) -> Job:
    """A job with one item a first draft of each of `tokens` (input, output), and a second draft of its
    first item that cost far more (a redraft is not what a first pass costs)."""
    made = JobFactory(**job)
    if pilot:
        Pilot.objects.create(job=made, per_stratum=1, strata=["category"], seed=1)
    items = [ItemFactory(job=made, awaiting_review=True) for _ in tokens]
    for item, (input_tokens, output_tokens) in zip(items, tokens, strict=True):
        add_version(item, input_tokens=input_tokens, output_tokens=output_tokens)
    add_version(items[0], input_tokens=9_000, output_tokens=9_000)
    return made


def estimate(prompt: PromptVersion, model: str = "gpt-4o-mini"):
    return request_estimate(prompt, SAMPLE, provider="emulator", model=model)


def test_with_nothing_measured_the_template_and_max_tokens_say_so(prompt):
    guessed = estimate(prompt)
    assert guessed.basis == EstimateBasis.TEMPLATE and guessed.drafts_measured == 0
    assert guessed.output_tokens == prompt.max_output_tokens // 2 == 300
    assert guessed.input_tokens > 50
    assert guessed.source == (
        "not measured yet for product_description v1 on this model: guessed from the template and max_tokens 600"
    )


def test_a_pilot_of_the_same_prompt_version_and_model_is_measured(prompt):
    drafted([(400, 90), (500, 110), (300, 70)], pilot=True, reference="PILOT-1")
    drafted([(2_000, 500)], reference="earlier")  # a pilot comes first
    measured = estimate(prompt)
    assert measured.basis == EstimateBasis.PILOT and measured.measured
    assert (measured.input_tokens, measured.output_tokens) == (400, 90)  # first drafts only
    assert measured.drafts_measured == 3
    assert measured.source == "measured on 3 first drafts of pilot PILOT-1"


def test_earlier_jobs_are_measured_when_there_is_no_pilot(prompt):
    drafted([(200, 40), (301, 81)], reference="first")
    drafted([(400, 60)], reference="second")
    measured = estimate(prompt)
    assert measured.basis == EstimateBasis.EARLIER_JOBS
    assert (measured.input_tokens, measured.output_tokens) == (301, 61)  # 300.3 and 60.3, rounded up
    assert measured.source == "measured on 3 first drafts of 2 jobs of this prompt version and model"


def test_another_model_or_prompt_version_is_not_measured(prompt):
    drafted([(400, 90)], pilot=True, model="gpt-4o")
    other = PromptVersion.objects.create(
        task=prompt.task,
        version=2,
        system_message=prompt.system_message,
        template=prompt.template,
        output_schema=prompt.output_schema,
        rules=prompt.rules,
    )
    drafted([(500, 100)], prompt_version=other)
    drafted([(700, 150)], provider="openai")
    assert estimate(prompt).basis == EstimateBasis.TEMPLATE
    assert estimate(prompt, model="gpt-4o").output_tokens == 90
    assert request_estimate(other, SAMPLE, provider="emulator", model="gpt-4o-mini").output_tokens == 100


def test_a_job_without_drafts_yet_measures_nothing(prompt):
    ItemFactory(job=JobFactory(), submitted=True)
    assert estimate(prompt).basis == EstimateBasis.TEMPLATE
