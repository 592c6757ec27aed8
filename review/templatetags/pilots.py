"""Template face of a pilot's report: `{% load pilots %}`, then `{{ share|percent }}` (0.6667: `66.7 %`)."""

from django import template

register = template.Library()


@register.filter
def percent(share: float | None) -> str:
    if share is None or share == "":
        return "—"
    return f"{100 * share:.1f} %".replace(".0 %", " %")
