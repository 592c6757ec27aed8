from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.catalogue import ImportReport, import_catalogue


class Command(BaseCommand):
    help = (
        "Import a catalogue file (JSONL or CSV): create and revise products, withdraw some. A record "
        "changes only the fields it names, unless --replace. The file is streamed: memory stays "
        "bounded whatever its size."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="a .jsonl or .csv file")
        parser.add_argument(
            "--skip-invalid",
            action="store_true",
            help="import the valid rows even when others are rejected (default: reject the whole file)",
        )
        parser.add_argument(
            "--replace",
            action="store_true",
            help="each record is the product's whole content: fields it does not name are removed "
            "(default: they are left as they are)",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="say what the import would do, with the work it would queue again and its cost, and change nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = import_catalogue(
                options["path"],
                skip_invalid=options["skip_invalid"],
                replace=options["replace"],
                dry_run=options["dry_run"],
            )
        except OSError as error:
            raise CommandError(f"Cannot read {options['path']}: {error.strerror or error}") from None
        self.stdout.write(report.summary)
        problems = "\n".join(str(error) for error in report.errors)
        if report.unlisted_errors:
            problems += f"\n{report.unlisted_note}"
        if report.stops(options["skip_invalid"]) and report.rejected:
            raise CommandError(
                f"Nothing was imported: {report.rejected} rejected row(s). "
                f"Fix them, or use --skip-invalid to import the valid rows.\n{problems}"
            )
        if report.stops(options["skip_invalid"]):
            raise CommandError(f"Nothing was imported: the file cannot be read.\n{problems}")
        for line in changes_in_words(report):
            self.stdout.write(line)
        if problems:
            self.stderr.write(f"Rejected rows (the other rows were imported):\n{problems}")
        if report.dry_run:
            self.stdout.write("Dry run: nothing was changed.")


def changes_in_words(report: ImportReport) -> list[str]:
    """The fields the revisions change, and the work of unfinished jobs they stop and queue again."""
    lines = []
    if report.changed_fields:
        counted = report.changed_fields_by_count
        lines.append("fields changed: " + ", ".join(f"{name} ({count})" for name, count in counted))
        lines += [f"  {sku}: {', '.join(fields)}" for sku, fields in report.revisions]
        if report.unlisted_revisions > 0:
            lines.append(f"  … and {report.unlisted_revisions} more revisions")
    if report.rework:
        cost = report.requeue_cost
        lines.append(
            f"unfinished jobs: {report.items_obsolete} items become obsolete and {report.items_requeued} "
            f"are queued again (estimated cost {_usd(cost)}), "
            f"{report.items_withdrawn} items withdrawn"
        )
        for job in report.rework.values():
            estimate = f", estimated {_usd(job.cost)} ({job.estimate_source})" if job.requeued else ""
            lines.append(
                f"  job {job.reference}: {job.obsolete} obsolete, {job.requeued} queued again{estimate}, "
                f"{job.withdrawn} withdrawn"
            )
    return lines


def _usd(amount: Decimal | None) -> str:
    if amount is None:
        return "unknown (no price for the model)"
    return "< 0.01 USD" if amount < Decimal("0.01") else f"{amount.quantize(Decimal('0.01'))} USD"
