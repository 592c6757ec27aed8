"""JSON files named by a setting (the price file, the rate file): read with a clear error naming the
setting and the file, and read again only when the file changes, keeping the last good reading
while a file that turned bad is fixed (the system checks refuse a bad file at startup)."""

import json
import logging
import os
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)


def read_setting_file(
    setting: str, path: str, parse: Callable[[Any], Any], error: type[ImproperlyConfigured]
):
    """`parse` of the file's JSON (numbers with a fraction as Decimal); `error`, naming the setting
    and the file, when it cannot be read, is not JSON, or `parse` raises `error`."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file, parse_float=Decimal)
    except OSError as exc:
        raise error(f"{setting} {path}: cannot be read ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:
        raise error(f"{setting} {path}: not valid JSON ({exc})") from None
    try:
        return parse(data)
    except error as exc:
        raise error(f"{setting} {path}: {exc}") from None


class WatchedFile:
    """A setting file's reading, made again when the file (or `also`, what the reading depends on
    besides it) changes. A file that turns bad while running is logged and its last good reading
    kept (or `empty`, when there never was one)."""

    def __init__(
        self, read: Callable[[str], Any], error: type[ImproperlyConfigured], empty: Callable[[], Any]
    ):
        self.read, self.error, self.empty = read, error, empty
        self.key: tuple | None = None
        self.value: Any = None
        self.good: dict[tuple, Any] = {}  # the last good reading, by path and `also`

    def get(self, path: str, also: tuple = ()) -> Any:
        try:
            stat = os.stat(path)
            key = (path, stat.st_mtime_ns, stat.st_size, *also)
        except OSError:
            key = (path, None, None, *also)
        if key != self.key:
            try:
                value = self.read(path)
                self.good[(path, *also)] = value
            except self.error as exc:
                log.error("%s; keeping what was read before", exc)
                value = self.good.get((path, *also), self.empty())
            self.key, self.value = key, value
        return self.value
