"""A self-hosted OpenAI-compatible server is a neighbour (issue 17, point 7): a rate limit slows
the unit down without failing any of its requests, and a refused key pauses the unit as a batch
provider's refusal does; so does a refusal every request meets alike, and a 429 is waited out as
long as a gateway in front says (issue 28, point 7). Against the server's emulator over real HTTP,
driven by the collector's own round as a worker would run it."""

import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.actions.collecting import collect_submission, observe_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.models import Item, Submission
from ledger.retrying import PERMANENT_REFUSAL_PATIENCE
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.api.conftest import ApiClient, token_for
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory, UserFactory
from tests.provider_emulators import BY_NAME, serving

pytestmark = pytest.mark.django_db

SERVER = BY_NAME["openai_compatible"]
KEY = SERVER.credentials["OPENAI_COMPATIBLE_API_KEY"]  # the key this deployment sends


@pytest.fixture
def server(settings, monkeypatch):
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    with serving(SERVER, settings, monkeypatch, seed=17) as running:
        yield running


def job_with_items(n: int):
    job = JobFactory(provider=SERVER.name, model=SERVER.model, unit_size=n)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def run_collector(job, *, until, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll_everything()
        counts = job.items.counts_by_state()
        if until(counts):
            return counts
        time.sleep(0.05)
    raise AssertionError(f"not settled: {job.items.counts_by_state()}")


def sent_and_asked_once(job) -> Submission:
    """The job's one unit, sent, and collected once (one round)."""
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    observe_submission(submission_id, provider=provider())
    collect_submission(submission_id)
    return Submission.objects.get(pk=submission_id)


def provider():
    from ledger.providers import get_provider

    return get_provider(SERVER.name)


def waiting_words(client, job, submission) -> dict[str, str]:
    """What the job page and the operations page say about why the unit waits."""
    said = {}
    for page in (reverse("job_detail", args=[job.pk]), reverse("operations")):
        html = client.get(page).content.decode()
        row = html.split(f'data-testid="submission-{submission.pk}">', 1)[1].split("</tr>", 1)[0]
        said[page] = row
    return said


def assert_no_attempt_spent(job) -> None:
    for item in job.items.all():
        assert (item.inference_attempt, item.inference_failures) == (1, 0)
        assert not item.events.filter(to_state=ItemState.INFERENCE_FAILED).exists()


def test_behind_a_server_allowing_two_requests_a_second_every_item_is_answered_and_no_attempt_spent(
    server,
):
    # The 3-a-minute server, scaled down: 429s that do not say how long to wait.
    server.configure(requests_per_window=2, window_ms=1_000, window_hint="none")
    job = job_with_items(12)

    counts = run_collector(job, until=lambda counts: set(counts) == {ItemState.AWAITING_REVIEW})

    assert counts == {ItemState.AWAITING_REVIEW: 12}
    assert_no_attempt_spent(job)
    assert Submission.objects.filter(job=job).count() == 1  # nothing was re-sent in a new unit
    stats = server.stats()
    assert sum(stats["inferences"].values()) == 12
    # Before: each 429 was retried after 1, 2 and 4 s, four calls an attempt, and a request that
    # never got through failed its item (three times, then a dead letter). Now the unit pauses
    # and slows down: fewer refused calls than items.
    assert 1 <= stats["rate_limited_calls"] < 12


def test_a_server_asking_for_an_hour_leaves_the_unit_waiting_in_the_ledger_not_failed(server, client):
    # One request an hour: the first is answered, the next is told to come back in an hour.
    server.configure(requests_per_window=1, window_ms=3_600_000, window_hint="retry-after")
    job = job_with_items(4)
    before = timezone.now()

    submission = sent_and_asked_once(job)

    assert submission.state == SubmissionState.ENDED
    assert before + timedelta(minutes=59) < submission.slowed_until <= timezone.now() + timedelta(hours=1)
    assert submission.claimed_until == submission.slowed_until  # no worker takes it before then
    assert submission.refusing_since is None
    assert job.items.counts_by_state() == {ItemState.AWAITING_REVIEW: 1, ItemState.SUBMITTED: 3}
    assert_no_attempt_spent(job)
    calls = len(server.stats()["completion_calls"])
    assert calls == 3  # the first answered, then the two it let go at once told to wait
    for _ in range(3):
        poll_everything()
    assert len(server.stats()["completion_calls"]) == calls  # the rounds leave it waiting

    client.force_login(UserFactory(roles=["operator"]))
    for page, row in waiting_words(client, job, submission).items():
        assert "The server asks us to slow down until" in row, page
        assert "none of them has failed" in row
    api = ApiClient(token_for(UserFactory(roles=["operator"])))
    [shown] = api.get(f"/api/jobs/{job.pk}").json()["submissions"]
    assert shown["slowed_until"] is not None

    # The hour has passed (and the server's window with it).
    server.configure(requests_per_window=0)
    Submission.objects.filter(pk=submission.pk).update(claimed_until=None, slowed_until=timezone.now())
    run_collector(job, until=lambda counts: counts == {ItemState.AWAITING_REVIEW: 4})

    submission.refresh_from_db()
    assert (submission.state, submission.slowed_until, submission.error) == (
        SubmissionState.COLLECTED,
        None,
        "",
    )
    assert_no_attempt_spent(job)


def test_a_refused_key_pauses_the_unit_and_a_key_fixed_within_the_day_resumes_it(server, client):
    server.configure(api_key="rotated-at-the-server")
    job = job_with_items(5)

    submission = sent_and_asked_once(job)
    collect_submission(submission.pk)  # asked again, round after round, within the day

    submission.refresh_from_db()
    assert submission.state == SubmissionState.ENDED
    assert submission.refusing_since is not None
    assert submission.gives_up_at == submission.refusing_since + PERMANENT_REFUSAL_PATIENCE
    assert submission.error.startswith("The server refuses our key: POST /chat/completions answered 401")
    assert KEY not in submission.error
    assert job.items.counts_by_state() == {ItemState.SUBMITTED: 5}  # none failed
    assert_no_attempt_spent(job)
    assert server.stats()["refused_keys"] == 2  # one call a round tells, not one per request
    client.force_login(UserFactory(roles=["operator"]))
    for page, row in waiting_words(client, job, submission).items():
        assert "The server refuses our key since" in row, page

    server.configure(api_key=KEY)  # the key is put right, within the day
    run_collector(job, until=lambda counts: counts == {ItemState.AWAITING_REVIEW: 5})

    submission.refresh_from_db()
    assert (submission.state, submission.refusing_since, submission.error) == (
        SubmissionState.COLLECTED,
        None,
        "",
    )
    assert_no_attempt_spent(job)
    assert server.stats()["inferences"] == {item.custom_id: 1 for item in job.items.all()}


def test_a_refusal_every_request_meets_alike_pauses_the_unit_and_a_server_put_right_resumes_it(
    server, client
):
    # A LiteLLM proxy without a database answers a key it cannot check 400 "No connected db.".
    server.configure(every_request_refused="No connected db.")
    job = job_with_items(6)

    submission = sent_and_asked_once(job)
    collect_submission(submission.pk)  # asked again, round after round, within the day

    submission.refresh_from_db()
    assert submission.state == SubmissionState.ENDED
    assert submission.refusing_since is not None
    assert submission.gives_up_at == submission.refusing_since + PERMANENT_REFUSAL_PATIENCE
    assert submission.error == (
        "The server refuses our requests: No connected db. "
        "(POST /chat/completions answered 400 to 3 requests in a row)"
    )
    assert job.items.counts_by_state() == {ItemState.SUBMITTED: 6}  # none failed
    assert_no_attempt_spent(job)
    # Each round stops at the third refusal alike (at most one more was on its way).
    assert 6 <= server.stats()["refused_requests"] <= 8
    client.force_login(UserFactory(roles=["operator"]))
    when = timezone.localtime(submission.refusing_since)
    for page, row in waiting_words(client, job, submission).items():
        assert "The server refuses our requests since " in row, page
        assert ": No connected db. (POST /chat/completions answered 400 to 3 requests in a row);" in row
        assert f"{when:%H:%M}" in row.split("The server refuses our requests since ", 1)[1][:40]
    api = ApiClient(token_for(UserFactory(roles=["operator"])))
    [shown] = api.get(f"/api/jobs/{job.pk}").json()["submissions"]
    assert shown["refusing_since"] is not None and "No connected db." in shown["error"]

    server.configure(every_request_refused=None)  # the gateway gets its database, within the day
    run_collector(job, until=lambda counts: counts == {ItemState.AWAITING_REVIEW: 6})

    submission.refresh_from_db()
    assert (submission.state, submission.refusing_since, submission.error) == (
        SubmissionState.COLLECTED,
        None,
        "",
    )
    assert_no_attempt_spent(job)
    assert server.stats()["inferences"] == {item.custom_id: 1 for item in job.items.all()}


def test_one_request_refused_among_answers_fails_that_item_alone_for_good(server):
    job = job_with_items(6)
    first, *others = job.items.order_by("pk")
    # The first request asked: refused before any other answer has arrived.
    server.configure(too_long_requests=[first.custom_id])

    run_collector(
        job, until=lambda counts: counts == {ItemState.AWAITING_REVIEW: 5, ItemState.INFERENCE_FAILED: 1}
    )

    first.refresh_from_db()
    assert first.state == ItemState.INFERENCE_FAILED
    assert first.reason_code == ReasonCode.REQUEST_INVALID
    assert "maximum context length is 2048 tokens" in first.reason
    [failure] = first.events.filter(to_state=ItemState.INFERENCE_FAILED)
    assert failure.data["transient"] is False
    [submission] = Submission.objects.filter(job=job)
    assert (submission.state, submission.refusing_since) == (SubmissionState.COLLECTED, None)
    assert server.stats()["inferences"] == {item.custom_id: 1 for item in others}
    # Permanent (rule 8): nothing asks for it again by itself.
    for _ in range(3):
        poll_everything()
    asked = [call["custom_id"] for call in server.stats()["completion_calls"]]
    assert asked.count(first.custom_id) == 1


def test_a_429_is_waited_out_as_long_as_the_gateway_passes_on_not_a_guessed_second(server):
    # LiteLLM passes on its provider's Retry-After as `llm_provider-retry-after`, and says nothing
    # itself: one request in any two seconds, the next told to come back in 2 s.
    server.configure(requests_per_window=1, window_ms=2_000, window_hint="llm_provider-retry-after")
    job = job_with_items(2)

    run_collector(job, until=lambda counts: counts == {ItemState.AWAITING_REVIEW: 2})

    calls = server.stats()["completion_calls"]
    assert [call["rate_limited"] for call in calls] == [False, True, False]  # one 429, not a storm
    told, again = calls[1], calls[2]
    assert told["retry_at"] == told["at"] + 2
    # Asked again when the gateway said, not after the 1 s guessed when a 429 says nothing.
    assert again["custom_id"] == told["custom_id"] and again["at"] >= told["retry_at"]
    assert_no_attempt_spent(job)


@pytest.mark.parametrize(
    ("refusing", "words"),
    [
        ({"api_key": "rotated-at-the-server"}, "The server refuses our key"),
        ({"every_request_refused": "No connected db."}, "The server refuses our requests: No connected db."),
    ],
)
def test_a_refusal_longer_than_the_patience_fails_the_unanswered_requests_for_good(server, refusing, words):
    server.configure(**refusing)
    job = job_with_items(3)
    submission = sent_and_asked_once(job)
    assert submission.refusing_since is not None

    # A day later, still refused.
    Submission.objects.filter(pk=submission.pk).update(
        refusing_since=submission.refusing_since - PERMANENT_REFUSAL_PATIENCE - timedelta(minutes=1),
        claimed_until=None,
    )
    assert collect_submission(submission.pk) == "collected"

    submission.refresh_from_db()
    assert (submission.state, submission.unanswered_reason) == (
        SubmissionState.COLLECTED,
        ReasonCode.RESULTS_UNAVAILABLE,
    )
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}
    for item in job.items.all():
        assert item.reason_code == ReasonCode.RESULTS_UNAVAILABLE
        assert words in item.reason and KEY not in item.reason
        [failure] = item.events.filter(to_state=ItemState.INFERENCE_FAILED)
        assert failure.data["transient"] is False
    assert server.stats()["inferences"] == {}
    # Permanent (rule 8): a server put right later is sent nothing by itself; an operator may retry.
    server.configure(api_key=KEY, every_request_refused=None)
    for _ in range(3):
        poll_everything()
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}
    assert server.stats()["inferences"] == {}
