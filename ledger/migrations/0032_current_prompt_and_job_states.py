"""A prompt version is made current on purpose (SPEC §1): `CurrentPromptChoice` records who made which
version current and when. Until now a job naming no version took its task's newest one, so each
task's newest version is made current here, by "system". Jobs may be `needs_attention` (and `paused`,
issue 19). Drafts are found by the day they arrived (the dashboard's spend today) through a BRIN index
on PostgreSQL: a few pages for the whole table, nearly nothing for each draft written."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def make_newest_versions_current(apps, schema_editor):
    PromptVersion = apps.get_model("ledger", "PromptVersion")
    CurrentPromptChoice = apps.get_model("ledger", "CurrentPromptChoice")
    for task in PromptVersion.objects.values_list("task", flat=True).distinct().order_by("task"):
        newest = PromptVersion.objects.filter(task=task).order_by("-version").first()
        CurrentPromptChoice.objects.create(task=task, prompt_version=newest, actor_name="system")


def forget_current_choices(apps, schema_editor):
    apps.get_model("ledger", "CurrentPromptChoice").objects.all().delete()


DRAFT_DAY_INDEX = "CREATE INDEX version_created_brin ON ledger_generatedversion USING brin (created_at)"


def add_draft_day_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DRAFT_DAY_INDEX)


def drop_draft_day_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS version_created_brin")


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0031_collections_that_keep_failing"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="CurrentPromptChoice",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("task", models.CharField(max_length=64)),
                ("actor_name", models.CharField(default="system", max_length=150)),
                ("made_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "ordering": ["task", "-id"],
            },
        ),
        migrations.RemoveConstraint(
            model_name="job",
            name="job_state_valid",
        ),
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("preparing", "Preparing"),
                    ("running", "Running: results still outstanding"),
                    ("paused", "Paused: nothing new is sent until someone acts"),
                    ("in_review", "In review: all results returned, decisions pending"),
                    (
                        "needs_attention",
                        "Needs attention: nothing in flight, no draft waiting for a reviewer, items waiting for an operator",
                    ),
                    ("completed", "Completed: every item at rest, none waiting for an operator"),
                    ("cancelled", "Cancelled"),
                ],
                default="preparing",
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "state__in",
                        [
                            "preparing",
                            "running",
                            "paused",
                            "in_review",
                            "needs_attention",
                            "completed",
                            "cancelled",
                        ],
                    )
                ),
                name="job_state_valid",
            ),
        ),
        migrations.AddField(
            model_name="currentpromptchoice",
            name="actor",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="currentpromptchoice",
            name="prompt_version",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="made_current",
                to="ledger.promptversion",
            ),
        ),
        migrations.AddField(
            model_name="currentpromptchoice",
            name="replaced",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="ledger.promptversion",
            ),
        ),
        migrations.AddIndex(
            model_name="currentpromptchoice",
            index=models.Index(fields=["task", "-id"], name="current_prompt_of_task"),
        ),
        migrations.RunPython(make_newest_versions_current, forget_current_choices),
        migrations.RunPython(add_draft_day_index, drop_draft_day_index),
    ]
