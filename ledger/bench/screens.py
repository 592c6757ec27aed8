"""Figure (f): every screen and list endpoint, on its first, middle and last page, and the catalogue
search by title or SKU (issue 9, point 6: ≤ 50 ms of server time at a million items and 1.2 M
products), each beside Django admin's changelist of the same table on the same page.

It builds on the bench's job (`job_creation`, then `collection`, which leaves its first items
awaiting review with their drafts). So that every screen has rows to show, two set-wise statements
(not timed) then approve a tenth of the drafts waiting, with their approvals, and fail a hundredth
of them validation, before the tables are vacuumed and analysed, as autovacuum would after bulk
changes.

Server time is the wall time of Django's test client handling the request in the measuring
process (middleware, views, queries and templates; no network), signed in as a superuser, the
median of a few requests after one to warm up. Runs in a process of its own on the bench's
database (`serve_figures`, through `manage.py shell`)."""

import json
import statistics
import sys
import time
from urllib.parse import quote

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import Client

from ledger.models import ApiToken, Approval, Item, ItemTally, Job, Product, SourceRevision
from ledger.states import ItemState
from review.operations import attention_groups
from review.paging import cursor_for, key_of

from .base import Bench, Figure
from .measuring import MANAGE, CommandFailed, run_measured

TARGET_MS = 50
REPEATS = 5
BASELINE_REPEATS = 3
# `make bench-quick`'s three screens (issue 29, point 5): the review desk, where reviewers spend their
# day; a job's last page, the deepest page of the longest list; the catalogue searched by a SKU
# prefix a thousand products share, the search with the most rows to find.
REVIEW_DESK = "screen /review/, first draft"
JOB_LAST_PAGE = "screen /jobs/{id}/, last page"
SKU_PREFIX_SEARCH = "screen /catalogue/ search by a SKU prefix of 1,000"
QUICK_SCREENS = (REVIEW_DESK, JOB_LAST_PAGE, SKU_PREFIX_SEARCH)


def measure(bench: Bench) -> list[Figure]:
    run = run_measured(
        [
            sys.executable,
            str(MANAGE),
            "shell",
            "-c",
            f"from ledger.bench.screens import serve_figures; serve_figures(quick={bench.quick})",
        ],
        env=bench.env,
    )
    last = run.output.strip().splitlines()[-1]
    try:
        rows = json.loads(last)
    except json.JSONDecodeError:
        raise CommandFailed(f"the screens did not report their times:\n{run.output[-4000:]}") from None
    bench.say(f"Screens: {len(rows)} addresses measured in {run.seconds:,.1f} s")
    figures = []
    for row in rows:
        ms, baseline = row["ms"], row["baseline_ms"]
        figures.append(
            Figure(
                name=row["name"],
                value=f"{ms:,.1f} ms",
                baseline=f"{baseline:,.1f} ms {row['baseline']}",
                ratio=ms / baseline if baseline else None,
                target=f"≤ {TARGET_MS} ms",
                passed=ms <= TARGET_MS,
            )
        )
    return figures


# --- in the measuring process ---------------------------------------------------------------


def _prepare(job_id: int) -> None:
    """Approvals for a tenth of the drafts waiting and a hundredth of them failed as too short:
    set-wise, through the same triggers as everything else."""

    person = User.objects.get(username="bench")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            WITH chosen AS (
                SELECT i.id, v.id AS version_id, v.content_hash, v.content
                FROM ledger_item i JOIN ledger_generatedversion v ON v.item_id = i.id
                WHERE i.job_id = %s AND i.state = 'awaiting_review' AND i.id %% 10 = 0
            ), approved AS (
                INSERT INTO ledger_approval (item_id, version_id, version_hash, approved_by_id, approved_at,
                                             final_content, edited, note)
                SELECT id, version_id, content_hash, %s, now(), content, false, '' FROM chosen
                RETURNING item_id, version_id
            )
            UPDATE ledger_item i SET state = 'approved', approved_version_id = a.version_id, updated_at = now()
            FROM approved a WHERE i.id = a.item_id
            """,
            [job_id, person.pk],
        )
        cursor.execute(
            """
            UPDATE ledger_item SET state = 'validation_failed', reason_code = 'too_short',
                   reason = 'Too short: 12 characters, at least 80', updated_at = now()
            WHERE job_id = %s AND state = 'awaiting_review' AND id %% 100 = 7
            """,
            [job_id],
        )
    ItemTally.objects.compact(job_id)
    with connection.cursor() as cursor:
        for table in ("ledger_item", "ledger_approval", "ledger_generatedversion", "ledger_itemtally"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def _server_ms(client, url: str, repeats: int, **headers) -> float:
    response = client.get(url, headers=headers)
    if response.status_code != 200:
        raise CommandFailed(f"GET {url} answered {response.status_code}: {response.content[:500]!r}")
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        client.get(url, headers=headers)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _middle_cursor(rows, order: list[str]) -> str:
    """The cursor a reader following `next` links would hold half-way down the list."""

    count = rows.count()
    if not count:
        return "1"
    middle = rows.order_by(*order)[max(count // 2 - 1, 0)]
    return cursor_for("after", key_of(middle, order))


def _admin_pages(count: int, per_page: int = 50) -> dict[str, int]:
    last = max(1, -(-count // per_page))
    return {"first page": 1, "middle page": max(1, last // 2), "last page": last}


def only(checks: list[tuple], names: tuple[str, ...]) -> list[tuple]:
    """The checks of the screens named, in the order they are measured; a name no check has is the
    bench's own mistake, said at once rather than measured as nothing."""
    missing = set(names) - {check[0] for check in checks}
    if missing:
        raise CommandFailed(f"no screen is named {', '.join(sorted(missing))}")
    return [check for check in checks if check[0] in names]


def serve_figures(*, quick: bool = False) -> None:
    """Measures every address (only `QUICK_SCREENS` when quick) and prints them as one JSON line."""

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    # The pages' static file names, without the manifest `collectstatic` would write (`make serve`
    # does): finding a name in it or not costs the same.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    job = Job.objects.get(reference="bench")
    _prepare(job.pk)
    person = User.objects.get(username="bench")
    person.groups.add(*Group.objects.filter(name__in=["catalogue_owner", "operator", "admin"]))
    client = Client()
    client.force_login(person)
    ApiToken.objects.filter(prefix="bd_bench").delete()
    ApiToken.objects.create(user=person, token_hash=ApiToken.hash("bd_bench_token"), prefix="bd_bench")
    bearer = {"Authorization": "Bearer bd_bench_token"}

    items = Item.objects.filter(job=job)
    waiting = Item.objects.filter(state=ItemState.AWAITING_REVIEW)
    products = Product.objects.all()
    approvals = Approval.objects.all()
    middle_item = _middle_cursor(items, ["id"])
    middle_waiting = _middle_cursor(waiting, ["updated_at", "id"])
    middle_product = _middle_cursor(products, ["sku"])
    middle_approval = _middle_cursor(approvals, ["-approved_at", "-id"])
    pages = {"first page": "1", "middle page": middle_item, "last page": "last"}
    item_admin = _admin_pages(items.count())
    waiting_admin = _admin_pages(waiting.count())
    product_admin = _admin_pages(products.count())
    approval_admin = _admin_pages(approvals.count())
    group = attention_groups()[0]
    sample = products.order_by("sku")[products.count() // 3]
    title = SourceRevision.objects.get(pk=sample.current_revision_id).title
    sku_part = sample.sku[:-1]
    # A word in one title of eight ("lamp"), and the first characters of a thousand SKUs.
    common_word = title.split()[1] if len(title.split()) > 1 else title.split()[0]
    sku_prefix = sample.sku[:-3]

    # (name, address, extra headers, baseline name, the admin's address)
    checks = [
        ("screen /, dashboard", "/", {}, "admin jobs", "/admin/ledger/job/"),
        ("screen /jobs/", "/jobs/", {}, "admin jobs", "/admin/ledger/job/"),
        (
            REVIEW_DESK,
            "/review/",
            {},
            "admin items waiting, p1",
            "/admin/ledger/item/?state__exact=awaiting_review",
        ),
        (
            "screen /review/, last draft",
            f"/review/?pos={waiting.count()}",
            {},
            "admin items waiting, last",
            f"/admin/ledger/item/?state__exact=awaiting_review&p={waiting_admin['last page']}",
        ),
        (
            "screen /operations/",
            "/operations/",
            {},
            "admin items failed",
            "/admin/ledger/item/?state__exact=validation_failed",
        ),
        (
            "screen /operations/, a group's last page",
            f"/operations/?group={group.key}&page=last",
            {"HX-Request": "true"},
            "admin items failed, last",
            f"/admin/ledger/item/?state__exact=validation_failed&p={_admin_pages(group.count)['last page']}",
        ),
        (
            "screen /catalogue/ search by title",
            f"/catalogue/?q={quote(title)}",
            {},
            "admin revisions ?q=",
            f"/admin/ledger/sourcerevision/?q={quote(title)}",
        ),
        (
            "screen /catalogue/ search by SKU",
            f"/catalogue/?q={quote(sku_part)}",
            {},
            "admin products ?q=",
            f"/admin/ledger/product/?q={quote(sku_part)}",
        ),
        (
            "screen /catalogue/ search by a common word",
            f"/catalogue/?q={quote(common_word)}",
            {},
            "admin revisions ?q=",
            f"/admin/ledger/sourcerevision/?q={quote(common_word)}",
        ),
        (
            SKU_PREFIX_SEARCH,
            f"/catalogue/?q={quote(sku_prefix)}",
            {},
            "admin products ?q=",
            f"/admin/ledger/product/?q={quote(sku_prefix)}",
        ),
        ("API /api/jobs", "/api/jobs", bearer, "admin jobs", "/admin/ledger/job/"),
        ("API /api/jobs/{id}", f"/api/jobs/{job.pk}", bearer, "admin jobs", "/admin/ledger/job/"),
        (
            "API /api/jobs/{id}/items?state=awaiting_review",
            f"/api/jobs/{job.pk}/items?state=awaiting_review",
            bearer,
            "admin items waiting, p1",
            "/admin/ledger/item/?state__exact=awaiting_review",
        ),
        (
            "API /api/jobs/{id}/items?sku=",
            f"/api/jobs/{job.pk}/items?sku={quote(sample.sku)}",
            bearer,
            "admin items ?q=",
            f"/admin/ledger/item/?q={quote(sample.sku)}",
        ),
        ("/metrics", "/metrics", bearer, "admin items, p1", "/admin/ledger/item/"),
        ("/api/health", "/api/health", {}, "admin items, p1", "/admin/ledger/item/"),
    ]
    for where, token in pages.items():
        admin_page = item_admin[where]
        checks += [
            (
                f"screen /jobs/{{id}}/, {where}",
                f"/jobs/{job.pk}/?page={quote(token)}",
                {},
                f"admin items, p{admin_page}",
                f"/admin/ledger/item/?p={admin_page}",
            ),
            (
                f"API /api/jobs/{{id}}/items, {where}",
                f"/api/jobs/{job.pk}/items?page={quote(token)}",
                bearer,
                f"admin items, p{admin_page}",
                f"/admin/ledger/item/?p={admin_page}",
            ),
        ]
    # Each paged screen beside the admin's page of the same rows: (screen, its address before the
    # page token, its middle page's token, the admin's page numbers, the admin's list and address).
    paged = [
        (
            "screen /review/?mode=list",
            "/review/?mode=list&page=",
            middle_waiting,
            waiting_admin,
            "admin items waiting",
            "/admin/ledger/item/?state__exact=awaiting_review&p=",
        ),
        (
            "screen /catalogue/",
            "/catalogue/?page=",
            middle_product,
            product_admin,
            "admin products",
            "/admin/ledger/product/?p=",
        ),
        (
            "screen /audit/",
            "/audit/?page=",
            middle_approval,
            approval_admin,
            "admin approvals",
            "/admin/ledger/approval/?p=",
        ),
    ]
    for screen, address, middle, admin_pages, admin_list, admin_address in paged:
        for where, token in {"first page": "1", "middle page": middle, "last page": "last"}.items():
            admin_page = admin_pages[where]
            checks.append(
                (
                    f"{screen}, {where}",
                    address + quote(token),
                    {},
                    f"{admin_list}, p{admin_page}",
                    f"{admin_address}{admin_page}",
                )
            )
    if quick:
        checks = only(checks, QUICK_SCREENS)
    rows = []
    for name, url, headers, baseline, admin_url in checks:
        rows.append(
            {
                "name": name,
                "ms": _server_ms(client, url, REPEATS, **headers),
                "baseline": baseline,
                "baseline_ms": _server_ms(client, admin_url, BASELINE_REPEATS),
            }
        )
    print(json.dumps(rows))
