"""How long `manage.py apply_retention` takes, and how much memory, on N erasable drafts (SPEC §11).

    .venv/bin/python scripts/retention_bench.py --drafts 1000000

A fresh PostgreSQL database of its own (on DATABASE_URL's server, dropped at the end), migrated,
then filled set-wise in SQL: N/4 rejected, obsolete, cancelled or validation-failed items, each with
four drafts written 100 days ago (three superseded, the last unusable by its item's state), and the
pass run in a process of its own under /usr/bin/time -v, then once more (the daily pass that finds
nothing new). Prints each one's output, wall time and peak resident memory."""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledger.bench.database import database_url, fresh_database, server_url  # noqa: E402

DRAFTS_PER_ITEM = 4
# A description of about 400 characters, as the default prompt asks for.
TEXT = (
    "A sturdy chopping board cut from a single piece of oak, oiled by hand and finished with rounded "
    "edges. It measures 40 by 25 centimetres, which leaves room to prepare a whole meal, and its "
    "weight keeps it steady on the counter. Wash it by hand, dry it upright and oil it now and then, "
    "and it will keep its warm colour for years of daily use in a busy kitchen at home."
)

SEED_SQL = """
INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff,
                       is_active, date_joined)
VALUES ('!', false, 'retention-bench', '', '', '', false, true, now());
INSERT INTO ledger_job (reference, task, provider, model, destination, unit_size, state, created_at,
                        updated_at, owner_id, prompt_version_id, budget_currency, pause_detail, pause_reason)
SELECT 'retention-bench', 'product_description', 'emulator', 'gpt-4o-mini', 'catalogue', 1000,
       'needs_attention', now(), now(), (SELECT id FROM auth_user WHERE username = 'retention-bench'),
       (SELECT min(id) FROM ledger_promptversion), '', '', '';
INSERT INTO ledger_product (sku, status, published_content, created_at, updated_at)
SELECT 'RET-' || g, 'active', '', now(), now() FROM generate_series(1, %(items)s) g;
INSERT INTO ledger_sourcerevision (number, title, fields, content_hash, created_at, product_id)
SELECT 1, 'Oak chopping board ' || p.sku, '{"material": "oak"}', md5(p.sku), now(), p.id
FROM ledger_product p ORDER BY p.id;
UPDATE ledger_product p SET current_revision_id = r.id FROM ledger_sourcerevision r WHERE r.product_id = p.id;
INSERT INTO ledger_item (state, reason, reason_code, inference_attempt, inference_failures, apply_failures,
                         created_at, updated_at, job_id, product_id, source_revision_id)
SELECT (ARRAY['rejected', 'obsolete', 'cancelled', 'validation_failed'])[1 + r.id %% 4], '', '', 1, 0, 0,
       now() - interval '100 days', now() - interval '100 days',
       (SELECT id FROM ledger_job WHERE reference = 'retention-bench'), r.product_id, r.id
FROM ledger_sourcerevision r ORDER BY r.id;
INSERT INTO ledger_generatedversion (item_id, number, custom_id, content, raw_output, content_hash,
                                     input_tokens, output_tokens, usage, valid, validation_reasons,
                                     validation_notes, created_at)
SELECT i.id, n, 'bd-' || i.id || '-' || n, %(text)s || ' ' || i.id, '', md5(i.id || '-' || n), 120, 90,
       '{}', i.state <> 'validation_failed' OR n < 4,
       CASE WHEN i.state = 'validation_failed' AND n = 4 THEN '["Too short"]'::jsonb ELSE '[]'::jsonb END,
       '[]', now() - interval '100 days' + n * interval '1 minute'
FROM ledger_item i CROSS JOIN generate_series(1, 4) n ORDER BY i.id, n;
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drafts", type=int, default=1_000_000)
    args = parser.parse_args()
    items = args.drafts // DRAFTS_PER_ITEM
    server = server_url(os.environ.get("DATABASE_URL", ""))
    with fresh_database(server) as name:
        url = database_url(server, name)
        # As deployed: with DEBUG on, Django would keep every statement's text (5,000 ids each) in memory.
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "retention-bench-only",
        }
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as connection:
            for statement in SEED_SQL.split(";\n"):
                if statement.strip():
                    connection.execute(statement, {"items": items, "text": TEXT})
            connection.execute("VACUUM ANALYZE")
        print(
            f"{items * DRAFTS_PER_ITEM} erasable drafts of {items} items written in {time.perf_counter() - started:.0f} s"
        )
        for what in ("apply_retention", "apply_retention again (nothing left to erase)"):
            timed = subprocess.run(
                ["/usr/bin/time", "-v", sys.executable, "manage.py", "apply_retention"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            print(timed.stdout)
            wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", timed.stderr).group(1)
            peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", timed.stderr).group(1))
            print(f"{what}: wall {wall}, peak RSS {peak / 1024:.0f} MB")
        with psycopg.connect(url) as connection:
            left = connection.execute(
                "SELECT count(*) FROM ledger_generatedversion WHERE content_expired_at IS NULL"
            ).fetchone()[0]
            events = connection.execute(
                "SELECT count(*) FROM ledger_event WHERE data ? 'content_expired_at'"
            ).fetchone()[0]
        print(f"drafts left with their text: {left}; retention events: {events}")


if __name__ == "__main__":
    main()
