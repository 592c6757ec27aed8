import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.bench.measuring import CommandFailed
from ledger.bench.run import run_bench, table

DEFAULT_PRODUCTS = 100_000


class Command(BaseCommand):
    help = (
        "Measure issue 9's figures on a fresh PostgreSQL database of the bench's own (on DATABASE_URL's "
        "server), each against a baseline taken in the same run; the database is dropped at the end."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--products",
            type=int,
            default=DEFAULT_PRODUCTS,
            help=f"catalogue size (default {DEFAULT_PRODUCTS:,}: about ten minutes on two cores)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["products"] < 1:
            raise CommandError("--products must be at least 1")
        # SIGTERM unwinds like Ctrl-C, so the database and the file are removed either way.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

        def say(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        try:
            figures = run_bench(products=options["products"], say=say)
        except CommandFailed as error:
            raise CommandError(str(error)) from None
        except KeyboardInterrupt:
            raise CommandError("Stopped: the bench's database and catalogue file are removed") from None
        self.stdout.write("")
        self.stdout.write(table(figures))
