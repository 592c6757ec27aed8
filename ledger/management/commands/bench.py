import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.bench.clusters import SERVER_ANSWER_MS
from ledger.bench.measuring import CommandFailed
from ledger.bench.run import FIGURES, figures_to_run, run_bench, table

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
            help=f"catalogue size (default {DEFAULT_PRODUCTS:,})",
        )
        parser.add_argument(
            "--figures",
            help=(
                f"comma-separated figures to measure, with what they need measured first "
                f"(default: all of {', '.join(FIGURES)})"
            ),
        )
        parser.add_argument(
            "--server-answer-ms",
            type=int,
            default=SERVER_ANSWER_MS,
            help=(
                f"milliseconds the self-hosted server takes to answer one request in the two-cluster "
                f"figure (default {SERVER_ANSWER_MS:,}; shorter is quicker, but a cluster's own start "
                f"then weighs on the ratio)"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["products"] < 1:
            raise CommandError("--products must be at least 1")
        if options["server_answer_ms"] < 0:
            raise CommandError("--server-answer-ms must be 0 or more")
        chosen = [name.strip() for name in (options["figures"] or "").split(",") if name.strip()]
        try:
            figures_to_run(chosen)
        except ValueError as error:
            raise CommandError(str(error)) from None
        # SIGTERM unwinds like Ctrl-C, so the database and the file are removed either way.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

        def say(text: str) -> None:
            self.stdout.write(text)
            self.stdout.flush()

        try:
            figures = run_bench(
                products=options["products"],
                say=say,
                figures=chosen,
                server_answer_ms=options["server_answer_ms"],
            )
        except CommandFailed as error:
            raise CommandError(str(error)) from None
        except KeyboardInterrupt:
            raise CommandError("Stopped: the bench's database and catalogue file are removed") from None
        self.stdout.write("")
        self.stdout.write(table(figures))
