"""A bulk change analyses the tables it changed a lot, as autovacuum would, because autovacuum may
be off (it is on this project's machines) and the planner guesses badly without statistics."""

import io
import json

import pytest
from django.db import connection
from django_q.models import OrmQ

from ledger.actions.jobs import create_job
from ledger.catalogue import import_catalogue
from ledger.database.table_statistics import analyse_after_bulk_change, analyse_stale_tables, needs_analysis
from ledger.models import Item, Product
from ledger.tasks import collect_round
from tests.factories import UserFactory

pytestmark = pytest.mark.postgresql_only

# An odd number, so that a table's row estimate equal to it was made by an ANALYZE of these rows.
PRODUCTS = 137


@pytest.mark.parametrize(
    "changed, rows_known, stale",
    [
        (1, -1, True),  # never analysed
        (0, -1, False),
        (50, 0, False),
        (51, 0, True),
        (150, 1_000, False),
        (151, 1_000, True),
        (100_000, 1_200_000, False),
        (120_051, 1_200_000, True),
    ],
)
def test_a_table_is_stale_past_autovacuums_rule(changed, rows_known, stale):
    assert needs_analysis(changed, rows_known) is stale


def estimated_rows(table: str) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
        return cursor.fetchone()[0]


def catalogue(count: int) -> io.BytesIO:
    lines = (json.dumps({"sku": f"STAT-{n:05d}", "title": f"Lamp {n}"}) for n in range(count))
    return io.BytesIO("\n".join(lines).encode())


@pytest.mark.django_db(transaction=True)
def test_an_import_and_a_job_leave_statistics_of_what_they_wrote():
    report = import_catalogue(catalogue(PRODUCTS))
    assert report.created == PRODUCTS
    assert estimated_rows("ledger_product") == PRODUCTS
    assert estimated_rows("ledger_sourcerevision") == PRODUCTS

    create_job(reference="stats", owner=UserFactory(), task="product_description", provider="emulator")
    assert estimated_rows("ledger_item") == PRODUCTS


@pytest.mark.django_db(transaction=True)
def test_a_small_change_to_a_big_table_is_not_analysed_again():
    import_catalogue(catalogue(PRODUCTS))
    assert analyse_after_bulk_change({Product: 60}) == []
    assert analyse_after_bulk_change({Product: 64, Item: 0}) == ["ledger_product"]


@pytest.mark.django_db
def test_nothing_is_analysed_inside_a_transaction():
    # ANALYZE there would not see the rows the transaction has not committed yet.
    assert analyse_after_bulk_change({Product: 10_000}) == []


def autovacuum_on() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum') = 'on'")
        return cursor.fetchone()[0]


def changes_counted() -> None:
    """PostgreSQL counts a backend's changes in its own memory and publishes them now and then."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")


@pytest.mark.django_db(transaction=True)
def test_the_tables_changed_a_few_rows_at_a_time_are_analysed_where_autovacuum_is_off():
    import_catalogue(catalogue(PRODUCTS))
    changes_counted()
    if autovacuum_on():
        assert analyse_stale_tables() == []  # autovacuum's business
        return
    analyse_stale_tables()  # whatever the migrations and the import left (counted after its ANALYZE)
    changes_counted()
    assert analyse_stale_tables() == []
    for product in Product.objects.order_by("pk")[:64]:  # one by one, as reviews and results come
        product.save(update_fields=["updated_at"])
    changes_counted()
    assert analyse_stale_tables() == ["ledger_product"]
    changes_counted()
    assert analyse_stale_tables() == []


@pytest.mark.django_db(transaction=True)
def test_each_round_of_the_collector_queues_the_analysis():
    collect_round(duration=0)
    assert [row.task["func"] for row in OrmQ.objects.all()] == ["ledger.tasks.analyse_stale_tables"]


@pytest.mark.django_db(transaction=True)
def test_a_job_analyses_its_events_without_sampling_their_texts():
    # An event's reason and data, like a draft's texts, are read with their item and never searched:
    # an ANALYZE samples them for no query (migration 0048), while the columns queries use keep theirs.
    import_catalogue(catalogue(PRODUCTS))
    create_job(reference="stats", owner=UserFactory(), task="product_description", provider="emulator")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, attname FROM pg_stats WHERE tablename IN ('ledger_event', 'ledger_generatedversion')"
        )
        kept = set(cursor.fetchall())
    assert ("ledger_event", "item_id") in kept
    assert ("ledger_event", "to_state") in kept
    assert not kept & {("ledger_event", "reason"), ("ledger_event", "data")}


@pytest.mark.django_db(transaction=True)
def test_an_import_analyses_its_products_without_sampling_their_digests():
    # A revision's hash and a product's line digest and published text are read with their row and
    # never searched (migration 0052); the columns the catalogue's screens filter by keep theirs.
    import_catalogue(catalogue(PRODUCTS))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, attname FROM pg_stats WHERE tablename IN ('ledger_product', 'ledger_sourcerevision')"
        )
        kept = set(cursor.fetchall())
    assert {
        ("ledger_product", "sku"),
        ("ledger_product", "status"),
        ("ledger_sourcerevision", "title"),
    } <= kept
    assert not kept & {
        ("ledger_sourcerevision", "content_hash"),
        ("ledger_product", "line_digest"),
        ("ledger_product", "published_content"),
    }
