"""One intent, one job in a real browser (issue 18, point 5): a double click on Start, and Back then
Start, make one job and show it."""

import pytest
from django.urls import reverse
from playwright.sync_api import Error as PlaywrightError

from ledger.models import Job
from review.models import JobStartToken
from tests.factories import ProductFactory
from tests.review.browser import log_in

# live_server needs committed data; each test ends with a flush, after which migrate's post_migrate step puts the roles, prompt and schedule back, as in a deployment.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def products():
    return [ProductFactory(sku="K-1"), ProductFactory(sku="K-2")]


def to_the_confirm_step(page, live_server, owner) -> None:
    # Waits, not measures: a loaded machine may take a while to start a job.
    page.set_default_timeout(30_000)
    log_in(page, live_server, owner, then=reverse("job_start"))
    page.get_by_role("button", name="Estimate the cost").click()
    page.get_by_test_id("start-job").wait_for()


def is_start(request) -> bool:
    """A send of the start form that asks to start the job."""
    return (
        request.method == "POST"
        and request.url.endswith(reverse("job_start"))
        and "step=start" in (request.post_data or "")
    )


def start_posts(page) -> list[str]:
    """The bodies of the start form's sends that asked to start the job, as the browser sent them."""
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.post_data) if is_start(request) else None)
    return sent


def test_a_double_click_on_start_makes_one_job(page, live_server, owner, products):
    to_the_confirm_step(page, live_server, owner)
    # The first click's request reaches the server, which answers; the answer is held, so the browser
    # is still on the form when the second click comes, as a person's double click finds it.
    sent: list[str] = []
    answers: list = []

    def first_answer_held(route, request) -> None:
        if not is_start(request):
            route.continue_()
            return
        sent.append(request.post_data)
        if len(sent) == 1:
            answers.append(route.fetch(max_redirects=0))
        else:
            route.continue_()

    page.route(live_server.url + reverse("job_start"), first_answer_held)
    button = page.get_by_test_id("start-job")
    button.scroll_into_view_if_needed()
    box = button.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.click(x, y)
    for _ in range(1200):  # until the server has answered the first send (each turn lets Playwright work)
        if answers:
            break
        page.wait_for_timeout(25)
    assert answers and answers[0].status == 302  # the first send started the job
    page.mouse.click(x, y)
    for attempt in range(2):
        try:
            page.wait_for_url(f"{live_server.url}/jobs/*/")
            break
        except PlaywrightError as error:
            # The second click aborts the first send's navigation, whose answer is held: the wait may
            # meet that abort first (seen under load); the second send's navigation goes on.
            if "ERR_ABORTED" not in str(error) or attempt:
                raise
    page.wait_for_load_state()
    assert len(sent) == 2 and sent[0] == sent[1]  # the browser sent the same form twice
    job = Job.objects.get()
    assert page.url == live_server.url + reverse("job_detail", args=[job.pk])
    assert f"This form started job {job.reference} already" in page.get_by_test_id("messages").inner_text()
    assert JobStartToken.objects.get().job == job
    page.unroute_all(behavior="ignoreErrors")


def test_back_then_start_shows_the_same_job(page, live_server, owner, products):
    to_the_confirm_step(page, live_server, owner)
    sent = start_posts(page)
    page.get_by_test_id("start-job").click()
    page.wait_for_url(f"{live_server.url}/jobs/*/")
    job = Job.objects.get()

    page.go_back()
    page.get_by_test_id("start-job").click()
    page.wait_for_url(live_server.url + reverse("job_detail", args=[job.pk]))
    assert len(sent) == 2, sent
    assert Job.objects.count() == 1
    assert f"This form started job {job.reference} already" in page.get_by_test_id("messages").inner_text()
