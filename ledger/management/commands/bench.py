import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.bench.base import Figure
from ledger.bench.clusters import SERVER_ANSWER_MS
from ledger.bench.measuring import CommandFailed
from ledger.bench.run import FIGURES, QUICK_FIGURES, QUICK_PRODUCTS, figures_to_run, run_bench, table
from ledger.bench.screens import QUICK_SCREENS

DEFAULT_PRODUCTS = 100_000


class Command(BaseCommand):
    help = (
        "Measure issue 9's figures on a fresh PostgreSQL database of the bench's own (on DATABASE_URL's "
        "server), each against a baseline taken in the same run; the database is dropped at the end. "
        "Exits non-zero when a figure misses its target."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--products",
            type=int,
            help=f"catalogue size (default {DEFAULT_PRODUCTS:,}; {QUICK_PRODUCTS:,} with --quick)",
        )
        parser.add_argument(
            "--figures",
            help=(
                f"comma-separated figures to measure, with what they need measured first "
                f"(default: all of {', '.join(FIGURES)})"
            ),
        )
        parser.add_argument(
            "--quick",
            action="store_true",
            help=(
                f"the look to take before a push (`make bench-quick`): {QUICK_PRODUCTS:,} products, the figures "
                f"{', '.join(QUICK_FIGURES)}, and of the screens only {'; '.join(QUICK_SCREENS)}"
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
        quick = options["quick"]
        products = options["products"]
        if products is None:
            products = QUICK_PRODUCTS if quick else DEFAULT_PRODUCTS
        if products < 1:
            raise CommandError("--products must be at least 1")
        if options["server_answer_ms"] < 0:
            raise CommandError("--server-answer-ms must be 0 or more")
        if quick and options["figures"]:
            raise CommandError(
                f"--quick measures its own figures ({', '.join(QUICK_FIGURES)}); leave out --figures"
            )
        chosen = [name.strip() for name in (options["figures"] or "").split(",") if name.strip()]
        if quick:
            chosen = list(QUICK_FIGURES)
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
                products=products,
                say=say,
                figures=chosen,
                server_answer_ms=options["server_answer_ms"],
                quick=quick,
            )
        except CommandFailed as error:
            raise CommandError(str(error)) from None
        except KeyboardInterrupt:
            raise CommandError("Stopped: the bench's database and catalogue file are removed") from None
        self.report(figures)

    def report(self, figures: list[Figure]) -> None:
        """The table, then the verdict: a figure that misses its target fails the command (a figure
        with nothing to judge it by, or skipped, does not)."""
        self.stdout.write("")
        self.stdout.write(table(figures))
        missed = [figure.name for figure in figures if figure.passed is False]
        if missed:
            raise CommandError(
                f"{len(missed)} of {len(figures)} figures missed their target: {'; '.join(missed)}"
            )
