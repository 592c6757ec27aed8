"""Roles, the default product_description prompt, and the database guard on events."""

from django.db import migrations

ROLES = ["catalogue_owner", "operator", "admin"]

CLAIM_WORDS = [
    "waterproof",
    "water-resistant",
    "organic",
    "eco-friendly",
    "sustainable",
    "hypoallergenic",
    "certified",
    "guaranteed",
    "award-winning",
    "best-selling",
    "clinically proven",
    "bpa-free",
    "vegan",
    "handmade",
    "lifetime warranty",
    "non-toxic",
    "dishwasher safe",
    "fireproof",
]

DEFAULT_PROMPT = {
    "task": "product_description",
    "version": 1,
    "system_message": (
        "You write product descriptions for a retail catalogue. Use only the facts given. "
        "Never claim a property, certification or guarantee the facts do not state."
    ),
    "template": (
        "Write a headline and a description of two to four sentences for this product.\n"
        "Title: {title}\n"
        "Facts:\n"
        "{facts}"
    ),
    "output_schema": {
        "type": "object",
        "properties": {
            "headline": {"type": "string", "minLength": 3, "maxLength": 120},
            "description": {"type": "string", "minLength": 40, "maxLength": 1200},
        },
        "required": ["headline", "description"],
        "additionalProperties": False,
    },
    "rules": {
        "text_field": "description",
        "min_length": 40,
        "max_length": 1200,
        "claim_words": CLAIM_WORDS,
    },
    "max_output_tokens": 600,
}

EVENT_GUARD_SQL = """
CREATE OR REPLACE FUNCTION ledger_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'ledger events are append-only: ' || TG_OP || ' refused';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_event_append_only
    BEFORE UPDATE OR DELETE ON ledger_event
    FOR EACH ROW EXECUTE FUNCTION ledger_event_append_only();
"""

EVENT_GUARD_REVERSE_SQL = """
DROP TRIGGER IF EXISTS ledger_event_append_only ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_append_only();
"""


def create_roles_and_prompt(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)
    PromptVersion = apps.get_model("ledger", "PromptVersion")
    PromptVersion.objects.get_or_create(
        task=DEFAULT_PROMPT["task"], version=DEFAULT_PROMPT["version"], defaults=DEFAULT_PROMPT
    )


def install_event_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(EVENT_GUARD_SQL)


def remove_event_guard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(EVENT_GUARD_REVERSE_SQL)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunPython(create_roles_and_prompt, migrations.RunPython.noop),
        migrations.RunPython(install_event_guard, remove_event_guard),
    ]
