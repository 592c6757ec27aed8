"""A job's state has one path (issue 26 point 2): `change_job_state` is the only code that writes it,
through `JOB_TRANSITIONS`, with the job's event and the reactions to the change; and the core verbs
know no pilot, budget, notice or lifecycle module (point 3): those hang on `actions.reactions`."""

import ast
import re
from pathlib import Path

import pytest

from ledger.actions.budgeting import pause
from ledger.actions.core import NotAllowed
from ledger.actions.job_states import change_job_state, refresh_job_state
from ledger.actions.jobs import resume_job
from ledger.actions.operating import cancel_job
from ledger.destinations import destination_for
from ledger.destinations.drilling import DrillingDestination
from ledger.models import Event, Job, JobNotification, PauseReason, Pilot
from ledger.states import JOB_TRANSITIONS, ItemState, JobState
from tests.factories import ItemFactory, JobFactory, UserFactory

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("ledger", "review", "batchdesk")
# The one writer of a job's state.
THE_VERB = ("ledger/actions/job_states.py", "change_job_state")


def production_modules():
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), path.read_text()


def root_name(node: ast.AST) -> str:
    """The name a chain of calls and attributes starts from: `Job` for `Job.objects.filter(...)`."""
    while isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def mentions_a_job(node: ast.AST) -> bool:
    return "job" in ast.unparse(node).lower()


class StateWrites(ast.NodeVisitor):
    """Every place that writes a job's state: `.update(state=…)` (or `.bulk_update`/`update_or_create`
    naming `state`) on a chain from `Job`, `Job(…, state=…)` or `Job.objects.create(…, state=…)`, an
    assignment to `<a job>.state`, `setattr(<a job>, "state", …)`; each with its enclosing function."""

    def __init__(self, path: str):
        self.path, self.function, self.found = path, "", []

    def visit_FunctionDef(self, node):
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def note(self, node: ast.AST) -> None:
        self.found.append((self.path, self.function, node.lineno, ast.unparse(node)[:120]))

    def visit_Call(self, node: ast.Call):
        names = {keyword.arg for keyword in node.keywords}
        func = node.func
        if isinstance(func, ast.Attribute) and root_name(func.value) == "Job":
            if func.attr in ("update", "create", "get_or_create", "update_or_create") and "state" in names:
                self.note(node)
            if func.attr in ("update_or_create", "get_or_create") and "state" in ast.unparse(node):
                self.note(node)
            if func.attr == "bulk_update" and "state" in ast.unparse(node.args[1:] + node.keywords):
                self.note(node)
        if isinstance(func, ast.Name) and func.id == "Job" and "state" in names:
            self.note(node)
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and mentions_a_job(node.args[0])
            and not (isinstance(node.args[1], ast.Constant) and node.args[1].value != "state")
        ):
            self.note(node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign):
        for target in node.targets:
            for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(each, ast.Attribute) and each.attr == "state" and mentions_a_job(each.value):
                    self.note(node)
        self.generic_visit(node)


def job_state_writes() -> list[tuple[str, str, int, str]]:
    found = []
    for path, source in production_modules():
        visitor = StateWrites(path)
        visitor.visit(ast.parse(source))
        found += visitor.found
        # Raw SQL that sets a job's state.
        for match in re.finditer(r"UPDATE\s+\"?ledger_job\"?\s+SET[^;\"']*\bstate\b", source, re.IGNORECASE):
            found.append((path, "", source.count("\n", 0, match.start()) + 1, match.group()))
    return found


def test_only_change_job_state_writes_a_jobs_state():
    writes = job_state_writes()
    assert {(path, function) for path, function, _, _ in writes} == {THE_VERB}, writes


def test_the_scan_finds_each_way_of_writing_a_jobs_state():
    """The scan above would see a second writer, whichever way it is written."""
    source = """
def elsewhere(job, job_id):
    Job.objects.filter(pk=job_id).update(state="running")
    Job.objects.select_for_update().filter(pk=job_id).update(state=new, updated_at=now)
    job.state = "paused"
    job.state, job.pause_reason = "paused", reason
    self.job.state = "running"
    setattr(job, "state", "completed")
    Job.objects.create(reference="x", state="running")
    Job(reference="x", state="running").save()
    Item.objects.filter(job=job).update(state="cancelled")  # an item's state: not a job's
    submission.state = "open"  # a unit's state: not a job's
"""
    visitor = StateWrites("somewhere.py")
    visitor.visit(ast.parse(source))
    assert len(visitor.found) == 8, visitor.found
    assert {function for _, function, _, _ in visitor.found} == {"elsewhere"}


# --- the table ---------------------------------------------------------------------------------------

ALL = list(JobState.values)
ALLOWED = [(a, b) for a in ALL for b in ALL if b in JOB_TRANSITIONS[a]]
REFUSED = [(a, b) for a in ALL for b in ALL if b not in JOB_TRANSITIONS[a]]


def test_the_table_names_every_state_and_a_cancelled_job_never_moves():
    assert set(JOB_TRANSITIONS) == set(ALL)
    assert all(set(nxt) <= set(ALL) and state not in nxt for state, nxt in JOB_TRANSITIONS.items())
    assert JOB_TRANSITIONS[JobState.CANCELLED] == frozenset()
    # Every job but a cancelled one may be cancelled or paused (a paused one only cancelled again).
    assert all(JobState.CANCELLED in JOB_TRANSITIONS[s] for s in ALL if s != JobState.CANCELLED)
    assert all(
        JobState.PAUSED in JOB_TRANSITIONS[s] for s in ALL if s not in (JobState.CANCELLED, JobState.PAUSED)
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("from_state", "to"), REFUSED)
def test_a_transition_the_table_does_not_allow_is_refused_and_changes_nothing(from_state, to):
    job = JobFactory(state=from_state, notify_url="https://receiver.example/hook")
    events, updated = Event.objects.count(), Job.objects.get(pk=job.pk).updated_at
    with pytest.raises(NotAllowed):
        change_job_state(job, to=to, reason="tried")
    assert job.state == from_state
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.updated_at) == (from_state, updated)
    assert Event.objects.count() == events
    assert not JobNotification.objects.filter(job=job).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("from_state", "to"), ALLOWED)
def test_an_allowed_transition_is_made_with_its_event_and_announced(from_state, to):
    actor = UserFactory()
    job = JobFactory(state=from_state, notify_url="https://receiver.example/hook")
    returned = change_job_state(job, to=to, actor=actor, reason="because", data={"n": 1})
    assert returned is job and job.state == to
    assert Job.objects.get(pk=job.pk).state == to
    event = Event.objects.filter(job=job, item=None, submission=None).get()
    assert (event.from_state, event.to_state, event.reason, event.data) == (
        from_state,
        to,
        "because",
        {"n": 1},
    )
    assert (event.actor, event.actor_name) == (actor, actor.get_username())
    assert list(JobNotification.objects.filter(job=job).values_list("event_type", flat=True)) == [f"job.{to}"]


# --- the verb ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_job_that_moved_since_it_was_read_is_not_changed():
    job = JobFactory(state=JobState.RUNNING)
    stale = Job.objects.get(pk=job.pk)
    change_job_state(job, to=JobState.IN_REVIEW)
    with pytest.raises(NotAllowed, match="no longer running"):
        change_job_state(stale, to=JobState.COMPLETED)
    assert Job.objects.get(pk=job.pk).state == JobState.IN_REVIEW
    assert Event.objects.filter(job=job).count() == 1


@pytest.mark.django_db
def test_expect_narrows_the_states_a_caller_moves_from():
    job = JobFactory(state=JobState.RUNNING)
    with pytest.raises(NotAllowed):
        change_job_state(job, to=JobState.PAUSED, expect=[JobState.IN_REVIEW])
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    change_job_state(
        job, to=JobState.PAUSED, expect=[JobState.RUNNING], pause_reason=PauseReason.BUDGET_REACHED
    )
    job.refresh_from_db()
    assert (job.state, job.pause_reason) == (JobState.PAUSED, PauseReason.BUDGET_REACHED)


@pytest.mark.django_db
def test_a_budget_pause_is_also_announced_as_the_budget_reached_a_billing_one_is_not():
    by_budget = JobFactory(state=JobState.RUNNING, notify_url="https://receiver.example/hook")
    by_billing = JobFactory(state=JobState.RUNNING, notify_url="https://receiver.example/hook")
    pause(by_budget, PauseReason.BUDGET_REACHED, "The next unit could cost up to 2.00 GBP")
    pause(by_billing, PauseReason.BILLING_REFUSED, "No credit")
    announced = JobNotification.objects.order_by("pk").values_list("job_id", "event_type")
    assert list(announced) == [
        (by_budget.pk, "job.paused"),
        (by_budget.pk, "job.budget_reached"),
        (by_billing.pk, "job.paused"),
    ]


@pytest.mark.django_db
def test_cancel_pause_resume_and_the_refresh_each_write_one_job_event_through_the_verb():
    owner = UserFactory()
    job = JobFactory(state=JobState.PREPARING, owner=owner)
    ItemFactory(job=job, state=ItemState.PREPARED)
    pause(job, PauseReason.BUDGET_REACHED, "Over budget")
    assert refresh_job_state(job.pk) == JobState.PAUSED  # nothing new is sent until someone acts
    assert resume_job(job.pk, actor=owner) == JobState.PREPARING  # resumed, then derived again
    assert cancel_job(job_id=job.pk, actor=owner)["from_state"] == JobState.PREPARING
    moves = Event.objects.filter(job=job, item=None).order_by("pk").values_list("from_state", "to_state")
    assert list(moves) == [
        (JobState.PREPARING, JobState.PAUSED),
        (JobState.PAUSED, JobState.RUNNING),
        (JobState.RUNNING, JobState.PREPARING),
        (JobState.PREPARING, JobState.CANCELLED),
    ]
    # A cancelled job stays so: the refresh leaves it, and nothing can move it.
    assert refresh_job_state(job.pk) == JobState.CANCELLED
    with pytest.raises(NotAllowed):
        resume_job(job.pk, actor=owner)


# --- the core verbs know no experiment or side effect -------------------------------------------------

CORE_VERBS = ("core.py", "job_states.py", "applying.py", "submitting.py")
KEPT_OUT = (
    "pilots",
    "budgets",
    "notifications",
    "notices",
    "deadlines",
    "provider_files",
    "lifecycle",
    "money",
)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(f"{node.module or ''}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("module", CORE_VERBS)
def test_a_core_verb_imports_no_pilot_budget_notice_or_lifecycle_module(module):
    imported = imported_modules(ROOT / "ledger" / "actions" / module)
    assert not {name for name in imported for part in name.split(".") if part in KEPT_OUT}, imported


@pytest.mark.django_db
def test_a_drilling_pilots_job_applies_through_the_drill_and_any_other_job_through_its_destination():
    plain = JobFactory(destination="catalogue")
    assert not isinstance(destination_for(plain), DrillingDestination)
    drilling = JobFactory(destination="catalogue")
    Pilot.objects.create(job=drilling, per_stratum=1, strata=["category"], seed=1, drill=True)
    drilling = Job.objects.select_related("pilot").get(pk=drilling.pk)
    wrapped = destination_for(drilling)
    assert isinstance(wrapped, DrillingDestination) and wrapped.name == destination_for(plain).name
