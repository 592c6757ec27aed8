"""What the batch emulators keep the same way: how often each request was sent before (its
attempt), their stored files and when those are forgotten, and JSONL read and written as the
providers read and write it."""

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class Attempts:
    """How many earlier units carried each request key: a retried request is a new attempt, and
    gets a fresh roll of the dice."""

    def __init__(self) -> None:
        self._sent: Counter = Counter()

    def next(self, key: Any) -> int:
        """The attempt this sending of `key` is (0 for the first), counted."""
        attempt = self._sent[key]
        self._sent[key] += 1
        return attempt


@dataclass
class SentRequest:
    """One request of a unit as it was sent (its body: chat-completions or Messages parameters),
    which attempt it is (`Attempts`), and its result once it has run (or will never run): an
    object, or the JSON text of the line a protocol writes it as."""

    custom_id: str
    body: dict
    attempt: int
    result: dict | str | None = None


class Expiring(Protocol):
    @property
    def expires_at(self) -> float | None: ...


def forget_expired(files: dict[str, Expiring], now: float) -> None:
    """Delete the files past their `expires_at`, as the providers delete them (reference §8.3)."""
    for file_id in [key for key, file in files.items() if file.expires_at and file.expires_at <= now]:
        del files[file_id]


def jsonl(lines: Iterable[str]) -> bytes:
    """Lines of JSON as a JSONL file's bytes."""
    return "".join(text + "\n" for text in lines).encode()


def jsonl_lines(content: bytes) -> Iterator[tuple[int, str]]:
    """The numbered lines of an uploaded JSONL file that hold more than JSON's whitespace. Lines end
    at newlines only: str.splitlines() would also end one at a U+2028 in a title."""
    for number, text in enumerate(content.decode("utf-8", "replace").split("\n"), start=1):
        if text.strip(" \t\r"):
            yield number, text
