"""The catalogue's search ("contains", whatever the case and the accents) at a million products: by
SKU, or by the current revision's title (`bd_searched`, `ledger/database/searched_text.py`: `creme`
finds `Crème`).

On PostgreSQL the SKU and that text have trigram indexes (migrations 0017 and 0056). Asking one for everything the
text contains is slow in two cases, and this module avoids both:

- Text whose trigrams are in nearly every row (`BENCH-` in every SKU, ` cm,` in every title):
  the index reads each trigram's list of rows, a million entries each. So the index is asked only
  for the few rarest pieces of the text (each a necessary condition: a row that contains the text
  contains every piece of it), and the rows it finds are checked for the whole text.
- A common word (one product in eight is a lamp): the index would find 150,000 rows to sort by SKU.
  Then the products are read in SKU order and checked one by one instead, which finds a page after
  a few hundred rows; the count is not read (it would mean checking every row).

How rare each piece is, and how common the whole text is, come from a sample of the catalogue
(3,000 products drawn by pages, split into trigrams by pg_trgm; each web process takes it again
every ten minutes, which costs the search that does it 0.1-0.4 s at 1.2 million products): a wrong
guess only costs time, never a different answer. SQLite, the demo's database, searches by
scanning."""

import re
import time
from dataclasses import dataclass

from django.db import connection
from django.db.models import Q, QuerySet, Value
from django.db.models.functions import StrIndex, Upper
from django.db.models.lookups import Contains

from ledger.database.searched_text import Searched, searchable
from ledger.database.setwise import among
from ledger.models import Product, SourceRevision

SAMPLE_SIZE = 3_000
SAMPLE_SECONDS = 600
# At most this many pieces of the text are looked up in an index.
PIECES = 3
# More matches than this through the indexes: the first ones found are listed (the count says
# "more than"); a longer search finds fewer.
FOUND_CAP = 1_000
# Text found all over the catalogue is searched by reading in SKU order when a page is found within
# this many products; it must be found this many times in the sample to tell.
WALK_ROWS = 30_000
MIN_FOUND_TO_WALK = 20
PAGE_ROWS = 51
# Checking a row the index found for the whole text costs about this many times what reading one
# entry of a trigram's list of rows does.
RECHECK_WEIGHT = 50
# LIKE's own characters: a piece never holds one.
_LIKE_SPECIAL = set("%_\\")


@dataclass(frozen=True)
class Sample:
    """Products drawn at random: how many products there are, and the sample's SKUs and texts (the
    searched text of their current revision, `bd_searched`)
    (upper case, in SKU order), and for each trigram the sample rows holding it (`trigram_rows`)."""

    products: int
    skus: list[str]
    texts: list[str]
    sku_trigrams: dict[str, int]
    text_trigrams: dict[str, int]

    def walk_length(self, q: str, *, texts: bool = True) -> float:
        """How many products a reader in SKU order would read, at most, to fill a page of the ones
        whose SKU or text contains `q` (searchable), wherever the page starts (estimated: the longest run of the
        sample without one, and the rows a page takes at the sample's share); infinite when the
        sample has too few of them to tell."""
        text = q.upper()
        found = [
            position
            for position, (sku, searched) in enumerate(zip(self.skus, self.texts, strict=True))
            if text in sku or (texts and text in searched)
        ]
        if len(found) < MIN_FOUND_TO_WALK:
            return float("inf")
        gaps = [b - a for a, b in zip([-1, *found], [*found, len(self.skus)], strict=True)]
        per_row = self.products / len(self.skus)
        return max(gaps) * per_row + PAGE_ROWS * len(self.skus) / len(found)


_samples: dict[str, tuple[float, Sample]] = {}


def forget_sample() -> None:
    _samples.clear()


_WORD = re.compile(r"[^\W_]+")


def trigrams(text: str) -> set[str]:
    """pg_trgm's trigrams of a value: each run of letters and digits, lower case, padded with two
    spaces before and one after."""
    found: set[str] = set()
    for word in _WORD.findall(text.lower()):
        padded = f"  {word} "
        found.update([padded[i : i + 3] for i in range(len(padded) - 2)])
    return found


def like_trigrams(piece: str) -> set[str]:
    """The trigrams pg_trgm looks up for `LIKE '%piece%'`: a word is padded on a side only where the
    piece shows where it ends (a character that is not a letter or digit)."""
    found = set()
    text = piece.lower()
    start = None
    for position in range(len(text) + 1):
        inside = position < len(text) and text[position].isalnum()
        if inside and start is None:
            start = position
        elif not inside and start is not None:
            word = ("  " if start > 0 else "") + text[start:position] + (" " if position < len(text) else "")
            found.update(word[i : i + 3] for i in range(len(word) - 2))
            start = None
    return found


def trigram_rows(values: list[str]) -> dict[str, int]:
    """For each trigram, the values holding it, as the bits of an int (bit i: values[i])."""
    bitmaps: dict[str, bytearray] = {}
    size = (len(values) + 7) // 8
    for position, value in enumerate(values):
        byte, bit = divmod(position, 8)
        for trigram in trigrams(value):
            bitmap = bitmaps.get(trigram)
            if bitmap is None:
                bitmap = bitmaps[trigram] = bytearray(size)
            bitmap[byte] |= 1 << bit
    return {trigram: int.from_bytes(bitmap, "little") for trigram, bitmap in bitmaps.items()}


def _bitmaps(holding, size: int) -> dict[str, int]:
    """(trigram, positions) as trigram_rows gives them: the positions as the bits of an int."""
    made = {}
    for trigram, positions in holding:
        bitmap = bytearray((size + 7) // 8)
        for position in positions:
            bitmap[position >> 3] |= 1 << (position & 7)
        made[trigram] = int.from_bytes(bitmap, "little")
    return made


def rare_pieces(
    q: str,
    rows: dict[str, int],
    sample_size: int,
    *,
    pieces: int = PIECES,
    recheck_weight: int = RECHECK_WEIGHT,
) -> list[str]:
    """Up to `pieces` three-character pieces of `q` for the index to look up, chosen on a sample of
    `sample_size` values (`rows`: trigram_rows of it) for the least work: each trigram looked up
    reads the rows holding it, and each row the pieces leave is checked for the whole text
    (RECHECK_WEIGHT times the cost of reading one). [] when `q` has no piece an index can use (then
    the whole text is asked for)."""
    everyone = (1 << sample_size) - 1
    candidates = []
    for start in range(len(q) - 2):
        piece = q[start : start + 3]
        if not piece.isascii() or _LIKE_SPECIAL & set(piece):
            continue
        found = like_trigrams(piece)
        if not found:
            continue
        holding = everyone
        for trigram in found:
            holding &= rows.get(trigram, 0)
        candidates.append((piece, holding, found))

    def work(left: int, looked_up: set[str]) -> int:
        return left.bit_count() * RECHECK_WEIGHT + sum(rows.get(t, 0).bit_count() for t in looked_up)

    chosen: list[str] = []
    left, looked_up = everyone, set()
    while candidates and len(chosen) < pieces:
        piece, holding, found = min(candidates, key=lambda c: (work(left & c[1], looked_up | c[2]), c[0]))
        if chosen and work(left & holding, looked_up | found) >= work(left, looked_up):
            break  # it saves less than it costs
        chosen.append(piece)
        left &= holding
        looked_up |= found
        candidates = [c for c in candidates if c[0].upper() != piece.upper()]
    return chosen


def sample() -> Sample:
    """The catalogue's sample, taken again after SAMPLE_SECONDS. The database splits the values
    into trigrams (pg_trgm's own `show_trgm`) and says which sample rows hold each."""
    key = connection.settings_dict["NAME"]
    taken = _samples.get(key)
    if taken is not None and time.monotonic() - taken[0] < SAMPLE_SECONDS:
        return taken[1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'ledger_product'::regclass")
        (estimate,) = cursor.fetchone()
        if estimate is None or estimate < SAMPLE_SIZE * 4:
            cursor.execute("SELECT count(*) FROM ledger_product")
            (estimate,) = cursor.fetchone()
        percent = min(100.0, 100.0 * SAMPLE_SIZE / max(estimate, 1))
        # SYSTEM reads whole pages at random: a few dozen pages, not the table.
        # One statement: the sample, in SKU order, and for each trigram the positions holding it.
        cursor.execute(
            """
            WITH drawn AS MATERIALIZED (
                SELECT (row_number() OVER (ORDER BY p.sku) - 1)::int AS position,
                       upper(p.sku::text) AS sku, coalesce(bd_searched(r.title), '') AS title
                FROM ledger_product p TABLESAMPLE SYSTEM (%s)
                LEFT JOIN ledger_sourcerevision r ON r.id = p.current_revision_id
            )
            SELECT 'v', sku || chr(31) || title, ARRAY[position] FROM drawn
            UNION ALL
            SELECT 's', t, array_agg(position) FROM drawn, unnest(show_trgm(sku)) t GROUP BY t
            UNION ALL
            SELECT 't', t, array_agg(position) FROM drawn, unnest(show_trgm(title)) t GROUP BY t
            """,
            [percent],
        )
        holding = cursor.fetchall()
    values = sorted((positions[0], text.split("\x1f", 1)) for kind, text, positions in holding if kind == "v")
    rows = [pair for _, pair in values]
    skus = [sku for sku, _ in rows]
    texts = [searched for _, searched in rows]
    made = Sample(
        products=int(estimate),
        skus=skus,
        texts=texts,
        sku_trigrams=_bitmaps(((t, positions) for kind, t, positions in holding if kind == "s"), len(rows)),
        text_trigrams=_bitmaps(((t, positions) for kind, t, positions in holding if kind == "t"), len(rows)),
    )
    _samples[key] = (time.monotonic(), made)
    return made


def _containing(rows: QuerySet, field: str, q: str, pieces: list[str]) -> QuerySet:
    """Rows whose `field` contains `q`: the index looks up `pieces`, then each row found is checked
    for the whole text (`strpos`, which no index answers, so the lookup stays on the pieces)."""
    if not pieces:
        return rows.filter(**{f"{field}__icontains": q})
    for piece in pieces:
        rows = rows.filter(**{f"{field}__icontains": piece})
    return rows.alias(whole_text_at=StrIndex(Upper(field), Upper(Value(q)))).filter(whole_text_at__gt=0)


def _text_containing(revisions: QuerySet, text: str, pieces: list[str]) -> QuerySet:
    """Revisions whose searched text (`bd_searched`: the title, upper case, without
    accents) contains `text`, written the same way: the index looks up `pieces`, then each revision
    found is checked for the whole text."""
    searched = Searched("title")
    if not pieces:
        return revisions.filter(Contains(searched, text))
    for piece in pieces:
        revisions = revisions.filter(Contains(searched, piece.upper()))
    return revisions.alias(whole_text_at=StrIndex(searched, Value(text))).filter(whole_text_at__gt=0)


@dataclass(frozen=True)
class Search:
    """What a search selects: `walk`, a filter to read in SKU order (text common all over the
    catalogue), or `ids` (and their `skus`), the products found through the indexes: all of them,
    or, `capped`, the first `cap` found of more."""

    walk: Q | None = None
    ids: list[int] | None = None
    skus: list[str] | None = None
    capped: bool = False


def search(q: str, *, cap: int) -> Search:
    """How to find the products whose SKU, current title or a current field's value contains `q`,
    whatever the case and the accents (`creme` finds `Crème`)."""
    text = searchable(q)
    plain = Q(sku__icontains=text) | Q(Contains(Searched("current_revision__title"), text))
    more = False  # more revisions found than `cap` (some may be old ones)
    if connection.vendor != "postgresql":
        return Search(walk=plain)
    catalogue = sample()
    if catalogue.walk_length(text) <= WALK_ROWS:
        return Search(walk=plain)
    size = len(catalogue.skus)
    by_sku = _containing(Product.objects.all(), "sku", text, rare_pieces(text, catalogue.sku_trigrams, size))
    texts = _text_containing(
        SourceRevision.objects.order_by(),
        text,
        rare_pieces(text, catalogue.text_trigrams, size),
    )
    # The revisions first, then their products by key: asked as one query, the planner may
    # read every product to meet the few revisions found.
    revisions = list(texts.values_list("pk", flat=True)[: cap + 1])
    more = len(revisions) > cap
    by_text = Product.objects.filter(among("current_revision", revisions))
    # Each side on its own, so that each stops after `cap` + 1 (a UNION would read all of both first).
    found = dict(by_sku.order_by().values_list("pk", "sku")[: cap + 1])
    found.update(by_text.order_by().values_list("pk", "sku")[: cap + 1])
    ids = sorted(found)[:cap]
    return Search(ids=ids, skus=[found[pk] for pk in ids], capped=more or len(found) > cap)


def found_products(rows: QuerySet, how: Search) -> QuerySet:
    """`rows` of the products found, also bounded by their first and last SKU. Matches are often
    neighbours in SKU order (`BENCH-004` finds BENCH-00400000 to BENCH-00409999); the bounds let
    the database start reading its SKU index where they start, not at the first product."""
    rows = rows.filter(among("id", how.ids))
    return rows.filter(sku__gte=min(how.skus), sku__lte=max(how.skus)) if how.skus else rows


def products_with_sku(q: str, *, cap: int) -> tuple[list[int], bool] | None:
    """The products whose SKU contains `q`, found through the SKU's trigram index by its rarest
    pieces: (the first `cap` ids found, whether there are more). None where a plain filter serves
    better: SKU text common all over the catalogue (then reading in order finds rows soon), or
    SQLite."""
    if connection.vendor != "postgresql":
        return None
    catalogue = sample()
    if catalogue.walk_length(q, texts=False) <= WALK_ROWS:
        return None
    pieces = rare_pieces(q, catalogue.sku_trigrams, len(catalogue.skus))
    ids = list(
        _containing(Product.objects.order_by(), "sku", q, pieces).values_list("pk", flat=True)[: cap + 1]
    )
    return ids[:cap], len(ids) > cap
