"""A product's current revision and a revision's product are checked by the database once per
statement (migration 0023), as strictly as the two foreign keys they replace: a statement with one
wrong reference is refused whole, with SQLSTATE 23503 (an IntegrityError), and changes nothing; a
product with revisions, or a revision a product points at, cannot be deleted."""

import pytest
from django.db import IntegrityError, connection, transaction

from ledger.actions.products import record_product
from ledger.models import Product, SourceRevision
from tests.factories import ProductFactory

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only]  # SQLite, the demo's, checks nothing here

MISSING = 987_654_321


def refused(sql: str, params: list) -> str:
    with pytest.raises(IntegrityError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    return str(caught.value)


def insert_products(*rows: tuple[str, int | None]) -> str:
    values = ", ".join("(%s, 'active', %s, '', now(), now())" for _ in rows)
    return refused(
        "INSERT INTO ledger_product (sku, status, current_revision_id, published_content, created_at, updated_at) "
        f"VALUES {values}",
        [value for row in rows for value in row],
    )


def test_a_product_must_point_at_a_revision_that_exists():
    product = ProductFactory()
    before = (Product.objects.count(), SourceRevision.objects.count())

    # One wrong row among right ones (and one without a revision yet) refuses the statement.
    assert "refers to a source revision" in insert_products(
        ("NEW-1", product.current_revision_id), ("NEW-2", None), ("NEW-3", MISSING)
    )
    assert "would refer to a source revision" in refused(
        "UPDATE ledger_product SET current_revision_id = %s WHERE id = %s", [MISSING, product.pk]
    )
    assert (Product.objects.count(), SourceRevision.objects.count()) == before
    product.refresh_from_db()
    assert product.current_revision.product_id == product.pk


def test_a_revision_must_belong_to_a_product_that_exists():
    product = ProductFactory()
    revision = product.current_revision
    insert = (
        "INSERT INTO ledger_sourcerevision (product_id, number, title, fields, content_hash, created_at) "
        "VALUES (%s, 7, 'Lamp', '{}', 'x', now()), (%s, 1, 'Lamp', '{}', 'x', now())"
    )
    assert "refers to a product" in refused(insert, [product.pk, MISSING])
    assert "would refer to a product" in refused(
        "UPDATE ledger_sourcerevision SET product_id = %s WHERE id = %s", [MISSING, revision.pk]
    )
    assert list(product.revisions.values_list("number", flat=True)) == [1]


def test_a_product_and_its_first_revision_pointing_at_each_other_are_written_in_one_statement():
    """As the import writes them: the checks run at the statement's end, when both are there."""
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH ids AS (SELECT nextval(pg_get_serial_sequence('ledger_product', 'id')) AS product, "
            "nextval(pg_get_serial_sequence('ledger_sourcerevision', 'id')) AS revision), "
            "p AS (INSERT INTO ledger_product (id, sku, status, current_revision_id, published_content, "
            "created_at, updated_at) SELECT product, 'BOTH-1', 'active', revision, '', now(), now() FROM ids) "
            "INSERT INTO ledger_sourcerevision (id, product_id, number, title, fields, content_hash, created_at) "
            "SELECT revision, product, 1, 'Lamp', '{}', 'x', now() FROM ids"
        )
    product = Product.objects.get(sku="BOTH-1")
    assert product.current_revision.product_id == product.pk


def test_a_product_with_revisions_and_a_current_revision_cannot_be_deleted():
    change = record_product(sku="KEEP-1", title="Lamp", fields={"w": 1})
    record_product(sku="KEEP-1", title="Lamp", fields={"w": 2})
    product = Product.objects.get(sku="KEEP-1")
    first = product.revisions.get(number=1)

    assert "cannot be deleted" in refused("DELETE FROM ledger_product WHERE id = %s", [product.pk])
    assert "cannot be deleted" in refused(
        "DELETE FROM ledger_sourcerevision WHERE id = %s", [product.current_revision_id]
    )
    # An old revision no product points at is not protected by this check.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM ledger_sourcerevision WHERE id = %s", [first.pk])
        assert product.revisions.count() == 1
        transaction.set_rollback(True)
    assert change.created and product.revisions.count() == 2
