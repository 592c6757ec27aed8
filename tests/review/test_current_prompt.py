"""A prompt version is made current on purpose (SPEC §1, issue 18 point 3): a new version is not
current, "Make current" on its page makes it the one jobs naming no version use, recorded with who
and when, and the page shows what it changes from the current version."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from ledger.actions.core import NotAllowed
from ledger.actions.jobs import create_job
from ledger.actions.prompts import create_prompt_version, make_prompt_current
from ledger.models import CurrentPromptChoice, PromptVersion
from tests.factories import ProductFactory, UserFactory

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'


@pytest.fixture
def v1() -> PromptVersion:
    return PromptVersion.objects.get(task="product_description", version=1)


def fields_of(prompt: PromptVersion, **changes) -> dict:
    return {
        "system_message": prompt.system_message,
        "template": prompt.template,
        "output_schema": prompt.output_schema,
        "rules": prompt.rules,
        "max_output_tokens": prompt.max_output_tokens,
        **changes,
    }


@pytest.fixture
def v2(v1) -> PromptVersion:
    """A stricter version: a shorter description is allowed at most."""
    return create_prompt_version(
        task="product_description", **fields_of(v1, rules={**v1.rules, "max_length": 200})
    )


def current_of(task: str = "product_description") -> PromptVersion | None:
    return PromptVersion.objects.filter(task=task).current().first()


def job_without_version(owner, reference: str):
    ProductFactory()
    return create_job(reference=reference, owner=owner, task="product_description", provider="emulator")


def make_current_url(prompt: PromptVersion) -> str:
    return reverse("prompt_make_current", args=[prompt.pk])


# --- the rule ------------------------------------------------------------------------------


def test_a_migrated_deployment_has_a_current_default_prompt_made_so_by_the_system(v1, owner):
    assert current_of() == v1
    choice = CurrentPromptChoice.objects.get(task="product_description")
    assert (choice.actor, choice.actor_name, choice.replaced) == (None, "system", None)
    assert job_without_version(owner, "out-of-the-box").prompt_version == v1


def test_a_new_version_is_not_current_and_jobs_naming_none_keep_the_current_one(v1, v2, owner):
    assert current_of() == v1
    assert job_without_version(owner, "after-v2").prompt_version == v1
    # Named, it is used.
    named = create_job(
        reference="named", owner=owner, task="product_description", provider="emulator", prompt_version=2
    )
    assert named.prompt_version == v2


def test_a_new_tasks_first_version_is_not_current_either_and_a_job_must_name_it(v1, owner):
    headline = create_prompt_version(task="headline", **fields_of(v1))
    ProductFactory()
    assert current_of("headline") is None
    with pytest.raises(NotAllowed, match="no current prompt version"):
        create_job(reference="h", owner=owner, task="headline", provider="emulator")
    job = create_job(reference="h", owner=owner, task="headline", provider="emulator", prompt_version=1)
    assert job.prompt_version == headline


def test_making_current_is_recorded_with_who_when_and_what_it_replaced(v1, v2, owner):
    choice, made = make_prompt_current(prompt=v2, actor=owner)
    assert made and current_of() == v2
    assert (choice.actor, choice.actor_name, choice.replaced, choice.task) == (
        owner,
        owner.username,
        v1,
        "product_description",
    )
    assert job_without_version(owner, "after-make-current").prompt_version == v2
    # Again: nothing written.
    again, made = make_prompt_current(prompt=v2, actor=UserFactory(roles=["catalogue_owner"]))
    assert not made and again == choice
    assert CurrentPromptChoice.objects.filter(task="product_description").count() == 2
    # Back to v1: a new row, the history kept.
    back, made = make_prompt_current(prompt=v1, actor=owner)
    assert made and back.replaced == v2 and current_of() == v1
    assert CurrentPromptChoice.objects.filter(task="product_description").count() == 3


def test_a_choice_made_on_a_stale_view_is_refused_and_changes_nothing(v1, v2, owner):
    other = UserFactory(roles=["catalogue_owner"], username="other-owner")
    make_prompt_current(prompt=v2, actor=other)
    with pytest.raises(NotAllowed, match="made current by other-owner"):
        make_prompt_current(prompt=v1, actor=owner, replacing=v1.pk)
    assert current_of() == v2


# --- the screen ----------------------------------------------------------------------------


def test_the_new_version_form_says_the_version_is_not_current(client, v1, owner):
    client.force_login(owner)
    data = {
        "task": "product_description",
        "system_message": v1.system_message,
        "template": v1.template,
        "output_schema": json.dumps(v1.output_schema),
        "rules": json.dumps(v1.rules),
        "max_output_tokens": "700",
    }
    response = client.post(f"{reverse('prompt_new')}?from={v1.pk}", data, follow=True)
    assert response.status_code == 200
    assert "It is not current: jobs that name no version go on using product_description v1" in (
        response.content.decode()
    )
    assert current_of() == v1


@pytest.mark.parametrize("roles", [["catalogue_owner"], ["admin"]])
def test_make_current_on_the_versions_page(client, v1, v2, roles):
    person = UserFactory(roles=roles)
    client.force_login(person)
    page = client.get(reverse("prompt_detail", args=[v2.pk])).content.decode()
    assert 'data-testid="not-current-badge"' in page and 'data-testid="make-current-form"' in page
    assert f'name="replacing" value="{v1.pk}"' in page

    response = client.post(make_current_url(v2), {"replacing": str(v1.pk)}, follow=True)

    assert response.redirect_chain == [(reverse("prompt_detail", args=[v2.pk]), 302)]
    html = response.content.decode()
    assert "product_description v2 is now current" in html
    assert 'data-testid="current-badge"' in html and 'data-testid="make-current-form"' not in html
    assert f'data-testid="made-current-by">{person.username}<' in html
    assert current_of() == v2
    choice = CurrentPromptChoice.objects.order_by("-pk").first()
    assert (choice.prompt_version, choice.actor, choice.replaced) == (v2, person, v1)
    # The list marks v2, not v1, as current; v1's page now offers to make it current again.
    listed = client.get(reverse("prompts")).content.decode()
    row = listed.split(f'data-testid="prompt-{v2.pk}"')[1].split("</tr>")[0]
    assert 'data-testid="current-badge"' in row
    assert listed.count('data-testid="current-badge"') == 1
    assert (
        'data-testid="make-current-form"'
        in client.get(reverse("prompt_detail", args=[v1.pk])).content.decode()
    )


def test_making_the_current_version_current_again_changes_nothing(client, v1, owner):
    client.force_login(owner)
    response = client.post(make_current_url(v1), {"replacing": str(v1.pk)}, follow=True)
    assert response.status_code == 200
    assert "was current already; nothing changed" in response.content.decode()
    assert CurrentPromptChoice.objects.count() == 1


def test_an_operator_an_outsider_and_a_stranger_cannot_make_a_version_current(
    client, v1, v2, operator, outsider
):
    for person in (operator, outsider):
        client.force_login(person)
        assert client.post(make_current_url(v2), {"replacing": str(v1.pk)}).status_code == 403
        page = client.get(reverse("prompt_detail", args=[v2.pk]))
        assert 'data-testid="make-current-form"' not in page.content.decode()
    client.logout()
    response = client.post(make_current_url(v2), {"replacing": str(v1.pk)})
    assert response.status_code == 302 and response.url.startswith(reverse("login"))
    assert current_of() == v1 and CurrentPromptChoice.objects.count() == 1


def test_make_current_takes_only_a_post(client, v1, v2, owner):
    client.force_login(owner)
    assert client.get(make_current_url(v2)).status_code == 405
    assert current_of() == v1


def test_make_current_needs_the_csrf_token(v1, v2, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(make_current_url(v2), {"replacing": str(v1.pk)}).status_code == 403
    assert current_of() == v1


def test_a_form_sent_again_after_someone_else_chose_is_refused_with_409(client, v1, v2, owner):
    v3 = create_prompt_version(task="product_description", **fields_of(v1, max_output_tokens=900))
    client.force_login(owner)
    # The page for v2 was shown while v1 was current; meanwhile another person made v3 current.
    make_prompt_current(prompt=v3, actor=UserFactory(roles=["catalogue_owner"], username="quicker"))

    response = client.post(make_current_url(v2), {"replacing": str(v1.pk)})

    assert response.status_code == 409
    html = response.content.decode()
    assert 'data-testid="make-current-refused"' in html and "made current by quicker" in html
    assert current_of() == v3


@pytest.mark.parametrize("replacing", ["abc", "0", "-1", "1" * 30, "١"])
def test_a_form_with_a_bad_version_is_400_and_changes_nothing(client, v1, v2, owner, replacing):
    client.force_login(owner)
    response = client.post(make_current_url(v2), {"replacing": replacing})
    assert response.status_code == 400
    assert current_of() == v1 and CurrentPromptChoice.objects.count() == 1


def test_an_unknown_version_is_404(client, owner):
    client.force_login(owner)
    assert client.post(reverse("prompt_make_current", args=[999_999]), {"replacing": ""}).status_code == 404


# --- the difference from the current version ---------------------------------------------


def test_the_versions_page_shows_what_it_changes_from_the_current_version(client, v1, owner):
    v2 = create_prompt_version(
        task="product_description",
        **fields_of(
            v1,
            template=v1.template + f"\nNever write {XSS}.",
            rules={**v1.rules, "max_length": 200},
        ),
    )
    client.force_login(owner)
    html = client.get(reverse("prompt_detail", args=[v2.pk])).content.decode()
    panel = html.split('data-testid="diff-against-current"')[1].split("</section>")[0]
    assert "product_description v1 → product_description v2" in panel
    assert "<del>-  &quot;max_length&quot;: 1200,</del>" in panel
    assert "<ins>+  &quot;max_length&quot;: 200,</ins>" in panel
    assert "<ins>+Never write &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;.</ins>" in panel
    assert XSS not in html
    # Only what changed: the output schema, system message and token limit are the same.
    assert 'data-testid="diff-template"' in panel and 'data-testid="diff-validation-rules"' in panel
    assert 'data-testid="diff-output-schema"' not in panel
    assert 'data-testid="diff-system-message"' not in panel
    assert 'data-testid="diff-max-output-tokens"' not in panel
    # The current version's own page has no difference to show.
    assert (
        'data-testid="diff-against-current"'
        not in client.get(reverse("prompt_detail", args=[v1.pk])).content.decode()
    )


def test_a_version_that_says_what_the_current_one_says_is_shown_as_such(client, v1, owner):
    same = create_prompt_version(task="product_description", **fields_of(v1))
    client.force_login(owner)
    html = client.get(reverse("prompt_detail", args=[same.pk])).content.decode()
    assert 'data-testid="no-changes"' in html


def test_the_versions_page_lists_who_made_which_version_current(client, v1, v2, owner):
    make_prompt_current(prompt=v2, actor=owner)
    client.force_login(owner)
    html = client.get(reverse("prompt_detail", args=[v1.pk])).content.decode()
    history = html.split('data-testid="current-history"')[1].split("</section>")[0]
    rows = history.split("<tr>")[2:]  # after the heading row
    assert len(rows) == 2
    assert "product_description v2" in rows[0] and owner.username in rows[0]
    assert "system" in rows[1] and "product_description v1" in rows[1]
