"""One check of a product's record (SPEC §7) for the importer, the API and `revise_product`: each
problem said where it is, a refused revision changes nothing."""

import pytest

from ledger.catalogue import ProductRefused, check_product_record, revise_product
from ledger.catalogue.checks import check_record
from ledger.catalogue.digests import SeenSkus
from ledger.catalogue.records import Rejection
from ledger.models import Product, SourceRevision


def test_each_problem_is_told_where_it_is():
    checked = check_product_record(
        {"sku": "bad sku", "title": " ", "status": "gone", "colour": "red", "notes": "a\x00b", "": 1}
    )
    assert list(checked.problems) == ["body", "sku", "title", "status", "notes"]
    assert checked.problems["body"] == ["a field has no name"]
    assert checked.problems["title"] == ["title is empty"]
    assert 'field "notes"' in checked.problems["notes"][0]
    assert checked.fields == {"colour": "red"}


def test_a_good_record_has_no_problems_and_keeps_what_it_clears():
    checked = check_product_record({"sku": "LAMP-1", "title": " Lamp ", "colour": "", "size": "M"})
    assert checked.problems == {}
    assert (checked.sku, checked.title, checked.fields, checked.cleared) == (
        "LAMP-1",
        "Lamp",
        {"size": "M"},
        ("colour",),
    )


def test_the_importer_says_the_same_words_in_the_same_order():
    seen = SeenSkus()
    assert not isinstance(check_record(1, {"sku": "LAMP-1", "title": "Lamp"}, seen), Rejection)
    again = check_record(2, {"sku": "LAMP-1", "title": "", "status": "gone"}, seen)
    assert isinstance(again, Rejection)
    assert again.message.startswith('sku "LAMP-1" appears again (first on line 1); title is empty; status ')


@pytest.mark.django_db
def test_revise_product_refuses_what_the_importer_refuses_and_changes_nothing():
    with pytest.raises(ProductRefused) as refused:
        revise_product(sku="LAMP-1", title="Lamp", fields={"notes": "a\x00b"})
    assert list(refused.value.problems) == ["notes"]
    assert not Product.objects.exists() and not SourceRevision.objects.exists()
    change = revise_product(sku="LAMP-1", title=" Lamp ", fields={"size": "M"})
    assert change.created
    assert SourceRevision.objects.get().title == "Lamp"
