"""The catalogue's search at a million products (review/search.py): the same products as a plain
"contains, whatever the case and the accents" on SKU and current title (not the fields' values),
whichever way it reads them."""

import pytest
from django.db import connection
from django.urls import reverse

from ledger.catalogue import revise_product
from ledger.database.searched_text import plain_upper
from ledger.models import Product
from review import search as searching
from review.search import like_trigrams, rare_pieces, trigram_rows, trigrams
from tests.factories import ProductFactory

pytestmark = pytest.mark.django_db

NOUNS = ["Desk lamp", "Wool throw", "Side table", "Chef's knife"]
COLOURS = ["ochre", "sage green", "slate blue"]
BRANDS = ["Hollin & Rye", "Northmoor", "Atelier Vey", "Kestrel Works", "Plain Field"]


@pytest.fixture(autouse=True)
def fresh_sample():
    searching.forget_sample()
    yield
    searching.forget_sample()


# --- choosing what the index is asked for (no database) ---------------------------------------


def test_trigrams_are_pg_trgm_s():
    assert trigrams("Ab-c") == {"  a", " ab", "ab ", "  c", " c "}
    # In LIKE '%…%' a word is padded only where the piece shows where it ends.
    assert like_trigrams("CH-0") == {"ch ", "  0"}
    assert like_trigrams("004") == {"004"}
    assert like_trigrams(" 5") == {"  5"}
    assert like_trigrams("p 5") == {"  5"}


def test_the_rarest_pieces_are_asked_for_not_those_every_row_has():
    skus = [f"BENCH-{n:08d}" for n in range(0, 4_000_000, 1_000)]
    pieces = rare_pieces("BENCH-0040000", trigram_rows(skus), len(skus))
    assert pieces and len(pieces) <= searching.PIECES
    # Every SKU holds BENCH-00: asking for it reads every row and finds them all.
    assert not {"BEN", "ENC", "NCH", "CH-", "H-0", "-00"} & set(pieces)
    assert all(piece in "BENCH-0040000" for piece in pieces)


def test_pieces_that_narrow_together_are_chosen():
    titles = [f"{noun} {size} cm, {colour}" for noun in NOUNS for colour in COLOURS for size in range(10, 60)]
    pieces = rare_pieces("Desk lamp 54 cm, ochre", trigram_rows(titles), len(titles))
    left = [t for t in titles if all(p.upper() in t.upper() for p in pieces)]
    assert "Desk lamp 54 cm, ochre" in left and len(left) <= 4  # of 600
    # A piece is not worth a trigram in a third of the rows when a rarer one narrows as much.
    assert not {"sk ", "p 5", " 54"} & set(pieces)
    assert rare_pieces("54", trigram_rows(titles), len(titles)) == []  # no piece of three characters
    assert rare_pieces("a%b_c", trigram_rows(titles), len(titles)) == []  # LIKE's own characters


# --- the screen, against a plain search ---------------------------------------------------------


@pytest.fixture
def catalogue(db):
    made = []
    for n in range(240):
        title = f"{NOUNS[n % 4]} {10 + n % 50} cm, {COLOURS[n % 3]}"
        fields = {"brand": BRANDS[n % 5], "weight_g": 100 + n, "features": ["LED"] if n % 7 == 0 else []}
        made.append(ProductFactory(sku=f"BENCH-{n:05d}", revision__title=title, revision__fields=fields))
    ProductFactory(sku="odd_one%", revision__title="A 100% wool throw_rug")
    ProductFactory(
        sku="ETE-1", revision__title="Lampe d'été", revision__fields={"brand": "Crème & Søn", "note": "ÉCRU"}
    )
    # An old title is not searched: only the current one.
    revise_product(sku="BENCH-00000", title="Renamed stool", fields={})
    return made


def expected(q: str) -> list[str]:
    """Found by reading every product: its SKU and its current title."""
    text = plain_upper(q)
    return sorted(
        p.sku
        for p in Product.objects.select_related("current_revision")
        if text in plain_upper(p.sku) or text in plain_upper(p.current_revision.title)
    )


def listed(client, q: str) -> tuple[list[str], object]:
    url, params, skus, first = reverse("catalogue"), {"q": q}, [], None
    while True:
        response = client.get(url, params)
        page = response.context["page"]
        first = first or page
        skus += [p.sku for p in page]
        if not page.has_next:
            return skus, first
        params = {"q": q, "page": page.next_page}


QUERIES = [
    "lamp",  # common all over: read in SKU order
    "desk lamp 54 cm, ochre",
    "Desk lamp 54",
    "BENCH-0010",
    "bench-001",
    "ench-0",
    "54 cm",
    "sage",
    "100%",
    "throw_",
    "_",
    "stool",
    "Desk lamp 10 cm, ochre",  # in an old title only
    "zzz",
    "cm, o",
    "northmoor",  # a field's value is not searched
    "Kestrel Works",
    "led",  # in a list
    "creme",  # Crème, in a field
    "CRÈME",
    "ete",  # été, in a title
    "son",  # Søn
    "ecru",
    "weight_g",  # a field's name is not searched
    "338",  # nor a number (a weight_g)
]


@pytest.mark.parametrize("q", QUERIES)
def test_the_search_lists_what_a_plain_search_finds(client, owner, catalogue, q):
    client.force_login(owner)
    skus, first = listed(client, q)
    assert skus == expected(q)
    if first.count is not None:
        assert first.count == len(skus)


@pytest.mark.postgresql_only
def test_the_sample_s_trigrams_are_pg_trgm_s(catalogue):
    """The sample is split into trigrams by the database (show_trgm); the text searched for, by
    Python: both must agree."""
    taken = searching.sample()
    assert len(taken.skus) == Product.objects.count() == len(taken.texts)
    assert taken.skus == sorted(taken.skus)
    assert trigram_rows(taken.skus) == taken.sku_trigrams
    assert trigram_rows(taken.texts) == taken.text_trigrams
    assert searching.sample() is taken  # kept for SAMPLE_SECONDS


@pytest.mark.postgresql_only
def test_common_text_is_read_in_sku_order_and_rare_text_through_the_indexes(catalogue):
    assert connection.vendor == "postgresql"
    common, rare = searching.search("lamp", cap=100), searching.search("Side table 13 cm", cap=100)
    assert common.walk is not None and common.ids is None
    assert rare.walk is None and sorted(
        Product.objects.filter(pk__in=rare.ids).values_list("sku", flat=True)
    ) == (expected("Side table 13 cm"))


@pytest.mark.postgresql_only
def test_more_matches_than_the_cap_list_the_first_ones_found(client, owner, catalogue, monkeypatch):
    monkeypatch.setattr(searching, "WALK_ROWS", 0)  # never read in SKU order
    found = searching.search("BENCH-001", cap=7)
    assert found.walk is None and found.capped and len(found.ids) == 7
    assert set(Product.objects.filter(pk__in=found.ids).values_list("sku", flat=True)) <= set(
        expected("BENCH-001")
    )
    monkeypatch.setattr(searching, "FOUND_CAP", 7)
    monkeypatch.setattr("review.catalogue.FOUND_CAP", 7)
    client.force_login(owner)
    response = client.get(reverse("catalogue"), {"q": "lamp"})
    page = response.context["page"]
    assert page.count_capped and page.count == 7 and len(page.object_list) == 7
    assert 'data-testid="search-capped"' in response.content.decode()
    assert all("LAMP" in p.current_revision.title.upper() for p in page)


def test_a_common_search_is_not_counted(client, owner, catalogue, monkeypatch):
    monkeypatch.setattr(searching, "WALK_ROWS", float("inf"))  # always read in SKU order, where it can
    client.force_login(owner)
    response = client.get(reverse("catalogue"), {"q": "lamp"})
    if connection.vendor == "postgresql":
        assert response.context["page"].count is None
        assert "a search this common is not counted" in response.content.decode()
    assert [p.sku for p in response.context["page"]] == expected("lamp")[:50]
