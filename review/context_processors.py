from django.http import HttpRequest

from ledger.health import collector_stalled


def collector_status(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"collector_stalled": collector_stalled()}
