"""What an import remembers, in memory bounded by the number of products: the SKUs of the file so
far (`SeenSkus`, at most 32 bytes a SKU) and the digests of the lines that made the catalogue's
products what they are (`KnownLines`, 24 bytes a product), so a line met again is recognised
without being read.
"""

import hashlib
import os
import sys
from array import array
from bisect import bisect_left

import psycopg
from django.db import connection

from ..models import Product


class SeenSkus:
    """The line each SKU of a file was first seen on, whatever the number of SKUs: an open-addressing
    table of 64-bit digests of the SKUs (`sku_digest`) beside their 32-bit line numbers, in two
    arrays of 12 bytes a slot, kept between three eighths and three quarters full: 16 to 32 bytes a
    SKU (25 MB at 1.2 million, 38 MB for a moment while it doubles). Two different SKUs sharing a
    digest would be reported as a repeat; in a file of a million SKUs the odds are about 1 in 37 million."""

    def __init__(self) -> None:
        self._digests = array("Q", bytes(8 * 1024))  # 0: an empty slot
        self._lines = array("I", bytes(4 * 1024))
        self._count = 0

    def first_line(self, sku: str, line: int) -> int | None:
        """The line `sku` was first seen on; None (and `line` is remembered) the first time."""
        return self.first_line_of(sku_digest(sku.encode()), line)

    def first_line_of(self, digest: int, line: int) -> int | None:
        """`first_line` of the SKU whose `sku_digest` this is."""
        slot = self._slot(digest)
        if self._digests[slot]:
            return self._lines[slot]
        self._digests[slot], self._lines[slot] = digest, line
        self._count += 1
        if 4 * self._count > 3 * len(self._digests):
            self._double()
        return None

    def _slot(self, digest: int) -> int:
        mask = len(self._digests) - 1
        slot = digest & mask
        while self._digests[slot] not in (0, digest):
            slot = (slot + 1) & mask
        return slot

    def _double(self) -> None:
        digests, lines = self._digests, self._lines
        self._digests = array("Q", bytes(16 * len(digests)))
        self._lines = array("I", bytes(8 * len(lines)))
        for digest, line in zip(digests, lines, strict=True):
            if digest:
                slot = self._slot(digest)
                self._digests[slot], self._lines[slot] = digest, line


def sku_digest(sku: bytes) -> int:
    """64 bits of a SKU's BLAKE2b, never 0 (0 marks an empty slot of `SeenSkus`)."""
    return int.from_bytes(hashlib.blake2b(sku, digest_size=8).digest()) or 1


# A new version here makes every line unknown again (when what a line means changes).
_LINE_DIGEST_PERSON = b"bd-line-1"


def line_digest(content: bytes) -> bytes:
    """A catalogue line's digest, taken over its bytes (without the line end)."""
    return hashlib.blake2b(content, digest_size=16, person=_LINE_DIGEST_PERSON).digest()


def product_line_digest(line: bytes, sku_number: int) -> bytes:
    """What a product keeps (`Product.line_digest`): its line's digest, then its SKU's (`sku_digest`)."""
    return line + sku_number.to_bytes(8)


class LineNotRecognised(Exception):
    """A recognised line's product changed meanwhile: the import starts again, reading every line."""


def may_recognise(name: str) -> bool:
    """Lines are recognised in JSONL files on PostgreSQL (a CSV row's meaning is its header's too)."""
    return connection.vendor == "postgresql" and os.path.splitext(name)[1].lower() != ".csv"


class KnownLines:
    """The lines that made products what they are now (`Product.line_digest`), read once at the
    start of an import: a line met again is unchanged, and is neither decoded, parsed nor hashed
    as content. Three arrays of 64-bit numbers sorted by the line's digest: its first 8 bytes,
    the product's SKU digest (for `SeenSkus`) and the product's id: 24 bytes a product (29 MB at
    1.2 million), read a batch at a time. Each recognised line is confirmed by the database
    (`_confirm`) with its whole digest before it counts."""

    _BATCH = 50_000

    def __init__(self) -> None:
        self.prefixes, self.skus, self.ids = array("Q"), array("Q"), array("Q")

    def _add(self, records: bytes) -> None:
        numbers = memoryview(records).cast("Q")
        for column, start in ((self.prefixes, 0), (self.skus, 1), (self.ids, 2)):
            values = array("Q", numbers[start::3])
            if sys.byteorder == "little":  # PostgreSQL sends them big-endian
                values.byteswap()
            column.extend(values)

    @classmethod
    def load(cls) -> "KnownLines":
        known = cls()
        # A cursor of the driver's own, in the import's transaction, for the bytes as they are sent;
        # on the server (named), so a batch at a time is held.
        with psycopg.ServerCursor(connection.connection, "bd_known_lines") as cursor:
            cursor.execute(
                "SELECT substring(line_digest FROM 1 FOR 8) || substring(line_digest FROM 17 FOR 8) "
                f"|| int8send(id) FROM {Product._meta.db_table} WHERE octet_length(line_digest) = 24 ORDER BY line_digest",
                binary=True,
            )
            while rows := cursor.fetchmany(cls._BATCH):
                known._add(b"".join(record for (record,) in rows))
        return known

    def find(self, digest: bytes) -> tuple[int, int] | None:
        """(product id, SKU digest) of the product whose line has this digest, if any."""
        prefix = int.from_bytes(digest[:8])
        position = bisect_left(self.prefixes, prefix)
        if position < len(self.prefixes) and self.prefixes[position] == prefix:
            return self.ids[position], self.skus[position]
        return None
