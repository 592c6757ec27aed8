"""Helpers for the browser tests (the fixtures `page` and `apply_inline` are in conftest.py)."""


def log_in(page, live_server, user, *, then: str) -> None:
    page.goto(live_server.url + then)
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(live_server.url + then)
