"""A person's own preferences: the time zone the screens show times in, and the review desk's
single-key shortcuts. Every signed-in person has this page, with a role or without."""

from zoneinfo import available_timezones

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from .models import DEFAULT_TIME_ZONE, Preferences

# Names in the time zone database that are no place's zone: "localtime" is the server's own zone
# (easily taken for "my local time"), "Factory" a placeholder that shows times as "-00".
NOT_A_PLACE = {"localtime", "Factory", "posixrules"}


def zone_choices() -> list[tuple[str, str]]:
    zones = sorted((available_timezones() - NOT_A_PLACE) | {DEFAULT_TIME_ZONE})
    return [(zone, zone.replace("_", " ")) for zone in zones]


class PreferencesForm(forms.ModelForm):
    time_zone = forms.ChoiceField(
        label="Time zone",
        choices=zone_choices,
        help_text="Every time on the screens is shown in this zone, and names it.",
    )
    keyboard_shortcuts = forms.BooleanField(
        label="Single-key shortcuts on the review desk",
        required=False,
        help_text="j next, k previous, a approve, e edit, r reject. Turn them off if stray keys reach "
        "the page (speech input, a screen reader's keys).",
    )

    class Meta:
        model = Preferences
        fields = ("time_zone", "keyboard_shortcuts")


@require_http_methods(["GET", "POST"])
@login_required
def preferences(request: HttpRequest) -> HttpResponse:
    current = Preferences.of(request.user)
    if request.method == "GET":
        return render(request, "preferences.html", {"form": PreferencesForm(instance=current)})
    form = PreferencesForm(request.POST, instance=current)
    if not form.is_valid():
        return render(request, "preferences.html", {"form": form}, status=400)
    saved = form.save()
    shortcuts = "on" if saved.keyboard_shortcuts else "off"
    messages.success(
        request, f"Saved: times are shown in {saved.time_zone}; single-key shortcuts are {shortcuts}."
    )
    return redirect("preferences")
