"""How every emulator spoils what it answers, as the knobs (`knobs.FaultKnobs`) ask: answers cut
off, refused, fenced or in prose (`answer_shape`); results repeated, made up for requests nobody
sent, or unreadable, scattered among the real ones (`repeated`, `made_up`, `scattered`); downloads
cut mid-line (`mid_line`). Each protocol writes the spoiled thing in its own words; where it goes
and how often is decided here.

Everything that involves chance is drawn from the seed (`dice`), so a run is reproducible: per
request from the seed, its key and its attempt (a retried request gets a fresh roll), per results
file from the seed and the unit's requests (a rerun writes the same file).
"""

import hashlib
import random
from collections.abc import Callable, Iterable
from typing import Any

from ledger.emulators import textgen
from ledger.emulators.knobs import FaultKnobs

# What a made-up result answers: a product nobody asked about (it reads like its neighbours).
UNASKED_TITLE = "Title: A product nobody asked about"


def dice(seed: int, *parts: Any) -> float:
    """A number in [0, 1) drawn from the seed and `parts`: the same parts, the same number."""
    text = ":".join(str(part) for part in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8]) / 2**64


def chance(seed: int, rate: float, *parts: Any) -> bool:
    """Whether the request `parts` name draws a fault at `rate`; a fault that is off costs no draw."""
    return rate > 0 and dice(seed, *parts) < rate


def answer_shape(knobs: FaultKnobs, seed: int, *parts: Any) -> str:
    """How the model answers the request `parts` name (its key and attempt), as the answer knobs
    say: a `textgen` shape, or "" for as asked."""
    for shape, rate in (
        (textgen.REFUSED, knobs.refuse_rate),
        (textgen.TRUNCATED, knobs.truncate_rate),
        (textgen.FENCED, knobs.fence_rate),
        (textgen.PROSE, knobs.prose_rate),
    ):
        if chance(seed, rate, shape, *parts):
            return shape
    return ""


def requests_key(requests: Iterable[tuple[Any, int]]) -> str:
    """A unit's requests, each as its key and attempt: what seeds the order of its results, so a
    rerun of the same requests writes the same file whatever id the unit got."""
    return ",".join(f"{key}#{attempt}" for key, attempt in requests)


def seeded(seed: int, text: str) -> random.Random:
    return random.Random(f"{seed}:{text}")


def hashed_order(seed: int, requests: Iterable[tuple[Any, int]]) -> random.Random:
    """The generator that orders and spoils a results file, seeded by the unit's requests."""
    return seeded(seed, hashlib.sha256(requests_key(requests).encode()).hexdigest())


def repeated[T](seed: int, rate: float, answers: Iterable[tuple[T, Any, int]]) -> list[T]:
    """The answers (each given with its request's key and attempt) that `duplicate_lines` writes
    twice."""
    return [answer for answer, key, attempt in answers if chance(seed, rate, "duplicate", key, attempt)]


def made_up[T](knobs: FaultKnobs, unknown: Callable[[int], T], malformed: Callable[[int], T]) -> list[T]:
    """The `unknown_lines` results for requests never sent and the `malformed_lines` ones nobody
    can read, numbered from 1, written by the protocol's `unknown(n)` and `malformed(n)`."""
    return [
        *(unknown(n) for n in range(1, knobs.unknown_lines + 1)),
        *(malformed(n) for n in range(1, knobs.malformed_lines + 1)),
    ]


def first_half(text: str) -> str:
    """A JSON object's first half, which never parses: a malformed line."""
    return text[: len(text) // 2]


def made_up_lines(knobs: FaultKnobs, line: Callable[[str], str]) -> list[str]:
    """`made_up` for a JSONL results file: `line(custom_id)` writes the line of `unknown-<n>`, and
    of `malformed-<n>` only its first half."""
    return made_up(knobs, lambda n: line(f"unknown-{n}"), lambda n: first_half(line(f"malformed-{n}")))


def scattered[T](answers: list[T], extra: list[T], rng: random.Random) -> list[T]:
    """`answers` with each of `extra` inserted at a place `rng` draws."""
    spoiled = list(answers)
    for answer in extra:
        spoiled.insert(rng.randint(0, len(spoiled)), answer)
    return spoiled


def mid_line(content: bytes) -> int:
    """About half of `content`, never just after a newline, so a download cut there splits a line."""
    cut = len(content) // 2
    return cut - 1 if cut > 1 and content[cut - 1 : cut] == b"\n" else cut
