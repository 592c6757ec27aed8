"""An item's, an event's and a unit entry's references are checked by the database once per statement
(migrations 0015 and 0053; migrations 0021 and 0051 plan each check for the statement's size), as strictly
as the per-row foreign keys they replace: a statement with one wrong reference is refused whole, with
SQLSTATE 23503 (an IntegrityError), and changes nothing."""

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.actions.jobs import create_job
from ledger.models import Event, GeneratedVersion, Item, Submission, SubmissionItem
from ledger.states import ItemState, SubmissionState
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only]  # SQLite, the demo's, checks nothing here

MISSING = 987_654_321


def refused(sql: str, params: list) -> str:
    with pytest.raises(IntegrityError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    return str(caught.value)


def insert_item(**columns) -> str:
    names = ", ".join(columns)
    return refused(
        f"INSERT INTO ledger_item ({names}, state, reason, reason_code, inference_attempt, "
        "inference_failures, apply_failures, created_at, updated_at) "
        f"SELECT {', '.join(['%s'] * len(columns))}, 'prepared', '', '', 1, 0, 0, now(), now()",
        list(columns.values()),
    )


def test_an_item_must_name_a_job_and_a_revision_of_its_own_product():
    item = ItemFactory()
    other = ProductFactory()
    before = Item.objects.count()

    assert "refers to" in insert_item(
        job_id=MISSING, product_id=item.product_id, source_revision_id=other.current_revision_id
    )
    assert "refers to" in insert_item(
        job_id=item.job_id, product_id=item.product_id, source_revision_id=MISSING
    )
    # A revision that exists, of another product.
    assert "refers to" in insert_item(
        job_id=item.job_id, product_id=item.product_id, source_revision_id=other.current_revision_id
    )
    assert Item.objects.count() == before


def test_one_wrong_row_refuses_the_whole_statement():
    job = JobFactory()
    products = [ProductFactory() for _ in range(3)]
    rows = [(job.pk, p.pk, p.current_revision_id) for p in products] + [(job.pk, products[0].pk, MISSING)]
    values = ", ".join("(%s, %s, %s, 'prepared', '', '', 1, 0, 0, now(), now())" for _ in rows)

    refused(
        "INSERT INTO ledger_item (job_id, product_id, source_revision_id, state, reason, reason_code, "
        f"inference_attempt, inference_failures, apply_failures, created_at, updated_at) VALUES {values}",
        [value for row in rows for value in row],
    )

    assert not Item.objects.filter(job=job).exists()


def test_an_item_approves_only_its_own_draft_and_joins_only_its_own_jobs_submission():
    item, other = ItemFactory(), ItemFactory()
    foreign_draft = add_version(other)
    foreign_submission = Submission.objects.create(
        job=other.job, provider="emulator", state=SubmissionState.INTENT
    )

    refused("UPDATE ledger_item SET approved_version_id = %s WHERE id = %s", [foreign_draft.pk, item.pk])
    refused("UPDATE ledger_item SET approved_version_id = %s WHERE id = %s", [MISSING, item.pk])
    refused("UPDATE ledger_item SET submission_id = %s WHERE id = %s", [foreign_submission.pk, item.pk])
    refused("UPDATE ledger_item SET job_id = %s WHERE id = %s", [other.job_id, item.pk])

    own = add_version(item)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_item SET approved_version_id = %s WHERE id = %s", [own.pk, item.pk])
    item.refresh_from_db()
    assert item.approved_version_id == own.pk and item.submission_id is None and item.job_id != other.job_id


def test_an_event_must_name_things_that_exist_and_an_item_of_its_own_job():
    item, other = ItemFactory(), ItemFactory()
    before = Event.objects.count()
    insert = (
        "INSERT INTO ledger_event (item_id, job_id, submission_id, actor_id, from_state, to_state, actor_name, "
        "reason, data, at) VALUES (%s, %s, %s, %s, '', 'prepared', 'system', '', '{}', now())"
    )

    refused(insert, [MISSING, item.job_id, None, None])
    refused(insert, [item.pk, other.job_id, None, None])
    refused(insert, [None, MISSING, None, None])
    refused(insert, [item.pk, item.job_id, MISSING, None])
    refused(insert, [item.pk, item.job_id, None, MISSING])

    assert Event.objects.count() == before


def test_a_job_of_many_items_passes_the_checks_with_every_reference_right():
    owner = UserFactory(roles=["catalogue_owner"])
    products = [ProductFactory() for _ in range(25)]

    job = create_job(reference="checked", owner=owner, task="product_description", provider="emulator")

    items = Item.objects.filter(job=job)
    assert items.count() == len(products)
    assert all(
        item.source_revision.product_id == item.product_id for item in items.select_related("source_revision")
    )
    assert (
        Event.objects.filter(job=job, item__isnull=False, to_state=ItemState.PREPARED, actor=owner).count()
        == 25
    )


# Rows enough for the database to match a statement against the table in one pass (migration 0021)
# rather than probe it row by row; the answer must not depend on which it does.
MANY = 20_000


@pytest.mark.parametrize("wrong", [None, "item", "item of another job", "user"])
def test_a_statement_of_many_events_is_checked_as_strictly_as_one_of_a_few(wrong):
    item, other = ItemFactory(), ItemFactory()
    owner = UserFactory()
    before = Event.objects.count()
    item_id = {"item": MISSING, "item of another job": other.pk}.get(wrong, item.pk)
    actor_id = MISSING if wrong == "user" else owner.pk
    insert = (
        "INSERT INTO ledger_event (item_id, job_id, actor_id, from_state, to_state, actor_name, reason, data, at) "
        "SELECT CASE WHEN g = %s THEN %s ELSE %s END, %s, CASE WHEN g = %s THEN %s ELSE %s END, "
        "'', 'prepared', 'system', '', '{}', now() FROM generate_series(1, %s) g"
    )
    params = [MANY - 7, item_id, item.pk, item.job_id, MANY - 7, actor_id, owner.pk, MANY]

    if wrong is None:
        with connection.cursor() as cursor:
            cursor.execute(insert, params)
        assert Event.objects.count() == before + MANY
    else:
        assert "refers to" in refused(insert, params)
        assert Event.objects.count() == before


@pytest.mark.parametrize("wrong", [None, "item", "item of another job", "job", "user"])
def test_a_few_events_beside_many_items_are_checked_as_strictly(wrong):
    """Migration 0051: a statement of events small beside the items the statistics know (a collection's
    chunk) has its items looked up by key instead of matched in one hashed pass; as strictly."""
    item, other = ItemFactory(), ItemFactory()
    owner = UserFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH products AS (INSERT INTO ledger_product (sku, status, published_content, created_at, updated_at) "
            "SELECT 'FEW-' || g, 'active', '', now(), now() FROM generate_series(1, 200) g RETURNING id), "
            "revisions AS (INSERT INTO ledger_sourcerevision (product_id, number, title, fields, content_hash, created_at) "
            "SELECT id, 1, 'Few', '{}', '', now() FROM products RETURNING id, product_id) "
            "INSERT INTO ledger_item (job_id, product_id, source_revision_id, state, reason, reason_code, "
            "inference_attempt, inference_failures, apply_failures, created_at, updated_at) "
            "SELECT %s, product_id, id, 'prepared', '', '', 1, 0, 0, now(), now() FROM revisions",
            [item.job_id],
        )
        # The statistics autovacuum keeps: what the check sizes the statement against.
        cursor.execute("ANALYZE ledger_item")
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'ledger_item'")
        assert cursor.fetchone()[0] >= 4 * 3 + 1  # three events are "few" beside these items
    before = Event.objects.count()
    rows = [(item.pk, item.job_id, owner.pk)] * 3
    if wrong == "item":
        rows[1] = (MISSING, item.job_id, owner.pk)
    elif wrong == "item of another job":
        rows[1] = (other.pk, item.job_id, owner.pk)
    elif wrong == "job":
        rows[1] = (None, MISSING, owner.pk)
    elif wrong == "user":
        rows[1] = (item.pk, item.job_id, MISSING)
    insert = (
        "INSERT INTO ledger_event (item_id, job_id, actor_id, from_state, to_state, actor_name, reason, data, at) "
        f"VALUES {', '.join(["(%s, %s, %s, '', 'prepared', 'system', '', '{}', now())"] * len(rows))}"
    )
    params = [value for row in rows for value in row]

    if wrong is None:
        with connection.cursor() as cursor:
            cursor.execute(insert, params)
        assert Event.objects.count() == before + 3
    else:
        assert "refers to" in refused(insert, params)
        assert Event.objects.count() == before


@pytest.mark.parametrize("wrong", [None, "revision of another product", "job"])
def test_a_statement_of_many_items_is_checked_as_strictly_as_one_of_a_few(wrong):
    job, stranger = JobFactory(), ProductFactory()
    before = Item.objects.count()
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH products AS (INSERT INTO ledger_product (sku, status, published_content, created_at, updated_at) "
            "SELECT 'MANY-' || g, 'active', '', now(), now() FROM generate_series(1, %s) g RETURNING id) "
            "INSERT INTO ledger_sourcerevision (product_id, number, title, fields, content_hash, created_at) "
            "SELECT id, 1, 'Many', '{}', '', now() FROM products",
            [MANY],
        )
    revision = (
        "r.id"
        if wrong != "revision of another product"
        else (
            f"CASE WHEN r.product_id = (SELECT max(product_id) FROM ledger_sourcerevision) "
            f"THEN {stranger.current_revision_id} ELSE r.id END"
        )
    )
    job_id = f"CASE WHEN r.product_id = (SELECT max(product_id) FROM ledger_sourcerevision) THEN {MISSING} ELSE %s END"
    insert = (
        "INSERT INTO ledger_item (job_id, product_id, source_revision_id, state, reason, reason_code, "
        "inference_attempt, inference_failures, apply_failures, created_at, updated_at) "
        f"SELECT {job_id if wrong == 'job' else '%s'}, r.product_id, {revision}, 'prepared', '', '', 1, 0, 0, now(), now() "
        "FROM ledger_sourcerevision r JOIN ledger_product p ON p.id = r.product_id WHERE p.sku LIKE 'MANY-%%'"
    )

    if wrong is None:
        with connection.cursor() as cursor:
            cursor.execute(insert, [job.pk])
        assert Item.objects.count() == before + MANY
    else:
        assert "refers to" in refused(insert, [job.pk])
        assert Item.objects.count() == before


def insert_versions(rows: list[tuple]) -> str:
    """(item, submission, custom_id) rows, written by one statement."""
    values = ", ".join("(%s, 1, %s, %s, '', '', '', 0, 0, '{}', true, '[]', now())" for _ in rows)
    return (
        "INSERT INTO ledger_generatedversion (item_id, number, submission_id, custom_id, content, raw_output, "
        f"content_hash, input_tokens, output_tokens, usage, valid, validation_reasons, created_at) VALUES {values}",
        [value for row in rows for value in row],
    )


def test_a_draft_must_name_an_item_and_a_submission_of_the_items_job():
    """Migration 0018: a draft's references are checked once per statement, as strictly as the
    foreign keys they replace, and a little more (its submission is of its item's job)."""
    item, other = ItemFactory(), ItemFactory()
    own = Submission.objects.create(
        job=item.job, provider="emulator", intent_key="own", state=SubmissionState.INTENT
    )
    foreign = Submission.objects.create(
        job=other.job, provider="emulator", intent_key="foreign", state=SubmissionState.INTENT
    )

    assert "refers to" in refused(*insert_versions([(MISSING, None, "bd-a")]))
    assert "refers to" in refused(*insert_versions([(item.pk, MISSING, "bd-b")]))
    assert "refers to" in refused(*insert_versions([(item.pk, foreign.pk, "bd-c")]))
    # One wrong row among right ones: the whole statement is refused.
    refused(
        *insert_versions([(item.pk, own.pk, "bd-d"), (other.pk, None, "bd-e"), (other.pk, own.pk, "bd-f")])
    )
    assert not GeneratedVersion.objects.exists()

    with connection.cursor() as cursor:
        cursor.execute(*insert_versions([(item.pk, own.pk, "bd-g"), (other.pk, foreign.pk, "bd-h")]))
    assert sorted(GeneratedVersion.objects.values_list("custom_id", "submission_id")) == [
        ("bd-g", own.pk),
        ("bd-h", foreign.pk),
    ]

    draft = GeneratedVersion.objects.get(custom_id="bd-g")
    refused("UPDATE ledger_generatedversion SET item_id = %s WHERE id = %s", [other.pk, draft.pk])
    refused("UPDATE ledger_generatedversion SET submission_id = %s WHERE id = %s", [foreign.pk, draft.pk])
    refused("UPDATE ledger_generatedversion SET submission_id = %s WHERE id = %s", [MISSING, draft.pk])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_generatedversion SET submission_id = NULL WHERE id = %s", [draft.pk])
    draft.refresh_from_db()
    assert draft.item_id == item.pk and draft.submission_id is None


def insert_entries(rows: list[tuple]) -> tuple[str, list]:
    """(submission, item, custom_id) rows, written by one statement."""
    values = ", ".join("(%s, %s, %s, '')" for _ in rows)
    return (
        f"INSERT INTO ledger_submissionitem (submission_id, item_id, custom_id, outcome) VALUES {values}",
        [value for row in rows for value in row],
    )


def test_an_entry_must_name_an_item_and_a_submission_that_exist():
    """Migration 0053: a unit's entries have their references checked once per statement, as strictly as
    the foreign keys they replace: one wrong row refuses the whole statement, and changing an entry's
    item or submission to one that does not exist is refused."""
    item, other = ItemFactory(), ItemFactory()
    unit = Submission.objects.create(job=item.job, provider="emulator", intent_key="unit")

    assert "refers to" in refused(*insert_entries([(unit.pk, MISSING, "bd-a")]))
    assert "refers to" in refused(*insert_entries([(MISSING, item.pk, "bd-b")]))
    refused(*insert_entries([(unit.pk, item.pk, "bd-c"), (unit.pk, MISSING, "bd-d")]))
    assert not SubmissionItem.objects.exists()

    with connection.cursor() as cursor:
        cursor.execute(*insert_entries([(unit.pk, item.pk, "bd-e"), (unit.pk, other.pk, "bd-f")]))
    entry = SubmissionItem.objects.get(custom_id="bd-e")
    refused("UPDATE ledger_submissionitem SET item_id = %s WHERE id = %s", [MISSING, entry.pk])
    refused("UPDATE ledger_submissionitem SET submission_id = %s WHERE id = %s", [MISSING, entry.pk])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_submissionitem SET outcome = 'returned' WHERE id = %s", [entry.pk])
    entry.refresh_from_db()
    assert (entry.submission_id, entry.item_id, entry.outcome) == (unit.pk, item.pk, "returned")


def test_a_statement_of_many_entries_is_checked_as_strictly_as_one_of_a_few():
    job = JobFactory()
    unit = Submission.objects.create(job=job, provider="emulator", intent_key="many")
    items = [ItemFactory(job=job) for _ in range(3)]
    insert = (
        "INSERT INTO ledger_submissionitem (submission_id, item_id, custom_id, outcome) "
        "SELECT %s, CASE WHEN g = %s THEN %s ELSE %s END, 'bd-many-' || g, '' FROM generate_series(1, %s) g"
    )

    assert "refers to" in refused(insert, [unit.pk, MANY - 7, MISSING, items[0].pk, MANY])
    assert not SubmissionItem.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute(insert, [unit.pk, MANY - 7, items[1].pk, items[0].pk, MANY])
    assert SubmissionItem.objects.count() == MANY
