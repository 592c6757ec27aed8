from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.catalogue import import_catalogue


class Command(BaseCommand):
    help = (
        "Import a catalogue file (JSONL or CSV): create and revise products, withdraw some. "
        "The file is streamed: memory stays bounded whatever its size."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="a .jsonl or .csv file")
        parser.add_argument(
            "--skip-invalid",
            action="store_true",
            help="import the valid rows even when others are rejected (default: reject the whole file)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = import_catalogue(options["path"], skip_invalid=options["skip_invalid"])
        except OSError as error:
            raise CommandError(f"Cannot read {options['path']}: {error.strerror or error}") from None
        self.stdout.write(report.summary)
        problems = "\n".join(str(error) for error in report.errors)
        if report.unlisted_errors:
            problems += f"\n{report.unlisted_note}"
        if not report.imported and report.rejected:
            raise CommandError(
                f"Nothing was imported: {report.rejected} rejected row(s). "
                f"Fix them, or use --skip-invalid to import the valid rows.\n{problems}"
            )
        if not report.imported:
            raise CommandError(f"Nothing was imported: the file cannot be read.\n{problems}")
        if problems:
            self.stderr.write(f"Rejected rows (the other rows were imported):\n{problems}")
