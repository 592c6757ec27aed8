"""The collector's pass without a worker: each task it would queue runs here, at once, in order
(for tests that drive the ledger in this process)."""

from django.utils.module_loading import import_string

from ledger import tasks


def run_here(func: str, *args):
    return import_string(func)(*args)


def poll_everything() -> int:
    return tasks.poll_everything(start=run_here)
