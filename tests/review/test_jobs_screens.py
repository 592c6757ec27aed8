"""The jobs screens: the list of jobs, starting one with its estimate, and one job's page."""

import re
from datetime import UTC, datetime
from decimal import Decimal
from uuid import uuid4

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.actions.prompts import make_prompt_current
from ledger.models import Event, Item, Job, Pilot, ProductStatus, PromptVersion, Submission
from ledger.money.pricing import price_for
from ledger.states import ItemState, JobState, SubmissionState
from review.jobs import SUBMISSIONS_PER_PAGE
from review.templatetags.display import money
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'


def kitchen(sku: str, category: str = "kitchen"):
    return ProductFactory(sku=sku, revision__fields={"category": category, "material": "oak"})


@pytest.fixture
def products():
    """Two kitchen products, one garden product, one withdrawn kitchen product."""
    made = [kitchen("K-1"), kitchen("K-2"), kitchen("G-1", "garden"), kitchen("K-OLD")]
    made[-1].status = ProductStatus.WITHDRAWN
    made[-1].save()
    return made


def start(**changes) -> dict:
    """A start form as the screen sends it, with a one-time token of its own."""
    data = {
        "start_token": str(uuid4()),
        "reference": "",
        "task": "product_description",
        "prompt_version": "",
        "provider": "emulator",
        "model": "gpt-4o-mini",
        "destination": "catalogue",
        "unit_size": "500",
        "scope": "all",
        "category": "",
        "skus": "",
    }
    return {**data, **changes}


def ledger_size() -> tuple[int, int, int]:
    return Job.objects.count(), Item.objects.count(), Event.objects.count()


# --- who may do what ---------------------------------------------------------------------


def pages(job: Job) -> list[str]:
    return [reverse("job_list"), reverse("job_start"), reverse("job_detail", args=[job.pk])]


POSTS = [
    (reverse("job_start"), start(step="start", reference="by-post")),
    (reverse("job_estimate"), start()),
]


def test_the_jobs_screens_need_a_login(client, job, products):
    before = ledger_size()
    for url in pages(job):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith(reverse("login")), url
    for url, data in POSTS:
        response = client.post(url, data)
        assert response.status_code == 302 and response.url.startswith(reverse("login")), url
    assert ledger_size() == before


def test_a_user_without_a_role_sees_nothing(client, job, products, outsider):
    client.force_login(outsider)
    before = ledger_size()
    for url in pages(job):
        assert client.get(url).status_code == 403, url
    for url, data in POSTS:
        assert client.post(url, data).status_code == 403, url
    assert ledger_size() == before


def test_an_operator_sees_the_jobs_screens_but_starts_nothing(client, job, products, operator):
    client.force_login(operator)
    before = ledger_size()
    for url in pages(job):
        assert client.get(url).status_code == 200, url
    for url, data in POSTS:
        assert client.post(url, data).status_code == 403, url
    assert ledger_size() == before
    form = client.get(reverse("job_start")).content.decode()
    assert "Only catalogue owners and admins start jobs." in form
    assert 'value="start"' not in form and "hx-post" not in form
    assert (
        reverse("job_start")
        not in client.get(reverse("job_list")).content.decode().split('<main id="content"')[1]
    )


def test_an_admin_starts_a_job(client, products):
    client.force_login(UserFactory(roles=["admin"]))
    response = client.post(reverse("job_start"), start(step="start", reference="by-admin"))
    assert response.status_code == 302
    assert Job.objects.get(reference="by-admin").items.count() == 3


# --- starting a job ----------------------------------------------------------------------


def items_of(reference: str) -> list[str]:
    job = Job.objects.get(reference=reference)
    return sorted(job.items.values_list("product__sku", flat=True))


def test_the_estimate_step_shows_requests_and_cost_and_starts_nothing(client, owner, products):
    client.force_login(owner)
    before = ledger_size()
    response = client.post(reverse("job_start"), start(unit_size="2"))
    assert response.status_code == 200
    html = response.content.decode()
    estimate = response.context["estimate"]
    assert estimate.requests == 3 and estimate.submissions == 2 and estimate.sample_size == 3
    assert "3 requests" in html and "2 provider batches" in html
    assert estimate.output_tokens_per_request == 300  # half of the prompt's 600
    assert estimate.input_tokens_per_request > 50
    assert (
        estimate.cost > 0 and f'<strong data-testid="estimated-cost">{money(estimate.cost)}</strong>' in html
    )
    expected = price_for("emulator", "gpt-4o-mini").cost(estimate.input_tokens, estimate.output_tokens)
    assert estimate.cost == expected.quantize(Decimal("0.000001"))
    assert "50% batch discount" in html
    assert 'value="start"' in html  # the confirm step offers to start
    assert ledger_size() == before


def basis_of(html: str) -> tuple[str, str]:
    """The estimate's basis and its words, as the start screen shows them."""
    found = re.search(r'data-testid="estimate-basis" data-basis="(\w+)">\s*Tokens ([^<]*?)\.\s*</p>', html)
    return found[1], found[2]


def test_the_estimate_uses_the_tokens_measured_on_a_pilot_and_says_so(client, owner, products):
    client.force_login(owner)
    guessed = client.post(reverse("job_start"), start())
    assert basis_of(guessed.content.decode()) == (
        "template",
        "not measured yet for product_description v1 on this model: guessed from the template and max_tokens 600",
    )
    pilot = JobFactory(reference="PILOT-7")
    Pilot.objects.create(job=pilot, per_stratum=1, strata=["category"], seed=1)
    for input_tokens, output_tokens in [(210, 70), (230, 90)]:
        add_version(
            ItemFactory(job=pilot, awaiting_review=True),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    measured = client.post(reverse("job_start"), start())

    html = measured.content.decode()
    assert basis_of(html) == ("pilot", "measured on 2 first drafts of pilot PILOT-7")
    estimate = measured.context["estimate"]
    assert (estimate.input_tokens_per_request, estimate.output_tokens_per_request) == (220, 80)
    assert "≈ 220 input and 80 output tokens a request" in html
    # Another model has measured nothing.
    other = client.post(reverse("job_start"), start(model="gpt-4o"))
    assert basis_of(other.content.decode())[0] == "template"


def test_the_estimate_says_when_a_providers_usage_will_be_apportioned(client, owner, products, monkeypatch):
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", "test-token")
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", "test-account")
    client.force_login(owner)
    model = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
    shared = client.post(reverse("job_start"), start(provider="cloudflare", model=model))
    assert shared.context["estimate"].apportioned
    assert 'data-testid="estimate-apportioned"' in shared.content.decode()
    assert "cloudflare reports usage only for a whole batch" in shared.content.decode()
    own = client.post(reverse("job_start"), start())
    assert not own.context["estimate"].apportioned
    assert 'data-testid="estimate-apportioned"' not in own.content.decode()


def test_a_dearer_model_is_estimated_dearer(client, owner, products):
    client.force_login(owner)
    cheap = client.post(reverse("job_start"), start(model="gpt-4o-mini")).context["estimate"]
    dear = client.post(reverse("job_start"), start(model="gpt-4o")).context["estimate"]
    assert dear.input_tokens == cheap.input_tokens
    assert dear.cost > cheap.cost


@pytest.mark.parametrize(
    "choice, skus",
    [
        ({"scope": "all"}, ["G-1", "K-1", "K-2"]),
        ({"scope": "category", "category": "kitchen"}, ["K-1", "K-2"]),
        ({"scope": "skus", "skus": "K-2, G-1\nK-2"}, ["G-1", "K-2"]),
    ],
)
def test_starting_a_job_freezes_the_chosen_products(client, owner, products, choice, skus):
    client.force_login(owner)
    response = client.post(
        reverse("job_start"), start(step="start", reference="spring", unit_size="10", **choice)
    )
    job = Job.objects.get(reference="spring")
    assert response.status_code == 302 and response.url == reverse("job_detail", args=[job.pk])
    assert items_of("spring") == skus
    assert (job.owner, job.unit_size, job.provider, job.destination) == (owner, 10, "emulator", "catalogue")
    assert job.prompt_version == PromptVersion.objects.get(task="product_description", version=1)
    page = client.get(response.url)
    assert f"Job spring started with {len(skus)} items." in page.content.decode()


def test_a_job_without_a_reference_is_named_after_its_task_and_time(client, owner, products, monkeypatch):
    # Both jobs start within the same second, whatever the machine's load.
    started = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: started)
    client.force_login(owner)
    for _ in range(2):
        assert client.post(reverse("job_start"), start(step="start")).status_code == 302
    first, second = Job.objects.order_by("id").values_list("reference", flat=True)
    assert first == f"product_description-{started:%Y%m%d-%H%M%S}"
    assert second == f"{first}-2"


def test_a_chosen_prompt_version_is_used(client, owner, products):
    v1 = PromptVersion.objects.get(task="product_description", version=1)
    v2 = PromptVersion.objects.create(
        task="product_description",
        version=2,
        system_message=v1.system_message,
        template=v1.template,
        output_schema=v1.output_schema,
        rules=v1.rules,
    )
    client.force_login(owner)
    client.post(reverse("job_start"), start(step="start", reference="chosen", prompt_version=str(v2.pk)))
    # None chosen: the task's current version, not its newest.
    client.post(reverse("job_start"), start(step="start", reference="current"))
    make_prompt_current(prompt=v2, actor=owner)
    client.post(reverse("job_start"), start(step="start", reference="made-current"))
    assert Job.objects.get(reference="chosen").prompt_version == v2
    assert Job.objects.get(reference="current").prompt_version == v1
    assert Job.objects.get(reference="made-current").prompt_version == v2


def test_the_categories_offered_are_those_of_active_products(client, owner, products):
    kitchen("W-1", "winter")
    withdrawn = kitchen("X-1", "attic")
    withdrawn.status = ProductStatus.WITHDRAWN
    withdrawn.save()
    client.force_login(owner)
    choices = dict(client.get(reverse("job_start")).context["form"].fields["category"].choices)
    assert [c for c in choices if c] == ["garden", "kitchen", "winter"]


def test_a_category_is_text_whatever_its_json_type_and_offered_once(client, owner):
    for sku, category in [("N-1", 5), ("N-2", "5"), ("N-3", True), ("N-4", ""), ("N-5", None)]:
        kitchen(sku, category)
    ProductFactory(sku="N-6", revision__fields={"material": "oak"})
    client.force_login(owner)
    choices = dict(client.get(reverse("job_start")).context["form"].fields["category"].choices)
    assert [c for c in choices if c] == ["5", "true"]
    response = client.post(reverse("job_start"), start(step="start", scope="category", category="5"))
    job = Job.objects.get()
    assert response.status_code == 302
    assert sorted(job.items.values_list("product__sku", flat=True)) == ["N-1", "N-2"]


@pytest.mark.parametrize(
    "changes, field, message",
    [
        (
            {"scope": "skus", "skus": "K-1 NOPE K-OLD"},
            "skus",
            "Unknown SKUs, or products not active: NOPE, K-OLD.",
        ),
        ({"scope": "skus", "skus": "  "}, "skus", "List at least one SKU."),
        (
            {"scope": "skus", "skus": " ".join(f"S-{n}" for n in range(20_001))},
            "skus",
            "20,001 SKUs named; at most 20,000, or leave them out for every active product.",
        ),
        ({"unit_size": "0"}, "unit_size", "Ensure this value is greater than or equal to 1."),
        ({"unit_size": "50001"}, "unit_size", "At most 50,000 requests: emulator's limit for one batch."),
        ({"reference": "taken"}, "reference", "A job with reference “taken” exists already."),
        ({"scope": "category"}, "category", "Choose a category."),
        ({"scope": "category", "category": "attic"}, "category", "Select a valid choice."),
        ({"provider": "carrier-pigeon"}, "provider", "Select a valid choice."),
        ({"destination": "nowhere"}, "destination", "Select a valid choice."),
        ({"task": "poetry"}, "task", "Select a valid choice."),
    ],
)
def test_bad_input_is_refused_and_starts_nothing(client, owner, products, changes, field, message):
    JobFactory(reference="taken")
    client.force_login(owner)
    before = ledger_size()
    for step in ("estimate", "start"):
        response = client.post(reverse("job_start"), start(step=step, **changes))
        assert response.status_code == 400
        errors = response.context["form"].errors[field]
        assert any(message in error for error in errors), errors
        assert response.context["estimate"] is None
    assert ledger_size() == before


def test_a_prompt_version_of_another_task_is_refused(client, owner, products):
    other = PromptVersion.objects.create(
        task="headline", version=1, system_message="s", template="{title} {facts}", output_schema={}
    )
    client.force_login(owner)
    before = ledger_size()
    response = client.post(reverse("job_start"), start(step="start", prompt_version=str(other.pk)))
    assert response.status_code == 400
    assert "not one of the task product_description" in response.content.decode()
    assert ledger_size() == before


def test_no_active_products_means_no_job(client, owner):
    client.force_login(owner)
    response = client.post(reverse("job_start"), start(step="start"))
    assert response.status_code == 400
    assert "There are no active products." in response.content.decode()
    assert not Job.objects.exists()


def test_the_htmx_estimate_is_a_partial(client, owner, products):
    client.force_login(owner)
    response = client.post(
        reverse("job_estimate"), start(scope="category", category="kitchen"), headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="estimate"')
    assert "<html" not in html and "<nav" not in html
    assert "2 requests" in html and 'value="start"' in html
    assert not Job.objects.exists()


def test_the_htmx_estimate_lists_what_to_fix(client, owner, products):
    client.force_login(owner)
    response = client.post(
        reverse("job_estimate"), start(scope="skus", skus="NOPE"), headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert "No estimate until these are fixed" in html and "NOPE" in html
    assert 'value="start"' not in html


def test_the_start_form_is_wired_for_htmx_and_works_without_it(client, owner, products):
    client.force_login(owner)
    html = client.get(reverse("job_start")).content.decode()
    assert 'action="/jobs/new"' in html and 'method="post"' in html
    assert 'hx-post="/jobs/new/estimate"' in html
    assert 'name="step" value="estimate"' in html
    assert 'value="start"' not in html  # only once an estimate was shown


def test_the_estimate_endpoint_takes_only_post(client, owner):
    client.force_login(owner)
    assert client.get(reverse("job_estimate")).status_code == 405


# --- the list of jobs ----------------------------------------------------------------------


def test_the_job_list_shows_owner_state_and_progress(client, owner, operator):
    job = JobFactory(owner=owner, reference="autumn", state=JobState.IN_REVIEW)
    ItemFactory(job=job, awaiting_review=True)
    ItemFactory(job=job, state=ItemState.APPLIED)
    client.force_login(operator)
    response = client.get(reverse("job_list"))
    html = response.content.decode()
    assert "autumn" in html and owner.username in html
    assert "In review: all results returned, decisions pending" in html
    assert 'title="Draft ready for review: 1"' in html and 'style="width: 50.000%"' in html


def test_the_job_list_filters_and_paginates(client, owner):
    JobFactory.create_batch(26)
    JobFactory(reference="special-one", state=JobState.COMPLETED)
    client.force_login(owner)
    url = reverse("job_list")
    first = client.get(url)
    assert len(first.context["progress"]) == 25 and "Page 1 of 2" in first.content.decode()
    assert len(client.get(url, {"page": 2}).context["progress"]) == 2
    assert [r.job.reference for r in client.get(url, {"state": "completed"}).context["progress"]] == [
        "special-one"
    ]
    assert [r.job.reference for r in client.get(url, {"reference": "SPECIAL"}).context["progress"]] == [
        "special-one"
    ]
    assert "Start a job" in first.content.decode()


def test_the_job_list_polls_only_while_a_job_works(client, owner):
    job = JobFactory(state=JobState.RUNNING)
    client.force_login(owner)
    partial = client.get(reverse("job_list"), headers={"HX-Request": "true"})
    assert partial.status_code == 200 and partial.content.decode().lstrip().startswith('<section id="jobs"')
    assert 'hx-trigger="every 2s"' in partial.content.decode()
    Job.objects.filter(pk=job.pk).update(state=JobState.COMPLETED)
    assert client.get(reverse("job_list"), headers={"HX-Request": "true"}).status_code == 286


def test_a_job_reference_is_escaped(client, owner):
    job = JobFactory(reference=XSS)
    client.force_login(owner)
    for url in (reverse("job_list"), reverse("dashboard"), reverse("job_detail", args=[job.pk])):
        html = client.get(url).content.decode()
        assert "<script>alert" not in html and "&lt;script&gt;" in html, url


# --- one job's page ------------------------------------------------------------------------


@pytest.fixture
def submission(job) -> Submission:
    return Submission.objects.create(
        job=job,
        provider="emulator",
        model="gpt-4o-mini",
        intent_key="bd_screens",
        state=SubmissionState.OPEN,
        provider_ref="batch_xyz",
        last_observed_status="in_progress",
        request_counts={"total": 4, "completed": 3, "failed": 1},
        anomalies=[
            {"kind": "unknown_custom_id", "custom_id": "bd-9-1"},
            {
                "kind": "counts_disagree",
                "provider_counts": {"completed": 3},
                "lines_in_files": {"succeeded": 2},
            },
            {"kind": "unreadable_line", "line": 7, "problem": "not JSON", "text": XSS},
        ],
    )


def test_the_job_page_shows_cost_and_submissions_with_anomalies(client, owner, job, submission):
    approved = ItemFactory(job=job, approved=True)
    approved.approved_version = add_version(approved)
    approved.save()
    rejected = ItemFactory(job=job, state=ItemState.REJECTED)
    add_version(rejected)
    client.force_login(owner)
    response = client.get(reverse("job_detail", args=[job.pk]))
    html = response.content.decode()
    cost = response.context["cost"]
    assert cost["total"] == cost["approved"] + cost["wasted"] > 0
    assert f'<dd class="num">{money(cost["wasted"], cost["currency"])}</dd>' in html
    assert "batch_xyz" in html and "in_progress" in html
    assert all(count in html for count in ("total 4", "completed 3", "failed 1"))
    assert '<details class="anomalies"' in html and "3 anomalies" in html
    assert "<strong>unknown_custom_id</strong>: custom_id: bd-9-1" in html
    assert "provider_counts: {&quot;completed&quot;: 3}" in html
    assert "<script>alert" not in html and "text: &lt;script&gt;" in html


def many_submissions(job, n: int, *, open_every: int = 1) -> list[Submission]:
    return Submission.objects.bulk_create(
        Submission(
            job=job,
            provider="emulator",
            model="gpt-4o-mini",
            intent_key=f"bd_many_{number}",
            provider_ref=f"batch_{number:03d}",
            state=SubmissionState.OPEN if number % open_every == 0 else SubmissionState.COLLECTED,
        )
        for number in range(n)
    )


def test_the_job_page_shows_its_submissions_a_page_at_a_time(client, operator, job):
    """A job of a million items has thousands of submissions: a page of them, their count, and links
    through the rest; cancelling still counts every running one."""
    per_page = SUBMISSIONS_PER_PAGE
    made = many_submissions(job, 2 * per_page + 3, open_every=2)
    ItemFactory(job=job, submitted=True)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    client.force_login(operator)
    url = reverse("job_detail", args=[job.pk])
    first = client.get(url)
    html = first.content.decode()
    shown = [row.submission.pk for row in first.context["submissions"]]
    assert shown == [s.pk for s in made[:per_page]]
    assert f"{len(made)} batches" in html and made[per_page - 1].provider_ref in html
    assert made[per_page].provider_ref not in html
    # Every open one, not only those on the page.
    assert first.context["cancel"]["batches"] == sum(s.state == SubmissionState.OPEN for s in made)
    following = first.context["submissions_page"].next_page
    second = client.get(url, {"submissions_page": following, "state": ItemState.SUBMITTED})
    assert [row.submission.pk for row in second.context["submissions"]] == [
        s.pk for s in made[per_page : 2 * per_page]
    ]
    assert len(second.context["page"].object_list) == 1  # the items' filter is kept
    # The progress panel polls its own address, on the same page of submissions.
    assert 'hx-get="' + url + "?submissions_page=" in second.content.decode()
    poll = client.get(
        url, {"submissions_page": following}, headers={"HX-Request": "true", "HX-Target": "job-progress"}
    )
    assert made[per_page].provider_ref in poll.content.decode()
    assert made[0].provider_ref not in poll.content.decode()
    last = client.get(url, {"submissions_page": "last"})
    assert [row.submission.pk for row in last.context["submissions"]] == [s.pk for s in made[-per_page:]]
    assert client.get(url, {"submissions_page": "junk"}).context["submissions"][0].submission.pk == made[0].pk


def test_the_job_page_finds_items_by_sku_through_the_catalogue_s_index(client, owner, job, monkeypatch):
    """A SKU filter on a million-item job: the products through the SKU's trigram index, then the
    job's items of them; the same items as a plain filter on the join."""
    from review import search as searching

    searching.forget_sample()
    monkeypatch.setattr(searching, "WALK_ROWS", 0)  # never the plain filter, however common
    for sku in ("ASH-1", "ASH-22", "OAK-1"):
        ItemFactory(job=job, product__sku=sku, awaiting_review=True)
    ItemFactory(product__sku="ASH-3", awaiting_review=True)  # of another job
    client.force_login(owner)
    url = reverse("job_detail", args=[job.pk])

    def skus(**params) -> list[str]:
        return [i.product.sku for i in client.get(url, params).context["page"]]

    assert skus(sku="ash") == ["ASH-1", "ASH-22"]
    assert skus(sku="SH-2") == ["ASH-22"]
    assert skus(sku="ash", state=ItemState.DEAD_LETTER) == []
    assert skus(sku="nothing") == []
    if connection.vendor == "postgresql":
        monkeypatch.setattr("review.jobs.SKU_PRODUCTS_CAP", 1)
        capped = client.get(url, {"sku": "ash"})
        # One product of three is looked at, in the index's order: this job's (one item) or not (none).
        assert len(capped.context["page"].object_list) <= 1 and capped.context["sku_capped"]
        assert "among the first 1 products found whose SKU contains it" in capped.content.decode()
    searching.forget_sample()


def test_the_job_page_filters_and_paginates(client, owner, job):
    ItemFactory(job=job, product__sku="ASH-1", state=ItemState.DEAD_LETTER, reason="Gave up")
    ItemFactory.create_batch(51, job=job, awaiting_review=True)
    client.force_login(owner)
    url = reverse("job_detail", args=[job.pk])
    assert len(client.get(url).context["page"].object_list) == 50
    second = client.get(url, {"page": 2})
    assert len(second.context["page"].object_list) == 2 and "Page 2 of 2" in second.content.decode()
    dead = client.get(url, {"state": ItemState.DEAD_LETTER})
    assert [i.product.sku for i in dead.context["page"]] == ["ASH-1"] and "Gave up" in dead.content.decode()
    assert [i.product.sku for i in client.get(url, {"sku": "ash"}).context["page"]] == ["ASH-1"]
    reviewing = client.get(url, {"state": ItemState.AWAITING_REVIEW, "page": 2})
    assert len(reviewing.context["page"].object_list) == 1
    assert "51 items match." in reviewing.content.decode()


def test_the_job_page_query_count_does_not_grow_with_items(
    client, owner, job, submission, django_assert_max_num_queries
):
    def add_items(n: int) -> None:
        for number, item in enumerate(ItemFactory.create_batch(n, job=job, awaiting_review=True)):
            add_version(item)
            if number % 3 == 0:
                add_version(item)
        ItemFactory.create_batch(n, job=job, submitted=True)

    Submission.objects.create(job=job, provider="emulator", model="m", intent_key="bd_other")
    client.force_login(owner)
    url = reverse("job_detail", args=[job.pk])
    add_items(2)
    searched = {"state": ItemState.AWAITING_REVIEW, "sku": "SKU", "page": 2}
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    # A SKU search is counted (up to a cap) where the other lists read the tallies: one query more.
    with CaptureQueriesContext(connection) as few_searched:
        client.get(url, searched)
    add_items(60)
    with django_assert_max_num_queries(len(few)):
        assert len(client.get(url).context["page"].object_list) == 50
    with django_assert_max_num_queries(len(few_searched)):
        client.get(url, searched)
    for panel in ("job-progress", "job-cost"):
        with django_assert_max_num_queries(len(few)):
            client.get(url, headers={"HX-Request": "true", "HX-Target": panel})


def test_the_job_progress_refreshes_itself_while_the_job_works(client, owner, job):
    ItemFactory(job=job, submitted=True)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    client.force_login(owner)
    url = reverse("job_detail", args=[job.pk])
    page = client.get(url).content.decode()
    assert f'hx-get="{url}" hx-trigger="every 2s"' in page
    assert f'hx-get="{url}" hx-trigger="every 10s"' in page
    poll = {"HX-Request": "true", "HX-Target": "job-progress"}
    partial = client.get(url, headers=poll)
    html = partial.content.decode()
    assert partial.status_code == 200 and html.lstrip().startswith('<div id="job-progress"')
    assert "<html" not in html and 'data-testid="items"' not in html and 'id="job-cost"' not in html
    assert 'title="Sent to the provider; waiting for its result: 1"' in html
    Job.objects.filter(pk=job.pk).update(state=JobState.IN_REVIEW)
    stopped = client.get(url, headers=poll)
    assert stopped.status_code == 286 and "hx-trigger" not in stopped.content.decode()
    assert "hx-trigger" not in client.get(url).content.decode()


def test_the_job_cost_refreshes_itself_while_the_job_works(client, owner, job):
    item = ItemFactory(job=job, awaiting_review=True)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    client.force_login(owner)
    url = reverse("job_detail", args=[job.pk])
    poll = {"HX-Request": "true", "HX-Target": "job-cost"}
    before = client.get(url, headers=poll)
    assert before.status_code == 200 and before.content.decode().lstrip().startswith('<section id="job-cost"')
    assert before.context["cost"]["total"] == 0
    add_version(item)
    after = client.get(url, headers=poll)
    assert after.context["cost"]["total"] > 0 and 'id="job-progress"' not in after.content.decode()
    Job.objects.filter(pk=job.pk).update(state=JobState.IN_REVIEW)
    assert client.get(url, headers=poll).status_code == 286


# --- cost per provider -------------------------------------------------------------------------


def test_the_estimate_of_a_model_without_a_price_says_so(client, owner, products):
    client.force_login(owner)
    response = client.post(reverse("job_start"), start(model="emulated-model"))
    assert response.status_code == 200
    estimate = response.context["estimate"]
    assert estimate.price is None and estimate.cost is None
    html = response.content.decode()
    assert (
        '<strong class="price-unknown" data-testid="price-unknown">price unknown for emulator/emulated-model</strong>'
        in html
    )
    assert "estimated-cost" not in html and "out per million tokens" not in html
    assert 'value="start"' in html  # it may still be started


def test_the_estimate_says_when_a_provider_has_no_batch_discount(client, owner, products, monkeypatch):
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", "test-token")
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", "test-account")
    client.force_login(owner)
    response = client.post(
        reverse("job_start"), start(provider="cloudflare", model="@cf/meta/llama-3.3-70b-instruct-fp8-fast")
    )
    assert response.status_code == 200, response.context["form"].errors
    html = response.content.decode()
    estimate = response.context["estimate"]
    assert estimate.cost == estimate.price.cost(estimate.input_tokens, estimate.output_tokens).quantize(
        Decimal("0.000001")
    )
    assert "no batch discount" in html and "Cloudflare states no batch discount: none is assumed." in html


def test_the_job_page_says_when_its_models_price_is_unknown(client, owner):
    job = JobFactory(model="emulated-model")
    add_version(ItemFactory(job=job, awaiting_review=True))
    client.force_login(owner)
    response = client.get(reverse("job_detail", args=[job.pk]))
    html = response.content.decode()
    assert (
        '<p class="price-unknown" data-testid="price-unknown">price unknown for emulator/emulated-model</p>'
        in html
    )
    assert "120 in, 60 out" in html and "Wasted</dt>" not in html


def test_the_job_page_shows_each_submission_in_the_providers_words_beside_its_state(
    client, owner, job, submission
):
    client.force_login(owner)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    row = re.search(rf'data-testid="submission-{submission.pk}">(.*?)</tr>', html, re.S).group(1)
    cells = re.findall(r'<td(?: data-testid="([a-z-]+)")?>(.*?)</td>', row, re.S)
    named = {name: " ".join(re.sub(r"<[^>]+>", " ", text).split()) for name, text in cells if name}
    assert list(named) == ["business-state", "provider-words", "collect-by"]  # side by side
    assert named["business-state"] == "Open Accepted by the provider; waiting for results"
    assert named["provider-words"] == "emulator said in_progress"
    assert "<q>in_progress</q>" in row


def test_the_job_page_says_until_when_a_submission_the_provider_refuses_is_asked_again(
    client, owner, job, submission
):
    since = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    Submission.objects.filter(pk=submission.pk).update(
        refusing_since=since, error="404: No batch found with id 'batch_1'."
    )
    client.force_login(owner)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    row = re.search(rf'data-testid="submission-{submission.pk}">(.*?)</tr>', html, re.S).group(1)
    refusing = re.search(r'data-testid="refusing">(.*?)</div>', row, re.S).group(1)
    assert refusing == (
        'Refused by the provider since <time datetime="2026-03-01T09:30:00+00:00">2026-03-01 09:30 UTC</time>: '
        'asked again until <time datetime="2026-03-02T09:30:00+00:00">2026-03-02 09:30 UTC</time>, '
        "then its unanswered requests fail for good."
    )
    assert "No batch found with id &#x27;batch_1&#x27;." in row  # the provider's words, escaped


def test_the_job_page_counts_apportioned_drafts(client, owner, job):
    version = add_version(ItemFactory(job=job, awaiting_review=True))
    version.usage = {"apportioned": True}
    version.save()
    client.force_login(owner)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert 'data-testid="apportioned-drafts">1 draft' in html


def test_the_item_page_marks_apportioned_usage_and_unknown_prices(client, owner):
    item = ItemFactory(job=JobFactory(model="emulated-model"), awaiting_review=True)
    shared, own = add_version(item), add_version(item)
    shared.usage = {"apportioned": True}
    shared.save()
    client.force_login(owner)
    html = client.get(reverse("item_detail", args=[item.pk])).content.decode()
    assert 'data-testid="apportioned-1"' in html and ">apportioned</span>" in html
    assert 'data-testid="apportioned-2"' not in html
    assert (
        f'<span data-testid="cost-{own.number}" class="price-unknown">price unknown for emulator/emulated-model</span>'
        in html
    )
