"""The prompt screens: versions per task, one version with a preview of its exact request, and
new versions (never edits)."""

import json

import pytest
from django.urls import reverse

from ledger.actions.core import NotAllowed
from ledger.actions.prompts import create_prompt_version
from ledger.drafts.schema_dialects import sent_schema
from ledger.models import PromptVersion
from tests.factories import JobFactory, ProductFactory, UserFactory

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'


@pytest.fixture
def v1() -> PromptVersion:
    return PromptVersion.objects.get(task="product_description", version=1)


def as_dict(prompt: PromptVersion) -> dict:
    prompt.refresh_from_db()
    return {
        "system_message": prompt.system_message,
        "template": prompt.template,
        "output_schema": prompt.output_schema,
        "rules": prompt.rules,
        "max_output_tokens": prompt.max_output_tokens,
    }


def new_version(prompt: PromptVersion, **changes) -> dict:
    """The form as it arrives pre-filled from `prompt`, with some fields changed."""
    data = {
        "task": prompt.task,
        "system_message": prompt.system_message,
        "template": prompt.template,
        "output_schema": json.dumps(prompt.output_schema, indent=2),
        "rules": json.dumps(prompt.rules, indent=2),
        "max_output_tokens": str(prompt.max_output_tokens),
    }
    return {**data, **changes}


def new_url(prompt: PromptVersion) -> str:
    return f"{reverse('prompt_new')}?from={prompt.pk}"


# --- who may do what ---------------------------------------------------------------------


def pages(prompt: PromptVersion) -> list[str]:
    return [reverse("prompts"), reverse("prompt_detail", args=[prompt.pk]), new_url(prompt)]


def test_the_prompt_screens_need_a_login(client, v1):
    for url in pages(v1):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith(reverse("login")), url
    response = client.post(new_url(v1), new_version(v1, max_output_tokens="700"))
    assert response.status_code == 302 and response.url.startswith(reverse("login"))
    assert PromptVersion.objects.count() == 1


def test_a_user_without_a_role_sees_nothing(client, v1, outsider):
    client.force_login(outsider)
    for url in pages(v1):
        assert client.get(url).status_code == 403, url
    assert client.post(new_url(v1), new_version(v1, max_output_tokens="700")).status_code == 403
    assert PromptVersion.objects.count() == 1


def test_an_operator_sees_prompts_but_cannot_create_one(client, v1, operator):
    client.force_login(operator)
    for url in pages(v1):
        assert client.get(url).status_code == 200, url
    assert client.post(new_url(v1), new_version(v1, max_output_tokens="700")).status_code == 403
    assert PromptVersion.objects.count() == 1
    assert (
        "Only catalogue owners and admins create prompt versions." in client.get(new_url(v1)).content.decode()
    )
    assert reverse("prompt_new") not in client.get(reverse("prompts")).content.decode()


@pytest.mark.parametrize("roles", [["catalogue_owner"], ["admin"]])
def test_owners_and_admins_create_versions(client, v1, roles):
    client.force_login(UserFactory(roles=roles))
    assert client.post(new_url(v1), new_version(v1, max_output_tokens="700")).status_code == 302
    assert PromptVersion.objects.filter(task="product_description", version=2).exists()


# --- list and detail -----------------------------------------------------------------------


def test_the_list_shows_versions_per_task_and_their_jobs(client, owner, v1):
    create_prompt_version(task="product_description", **{**as_dict(v1), "max_output_tokens": 500})
    create_prompt_version(task="headline", **as_dict(v1))
    JobFactory.create_batch(2, prompt_version=v1)
    client.force_login(owner)
    response = client.get(reverse("prompts"))
    rows = [(p.task, p.version, p.jobs_using) for p in response.context["versions"]]
    assert rows == [("headline", 1, 0), ("product_description", 2, 0), ("product_description", 1, 2)]
    html = response.content.decode()
    assert 'data-testid="task-headline"' in html and 'data-testid="task-product_description"' in html
    assert f"{reverse('prompt_new')}?from={v1.pk}" in html


def test_the_detail_shows_the_whole_version(client, owner, v1):
    client.force_login(owner)
    html = client.get(reverse("prompt_detail", args=[v1.pk])).content.decode()
    assert "Use only the facts given." in html
    assert "Title: {title}" in html
    assert "&quot;additionalProperties&quot;: false" in html  # pretty JSON
    assert "&quot;text_field&quot;: &quot;description&quot;" in html
    assert "Enter a SKU to see the request" in html


def test_an_unknown_version_is_404(client, owner):
    client.force_login(owner)
    assert client.get(reverse("prompt_detail", args=[999999])).status_code == 404
    assert client.get(f"{reverse('prompt_new')}?from=999999").status_code == 404
    assert client.get(f"{reverse('prompt_new')}?from=abc").status_code == 404


# --- the request preview -------------------------------------------------------------------


def test_the_preview_shows_the_exact_request_with_the_title_escaped(client, operator, v1):
    ProductFactory(sku="OAK-1", revision__title=f"Oak {XSS} board", revision__fields={"material": "oak"})
    client.force_login(operator)
    response = client.get(reverse("prompt_detail", args=[v1.pk]), {"sku": "OAK-1", "model": "gpt-4o"})
    html = response.content.decode()
    assert "<script>alert" not in html
    line = json.loads(response.context["preview"].request_json)
    assert line["url"] == "/v1/chat/completions" and line["body"]["model"] == "gpt-4o"
    assert line["body"]["max_completion_tokens"] == 600
    # OpenAI is sent its strict dialect of the schema (SPEC rule 17).
    assert line["body"]["response_format"]["json_schema"]["schema"] == (
        sent_schema(v1.output_schema, "openai_strict").schema
    )
    user_message = line["body"]["messages"][1]["content"]
    assert f"Title: Oak {XSS} board" in user_message and "- material: oak" in user_message
    # The title inside the request JSON, JSON-escaped and then HTML-escaped.
    assert "Title: Oak &lt;script&gt;alert(\\&quot;x\\&quot;)&lt;/script&gt; board" in html


def test_the_preview_for_an_unknown_sku_says_so(client, owner, v1):
    client.force_login(owner)
    response = client.get(reverse("prompt_detail", args=[v1.pk]), {"sku": "NOPE"})
    assert response.status_code == 200
    assert "No product has the SKU “NOPE”." in response.content.decode()
    assert response.context["preview"] is None


def test_the_htmx_preview_is_a_partial(client, owner, v1):
    ProductFactory(sku="OAK-1")
    client.force_login(owner)
    response = client.get(
        reverse("prompt_detail", args=[v1.pk]), {"sku": "OAK-1"}, headers={"HX-Request": "true"}
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="preview"')
    assert "<html" not in html and "&quot;custom_id&quot;" in html


# --- new versions --------------------------------------------------------------------------


def test_the_new_version_form_is_prefilled_from_the_source(client, owner, v1):
    client.force_login(owner)
    response = client.get(new_url(v1))
    form = response.context["form"]
    assert form["task"].value() == "product_description"
    assert json.loads(form["output_schema"].value()) == v1.output_schema
    html = response.content.decode()
    assert "Title: {title}" in html and "&quot;description&quot;" in html


def test_a_new_version_is_the_next_number_and_leaves_the_old_one_alone(client, owner, v1):
    before = as_dict(v1)
    JobFactory(prompt_version=v1)
    client.force_login(owner)
    template = "Describe this product in two sentences.\r\nTitle: {title}\r\nFacts:\r\n{facts}"
    response = client.post(new_url(v1), new_version(v1, template=template))
    v2 = PromptVersion.objects.get(task="product_description", version=2)
    assert response.status_code == 302 and response.url == reverse("prompt_detail", args=[v2.pk])
    assert v2.template == "Describe this product in two sentences.\nTitle: {title}\nFacts:\n{facts}"
    assert (v2.output_schema, v2.rules, v2.system_message) == (
        v1.output_schema,
        v1.rules,
        v1.system_message,
    )
    assert as_dict(v1) == before
    assert (
        "Created product_description v2. Earlier versions are unchanged."
        in client.get(response.url).content.decode()
    )
    client.post(new_url(v1), new_version(v1, max_output_tokens="800"))
    assert PromptVersion.objects.get(task="product_description", version=3).max_output_tokens == 800


def test_a_new_task_starts_at_version_1(client, owner, v1):
    client.force_login(owner)
    client.post(reverse("prompt_new"), new_version(v1, task="headline"))
    assert PromptVersion.objects.get(task="headline").version == 1


def test_an_unchanged_copy_is_refused(client, owner, v1):
    client.force_login(owner)
    response = client.post(new_url(v1), new_version(v1))
    assert response.status_code == 400
    assert "Nothing changed: this would be a copy of product_description v1." in response.content.decode()
    assert PromptVersion.objects.count() == 1


@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"output_schema": "{not json"}, "output_schema", "Not valid JSON"),
        ({"output_schema": "[1, 2]"}, "output_schema", "The output schema must be a JSON object"),
        ({"output_schema": '{"type": "nonsense"}'}, "output_schema", "not a valid JSON Schema"),
        ({"output_schema": '{"type": "string"}'}, "output_schema", '("type": "object")'),
        ({"output_schema": ""}, "output_schema", "This field is required."),
        ({"template": "Title: {title}"}, "template", "The template must contain {facts}"),
        ({"template": "{title} {facts} {price}"}, "template", "The template uses {price}"),
        ({"template": "{title} {facts} {"}, "template", "The template does not format"),
        ({"template": "{title} {facts} {0}"}, "template", "The template uses {0}"),
        ({"rules": '{"min_length": -1}'}, "rules", "min_length must be a whole number"),
        ({"rules": '{"text_field": "body"}'}, "rules", 'text_field "body" is not a property'),
        ({"rules": '{"colour": "red"}'}, "rules", "Unknown rules: colour"),
        ({"rules": '{"claim_words": "vegan"}'}, "rules", "claim_words must be a list"),
        ({"task": "Product Description"}, "task", "Lower-case letters"),
        ({"max_output_tokens": "0"}, "max_output_tokens", "greater than or equal to 1"),
        ({"system_message": "  "}, "system_message", "This field is required."),
        # Placeholders are written plainly: no format spec, conversion, index or attribute.
        ({"template": "{title:>10} {facts}"}, "template", "The template writes {title:>10}: write {title}"),
        ({"template": "{title!r} {facts}"}, "template", "The template writes {title!r}"),
        ({"template": "{title} {facts[0]}"}, "template", "The template writes {facts[0]}"),
        ({"template": "{title.upper} {facts}"}, "template", "The template writes {title.upper}"),
        ({"template": "{title:{facts}} {facts}"}, "template", "The template writes {title:{facts}}"),
        ({"template": "{title} {facts} {price:.2f}"}, "template", "The template uses {price:.2f}"),
        # NUL, typed or escaped in JSON: PostgreSQL cannot store it.
        ({"template": "{title}\x00{facts}"}, "template", "Null characters are not allowed"),
        ({"system_message": "Write.\x00"}, "system_message", "Null characters are not allowed"),
        (
            {"output_schema": '{"type": "object", "description": "a\\u0000b"}'},
            "output_schema",
            'The output schema, key "description" contains a NUL character',
        ),
        (
            {"output_schema": '{"type": "object", "properties": {"a\\u0000": {"type": "string"}}}'},
            "output_schema",
            'The output schema, key "properties" has a key that contains a NUL character',
        ),
        (
            {"rules": '{"claim_words": ["vegan\\u0000"]}'},
            "rules",
            'The rules, key "claim_words", item 1 contains a NUL character',
        ),
        # Numbers JSON does not have.
        (
            {"output_schema": '{"type": "object", "maxProperties": NaN}'},
            "output_schema",
            "is not a finite number",
        ),
        (
            {"output_schema": '{"type": "object", "maxProperties": -Infinity}'},
            "output_schema",
            "is not a finite number",
        ),
        (
            {"output_schema": '{"type": "object", "maxProperties": 1e999}'},
            "output_schema",
            "is not a finite number",
        ),
        ({"rules": '{"min_length": NaN}'}, "rules", 'The rules, key "min_length" is not a finite number'),
        ({"max_output_tokens": "NaN"}, "max_output_tokens", "Enter a whole number."),
        ({"max_output_tokens": "9" * 30}, "max_output_tokens", "less than or equal to 100000"),
        # Nesting that would exhaust a stack.
        ({"output_schema": "[" * 5000 + "]" * 5000}, "output_schema", "nested too deeply"),
        (
            {"output_schema": '{"type": "object", "not": ' * 40 + "{}" + "}" * 40},
            "output_schema",
            "The output schema nests lists and objects more than 32 deep",
        ),
    ],
)
def test_invalid_versions_are_refused_and_nothing_is_created(client, owner, v1, changes, field, message):
    before = as_dict(v1)
    client.force_login(owner)
    response = client.post(new_url(v1), new_version(v1, **changes))
    assert response.status_code == 400
    errors = response.context["form"].errors[field]
    assert any(message in error for error in errors), errors
    assert PromptVersion.objects.count() == 1 and as_dict(v1) == before


def test_no_rules_means_an_empty_rule_set(client, owner, v1):
    client.force_login(owner)
    client.post(new_url(v1), new_version(v1, rules=""))
    assert PromptVersion.objects.get(version=2).rules == {}


def test_the_verb_refuses_bad_input_on_its_own(v1):
    good = as_dict(v1)
    with pytest.raises(NotAllowed, match=r"must contain \{title\}"):
        create_prompt_version(task="product_description", **{**good, "template": "{facts}"})
    with pytest.raises(NotAllowed, match="not a valid JSON Schema"):
        create_prompt_version(task="product_description", **{**good, "output_schema": {"type": 5}})
    with pytest.raises(NotAllowed, match="task name"):
        create_prompt_version(task="", **good)
    assert PromptVersion.objects.count() == 1
    assert create_prompt_version(task="product_description", **good).version == 2


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"template": "{title!r} {facts}"}, r"writes \{title!r\}"),
        ({"template": "{title} {facts:>999999999}"}, r"writes \{facts:>999999999\}"),
        ({"system_message": "Write.\x00"}, "The system message contains a NUL character"),
        ({"template": "{title}\x00{facts}"}, "The template contains a NUL character"),
        (
            {"output_schema": {"type": "object", "description": "\x00"}},
            "The output schema, key .description. contains a NUL",
        ),
        ({"output_schema": {"type": "object", "maxProperties": float("nan")}}, "is not a finite number"),
        ({"rules": {"min_length": float("inf")}}, 'The rules, key "min_length" is not a finite number'),
        ({"rules": {"claim_words": [object()]}}, "The rules, key .claim_words., item 1 is not a JSON value"),
        ({"max_output_tokens": float("nan")}, "max_output_tokens must be a whole number"),
        ({"max_output_tokens": 10**30}, "max_output_tokens must be a whole number"),
        ({"max_output_tokens": 5.5}, "max_output_tokens must be a whole number"),
        ({"max_output_tokens": True}, "max_output_tokens must be a whole number"),
    ],
)
def test_the_verb_refuses_format_specs_nul_and_nan(v1, changes, message):
    with pytest.raises(NotAllowed, match=message):
        create_prompt_version(task="product_description", **{**as_dict(v1), **changes})
    assert PromptVersion.objects.count() == 1
