"""POST /api/prompts/{task}/current {version} (SPEC §6): a catalogue owner makes a version current."""

import pytest

from ledger.actions.prompts import create_prompt_version
from ledger.models import CurrentPromptChoice, Job, PromptVersion
from tests.api.conftest import assert_error
from tests.factories import ProductFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/prompts/product_description/current"


@pytest.fixture
def v2() -> PromptVersion:
    v1 = PromptVersion.objects.get(task="product_description", version=1)
    return create_prompt_version(
        task="product_description",
        system_message=v1.system_message,
        template=v1.template,
        output_schema=v1.output_schema,
        rules={**v1.rules, "max_length": 200},
        max_output_tokens=v1.max_output_tokens,
    )


def current_version() -> int | None:
    current = PromptVersion.objects.filter(task="product_description").current().first()
    return current.version if current else None


def test_an_owner_makes_a_version_current_and_new_jobs_use_it(as_owner, owner, v2):
    ProductFactory()
    assert (
        as_owner.post_json(
            "/api/jobs", {"reference": "before", "task": "product_description", "provider": "emulator"}
        ).status_code
        == 202
    )

    response = as_owner.post_json(URL, {"version": 2})

    assert response.status_code == 200
    body = response.json()
    assert {
        key: body[key]
        for key in ("task", "version", "prompt_version_id", "made_current_by", "replaced_version", "changed")
    } == {
        "task": "product_description",
        "version": 2,
        "prompt_version_id": v2.pk,
        "made_current_by": owner.username,
        "replaced_version": 1,
        "changed": True,
    }
    assert body["made_current_at"]
    choice = CurrentPromptChoice.objects.order_by("-pk").first()
    assert (choice.prompt_version, choice.actor) == (v2, owner)
    assert (
        as_owner.post_json(
            "/api/jobs", {"reference": "after", "task": "product_description", "provider": "emulator"}
        ).status_code
        == 202
    )
    assert Job.objects.get(reference="before").prompt_version.version == 1
    assert Job.objects.get(reference="after").prompt_version == v2
    # Everyone may read it.
    assert as_owner.get(URL).json()["version"] == 2


def test_the_same_call_again_changes_nothing(as_owner, v2):
    assert as_owner.post_json(URL, {"version": 2}).json()["changed"] is True
    again = as_owner.post_json(URL, {"version": 2})
    assert again.status_code == 200 and again.json()["changed"] is False
    assert CurrentPromptChoice.objects.count() == 2  # migrate's, and this one


def test_an_operator_reads_but_cannot_choose(as_operator, v2):
    assert as_operator.get(URL).json()["version"] == 1
    assert_error(as_operator.post_json(URL, {"version": 2}), 403, "forbidden")
    assert current_version() == 1


def test_without_a_token_or_a_role_nothing_happens(api_as, as_outsider, client, v2):
    assert_error(client.post(URL, {"version": 2}, content_type="application/json"), 401, "unauthenticated")
    assert_error(as_outsider.post_json(URL, {"version": 2}), 403, "forbidden")
    assert current_version() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "version"),
        ({"version": None}, "version"),
        ({"version": "2"}, "version"),
        ({"version": 2.0}, "version"),
        ({"version": True}, "version"),
        ({"version": 0}, "version"),
        ({"version": -2}, "version"),
        ({"version": 10**30}, "version"),
        ({"version": 2**31}, "version"),
        ({"version": 3}, "version"),  # no such version of the task
        ({"version": 2, "note": "x"}, "note"),
    ],
)
def test_bad_input_is_400_and_changes_nothing(as_owner, v2, body, field):
    assert_error(as_owner.post_json(URL, body), 400, "invalid", {field})
    assert current_version() == 1 and CurrentPromptChoice.objects.count() == 1


@pytest.mark.parametrize("raw", ["[2]", '"2"', "{", '{"version": NaN}', '{"version": 2, "version": 1}'])
def test_a_body_that_is_not_one_json_object_is_400(as_owner, v2, raw):
    response = as_owner.post(URL, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert current_version() == 1


@pytest.mark.parametrize("task", ["headline", "Product_Description", "x" * 65, "a%00b", "%E2%80%AE", "_x"])
def test_an_unknown_task_is_404(as_owner, task):
    assert_error(as_owner.post_json(f"/api/prompts/{task}/current", {"version": 1}), 404, "not_found")
    assert_error(as_owner.get(f"/api/prompts/{task}/current"), 404, "not_found")


def test_a_task_with_no_current_version_says_so_until_one_is_made_current(as_owner, owner):
    v1 = PromptVersion.objects.get(task="product_description", version=1)
    create_prompt_version(
        task="headline",
        system_message=v1.system_message,
        template=v1.template,
        output_schema=v1.output_schema,
        rules=v1.rules,
        max_output_tokens=100,
    )
    ProductFactory()
    assert as_owner.get("/api/prompts/headline/current").json()["version"] is None
    refused = as_owner.post_json("/api/jobs", {"reference": "h", "task": "headline", "provider": "emulator"})
    error = assert_error(refused, 400, "invalid", {"prompt_version"})
    assert "no current prompt version" in error["fields"]["prompt_version"]
    made = as_owner.post_json("/api/prompts/headline/current", {"version": 1})
    assert made.status_code == 200 and made.json()["replaced_version"] is None
    assert (
        as_owner.post_json(
            "/api/jobs", {"reference": "h", "task": "headline", "provider": "emulator"}
        ).status_code
        == 202
    )


def test_other_methods_are_405(as_owner):
    response = as_owner.put_json(URL, {"version": 1})
    assert_error(response, 405, "method_not_allowed")
    assert set(response["Allow"].split(", ")) == {"GET", "POST"}


def test_an_admin_may_choose(api_as, v2):
    admin = UserFactory(roles=["admin"])
    assert api_as(admin).post_json(URL, {"version": 2}).status_code == 200
    assert current_version() == 2
