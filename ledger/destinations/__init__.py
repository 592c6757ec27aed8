"""Destinations by name: the built-in `catalogue`, and a webhook for every BATCHDESK_WEBHOOK_<NAME>;
and the destination a job's approved drafts go through (`destination_for`)."""

import os

from ..models import Job
from .base import Destination
from .catalogue import CatalogueDestination
from .drilling import DrillingDestination
from .webhook import WebhookDestination

WEBHOOK_PREFIX = "BATCHDESK_WEBHOOK_"
NOT_A_WEBHOOK = {"TIMEOUT"}


def webhook_urls() -> dict[str, str]:
    """Webhook destinations configured in the environment, by lower-case name."""
    urls = {}
    for key, value in os.environ.items():
        if key.startswith(WEBHOOK_PREFIX) and not key.endswith("_TOKEN"):
            name = key.removeprefix(WEBHOOK_PREFIX)
            if name and name not in NOT_A_WEBHOOK and value:
                urls[name.lower()] = value
    return urls


def destination_names() -> list[str]:
    return ["catalogue", *sorted(webhook_urls())]


def get_destination(name: str) -> Destination:
    if name == "catalogue":
        return CatalogueDestination()
    url = webhook_urls().get(name)
    if url is None:
        raise KeyError(f"unknown destination {name!r}")
    token = os.environ.get(f"{WEBHOOK_PREFIX}{name.upper()}_TOKEN", "")
    return WebhookDestination(name=name, url=url, token=token)


def destination_for(job: Job) -> Destination:
    """The destination `job` applies its approved drafts through: its own, inside the acceptance drill
    when the job is a pilot that drills (load the job with its `pilot`: no query). KeyError when the
    job's destination is not configured."""
    destination = get_destination(job.destination)
    if hasattr(job, "pilot") and job.pilot.drill:
        return DrillingDestination(destination)
    return destination
