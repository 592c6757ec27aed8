"""Company sign-in in a real browser (SPEC §8): BatchDesk's button, the provider's own log-in form
(tests/oidc_provider, a real OpenID provider in a process of its own), back at BatchDesk with the role
of the directory group; the group taken away in the directory, the role is gone at the next sign-in."""

import pytest
from django.contrib.auth.models import User

from tests.oidc_provider.running import start_provider
from tests.review.test_narrow_screens import OVERFLOWING, PHONE

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def directory(tmp_path, live_server, settings):
    provider = start_provider(tmp_path, live_server.url + "/oidc/callback/")
    for name, value in provider.batchdesk_settings().items():
        setattr(settings, name, value)
    yield provider
    provider.stop()


def sign_in_with_the_directory(page) -> None:
    page.get_by_role("link", name="Sign in with Acme Directory").click()


def test_the_role_follows_the_directory_group_in_the_browser(page, live_server, directory):
    from playwright.sync_api import expect

    directory.person("alice", password="directory-pw", groups="Catalogue team")
    page.set_viewport_size(PHONE)
    page.goto(live_server.url + "/review/")
    page.wait_for_url(f"{live_server.url}/accounts/login/?next=/review/")
    assert page.evaluate(OVERFLOWING) == []

    sign_in_with_the_directory(page)
    # The provider's own form, on its own address.
    page.wait_for_url(f"{directory.issuer.removesuffix('/o')}/accounts/login/**")
    page.get_by_label("Directory user name").fill("alice")
    page.get_by_label("Directory password").fill("directory-pw")
    page.get_by_role("button", name="Sign in to the directory").click()

    page.wait_for_url(live_server.url + "/review/")
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    expect(page.locator("a.who")).to_contain_text("alice")
    alice = User.objects.get(username="alice")
    assert set(alice.groups.values_list("name", flat=True)) == {"catalogue_owner"}
    page.goto(live_server.url + "/")
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()

    # The directory takes her out of the group; she signs out and in again (the provider remembers
    # her, so no form this time).
    directory.person("alice", groups="")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(live_server.url + "/accounts/login/")
    sign_in_with_the_directory(page)
    page.wait_for_url(live_server.url + "/")
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.locator("a.who")).to_contain_text("alice")
    assert not alice.groups.exists()
