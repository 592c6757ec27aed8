#!/usr/bin/env python
"""A pilot's forecast measured against what its scope then cost (issue 27), on an uneven catalogue,
as a finance lead would try it: real processes (the emulator of OpenAI's Batch API, a django-q2
cluster), the API a reviewer and an operator use, and a fresh PostgreSQL database of its own.

The catalogue: 3,000 products in six categories of different sizes. Furniture (a third of them) has
long product sheets: its requests cost about twice the others', and its answers run past the prompt
version's `max_output_tokens` (the version under test allows 120), so every furniture draft is cut
off and unusable, however often it is drafted again. The emulator also answers a share of every
request in prose (`--prose-rate`), which a redraft usually mends.

A reviewer approves every usable draft; an operator asks for a new draft of every unusable one, up
to `--redrafts` times (the projection's own cap on redrafts). The pilot draws from the default
strata (category and length band), so furniture, all long, is one stratum among eleven: a small
share of the sample for a third of the scope. Then the pilot's decision is go, and the full job runs
the same way. The script prints the projection, what was spent (the pilot's spend and the full job's,
from the API), and the error.

    DATABASE_URL is ignored: the script makes (and drops first) the database `bd_uneven`.
    .venv/bin/python scripts/uneven_pilot.py [--products 3000] [--redrafts 2] [--seed 7]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CATEGORIES = {  # share of the catalogue
    "furniture": Decimal("0.333"),
    "lighting": Decimal("0.20"),
    "kitchen": Decimal("0.167"),
    "garden": Decimal("0.133"),
    "bath": Decimal("0.10"),
    "stationery": Decimal("0.067"),
}
WOODS = ["oak", "beech", "walnut", "ash", "cherry", "maple", "teak"]
COLOURS = ["white", "black", "sage", "sand", "navy", "clay", "slate"]
AT_REST = {"applied", "cancelled", "obsolete", "withdrawn", "dead_letter", "rejected"}
ON_THE_WAY = {"prepared", "submitted", "submission_uncertain", "returned", "approved", "applying"}


def product(n: int, category: str) -> dict:
    wood, colour = WOODS[n % len(WOODS)], COLOURS[(n // 7) % len(COLOURS)]
    record = {
        "sku": f"UNV-{n:05d}",
        "title": f"{wood.title()} {category} piece no. {n}",
        "category": category,
    }
    if category == "furniture":  # a long sheet: many facts, each a clause
        record |= {
            "material": f"solid {wood} with a hand-rubbed {colour} oil finish on every visible face",
            "dimensions": f"{80 + n % 40} cm wide, {40 + n % 20} cm deep and {70 + n % 30} cm high overall",
            "assembly": "arrives flat-packed with every fixing, a hex key and illustrated instructions",
            "care": "wipe with a soft damp cloth and dry at once; re-oil twice a year with the supplied oil",
            "weight": f"{12 + n % 25} kg assembled, with a maximum load of {40 + n % 60} kg on the top",
            "joinery": "mortise and tenon joints glued and pinned, with corner blocks under the top",
            "feet": "adjustable levelling feet with felt pads that protect wooden and tiled floors",
            "origin": "made in a family workshop in the Carpathian foothills from certified timber",
            "drawers": "two soft-close drawers on full-extension runners with dovetailed fronts",
            "warranty_note": "the workshop repairs any joint that loosens within the first five years",
        }
    else:
        record |= {"material": wood, "colour": colour, "size": f"{10 + n % 30} cm"}
    return record


def catalogue(products: int) -> list[dict]:
    rows, n = [], 0
    names = list(CATEGORIES)
    for index, name in enumerate(names):
        count = products - n if index == len(names) - 1 else int(CATEGORIES[name] * products)
        rows += [product(n + i, name) for i in range(count)]
        n += count
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", type=int, default=3000)
    parser.add_argument("--redrafts", type=int, default=3)
    parser.add_argument("--per-stratum", type=int, default=15)
    parser.add_argument("--prose-rate", default="0.15")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--database", default="bd_uneven")
    options = parser.parse_args()

    subprocess.run(["dropdb", "-h", "127.0.0.1", "--if-exists", "--force", options.database], check=True)
    subprocess.run(["createdb", "-h", "127.0.0.1", options.database], check=True)
    work = Path(tempfile.mkdtemp(prefix="uneven-"))
    rates = work / "rates.json"
    rates.write_text(json.dumps({"source": "measurement", "per_usd": {"2026-01-01": "0.7890"}}))
    os.environ.update(
        DATABASE_URL=f"postgres://127.0.0.1:5432/{options.database}",
        DJANGO_SETTINGS_MODULE="batchdesk.settings",
        DEBUG="1",
        ALLOWED_HOSTS="testserver,localhost,127.0.0.1",
        BATCHDESK_FX_FILE=str(rates),
        BATCHDESK_CURRENCY="GBP",
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client

    from ledger.actions.prompts import create_prompt_version
    from ledger.bootstrap import DEFAULT_PROMPT
    from ledger.models import GeneratedVersion, Item, Job
    from tests.processes import Processes, wait_until

    call_command("migrate", verbosity=0)
    source = work / "catalogue.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in catalogue(options.products)))
    call_command("import_catalogue", str(source))
    prompt = create_prompt_version(
        task=DEFAULT_PROMPT["task"],
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=DEFAULT_PROMPT["output_schema"],
        rules=DEFAULT_PROMPT["rules"],
        max_output_tokens=120,
    )
    from django.contrib.auth.models import Group, User

    owner = User.objects.create_user("finance-trial", password="x")
    owner.groups.add(*Group.objects.filter(name__in=["catalogue_owner", "operator"]))
    from io import StringIO

    said = StringIO()
    call_command("create_api_token", owner.username, stdout=said)
    token = said.getvalue().split()[-1]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(path: str, body: dict) -> dict:
        answer = api.post(path, json.dumps(body), content_type="application/json")
        assert answer.status_code < 300, (path, answer.status_code, answer.content[:500])
        return answer.json()

    processes = Processes(DJANGO_SETTINGS_MODULE="batchdesk.settings")
    try:
        processes.emulator(
            "--per-request-ms", "1", "--prose-rate", options.prose_rate, "--seed", str(options.seed)
        )
        processes.start("qcluster", stdout=(work / "qcluster.log").open("w"))

        def drive(job_id: int, what: str) -> None:
            """Review and mend until every item is at rest or unusable past the cap."""
            started = time.monotonic()

            def done() -> bool:
                job = Job.objects.get(pk=job_id)
                if job.state == "paused":
                    raised = (job.budget * Decimal("1.5")).quantize(Decimal("0.01"))
                    print(f"{what} paused: {job.pause_detail}; the budget raised to {raised}", flush=True)
                    post(f"/api/jobs/{job_id}/budget", {"budget": str(raised)})
                states = dict(Item.objects.filter(job_id=job_id).values_list("id", "state"))
                for item_id, state in states.items():
                    if state == "awaiting_review":
                        version = GeneratedVersion.objects.filter(item_id=item_id).order_by("-number").first()
                        post(f"/api/items/{item_id}/versions/{version.pk}/approve", {})
                    elif state == "validation_failed":
                        drafts = GeneratedVersion.objects.filter(item_id=item_id).count()
                        if drafts <= options.redrafts:
                            post(f"/api/items/{item_id}/retry", {"unit": "inference"})
                waiting = [
                    state
                    for item_id, state in Item.objects.filter(job_id=job_id).values_list("id", "state")
                    if state in ON_THE_WAY
                    or state == "awaiting_review"
                    or (
                        state == "validation_failed"
                        and GeneratedVersion.objects.filter(item_id=item_id).count() <= options.redrafts
                    )
                ]
                return not waiting

            wait_until(done, timeout=1800, what=what, every=2)
            print(f"{what}: at rest after {time.monotonic() - started:.0f} s", flush=True)

        pilot = post(
            "/api/jobs",
            {
                "reference": "uneven-pilot",
                "task": DEFAULT_PROMPT["task"],
                "provider": "emulator",
                "prompt_version": prompt.version,
                "unit_size": 100,
                "pilot": {"per_stratum": options.per_stratum, "seed": options.seed},
            },
        )
        drive(pilot["id"], "the pilot")
        report = api.get(f"/api/jobs/{pilot['id']}/pilot").json()
        (work / "pilot-report.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"the pilot's report: {work / 'pilot-report.json'}", flush=True)
        decided = post(f"/api/jobs/{pilot['id']}/pilot/decision", {"decision": "go", "note": "measured"})
        full = decided["full_job"]
        drive(full["id"], "the full job")
        pilot_cost = Decimal(str(api.get(f"/api/jobs/{pilot['id']}").json()["cost"]["total"]))
        full_cost = Decimal(str(api.get(f"/api/jobs/{full['id']}").json()["cost"]["total"]))
        report = api.get(f"/api/jobs/{pilot['id']}/pilot").json()
    finally:
        processes.stop_all()

    projection = report["projection"]
    cost = projection["cost"]
    actual = pilot_cost + full_cost
    expected = Decimal(str(cost["expected"]))
    print(
        json.dumps(
            {
                "sample": report["sample"]["strata"]
                and [
                    {"key": s["key"], "scope": s["scope_products"], "drawn": s["products"]}
                    for s in report["sample"]["strata"]
                ],
                "projection_cost": cost,
                "risks": report.get("risks"),
                "accuracy": report.get("accuracy"),
            },
            indent=1,
            default=str,
        )
    )
    print(
        f"projected {expected} ({cost['low']}–{cost['high']}) {cost['currency']}; actual {actual} "
        f"(pilot {pilot_cost} + full job {full_cost}); error {(actual - expected) / actual * 100:+.1f} % of actual; "
        f"within the range: {Decimal(str(cost['low'])) <= actual <= Decimal(str(cost['high']))}"
    )


if __name__ == "__main__":
    main()
