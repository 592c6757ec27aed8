"""Lists and objects as product fields (SPEC §7): imported, hashed canonically, put in prompts,
and read by the check that a draft claims nothing the source does not state."""

import json
from pathlib import Path

import pytest

from ledger.catalogue import import_catalogue
from ledger.drafts.json_values import MAX_FIELD_DEPTH
from ledger.drafts.validation import check_draft, render_user_message, source_text
from ledger.models import Product, PromptVersion, SourceRevision

pytestmark = pytest.mark.django_db

LAMP = {
    "sku": "LIG-7",
    "title": "Petrel desk lamp",
    "features": ["LED", "dimmable", "", "USB-C"],
    "dimensions": {"h_cm": 42, "w_cm": 14.5, "base": {"shape": "round", "weighted": True}},
    "colour": "sage",
    "note": None,
}


def write_jsonl(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def lamp_revision() -> SourceRevision:
    return Product.objects.get(sku="LIG-7").current_revision


def test_lists_and_objects_are_stored_as_given(tmp_path):
    report = import_catalogue(write_jsonl(tmp_path, "a.jsonl", json.dumps(LAMP)))

    assert report.summary == "created 1, revised 0, unchanged 0, withdrawn 0, rejected 0"
    # A blank string inside a list is kept; a null at the top is no field, as before.
    assert lamp_revision().fields == {
        "features": ["LED", "dimmable", "", "USB-C"],
        "dimensions": {"h_cm": 42, "w_cm": 14.5, "base": {"shape": "round", "weighted": True}},
        "colour": "sage",
    }


def test_key_order_at_any_depth_makes_no_revision_and_a_changed_value_does(tmp_path):
    import_catalogue(write_jsonl(tmp_path, "a.jsonl", json.dumps(LAMP)))
    swapped = {
        "colour": "sage",
        "dimensions": {"base": {"weighted": True, "shape": "round"}, "w_cm": 14.5, "h_cm": 42},
        "title": "Petrel desk lamp",
        "features": ["LED", "dimmable", "", "USB-C"],
        "sku": "LIG-7",
    }

    again = import_catalogue(write_jsonl(tmp_path, "b.jsonl", json.dumps(swapped)))

    assert again.summary == "created 0, revised 0, unchanged 1, withdrawn 0, rejected 0"
    assert SourceRevision.objects.count() == 1

    reordered_list = {**LAMP, "features": ["dimmable", "LED", "", "USB-C"]}
    moved = import_catalogue(write_jsonl(tmp_path, "c.jsonl", json.dumps(reordered_list)))
    # A list is a sequence: its order is content.
    assert moved.revised == 1
    one_for_true = {
        **reordered_list,
        "dimensions": {**LAMP["dimensions"], "base": {"shape": "round", "weighted": 1}},
    }
    changed = import_catalogue(write_jsonl(tmp_path, "d.jsonl", json.dumps(one_for_true)))
    assert changed.revised == 1
    assert lamp_revision().number == 3


def deep(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


NESTED_REFUSALS = [
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "features": ["LED", "dim\\u0000"]}',
        'field "features", item 2 contains a NUL character',
        id="nul-in-a-list",
    ),
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "size": {"outer": {"w\\u0000": 1}}}',
        'field "size", key "outer" has a key that contains a NUL character',
        id="nul-in-a-key",
    ),
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "tags": [{"label": "\\ud800"}]}',
        'field "tags", item 1, key "label" contains an unpaired surrogate escape',
        id="lone-surrogate",
    ),
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "sizes": [1, 1e400]}',
        'field "sizes", item 2 is not a finite number',
        id="infinite-number",
    ),
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "sizes": [NaN]}',
        "NaN is not a number",
        id="nan",
    ),
    pytest.param(
        json.dumps({"sku": "A-1", "title": "Jar", "deep": deep(MAX_FIELD_DEPTH + 1)}),
        f'field "deep" nests lists and objects more than {MAX_FIELD_DEPTH} deep',
        id="too-deep",
    ),
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "deep": ' + "[" * 30_000 + "]" * 30_000 + "}",
        "nested thousands deep",
        id="deeper-than-python-reads",
    ),
    pytest.param(
        '{"sku": "A-1", "title": "Jar", "count": ' + "9" * 5000 + "}",
        "not valid JSON here (Exceeds the limit (4300 digits)",
        id="huge-integer",
    ),
]


@pytest.mark.parametrize(("line", "message"), NESTED_REFUSALS)
def test_what_a_database_cannot_store_is_refused_with_its_place(tmp_path, line, message):
    report = import_catalogue(write_jsonl(tmp_path, "bad.jsonl", json.dumps(LAMP), line))

    assert not report.imported
    assert [str(error) for error in report.errors] == [f"line 2: {report.errors[0].message}"]
    assert message in report.errors[0].message
    assert not Product.objects.exists()


def test_the_deepest_value_allowed_is_imported(tmp_path):
    record = {"sku": "A-1", "title": "Jar", "deep": deep(MAX_FIELD_DEPTH)}

    assert import_catalogue(write_jsonl(tmp_path, "a.jsonl", json.dumps(record))).created == 1
    assert Product.objects.get().current_revision.fields["deep"] == deep(MAX_FIELD_DEPTH)


def test_the_prompt_gives_lists_and_objects_as_compact_json_and_text_as_it_is(tmp_path):
    import_catalogue(write_jsonl(tmp_path, "a.jsonl", json.dumps(LAMP)))
    prompt = PromptVersion(
        task="t", version=1, system_message="s", template="{title}\n{facts}", output_schema={}
    )

    message = render_user_message(prompt, lamp_revision())

    assert message == (
        "Petrel desk lamp\n"
        "- colour: sage\n"
        '- dimensions: {"base":{"shape":"round","weighted":true},"h_cm":42,"w_cm":14.5}\n'
        '- features: ["LED","dimmable","","USB-C"]'
    )


CLAIMS = {"claim_words": ["dimmable", "weighted", "round", "waterproof", "usb-c"]}


def test_a_claim_stated_only_inside_a_list_or_an_object_is_not_a_false_claim(tmp_path):
    import_catalogue(write_jsonl(tmp_path, "a.jsonl", json.dumps(LAMP)))
    prompt = PromptVersion(
        task="t", version=1, system_message="s", template="{facts}", output_schema={}, rules=CLAIMS
    )
    draft = "A dimmable USB-C lamp on a round, weighted base."

    checked = check_draft(prompt=prompt, revision=lamp_revision(), output=draft)
    assert (checked.text, checked.reasons) == (draft, [])

    reasons = check_draft(prompt=prompt, revision=lamp_revision(), output=draft + " Waterproof too.").reasons
    assert reasons == [
        "Claims “waterproof”, which the product's source does not state: "
        "“…on a round, weighted base. Waterproof too.”"
    ]


def test_the_source_text_holds_every_name_and_value_one_piece_a_line():
    revision = SourceRevision(
        title="Jug", fields={"care": ["dishwasher", "safe below 60\u00b0C"], "specs": {"lid": False}}
    )

    assert source_text(revision) == "jug\ncare\ndishwasher\nsafe below 60\u00b0c\nspecs\nlid\nfalse"
    # Two list entries are two statements: "dishwasher safe" is stated by neither.
    prompt = PromptVersion(rules={"claim_words": ["dishwasher safe"]}, output_schema={})
    assert check_draft(prompt=prompt, revision=revision, output="A dishwasher safe jug.")[1]
