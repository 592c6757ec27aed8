"""Review labour in money (SPEC §9): `BATCHDESK_REVIEW_HOURLY_RATE`, the business currency per hour
of review, prices the review hours a pilot projects. Unset, review is projected in hours only and
the pilot report says so; set to anything but a positive amount, it stops every process at startup
(system check batchdesk.E007)."""

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.core import checks

from ..setting_files import setting_refused


def read_hourly_rate(value: str) -> Decimal:
    try:
        rate = Decimal(value.strip())
    except InvalidOperation:
        raise ValueError(f"{value!r} is not an amount such as 32.50") from None
    if not rate.is_finite() or rate <= 0:
        raise ValueError(f"{value!r} is not a positive amount")
    return rate


def review_hourly_rate() -> Decimal | None:
    """The business currency per hour of review; None when unset."""
    value = settings.BATCHDESK_REVIEW_HOURLY_RATE
    return read_hourly_rate(value) if value else None


def check_review_hourly_rate(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """System check: a review rate that is set but is no positive amount stops every process."""
    return setting_refused(
        "BATCHDESK_REVIEW_HOURLY_RATE",
        read_hourly_rate,
        ValueError,
        hint="Set it to the business currency per hour of review, e.g. 32.50, or unset it.",
        id="batchdesk.E007",
        named=True,
    )
