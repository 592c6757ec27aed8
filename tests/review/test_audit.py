"""The audit screens: approvals with their edits, the CSV export, and any item's event log."""

import csv
import io
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.http import StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from ledger.models import (
    ApiToken,
    Approval,
    ArmPreference,
    CatalogueImport,
    CatalogueImportChunk,
    CollectorHeartbeat,
    Comment,
    DestinationAttempt,
    DrillKind,
    DrillStep,
    Event,
    ExchangeRate,
    Item,
    JobNotification,
    NotificationAttempt,
    Pilot,
    PilotDecision,
    PilotProduct,
    PilotStratum,
    ProviderHint,
    Publication,
    ReviewClaim,
    Submission,
    SubmissionItem,
    UnitCharge,
)
from ledger.states import ItemState
from review.audit import CSV_COLUMNS, csv_cell, edit_of
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'


@pytest.fixture
def admin():
    return UserFactory(username="alice", roles=["admin"])


def approve(
    item: Item,
    by,
    *,
    generated: str = "",
    final: str | None = None,
    at: datetime | None = None,
    note: str = "",
) -> Approval:
    """A new version and its approval as the ledger records them, optionally edited and back-dated."""
    version = add_version(item, generated)
    approval = Approval.objects.create(
        item=item,
        version=version,
        version_hash=version.content_hash,
        approved_by=by,
        final_content=final if final is not None else version.content,
        edited=final is not None and final != version.content,
        note=note,
    )
    Item.objects.filter(pk=item.pk).update(state=ItemState.APPROVED, approved_version=version)
    if at is not None:
        Approval.objects.filter(pk=approval.pk).update(approved_at=at)
        approval.refresh_from_db()
    return approval


def exported(response) -> list[dict]:
    assert isinstance(response, StreamingHttpResponse)
    text = b"".join(response.streaming_content).decode("utf-8")
    assert text.startswith("\ufeff")  # the byte-order mark spreadsheet programs need to read UTF-8
    return list(csv.DictReader(io.StringIO(text.removeprefix("\ufeff"))))


# --- who may see it --------------------------------------------------------------------------


def test_only_admins_see_the_audit(client, owner, operator, outsider, item):
    urls = [reverse("audit"), reverse("audit_csv"), reverse("audit_events", args=[item.pk])]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/accounts/login/?next="), url
    for person in (owner, operator, outsider):
        client.force_login(person)
        for url in urls:
            assert client.get(url).status_code == 403, (person, url)
    for person in (UserFactory(roles=["admin"]), UserFactory(is_superuser=True)):
        client.force_login(person)
        for url in urls:
            assert client.get(url).status_code == 200, (person, url)


# --- the approvals -------------------------------------------------------------------------


def test_approvals_show_who_when_which_version_and_the_edit(client, admin, owner, job):
    plain = approve(ItemFactory(job=job, product__sku="OAK-1"), owner)
    edited_item = ItemFactory(job=job, product__sku="OAK-2", awaiting_review=True)
    add_version(edited_item, "A first draft that was replaced.")
    edited = approve(
        edited_item, owner, final="A sturdy board of solid oak, oiled by hand.", note="tightened"
    )
    client.force_login(admin)
    response = client.get(reverse("audit"))
    html = response.content.decode()
    assert [row.approval for row in response.context["rows"]] == [edited, plain]
    assert owner.username in html and job.reference in html and "OAK-1" in html and "OAK-2" in html
    assert f'<code title="{edited.version_hash}">{edited.version_hash[:12]}</code>' in html
    assert '<td class="num">2</td>' in html  # the second version of OAK-2 was approved
    assert '<span class="badge">edited</span>' in html and "Note: tightened" in html
    assert response.context["rows"][1].diff is None
    assert ("insert", "of solid oak, oiled by hand.") in response.context["rows"][0].diff


def test_an_edit_is_shown_word_by_word_unless_too_long(client, admin, owner):
    item = ItemFactory(awaiting_review=True)
    approval = approve(
        item,
        owner,
        generated="A sturdy board made from oak.",
        final="A sturdy board made from solid oak, oiled.",
    )
    assert edit_of(approval) == [
        ("equal", "A sturdy board made from "),
        ("delete", "oak."),
        ("insert", "solid oak, oiled."),
    ]
    approval.final_content = "x " * 10_000
    assert edit_of(approval) is None
    Approval.objects.filter(pk=approval.pk).update(final_content="x " * 10_000)
    client.force_login(admin)
    html = client.get(reverse("audit")).content.decode()
    assert "Too long to compare word by word; the final text:" in html


def test_edited_text_is_escaped_in_the_diff(client, admin, owner):
    approve(ItemFactory(awaiting_review=True), owner, final=f"Now with {XSS} inside", note=XSS)
    client.force_login(admin)
    html = client.get(reverse("audit")).content.decode()
    assert "<script>alert" not in html
    assert "<ins>Now with &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; inside</ins>" in html
    assert "Note: &lt;script&gt;" in html


def test_approvals_filter_by_person_job_and_dates(client, admin, owner, job):
    bob = UserFactory(username="bob", roles=["catalogue_owner"])
    other_job = JobFactory(reference="other-job")
    now = timezone.now()
    a = approve(ItemFactory(job=job), owner, at=now - timedelta(days=10))
    b = approve(ItemFactory(job=job), bob, at=now - timedelta(days=2))
    c = approve(ItemFactory(job=other_job), bob, at=now)
    client.force_login(admin)

    def shown(**query) -> list[Approval]:
        response = client.get(reverse("audit"), query)
        assert response.status_code == 200
        return [row.approval for row in response.context["rows"]]

    assert shown() == [c, b, a]
    assert shown(person="bob") == [c, b]
    assert shown(job=job.reference) == [b, a]
    assert shown(person="bob", job=job.reference) == [b]
    assert shown(since=(now - timedelta(days=3)).date().isoformat()) == [c, b]
    assert shown(until=(now - timedelta(days=2)).date().isoformat()) == [b, a]
    day = (now - timedelta(days=10)).date().isoformat()
    assert shown(since=day, until=day) == [a]
    choices = client.get(reverse("audit")).context["filters"].fields["person"].choices
    assert [str(label) for _, label in choices] == ["Everyone", "bob", owner.username]


def test_the_filters_errors_follow_the_fields_order_on_the_page(client, admin):
    """The dates come last on the audit's filter, and so do their errors (the dates' rule is shared
    with the quality page, whose filter starts with them)."""
    client.force_login(admin)
    page = client.get(reverse("audit"), {"job": "no-such-job", "since": "yesterday"})
    assert list(page.context["filters"].fields) == ["decision", "person", "job", "since", "until"]
    html = page.content.decode()
    assert html.index("No job has this reference.") < html.index("Enter a valid date.")


@pytest.mark.parametrize(
    "query, message",
    [
        ({"job": "no-such-job"}, "No job has this reference."),
        ({"person": "nobody"}, "Select a valid choice."),
        ({"since": "2025-02-01", "until": "2025-01-01"}, "The start date is after the end date."),
        ({"since": "yesterday"}, "Enter a valid date."),
    ],
)
def test_bad_filters_are_explained_and_export_nothing(client, admin, owner, query, message):
    approve(ItemFactory(), owner)
    client.force_login(admin)
    page = client.get(reverse("audit"), query)
    assert page.status_code == 200 and message in page.content.decode()
    assert page.context["rows"] == []
    assert reverse("audit_csv") not in page.content.decode()
    export = client.get(reverse("audit_csv"), query)
    assert export.status_code == 400
    assert message in export.content.decode()


def test_approvals_are_paginated(client, admin, owner, job):
    for _ in range(51):
        approve(ItemFactory(job=job), owner)
    client.force_login(admin)
    assert len(client.get(reverse("audit")).context["rows"]) == 50
    second = client.get(reverse("audit"), {"page": 2})
    assert len(second.context["rows"]) == 1 and "Page 2 of 2" in second.content.decode()


def test_the_page_query_count_does_not_grow_with_rows(
    client, admin, owner, job, django_assert_max_num_queries
):
    approve(ItemFactory(job=job), owner, final="Edited once.")
    client.force_login(admin)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        client.get(reverse("audit"))
    for _ in range(20):
        approve(ItemFactory(job=job), owner, final="Edited again, differently.")
    with django_assert_max_num_queries(len(few)):
        client.get(reverse("audit"))


# --- CSV -----------------------------------------------------------------------------------


def test_the_csv_export_streams_the_filtered_rows(client, admin, owner, job):
    bob = UserFactory(username="bob", roles=["catalogue_owner"])
    mine = approve(ItemFactory(job=job, product__sku="OAK-1"), owner, final='Line one,\n"quoted" line two')
    approve(ItemFactory(job=job), bob)
    client.force_login(admin)

    response = client.get(reverse("audit_csv"), {"person": owner.username, "job": job.reference})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="decisions-')
    [row] = exported(response)
    assert row == {
        "decision": "approved",
        "decided_at": mine.approved_at.isoformat(),
        "decided_by": owner.username,
        "job": job.reference,
        "sku": "OAK-1",
        "item_id": str(mine.item_id),
        "version_number": "1",
        "version_id": str(mine.version_id),
        "content_hash": mine.version_hash,
        "edited": "yes",
        "note": "",
        "reason": "",
        "generated_content": mine.version.content,
        "final_content": 'Line one,\n"quoted" line two',
        "reason_code": "",
        "undone_at": "",
    }
    assert len(exported(client.get(reverse("audit_csv")))) == 2


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_that_a_spreadsheet_would_run_are_defused(client, admin, owner, start):
    formula = f'{start}HYPERLINK("https://evil.example","click")'
    approve(ItemFactory(), owner, final=formula, note=f"{start}1+1")
    client.force_login(admin)
    [row] = exported(client.get(reverse("audit_csv")))
    assert row["final_content"] == "'" + formula
    assert row["note"] == f"'{start}1+1"


def test_every_csv_cell_is_quoted(client, admin, owner):
    """Numbers, hashes and empty cells too, so a spreadsheet takes each as the text it is."""
    approval = approve(ItemFactory(product__sku="OAK-7"), owner, generated="A plain draft.", note="")
    client.force_login(admin)
    response = client.get(reverse("audit_csv"))
    header, row, end = b"".join(response.streaming_content).decode("utf-8").split("\r\n")
    assert header == "\ufeff" + ",".join('"' + name + '"' for name in CSV_COLUMNS)
    cells = [
        "approved",
        approval.approved_at.isoformat(),
        owner.username,
        approval.item.job.reference,
        "OAK-7",
        str(approval.item_id),
        "1",
        str(approval.version_id),
        approval.version_hash,
        "no",
        "",
        "",
        "A plain draft.",
        "A plain draft.",
        "",
        "",
    ]
    assert row == ",".join(f'"{cell}"' for cell in cells)
    assert end == ""


def test_csv_cell_leaves_everything_else_alone():
    assert csv_cell("A plain = sign later") == "A plain = sign later"
    assert csv_cell(7) == 7 and csv_cell(True) == "yes" and csv_cell(False) == "no"


def test_the_csv_export_reads_rows_in_chunks(client, admin, owner, job, monkeypatch):
    """A server-side cursor hands rows over in chunks; the export never lists them all at once."""
    from django.db.models.query import QuerySet

    chunks = []
    real_iterator = QuerySet.iterator

    def watched(self, chunk_size=None):
        chunks.append(chunk_size)
        return real_iterator(self, chunk_size=chunk_size)

    monkeypatch.setattr(QuerySet, "iterator", watched)
    for _ in range(3):
        approve(ItemFactory(job=job), owner)
    client.force_login(admin)
    response = client.get(reverse("audit_csv"))
    assert len(exported(response)) == 3
    assert chunks == [500, 500]  # the approvals, and the rejections


# --- events --------------------------------------------------------------------------------


def test_the_event_log_of_any_item_is_complete_and_escaped(client, admin, owner):
    item = ItemFactory(state=ItemState.DEAD_LETTER)
    Event.objects.create(item=item, job=item.job, to_state="prepared", actor_name="alice")
    Event.objects.create(item=item, job=item.job, from_state="prepared", to_state="submitted", reason="In b1")
    Event.objects.create(
        item=item,
        job=item.job,
        from_state="submitted",
        to_state="dead_letter",
        reason=XSS,
        data={"custom_id": "bd-1-1", "transient": True},
    )
    Event.objects.create(item=ItemFactory(), to_state="prepared", reason="another item's event")
    client.force_login(admin)
    html = client.get(reverse("audit_events", args=[item.pk])).content.decode()
    # After the events the item reached its state with, the three written here, in their order.
    assert html.index("dead_letter</td>") < html.index("In b1") < html.index("&lt;script&gt;")
    assert "alice" in html
    assert "another item&#x27;s event" not in html and "another item's event" not in html
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "{&quot;custom_id&quot;: &quot;bd-1-1&quot;, &quot;transient&quot;: true}" in html
    assert "Gave up after the allowed attempts; needs an operator" in html
    assert client.get(reverse("audit_events", args=[999999])).status_code == 404


# --- the Django admin ----------------------------------------------------------------------

# Every model of the ledger app, so a model added later cannot be missing from the admin unnoticed.
# Exchange rates are the one thing of the ledger's an admin may add (SPEC §9): tested in test_admin_doors.
LEDGER_MODELS = [model for model in apps.get_app_config("ledger").get_models() if model is not ExchangeRate]


@pytest.fixture
def one_of_each(owner, item, draft) -> None:
    submission = Submission.objects.create(job=item.job, provider="emulator", model="m", intent_key="bd_x")
    SubmissionItem.objects.create(submission=submission, item=item, custom_id="bd-x-1")
    approve(item, owner)
    DestinationAttempt.objects.create(item=item, version=draft, destination="catalogue", operation_key="k")
    Event.objects.create(item=item, job=item.job, to_state="prepared")
    Event.objects.create(item=item, job=item.job, from_state="applying", to_state="dead_letter")
    CollectorHeartbeat.objects.create(name="collector", last_poll_at=timezone.now())
    ApiToken.objects.create(user=owner, token_hash="f" * 64, prefix="bd_abc")
    Publication.objects.create(product=item.product, version=draft, operation_key="k", content=draft.content)
    upload = CatalogueImport.objects.create(file_name="a.csv", size=10, uploaded_by=owner)
    CatalogueImportChunk.objects.create(catalogue_import=upload, number=0, data=b"sku,title\n")
    UnitCharge.objects.create(
        job=item.job,
        submission=submission,
        currency="GBP",
        reserved_usd=Decimal("1"),
        reserved=Decimal("0.8"),
    )
    pilot = Pilot.objects.create(job=item.job, per_stratum=1, strata=["category"], seed=1)
    PilotStratum.objects.create(
        pilot=pilot, number=1, values={"category": None}, scope_products=1, sample_products=1
    )
    PilotProduct.objects.create(pilot=pilot, product=item.product, stratum=1)
    DrillStep.objects.create(pilot=pilot, kind=DrillKind.INTERRUPTED_COLLECTION, submission=submission)
    PilotDecision.objects.create(pilot=pilot, decision="no_go", by=owner, note="<b>not yet</b>")
    ArmPreference.objects.create(
        pilot=pilot,
        product=item.product,
        reviewer=owner,
        arm_a=1,
        arm_b=2,
        version_a=draft,
        version_b=draft,
        a_on_left=True,
    )
    notification = JobNotification.objects.create(
        job=item.job,
        channel="webhook",
        message_id="msg_x",
        event_type="job.running",
        recipient="http://r",
        body=b"{}",
    )
    NotificationAttempt.objects.create(notification=notification, status=500, answer="<b>down</b>")
    ProviderHint.objects.create(
        provider="openai",
        webhook_id="msg_y",
        event_type="batch.completed",
        batch_ref="<b>batch</b>",
        submission=submission,
        outcome="poll_queued",
    )
    Comment.objects.create(item=item, version=draft, author=owner, text="<b>see the source</b>")
    ReviewClaim.objects.create(item=item, reviewer=owner, until=timezone.now())


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_the_ledger_is_read_only_in_the_admin(client, one_of_each):
    client.force_login(UserFactory(is_superuser=True, is_staff=True))
    index = client.get(reverse("admin:index")).content.decode()
    for model in LEDGER_MODELS:
        obj = model.objects.first()
        assert admin_url(model, "changelist") in index, model
        assert client.get(admin_url(model, "changelist")).status_code == 200, model
        change = client.get(admin_url(model, "change", obj.pk))
        assert change.status_code == 200, model
        assert 'name="_save"' not in change.content.decode(), model
        assert client.get(admin_url(model, "add")).status_code == 403, model
        assert client.post(admin_url(model, "change", obj.pk), {}).status_code == 403, model
        if model is not ApiToken:  # tokens may be deleted: see below
            assert client.post(admin_url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403, model
            assert model.objects.filter(pk=obj.pk).exists(), model
        assert admin_url(model, "add") not in index, model
    token_page = client.get(admin_url(ApiToken, "change", ApiToken.objects.get().pk)).content.decode()
    assert "f" * 64 not in token_page


@pytest.mark.parametrize(
    "person", [{"roles": ["admin"], "is_staff": True}, {"is_superuser": True, "is_staff": True}]
)
def test_admins_may_delete_an_api_token_and_nothing_else(client, one_of_each, person):
    client.force_login(UserFactory(**person))
    token = ApiToken.objects.get()
    assert client.post(admin_url(ApiToken, "delete", token.pk), {"post": "yes"}).status_code == 302
    assert not ApiToken.objects.exists()
    client.force_login(UserFactory(roles=["operator"], is_staff=True))
    other = ApiToken.objects.create(user=UserFactory(), token_hash="e" * 64, prefix="bd_def")
    assert client.post(admin_url(ApiToken, "delete", other.pk), {"post": "yes"}).status_code == 403
    assert ApiToken.objects.filter(pk=other.pk).exists()


def test_events_are_filtered_by_the_state_they_reached(client, one_of_each):
    client.force_login(UserFactory(is_superuser=True, is_staff=True))
    response = client.get(admin_url(Event, "changelist"), {"to_state": "dead_letter"})
    assert response.status_code == 200
    assert [e.to_state for e in response.context["cl"].result_list] == ["dead_letter"]
    assert "By to state" in response.content.decode()


def test_staff_admins_see_the_ledger_and_other_staff_do_not(client, one_of_each):
    client.force_login(UserFactory(roles=["admin"], is_staff=True))
    assert client.get(admin_url(Item, "changelist")).status_code == 200
    client.force_login(UserFactory(roles=["operator"], is_staff=True))
    assert client.get(admin_url(Item, "changelist")).status_code == 403
    client.force_login(UserFactory(roles=["admin"]))  # the `admin` group needs no staff flag
    assert client.get(admin_url(Item, "changelist")).status_code == 200
    client.force_login(UserFactory(roles=["operator"]))
    assert client.get(admin_url(Item, "changelist")).status_code == 302


def test_the_rows_links_and_times_are_what_url_and_date_make(settings):
    """The audit makes each row's links and time in Python; they are what the template tags made."""
    from django.template import Context, Template
    from django.urls import reverse, set_script_prefix
    from django.utils import timezone

    from review.audit import AuditRow
    from review.common import url_of

    for name in ("job_detail", "item_detail", "audit_events"):
        for pk in (1, 42, 2**40):
            assert url_of(name, pk) == reverse(name, args=[pk])
    set_script_prefix("/desk/")
    try:
        assert url_of("item_detail", 7) == reverse("item_detail", args=[7]) == "/desk/items/7/"
    finally:
        set_script_prefix("/")
    settings.TIME_ZONE = "Europe/Berlin"
    moment = timezone.now()
    row = AuditRow(Approval(approved_at=moment), None)
    shown = Template("""{{ at|date:'c' }} {{ at|date:"Y-m-d H:i T" }}""")
    with timezone.override("Europe/Berlin"):
        assert f"{row.at_iso} {row.at_shown}" == shown.render(Context({"at": moment}))
        assert "+01:00" in row.at_iso or "+02:00" in row.at_iso


# --- rejections ----------------------------------------------------------------------------


def reject(item: Item, by, reason: str) -> Event:
    """A draft and its rejection as the ledger records them: the reviewer's verb."""
    from ledger.actions.reviewing import reject_version

    version = add_version(item)
    reject_version(item_id=item.pk, version_id=version.pk, reviewer=by, reason=reason)
    return Event.objects.filter(item=item, to_state=ItemState.REJECTED).get()


def test_the_audit_shows_rejections_with_who_why_and_the_draft(client, admin, owner, job):
    rejected = reject(ItemFactory(job=job, awaiting_review=True, product__sku="OAK-9"), owner, XSS)
    reject(ItemFactory(awaiting_review=True), UserFactory(username="bob", roles=["catalogue_owner"]), "No")
    client.force_login(admin)
    html = client.get(reverse("audit"), {"decision": "rejected", "job": job.reference}).content.decode()
    assert "1 rejection" in html and 'data-testid="rejections"' in html
    row = html[html.index(f'data-testid="rejection-{rejected.pk}"') :]
    assert owner.username in row and "OAK-9" in row and rejected.data["version"]
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in row and XSS not in html
    version = Item.objects.get(pk=rejected.item_id).versions.get()
    assert version.content_hash[:12] in row
    by_bob = client.get(reverse("audit"), {"decision": "rejected", "person": "bob"}).content.decode()
    assert "1 rejection" in by_bob and "OAK-9" not in by_bob
    assert "0 approvals" in client.get(reverse("audit")).content.decode()  # approvals stay apart


def test_an_approval_that_repaired_an_unusable_draft_says_so(client, admin, owner):
    item = ItemFactory(awaiting_review=True)
    approval = approve(item, owner, final="An oak board, 40 x 25 cm, oiled by hand and ready for use.")
    approval.version.valid = False
    approval.version.save()
    client.force_login(admin)
    assert 'data-testid="repaired"' in client.get(reverse("audit")).content.decode()


def test_the_csv_holds_approvals_and_rejections_newest_first_with_a_byte_order_mark(client, admin, owner):
    approval = approve(ItemFactory(product__sku="OAK-1"), owner, final="Oiled at 20 °C for a day.")
    Approval.objects.filter(pk=approval.pk).update(approved_at=timezone.now() - timedelta(hours=1))
    rejection = reject(ItemFactory(awaiting_review=True, product__sku="OAK-2"), owner, "Says 100 °C")
    client.force_login(admin)
    response = client.get(reverse("audit_csv"))
    raw = b"".join(response.streaming_content)
    assert raw.startswith(b"\xef\xbb\xbf")  # UTF-8's byte-order mark
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"))))
    assert [(r["decision"], r["sku"]) for r in rows] == [("rejected", "OAK-2"), ("approved", "OAK-1")]
    assert rows[0]["reason"] == "Says 100 °C" and rows[0]["decided_by"] == owner.username
    assert rows[0]["version_id"] == str(rejection.data["version"]) and rows[0]["final_content"] == ""
    assert rows[1]["final_content"] == "Oiled at 20 °C for a day."
