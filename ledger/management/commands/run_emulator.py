import argparse
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.emulators import PROTOCOLS, emulator_class
from ledger.emulators.knobs import OPTIONAL_ANSWERS, WINDOW_HINTS
from ledger.emulators.server import ApiError


def call_numbers(text: str) -> list[int]:
    """`--lose-create 1,3` → [1, 3]."""
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1 separated by commas, not {text!r}")
    return numbers


def add_count(group: argparse._ArgumentGroup, flag: str, help: str, metavar: str = "K") -> None:
    """A flag taking a whole number of calls, units or lines: 0 (none) unless given."""
    group.add_argument(flag, type=int, default=0, metavar=metavar, help=help)


def add_share(group: argparse._ArgumentGroup, flag: str, help: str) -> None:
    """A flag taking a share (0 to 1) of the requests or lines: 0 unless given."""
    group.add_argument(flag, type=float, default=0.0, metavar="F", help=help)


# The answer knobs, each a share of the requests that succeed: (flag, what that share gets).
ANSWER_RATES = (
    ("--truncate-rate", "share cut off at the token limit"),
    ("--refuse-rate", "share the model refuses"),
    ("--fence-rate", "share with the JSON in a code fence"),
    ("--prose-rate", "share in prose where JSON was asked"),
)
# Knobs only the openai_compatible emulator has (`CompatibleKnobs`): passed only when given, so
# another protocol given one refuses it by name.
SERVER_KNOBS = (
    "api_key",
    "requests_per_window",
    "window_ms",
    "window_hint",
    "every_request_refused",
    "every_request_refused_status",
    "too_long_requests",
)


def emulator_kwargs(options: dict[str, Any]) -> dict[str, Any]:
    """The emulator's keyword arguments the command's options ask for (see `knobs.FaultKnobs`)."""
    server = {name: options[name] for name in SERVER_KNOBS if options.get(name) is not None}
    return {
        **server,
        "host": options["host"],
        "port": options["port"],
        "seed": options["seed"],
        "per_request_ms": options["per_request_ms"],
        "fail_rate": options["fail_rate"],
        "expire_rate": options["expire_rate"],
        "expire_after_ms": options["expire_after_ms"],
        "lose_create_responses": options["lose_create"],
        "rate_limit_calls": options["rate_limit"],
        "rate_limit_path": options["rate_limit_path"],
        "retry_after": options["retry_after"],
        "server_errors": options["server_errors"],
        "server_error_path": options["server_error_path"],
        "server_error_status": options["server_error_status"],
        "refusals": options["refusals"],
        "refusal_path": options["refusal_path"],
        "refusal_status": options["refusal_status"],
        "billing_refusals": options["billing_refusals"],
        "duplicate_lines": options["duplicate_rate"],
        "unknown_lines": options["unknown_lines"],
        "malformed_lines": options["malformed_lines"],
        "count_mismatch": options["count_mismatch"],
        "cut_downloads": options["cut_downloads"],
        "truncate_rate": options["truncate_rate"],
        "refuse_rate": options["refuse_rate"],
        "fence_rate": options["fence_rate"],
        "prose_rate": options["prose_rate"],
        "optional_properties": options["optional_properties"],
        "webhook_url": options["webhook_url"],
        "webhook_secret": options["webhook_secret"],
        "webhook_deliveries": options["webhook_deliveries"],
    }


class Command(BaseCommand):
    help = (
        "Serve the emulator of one provider's wire protocol until Ctrl-C (default: the OpenAI Files + "
        "Batch API, which provider `emulator` speaks). "
        "Fault knobs can also be changed while it runs: POST /_emulator/config."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--protocol", choices=sorted(PROTOCOLS), default="openai", help="which provider's wire protocol"
        )
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
        parser.add_argument("--per-request-ms", type=float, default=100, help="processing time per request")
        parser.add_argument("--seed", type=int, default=0, help="picks which requests and lines go wrong")

        results = parser.add_argument_group("failed and expired requests")
        results.add_argument("--fail-rate", type=float, default=0.0, help="share of requests answered 500")
        results.add_argument("--expire-rate", type=float, default=0.0, help="share of requests that expire")
        results.add_argument(
            "--expire-after-ms",
            type=float,
            default=None,
            metavar="N",
            help="a batch in progress this long expires; requests not yet run become batch_expired",
        )

        calls = parser.add_argument_group("refused and lost calls (counted from start)")
        calls.add_argument(
            "--lose-create",
            type=call_numbers,
            default=[],
            metavar="N[,N...]",
            help="the N-th batch created (refused calls do not count) gets no answer: the connection drops",
        )
        add_count(calls, "--rate-limit", "answer the first K API calls 429")
        calls.add_argument(
            "--rate-limit-path", metavar="PREFIX", help="only calls under this path, e.g. /v1/batches"
        )
        calls.add_argument(
            "--retry-after", type=float, default=1, metavar="S", help="retry-after of a 429, seconds"
        )
        add_count(calls, "--server-errors", "answer the first K API calls 500")
        calls.add_argument(
            "--server-error-path",
            metavar="PREFIX",
            help="only calls under this path, e.g. 'POST /v1/batches'",
        )
        calls.add_argument(
            "--server-error-status",
            type=int,
            default=500,
            metavar="CODE",
            help="the status of those errors, e.g. 529 (Anthropic overloaded) or 503",
        )
        add_count(calls, "--refusals", "answer the first K API calls 404 (a permanent error)")
        calls.add_argument("--refusal-path", metavar="PREFIX", help="only calls under this path")
        calls.add_argument(
            "--refusal-status",
            type=int,
            default=404,
            metavar="CODE",
            help="the status of those refusals, e.g. 403",
        )
        add_count(
            calls,
            "--billing-refusals",
            "refuse the first K units created as an account the provider will not bill",
        )
        add_count(calls, "--cut-downloads", "cut the first K downloads of each file")

        server = parser.add_argument_group("a self-hosted server (--protocol openai_compatible)")
        server.add_argument("--api-key", metavar="KEY", help="answer 401 to calls without this bearer key")
        server.add_argument(
            "--requests-per-window",
            type=int,
            metavar="N",
            help="answer 429 to completion calls beyond N in any window",
        )
        server.add_argument(
            "--window-ms", type=float, metavar="MS", help="the window's length (default 60000)"
        )
        server.add_argument(
            "--window-hint",
            choices=WINDOW_HINTS,
            help="how those 429s say when to come back (default retry-after)",
        )
        server.add_argument(
            "--every-request-refused",
            metavar="WORDS",
            help='answer every call 400 with these words (a LiteLLM proxy without a database: "No connected db.")',
        )
        server.add_argument(
            "--every-request-refused-status",
            type=int,
            metavar="STATUS",
            help="the status of those answers (default 400)",
        )
        server.add_argument(
            "--too-long-requests",
            type=lambda text: [part for part in text.split(",") if part],
            metavar="ID[,ID]",
            help="answer these custom_ids 400, as a prompt longer than the model's context",
        )

        answers = parser.add_argument_group("answers, in the protocol's own words")
        for flag, help in ANSWER_RATES:
            add_share(answers, flag, help)
        answers.add_argument(
            "--optional-properties",
            choices=OPTIONAL_ANSWERS,
            default="written",
            help="a property an answer need not write: written, null wherever the schema takes "
            "null (as strict mode answers an optional one), or left out when not required",
        )

        files = parser.add_argument_group("output file anomalies")
        add_share(files, "--duplicate-rate", "share of lines written twice")
        add_count(files, "--unknown-lines", "lines for custom_ids never sent", metavar="N")
        add_count(files, "--malformed-lines", "lines that are not JSON", metavar="N")
        files.add_argument(
            "--count-mismatch",
            action="store_true",
            help="report one more completed request than the files hold",
        )

        hooks = parser.add_argument_group("batch webhooks (--protocol openai or gemini)")
        hooks.add_argument(
            "--webhook-url", metavar="URL", help="post the provider's event there when a batch ends"
        )
        hooks.add_argument(
            "--webhook-secret",
            metavar="whsec_...",
            help="sign those events as Standard Webhooks do, with this secret",
        )
        hooks.add_argument(
            "--webhook-deliveries",
            type=int,
            default=1,
            metavar="N",
            help="post each event N times with the same webhook-id (2 exercises deduplication)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] >= 2:
            logging.getLogger("ledger.emulators").setLevel(logging.INFO)
        try:
            emulator = emulator_class(options["protocol"])(**emulator_kwargs(options))
        except ApiError as error:
            raise CommandError(str(error)) from None

        def announce(url: str) -> None:
            self.stdout.write(f"Provider emulator ({options['protocol']}) serving {url} (Ctrl-C to stop)")
            self.stdout.flush()

        try:
            emulator.serve_forever(on_ready=announce)
        except KeyboardInterrupt:
            self.stdout.write("Emulator stopped.")
