# Written by hand: catalogue files imported by a worker, with their bytes kept in the database.
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0008_item_reason_code"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="CatalogueImport",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("file_name", models.CharField(max_length=255)),
                ("size", models.PositiveBigIntegerField()),
                ("skip_invalid", models.BooleanField(default=False)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("queued", "Waiting for a worker"),
                            ("running", "Importing"),
                            ("done", "Finished"),
                            ("failed", "Failed"),
                        ],
                        default="queued",
                        max_length=16,
                    ),
                ),
                ("claimed_by", models.CharField(blank=True, max_length=32)),
                ("rows_read", models.PositiveBigIntegerField(default=0)),
                ("checked_bytes", models.PositiveBigIntegerField(default=0)),
                ("rows_written", models.PositiveBigIntegerField(default=0)),
                ("counts", models.JSONField(blank=True, default=dict)),
                ("errors", models.JSONField(blank=True, default=list)),
                ("error_count", models.PositiveBigIntegerField(default=0)),
                ("imported", models.BooleanField(default=False)),
                ("failure", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("progress_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "uploaded_by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("state__in", ["queued", "running", "done", "failed"])),
                        name="catalogue_import_state_valid",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="CatalogueImportChunk",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveIntegerField()),
                ("data", models.BinaryField()),
                (
                    "catalogue_import",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="chunks",
                        to="ledger.catalogueimport",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("catalogue_import", "number"), name="import_chunk_number_unique"
                    )
                ],
            },
        ),
    ]
