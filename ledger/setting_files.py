"""Settings that name something to read (the price file, the rate file, the notify secret): one that
is set but cannot be read stops every process at startup (`setting_refused`). JSON files named by a
setting are read with a clear error naming the setting and the file, and read again only when the
file changes, keeping the last good reading while a file that turned bad is fixed."""

import json
import logging
import os
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core import checks
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


def file_number(value: Any, where: str, *, what: str, error: type[ImproperlyConfigured]) -> Decimal:
    """A number written in a setting file (JSON number or text), or `error` saying that `where` must
    be `what`; the caller refuses the infinite ones and bounds it."""
    if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
        raise error(f"{where}: must be {what}, not {json.dumps(value, default=str)}")
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise error(f"{where}: must be {what}, not {value!r}") from None
    return number


def setting_refused(
    setting: str,
    read: Callable[[str], object],
    refused: type[Exception],
    *,
    hint: str,
    id: str,
    named: bool = False,
) -> list[checks.CheckMessage]:
    """A system check: a setting that is set but cannot be read (`read` raises `refused`) stops the
    web server and the workers at startup. `named` puts the setting's name before the reason."""
    value = getattr(settings, setting, "")
    if not value:
        return []
    try:
        read(value)
    except refused as exc:
        return [checks.Error(f"{setting}: {exc}" if named else str(exc), hint=hint, id=id)]
    return []


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
