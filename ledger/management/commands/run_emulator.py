import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.providers.emulator import ApiError, Emulator


class Command(BaseCommand):
    help = "Serve the OpenAI Files + Batch API emulator (provider `emulator`) until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
        parser.add_argument("--per-request-ms", type=float, default=100, help="processing time per request")
        parser.add_argument("--fail-rate", type=float, default=0.0, help="share of requests answered 500")
        parser.add_argument("--expire-rate", type=float, default=0.0, help="share of requests that expire")
        parser.add_argument("--seed", type=int, default=0, help="picks which requests fail or expire")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] >= 2:
            logging.getLogger("ledger.providers.emulator").setLevel(logging.INFO)
        try:
            emulator = Emulator(
                host=options["host"],
                port=options["port"],
                per_request_ms=options["per_request_ms"],
                fail_rate=options["fail_rate"],
                expire_rate=options["expire_rate"],
                seed=options["seed"],
            )
        except ApiError as error:
            raise CommandError(str(error)) from None

        def announce(url: str) -> None:
            self.stdout.write(f"Provider emulator serving {url} (Ctrl-C to stop)")
            self.stdout.flush()

        try:
            emulator.serve_forever(on_ready=announce)
        except KeyboardInterrupt:
            self.stdout.write("Emulator stopped.")
