"""How long exporting a large job takes, and whether the web process's memory stays flat while it does
(issue 20, point 6). Not part of `make bench`: it needs jobs of its own, made set-wise here.

    DATABASE_URL=postgres://127.0.0.1:5432/mydb .venv/bin/python scripts/bench_export.py 100000 1000000

On the (migrated) database DATABASE_URL names, it makes one job per size given, set-wise with SQL, its
items spread over the states an export meets (applied, approved, rejected, validation failed, awaiting
review, not sent yet) with drafts, approvals, destination attempts and one settled unit. Then, for
each size, it starts a fresh web server (granian with one worker process, as `make serve` runs it),
warms it up with an export of a 1,000-item
job, and downloads the job's export with curl to /dev/null, once as CSV and once as JSONL. It prints
the time to the first byte and the wall time of each download, and the worker's peak resident memory
(VmHWM from /proc) after the warm-up and after each download. The jobs stay in the database (their
references say `export-bench-`); run it on a database of your own. `--jobs ID…` measures jobs made
by an earlier run instead of making new ones.
"""

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchdesk.settings")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(40))

import django  # noqa: E402

django.setup()

from decimal import Decimal  # noqa: E402

from django.contrib.auth.models import Group, User  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from ledger.models import ApiToken, ItemTally, Job, PromptVersion, Submission, UnitCharge  # noqa: E402
from ledger.money.currency import business_currency  # noqa: E402

WARM_UP_ITEMS = 1000
TOKEN = "bd_export_bench_token"
DRAFT = (
    "A sturdy chopping board cut from a single piece of European oak, oiled by hand and finished with "
    "rounded edges. It measures forty by twenty-five centimetres, has a juice groove on one side and "
    "a flat face on the other, and rests on four small feet that keep it steady on the worktop. "
)


def person() -> User:
    user, _ = User.objects.get_or_create(username="export-bench")
    user.groups.add(*Group.objects.filter(name__in=["operator"]))
    ApiToken.objects.get_or_create(
        token_hash=ApiToken.hash(TOKEN), defaults={"user": user, "prefix": TOKEN[:8]}
    )
    return user


def make_job(items: int, owner: User) -> Job:
    """A job of `items` items, set-wise: ten states' worth of rows in a few statements."""
    started = time.perf_counter()
    reference = f"export-bench-{items}-{secrets.token_hex(3)}"
    prompt = PromptVersion.objects.get(task="product_description", version=1)
    with transaction.atomic():
        job = Job.objects.create(
            reference=reference, owner=owner, task=prompt.task, prompt_version=prompt, provider="emulator",
            model="gpt-4o-mini", state="needs_attention",
        )  # fmt: skip
        unit = Submission.objects.create(
            job=job, provider="emulator", model="gpt-4o-mini", intent_key=f"bd_{reference}",
            state="collected", requests_sent=items,
        )  # fmt: skip
        UnitCharge.objects.create(
            job=job, submission=unit, requests=items, currency=business_currency(),
            reserved_usd=Decimal("1"), reserved=Decimal("0.789"), cost_usd=Decimal("1"), cost=Decimal("0.789"),
            settled_at=timezone.now(), rate=Decimal("0.789"), rate_date=timezone.localdate(),
            rate_source="export bench",
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(
                """
                WITH made AS (
                    INSERT INTO ledger_product (sku, status, published_content, created_at, updated_at)
                    SELECT %s || '-' || g, 'active', '', now(), now() FROM generate_series(1, %s) g
                    RETURNING id
                )
                SELECT min(id), max(id) FROM made
                """,
                [reference, items],
            )
            low, high = cursor.fetchone()
            cursor.execute(
                """
                INSERT INTO ledger_sourcerevision (product_id, number, title, fields, content_hash, created_at)
                SELECT id, 1, 'Oak chopping board', '{"material": "oak"}', md5(id::text), now()
                FROM ledger_product WHERE id BETWEEN %s AND %s
                """,
                [low, high],
            )
            cursor.execute(
                """
                UPDATE ledger_product p SET current_revision_id = r.id FROM ledger_sourcerevision r
                WHERE r.product_id = p.id AND p.id BETWEEN %s AND %s
                """,
                [low, high],
            )
            cursor.execute(
                """
                INSERT INTO ledger_item (job_id, product_id, source_revision_id, state, reason, reason_code,
                                         inference_attempt, inference_failures, apply_failures,
                                         created_at, updated_at, submission_id)
                SELECT %(job)s, r.product_id, r.id, s.state,
                       CASE s.state WHEN 'rejected' THEN '=HYPERLINK("http://evil.example","not oak")'
                                    WHEN 'validation_failed' THEN 'Too short: 12 characters, at least 80'
                                    WHEN 'applied' THEN 'Published on the product' ELSE '' END,
                       CASE s.state WHEN 'validation_failed' THEN 'too_short' ELSE '' END,
                       1, 0, 0, now(), now(), CASE WHEN s.state = 'prepared' THEN NULL ELSE %(unit)s END
                FROM ledger_sourcerevision r
                CROSS JOIN LATERAL (SELECT (ARRAY['applied', 'applied', 'applied', 'applied', 'approved',
                    'approved', 'rejected', 'validation_failed', 'awaiting_review', 'prepared'])
                    [r.product_id %% 10 + 1] AS state) s
                WHERE r.product_id BETWEEN %(low)s AND %(high)s
                ORDER BY r.product_id
                """,
                {"job": job.pk, "unit": unit.pk, "low": low, "high": high},
            )
            cursor.execute(
                """
                INSERT INTO ledger_generatedversion (item_id, number, custom_id, content, raw_output,
                    content_hash, input_tokens, output_tokens, usage, valid, validation_reasons,
                    validation_notes, created_at, submission_id)
                SELECT i.id, 1, 'bd-' || i.id || '-1', %s || i.id, '', md5(i.id::text), 380, 120, '{}',
                       i.state <> 'validation_failed', '[]', '[]', now(), %s
                FROM ledger_item i WHERE i.job_id = %s AND i.state <> 'prepared'
                """,
                [DRAFT, unit.pk, job.pk],
            )
            cursor.execute(
                """
                INSERT INTO ledger_approval (item_id, version_id, version_hash, approved_by_id, approved_at,
                                             final_content, edited, note)
                SELECT i.id, v.id, v.content_hash, %s, now(), v.content, false, ''
                FROM ledger_item i JOIN ledger_generatedversion v ON v.item_id = i.id
                WHERE i.job_id = %s AND i.state IN ('applied', 'approved')
                """,
                [owner.pk, job.pk],
            )
            cursor.execute(
                """
                UPDATE ledger_item i SET approved_version_id = a.version_id
                FROM ledger_approval a WHERE a.item_id = i.id AND i.job_id = %s
                """,
                [job.pk],
            )
            cursor.execute(
                """
                INSERT INTO ledger_destinationattempt (item_id, version_id, destination, operation_key,
                                                       outcome, response, started_at, finished_at)
                SELECT i.id, i.approved_version_id, 'catalogue', 'bd-apply-' || i.approved_version_id,
                       'applied', '', now(), now()
                FROM ledger_item i WHERE i.job_id = %s AND i.state = 'applied'
                """,
                [job.pk],
            )
    ItemTally.objects.compact(job.pk)
    print(f"made job {job.pk} ({items:,} items) in {time.perf_counter() - started:,.1f} s", flush=True)
    return job


def analyse() -> None:
    with connection.cursor() as cursor:
        for table in (
            "ledger_item",
            "ledger_product",
            "ledger_sourcerevision",
            "ledger_generatedversion",
            "ledger_approval",
            "ledger_destinationattempt",
        ):
            cursor.execute(f"VACUUM ANALYZE {table}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for {pid}")


def download(port: int, job: Job, format: str) -> tuple[float, float, int]:
    """(seconds to the first byte, seconds in all, bytes) of one export fetched with curl to /dev/null."""
    answer = subprocess.run(
        [
            "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_starttransfer} %{time_total}",
            "-H", f"Authorization: Bearer {TOKEN}",
            f"http://127.0.0.1:{port}/api/jobs/{job.pk}/export?format={format}",
        ],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    status, size, first_byte, seconds = answer
    if status != "200":
        raise RuntimeError(f"export answered {status}")
    return float(first_byte), float(seconds), int(size)


def measure(job: Job, items: int, warm_up: Job) -> None:
    port = free_port()
    env = {**os.environ, "DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1", "LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryDirectory(prefix="bd_export_bench_"):
        server = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "granian"), "batchdesk.asgi:application",
                "--interface", "asginl", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            ],
            cwd=ROOT, env=env,
        )  # fmt: skip
        try:
            for _ in range(300):
                try:
                    download(port, warm_up, "csv")
                    break
                except (subprocess.CalledProcessError, RuntimeError):
                    time.sleep(0.1)
            [worker] = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
            warmed = peak_kb(int(worker))
            print(
                f"{items:>9,} items: worker peak after a {WARM_UP_ITEMS:,}-item export: {warmed / 1024:,.0f} MB"
            )
            for format in ("csv", "jsonl"):
                first_byte, seconds, size = download(port, job, format)
                print(
                    f"{items:>9,} items, {format:<5}: first byte {first_byte:,.2f} s, all {seconds:,.1f} s, "
                    f"{size / 1e6:,.0f} MB "
                    f"({items / seconds:,.0f} items/s); worker peak {peak_kb(int(worker)) / 1024:,.0f} MB",
                    flush=True,
                )
        finally:
            server.terminate()
            server.wait()


def main(arguments: list[str]) -> None:
    owner = person()
    made = Job.objects.filter(reference__startswith=f"export-bench-{WARM_UP_ITEMS}-").first()
    warm_up = made or make_job(WARM_UP_ITEMS, owner)
    if arguments[:1] == ["--jobs"]:
        jobs = [(job, job.items.count()) for job in Job.objects.filter(pk__in=arguments[1:]).order_by("pk")]
    else:
        jobs = [(make_job(int(size), owner), int(size)) for size in arguments or [100_000, 1_000_000]]
        analyse()
    for job, items in jobs:
        measure(job, items, warm_up)


if __name__ == "__main__":
    main(sys.argv[1:])
