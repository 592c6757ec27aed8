"""The Content-Security-Policy: scripts only from our own files, so injected markup cannot run."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

pytestmark = pytest.mark.django_db

TEMPLATES = Path(settings.BASE_DIR) / "templates"


def directives(response) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    return {name: values for name, *values in (part.split() for part in policy.split(";"))}


def test_every_page_says_scripts_come_from_this_server_only(client, owner):
    for response in (client.get(reverse("login")), client.get("/api/health")):
        policy = directives(response)
        assert policy["script-src"] == ["'self'"]
        assert policy["default-src"] == ["'self'"]
        assert policy["object-src"] == ["'none'"]
        assert policy["frame-ancestors"] == ["'none'"]
    client.force_login(owner)
    assert directives(client.get(reverse("dashboard")))["script-src"] == ["'self'"]


DJANGO_COMMENT = re.compile(r"\{#.*?#\}")
INLINE_CODE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline <script>"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "an inline event handler (on…=)"),
    (re.compile(r"\b(hx|data-hx)-on", re.I), "hx-on (htmx would have to evaluate it)"),
    (re.compile(r"javascript:", re.I), "a javascript: address"),
    (re.compile(r"<style", re.I), "an inline <style>"),
]


def test_no_template_carries_code_the_policy_would_block():
    found = [
        f"{path.relative_to(TEMPLATES)}: {what}"
        for path in sorted(TEMPLATES.rglob("*.html"))
        for pattern, what in INLINE_CODE
        if pattern.search(DJANGO_COMMENT.sub("", path.read_text()))
    ]
    assert found == []
