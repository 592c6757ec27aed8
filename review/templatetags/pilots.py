"""Template face of a pilot's report: `{% load pilots %}`, then `{{ share|percent }}` (0.6667: `66.7 %`)
and `{{ difference|points }}` (-0.08: `−8 %`, 0.12: `+12 %`)."""

from django import template

register = template.Library()


@register.filter
def percent(share: float | None) -> str:
    if share is None or share == "":
        return "—"
    return f"{100 * share:.1f} %".replace(".0 %", " %")


@register.filter
def points(difference: float | None) -> str:
    """A difference of two shares, signed: `+12 %`, `−8.3 %`, `0 %`."""
    if difference is None or difference == "":
        return "—"
    text = percent(abs(difference))
    if difference > 0:
        return "+" + text
    return "−" + text if difference < 0 else text
