"""Destinations by name. Webhook destinations (SPEC §6) join this table later."""

from .base import Destination


def destination_names() -> list[str]:
    return ["catalogue"]


def get_destination(name: str) -> Destination:
    from .catalogue import CatalogueDestination

    if name == "catalogue":
        return CatalogueDestination()
    raise KeyError(f"unknown destination {name!r}")
