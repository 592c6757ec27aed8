"""`migrate` puts in place everything the background side and the screens need (SPEC rule 14):
roles, the default prompt and the collector's schedule, once, however often it runs."""

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django_q.models import Schedule

from ledger.actions.prompts import create_prompt_version, make_prompt_current
from ledger.models import CurrentPromptChoice, PromptVersion
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_a_migrated_database_has_roles_prompt_and_schedule():
    assert set(Group.objects.values_list("name", flat=True)) >= {"catalogue_owner", "operator", "admin"}
    assert PromptVersion.objects.filter(task="product_description").exists()
    schedule = Schedule.objects.get(name="collector")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "ledger.tasks.collect_round",
        Schedule.MINUTES,
        -1,
    )


def test_migrate_again_restores_what_is_missing_and_duplicates_nothing():
    Schedule.objects.filter(name="collector").delete()
    Group.objects.filter(name="operator").delete()
    kept = PromptVersion.objects.get(task="product_description")

    call_command("migrate", verbosity=0)
    call_command("migrate", verbosity=0)

    assert Schedule.objects.filter(name="collector").count() == 1
    assert Group.objects.filter(name="operator").count() == 1
    # The default prompt is made only for a task that has none: people's versions are left alone.
    assert list(PromptVersion.objects.filter(task="product_description")) == [kept]


def test_migrate_leaves_the_default_prompt_current_and_a_later_choice_alone():
    v1 = PromptVersion.objects.get(task="product_description")
    assert PromptVersion.objects.filter(task="product_description").current().get() == v1
    v2 = create_prompt_version(
        task="product_description",
        system_message=v1.system_message,
        template=v1.template,
        output_schema=v1.output_schema,
        rules=v1.rules,
        max_output_tokens=300,
    )
    make_prompt_current(prompt=v2, actor=UserFactory(roles=["catalogue_owner"]))

    call_command("migrate", verbosity=0)

    assert PromptVersion.objects.filter(task="product_description").current().get() == v2
    assert CurrentPromptChoice.objects.count() == 2


def test_migrate_installs_the_daily_retention_pass_once():
    Schedule.objects.filter(name="retention").delete()

    call_command("migrate", verbosity=0)
    call_command("migrate", verbosity=0)

    schedule = Schedule.objects.get(name="retention")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "ledger.tasks.apply_retention",
        Schedule.DAILY,
        -1,
    )
    assert schedule.next_run is not None
