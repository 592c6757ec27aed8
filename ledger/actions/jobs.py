"""Jobs: freezing a set of items, and whether an item's draft is still for its product's current
revision (withdrawn or obsolete items move out of the way; the current revision is queued)."""

from dataclasses import dataclass, replace
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ..database.setwise import among, insert_from_select, insert_select_sql
from ..database.table_statistics import analyse_after_bulk_change
from ..destinations import destination_names
from ..models import (
    DEFAULT_DESTINATION,
    MAX_NAMED_SKUS,
    Event,
    Item,
    Job,
    PauseReason,
    Pilot,
    Product,
    ProductStatus,
    PromptVersion,
    Submission,
    no_prompt_for_job,
)
from ..money.budgets import budget_problem, committed
from ..money.currency import business_currency
from ..pilots.drill import plan_drill
from ..pilots.sample import PilotPlan, SampleRefused, record_sample, sampled_products_sql, unknown_fields
from ..providers import capabilities, default_model, default_unit_size, provider_names
from ..providers.model_names import model_name_problem
from ..states import STOPS, ItemState, JobState, SubmissionState
from .core import NotAllowed, actor_name, change_state, enqueue
from .job_states import change_job_state, refresh_job_state
from .reactions import ON_JOB_STATE, react


def create_job(
    *,
    reference: str,
    owner,
    task: str,
    provider: str,
    model: str | None = None,
    prompt_version: int | None = None,
    destination: str = DEFAULT_DESTINATION,
    skus: list[str] | None = None,
    unit_size: int | None = None,
    budget: Decimal | None = None,
    pilot: PilotPlan | None = None,
    notify_url: str = "",
    leaving_out_approved_in: int | None = None,
) -> Job:
    """Freeze the set of items (each product's current revision) and queue their submission. No
    model or unit size: the provider's default model, and the usual size within its limit. No prompt
    version: the task's current one. A `pilot`: the items are a stratified sample of those products
    (`ledger.pilots.sample`), recorded with the job. A `notify_url` is told of the job's events
    (`ledger.notices.notifications`; the forms check the address). `leaving_out_approved_in`, a job's
    id: the products whose draft approved in that job stands are left out (`Item.objects.approved_products`,
    the rule the pilot decision counts them by; a pilot's full job: nobody pays twice for a product)."""
    if provider not in provider_names():
        raise NotAllowed(f"Unknown provider {provider!r}; known: {', '.join(provider_names())}")
    if destination not in destination_names():
        raise NotAllowed(f"Unknown destination {destination!r}; known: {', '.join(destination_names())}")
    model = model or default_model(provider)
    if problem := model_name_problem(provider, model):
        raise NotAllowed(problem)
    unit_size = unit_size or default_unit_size(provider)
    limit = capabilities(provider).max_requests
    if not 1 <= unit_size <= limit:
        raise NotAllowed(f"unit_size must be between 1 and {limit:,} ({provider}'s limit for one batch)")
    prompt = PromptVersion.objects.for_job(task, prompt_version)
    if prompt is None:
        raise NotAllowed(no_prompt_for_job(task, prompt_version))
    if budget is not None and (problem := budget_problem(budget, provider, model)):
        raise NotAllowed(problem)
    # Written set-wise by the database: however many products, nothing per item passes through Python.
    products_sql = f"{Product._meta.db_table} WHERE status = %s"
    products_params: list = [ProductStatus.ACTIVE]
    if skus is not None:
        wanted = sorted(set(skus))
        if len(wanted) > MAX_NAMED_SKUS:
            raise NotAllowed(f"{len(wanted):,} SKUs named; at most {MAX_NAMED_SKUS:,}")
        found = Product.objects.filter(status=ProductStatus.ACTIVE, sku__in=wanted).values_list(
            "sku", flat=True
        )
        missing = set(wanted) - set(found)
        if missing:
            raise NotAllowed(f"Not active products or unknown SKUs: {', '.join(sorted(missing))}")
        products_sql += f" AND sku IN ({', '.join(['%s'] * len(wanted))})" if wanted else " AND 1 = 0"
        products_params += wanted
    if leaving_out_approved_in is not None:
        approved_sql, approved_params = (
            Item.objects.filter(job_id=leaving_out_approved_in).approved_products().query.sql_with_params()
        )
        products_sql += f" AND id NOT IN ({approved_sql})"
        products_params += approved_params
    if pilot is not None:  # the scope its sample is drawn from
        scope = Product.objects.filter(status=ProductStatus.ACTIVE)
        if skus is not None:
            scope = scope.filter(among("sku", wanted))
        if unknown := unknown_fields(pilot.strata, scope):
            raise NotAllowed(f"No product to work on has the field {', '.join(map(repr, unknown))}")
    with transaction.atomic():
        if Job.objects.filter(reference=reference).exists():
            raise NotAllowed(f"A job with reference {reference!r} exists already")
        job = Job.objects.create(
            reference=reference,
            owner=owner,
            task=task,
            prompt_version=prompt,
            provider=provider,
            model=model,
            destination=destination,
            unit_size=unit_size,
            budget=budget,
            budget_currency=business_currency() if budget is not None else "",
            notify_url=notify_url,
        )
        if pilot is not None:
            try:
                drawn = record_sample(
                    job=job, plan=pilot, scope=scope, scope_skus=wanted if skus is not None else None
                )
            except SampleRefused as refusal:
                raise NotAllowed(str(refusal)) from None
            if pilot.drill:
                plan_drill(drawn)
            products_sql, products_params = sampled_products_sql(drawn)
        # Items in SKU order, as the catalogue lists them, and each item's event, in the items' order.
        items = {
            "select": {"product": "id", "source_revision": "current_revision_id"},
            "values": {"job": job},
            "from_sql": f"{products_sql} ORDER BY sku",
            "params": products_params,
        }
        events = {
            "select": {"item": "id"},
            "values": {
                "job": job,
                "to_state": ItemState.PREPARED,
                "actor": owner,
                "actor_name": actor_name(owner),
            },
        }
        if connection.vendor == "postgresql":
            # One statement: the events are written from the rows the items' INSERT returns, in the
            # order it wrote them (ids given in SKU order), without reading the items back or sorting.
            new_items = insert_select_sql(Item, **items, returning=["id"])
            written = insert_from_select(
                Event, **events, from_sql="new_items", with_={"new_items": new_items}
            )
        else:  # SQLite, the demo's database, writes no rows from a WITH clause
            written = insert_from_select(Item, **items)
            events_from = f"{Item._meta.db_table} WHERE job_id = %s ORDER BY id"
            insert_from_select(Event, **events, from_sql=events_from, params=[job.pk])
        if not written:
            raise NotAllowed("No active products to work on")
        Event.objects.create(job=job, to_state=JobState.PREPARING, actor=owner, actor_name=actor_name(owner))
        react(ON_JOB_STATE, job, JobState.PREPARING)
        enqueue("ledger.tasks.submit_job", job.pk)
    analyse_after_bulk_change({Item: written, Event: written})
    return job


def queue_current_revision(item: Item) -> Item | None:
    """The item's draft is for an old revision: add the product's current revision to the job
    (unless the job was cancelled: then nothing more of it is sent)."""
    product = Product.objects.get(pk=item.product_id)
    if product.status != ProductStatus.ACTIVE or product.current_revision_id == item.source_revision_id:
        return None
    if Job.objects.filter(pk=item.job_id, state=JobState.CANCELLED).exists():
        return None
    new_item, created = Item.objects.get_or_create(
        job_id=item.job_id, source_revision_id=product.current_revision_id, defaults={"product": product}
    )
    if created:
        Event.objects.create(
            item=new_item,
            job_id=item.job_id,
            to_state=ItemState.PREPARED,
            reason=f"Product revised; replaces item {item.pk}",
        )
        enqueue("ledger.tasks.submit_job", item.job_id)
    return new_item


def currency_problem(item: Item, *, product: Product | None = None) -> str | None:
    """`withdrawn` or `obsolete` when the item's draft may no longer be published; else None.
    A screen listing many items passes each one's product, loaded with it, to save a query each."""
    product = product or Product.objects.get(pk=item.product_id)
    if product.status == ProductStatus.WITHDRAWN:
        return ItemState.WITHDRAWN
    if product.current_revision_id != item.source_revision_id:
        return ItemState.OBSOLETE
    return None


def judge_currency(item: Item, *, actor=None) -> str | None:
    """Withdrawn or revised product? Move the item out of the way and say why; else None."""
    # One transaction: an obsolete item and its replacement are recorded together or not at all.
    with transaction.atomic():
        problem = currency_problem(item)
        if problem:
            stop = STOPS[problem]
            change_state(item.pk, to=problem, actor=actor, reason=stop.event, code=stop.code)
            if problem == ItemState.OBSOLETE:
                queue_current_revision(item)
    return problem


@dataclass(frozen=True)
class Arm:
    """What one more arm of a pilot changes from the first: its provider, model or prompt version."""

    provider: str | None = None
    model: str | None = None
    prompt_version: int | None = None


MAX_ARMS = 4


def create_pilot_arms(*, reference: str, pilot: PilotPlan, arms: list[Arm], **job_fields) -> list[Job]:
    """A pilot of several arms (issue 19): one job per arm over the same scope and seed, each drawing
    its share of every stratum's sample (`PilotPlan.arm`), or, with `pilot.same_sample`, the whole sample
    (the same products, for a blind comparison), in one transaction: the first arm is the job
    named `reference`, arm k is `reference-arm-k`. An arm that leaves a setting out takes the first
    arm's (a provider named anew takes its own default model)."""
    if not 1 <= len(arms) < MAX_ARMS:
        raise NotAllowed(f"A pilot has 2 to {MAX_ARMS} arms: name 1 to {MAX_ARMS - 1} besides the job itself")
    count = len(arms) + 1
    with transaction.atomic():
        first = create_job(reference=reference, pilot=replace(pilot, arm=1, arms=count), **job_fields)
        jobs = [first]
        for number, arm in enumerate(arms, start=2):
            fields = dict(job_fields)
            if arm.provider is not None and arm.provider != first.provider:
                fields.update(provider=arm.provider, model=arm.model)
            elif arm.model is not None:
                fields.update(provider=first.provider, model=arm.model)
            else:
                fields.update(provider=first.provider, model=first.model)
            if arm.prompt_version is not None:
                fields["prompt_version"] = arm.prompt_version
            else:
                fields["prompt_version"] = first.prompt_version.version
            jobs.append(
                create_job(
                    reference=f"{reference}-arm-{number}",
                    pilot=replace(pilot, arm=number, arms=count),
                    **fields,
                )
            )
        Pilot.objects.filter(job__in=jobs[1:]).update(first_arm=Pilot.objects.get(job=first))
    return jobs


def set_budget(job_id: int, budget: Decimal, *, actor) -> Job:
    """Give the job a budget (or a new one) in the business currency. It may not be below what the
    job has spent and holds already. A job paused by its budget goes on (`resume_job`); whether the
    next unit fits is judged when it is sent."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == JobState.CANCELLED:
            raise NotAllowed("The job is cancelled")
        if problem := budget_problem(budget, job.provider, job.model):
            raise NotAllowed(problem)
        held = committed(job.pk)
        if budget < held:
            raise NotAllowed(
                f"The job has already spent or holds {held} {business_currency()}: the budget can be no lower"
            )
        Job.objects.filter(pk=job.pk).update(
            budget=budget, budget_currency=business_currency(), updated_at=timezone.now()
        )
        Event.objects.create(
            job=job,
            from_state=job.state,
            to_state=job.state,
            actor=actor,
            actor_name=actor_name(actor),
            reason=f"Budget set to {budget} {business_currency()}",
            data={"budget": str(budget), "was": str(job.budget) if job.budget is not None else None},
        )
    if job.state == JobState.PAUSED and job.pause_reason == PauseReason.BUDGET_REACHED:
        resume_job(job.pk, actor=actor)
    job.refresh_from_db()
    return job


def resume_job(job_id: int, *, actor) -> str:
    """A paused job goes on: its units waiting to be sent are sent by the next pass (each checked
    against the budget again). NotAllowed when the job is not paused."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.PAUSED:
            raise NotAllowed(f"The job is {job.state}, not paused")
        go_on(job, actor=actor, reason="Resumed")
    return refresh_job_state(job_id)


def go_on(job: Job, *, actor, reason: str, data: dict | None = None) -> None:
    """The paused `job` (read locked, in the caller's transaction) runs again, and its units waiting
    to be sent are sent by the next pass."""
    change_job_state(
        job, to=JobState.RUNNING, actor=actor, reason=reason, data=data, pause_reason="", pause_detail=""
    )
    # Sent by the next pass rather than waiting out a claim taken before the pause.
    Submission.objects.filter(job=job, state=SubmissionState.INTENT).filter(
        Q(claimed_until__isnull=False)
    ).update(claimed_until=None)
    enqueue("ledger.tasks.submit_job", job.pk)
