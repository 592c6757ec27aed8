"""The review desk (review/desk.py) through Django's test client: focus mode (one draft, its diff,
cost and position), drafts that may no longer be approved, and editing before approving. The list
and its bulk decisions: test_review_list.py."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Approval, GeneratedVersion, Item, Product
from ledger.money.pricing import version_cost
from ledger.states import ItemState
from review.common import word_diff
from review.templatetags.display import money
from tests.factories import ItemFactory, JobFactory, add_version
from tests.review.drafts import queue_of, revise, withdraw

pytestmark = pytest.mark.django_db

XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'
ESCAPED_XSS = (
    "&lt;script&gt;window.__xss=1&lt;/script&gt;&lt;img src=x onerror=&quot;window.__xss=2&quot;&gt;"
)


def publish(product: Product, text: str) -> None:
    """As if an earlier draft had been applied: the catalogue destination's fields on the product."""
    earlier = add_version(ItemFactory(product=product, state=ItemState.APPLIED), text)
    Product.objects.filter(pk=product.pk).update(
        published_content=text, published_version=earlier, published_revision=1, published_at=timezone.now()
    )


def focus(client, **params):
    return client.get(reverse("review_queue"), params)


def focus_at(client, url: str, **headers):
    return client.get(url, headers=headers)


def listing(client, **params):
    return client.get(reverse("review_queue"), {"mode": "list", **params})


def approve_data(draft: GeneratedVersion, **more) -> dict:
    return {"version_id": draft.pk, "version_hash": draft.content_hash, **more}


HTMX = {"HX-Request": "true"}


# --- the word diff -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "before, after",
    [
        ("", "A new oak board."),
        ("An oak board.", ""),
        ("An oak board for bread.", "An oak board for cheese and bread."),
        ("  Two  spaces\nand a line.", "Two spaces\n\nand two lines. "),
        ("same", "same"),
        ("   ", "\n"),
    ],
)
def test_the_word_diff_rebuilds_both_texts(before, after):
    pieces = word_diff(before, after)
    assert "".join(text for op, text in pieces if op != "delete") == after
    assert "".join(text for op, text in pieces if op != "insert").split() == before.split()
    assert {op for op, _ in pieces} <= {"equal", "delete", "insert"}


def test_the_word_diff_marks_whole_words():
    assert word_diff("An oak board for bread.", "An oak board for cheese.") == [
        ("equal", "An oak board for "),
        ("delete", "bread."),
        ("insert", "cheese."),
    ]


# --- focus mode ----------------------------------------------------------------------------


def test_focus_mode_shows_one_draft_with_its_position_and_cost(client, owner):
    drafts = queue_of(3)
    client.force_login(owner)
    response = focus(client)
    html = response.content.decode()
    assert response.context["card"].version == drafts[0]
    assert drafts[0].content in html
    assert drafts[1].content not in html and drafts[2].content not in html
    assert '<span class="desk-position" data-testid="position">1 of 3</span>' in html
    assert f"Cost {money(version_cost(drafts[0]))} · 120 tokens in, 60 out" in html
    assert "Passed every validation rule." in html
    assert "Nothing is published for this product yet" in html
    assert f'href="{reverse("review_queue")}?pos=2&amp;after=' in html
    assert 'rel="prev"' not in html

    second = focus(client, pos=2).content.decode()
    assert drafts[1].content in second and "2 of 3" in second and 'rel="prev"' in second
    third = focus(client, item=drafts[2].item_id).content.decode()
    assert drafts[2].content in third and "3 of 3" in third and 'rel="next"' not in third
    assert "3 of 3" in focus(client, pos=99).content.decode()
    assert "1 of 3" in focus(client, pos="nonsense").content.decode()


def test_focus_mode_compares_the_draft_with_the_published_text_word_by_word(client, owner):
    item = ItemFactory(awaiting_review=True)
    publish(item.product, "An oak board for <b>bread</b>. Oiled.")
    add_version(item, 'An oak board for <i>cheese</i> & "wine". Oiled.')
    client.force_login(owner)
    html = focus(client).content.decode()
    start = html.index('<div class="word-diff"')
    assert html[start : html.index("</div>", start)] == (
        '<div class="word-diff" data-testid="diff">An oak board for '
        "<del>&lt;b&gt;bread&lt;/b&gt;. </del>"
        "<ins>&lt;i&gt;cheese&lt;/i&gt; &amp; &quot;wine&quot;. </ins>"
        "Oiled."
    )
    assert "<b>" not in html and "<i>" not in html


def test_focus_mode_shows_validation_notes(client, owner):
    item = ItemFactory(awaiting_review=True)
    add_version(item, "Short.", valid=False, reasons=["Shorter than 40 characters"])
    client.force_login(owner)
    html = focus(client).content.decode()
    assert "Shorter than 40 characters" in html
    assert "Only a valid draft can be approved." in html
    assert 'disabled aria-describedby="refusal-' in html


def test_an_htmx_step_returns_only_the_focus_partial(client, owner):
    drafts = queue_of(2)
    client.force_login(owner)
    response = client.get(reverse("review_queue"), {"pos": 2}, headers=HTMX)
    html = response.content.decode()
    assert "<html" not in html and '<nav aria-label="Main"' not in html
    assert drafts[1].content in html and "2 of 2" in html
    assert html.lstrip().startswith(f'<article class="card focus-card" id="review-card-{drafts[1].item_id}"')
    assert "HX-Request" in response.headers["Vary"]


def test_a_job_filter_narrows_the_queue_and_is_kept_when_stepping(client, owner):
    job = JobFactory()
    queue_of(2)
    mine = queue_of(2, job=job)
    client.force_login(owner)
    html = focus(client, job=job.pk).content.decode()
    assert mine[0].content in html and "1 of 2" in html
    assert f"?job={job.pk}&amp;pos=2" in html
    assert f'<option value="{job.pk}" selected>{job.reference} (2 waiting)</option>' in html


def test_an_item_that_is_no_longer_waiting_opens_its_own_page(client, owner, item):
    Item.objects.filter(pk=item.pk).update(state=ItemState.APPLIED)
    client.force_login(owner)
    response = focus(client, item=item.pk)
    assert response.status_code == 302 and response.url == reverse("item_detail", args=[item.pk])


def test_an_empty_queue_says_so(client, owner):
    client.force_login(owner)
    assert "Nothing is waiting for review." in focus(client).content.decode()
    assert "Nothing is waiting for review." in listing(client).content.decode()


def test_an_operator_sees_the_desk_but_no_decision(client, operator):
    drafts = queue_of(2)
    client.force_login(operator)
    html = focus(client).content.decode()
    assert drafts[0].content in html and "Only catalogue owners approve or reject drafts." in html
    assert "/approve" not in html and "/reject" not in html and "/undo" not in html  # no decision forms
    rows = listing(client).content.decode()
    assert drafts[1].content in rows
    assert 'name="item"' not in rows and reverse("approve_selected") not in rows


# --- deciding in focus mode ----------------------------------------------------------------


def test_approving_in_focus_mode_answers_with_the_outcome_and_the_next_draft(client, owner):
    drafts = queue_of(3)
    client.force_login(owner)
    response = client.post(
        reverse("approve_item", args=[drafts[1].item_id]), approve_data(drafts[1], pos=2), headers=HTMX
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(f'<article class="card" id="review-card-{drafts[1].item_id}"')
    assert "Approved — being applied" in html
    assert "Now: A specific version was approved; waiting to be applied" in html
    assert drafts[2].content in html and "2 of 2" in html  # the next draft took its place
    assert response.headers["HX-Replace-Url"].startswith("/review/?pos=2&after=")
    assert Item.objects.get(pk=drafts[1].item_id).state == ItemState.APPROVED
    # A reload shows the same draft.
    assert focus_at(client, response.headers["HX-Replace-Url"]).context["card"].version == drafts[2]


def test_approving_the_last_draft_steps_back_to_the_one_before(client, owner):
    drafts = queue_of(2)
    client.force_login(owner)
    html = client.post(
        reverse("approve_item", args=[drafts[1].item_id]), approve_data(drafts[1], pos=2), headers=HTMX
    ).content.decode()
    assert drafts[0].content in html and "1 of 1" in html


def test_rejecting_in_focus_mode_needs_a_reason_and_then_moves_on(client, owner):
    drafts = queue_of(2)
    client.force_login(owner)
    url = reverse("reject_item", args=[drafts[0].item_id])
    refused = client.post(url, {"version_id": drafts[0].pk, "pos": 1}, headers=HTMX)
    assert refused.status_code == 400
    html = refused.content.decode()
    assert "Nothing was changed: Say why the draft is rejected: pick a reason or write one." in html
    assert drafts[0].content in html and "1 of 2" in html  # still the same draft

    done = client.post(
        url, {"version_id": drafts[0].pk, "pos": 1, "reason": "Claims a warranty"}, headers=HTMX
    )
    html = done.content.decode()
    assert "Rejected" in html and "(Claims a warranty)" in html
    assert drafts[1].content in html and "1 of 1" in html
    item = Item.objects.get(pk=drafts[0].item_id)
    assert (item.state, item.reason) == (ItemState.REJECTED, "Claims a warranty")


def test_without_javascript_a_decision_returns_to_the_same_position(client, owner):
    drafts = queue_of(3)
    client.force_login(owner)
    page = focus(client, pos=2)
    place = page.context["return_to"]
    assert place.startswith("/review/?pos=2&after=")
    assert f'name="next" value="{place.replace("&", "&amp;")}"' in page.content.decode()
    response = client.post(
        reverse("approve_item", args=[drafts[1].item_id]),
        approve_data(drafts[1], next=place),
        follow=True,
    )
    html = response.content.decode()
    assert response.redirect_chain == [(place, 302)]
    assert f"{drafts[1].item.product.sku}: Approved — being applied." in html
    assert drafts[2].content in html and "2 of 2" in html


def offsets(queries) -> list[int]:
    """The OFFSETs the queries asked for: each reads and skips that many rows."""
    return [int(n) for q in queries for n in re.findall(r"OFFSET (\d+)", q["sql"])]


def test_stepping_through_the_queue_counts_nothing_whatever_the_position(client, owner):
    """A million drafts waiting: the next and previous links carry the cursor of the draft before
    theirs, so the draft is read from the queue's index, never by skipping the ones before it."""
    drafts = queue_of(6)
    client.force_login(owner)
    page, seen = focus(client), []
    while True:
        seen.append(page.context["card"].version)
        assert f"{len(seen)} of 6" in page.content.decode()
        if not page.context["next_url"]:
            break
        with CaptureQueriesContext(connection) as queries:
            page = focus_at(client, page.context["next_url"], **HTMX)
        assert offsets(queries.captured_queries) == []
    assert seen == drafts
    back = []
    while page.context["previous_url"]:
        with CaptureQueriesContext(connection) as queries:
            page = focus_at(client, page.context["previous_url"])
        assert offsets(queries.captured_queries) == []
        back.append(page.context["card"].version)
    assert back == drafts[-2::-1]


def test_a_position_typed_in_is_counted_from_the_nearer_end(client, owner):
    drafts = queue_of(6)
    client.force_login(owner)
    for pos in range(1, 7):
        with CaptureQueriesContext(connection) as queries:
            page = focus(client, pos=pos)
        assert page.context["card"].version == drafts[pos - 1]
        assert max(offsets(queries.captured_queries), default=0) <= 2
    # A cursor that is not one of ours is ignored: the position decides.
    assert focus(client, pos=3, after="forged").context["card"].version == drafts[2]


def test_a_draft_opened_by_its_item_deep_in_the_queue_is_not_counted_to(client, owner, monkeypatch):
    """The list's rows open their draft by item: its place is counted only near either end of the
    queue; deeper, the desk shows the draft and how many wait, and steps on by cursors."""
    monkeypatch.setattr("review.desk.POSITION_COUNT_CAP", 2)
    drafts = queue_of(7)
    client.force_login(owner)
    assert focus(client, item=drafts[1].item_id).context["pos"] == 2
    assert focus(client, item=drafts[5].item_id).context["pos"] == 6  # counted from the end
    with CaptureQueriesContext(connection) as queries:
        deep = focus(client, item=drafts[3].item_id)
    assert deep.context["card"].version == drafts[3] and deep.context["pos"] is None
    assert offsets(queries.captured_queries) == []
    assert "7 waiting" in deep.content.decode() and "pos=" not in deep.context["next_url"]
    following = focus_at(client, deep.context["next_url"])
    assert following.context["card"].version == drafts[4]
    back = focus_at(client, deep.context["previous_url"])
    assert back.context["card"].version == drafts[2]
    # A decision there moves on to the next draft, by the cursor.
    response = client.post(
        reverse("approve_item", args=[drafts[3].item_id]),
        approve_data(drafts[3], after=deep.context["after"]),
        headers=HTMX,
    )
    assert response.context["card"].version == drafts[4]


def test_a_decision_deep_in_the_queue_moves_on_without_counting(client, owner):
    drafts = queue_of(5)
    client.force_login(owner)
    page = focus(client)
    for _ in range(3):
        page = focus_at(client, page.context["next_url"])
    assert page.context["card"].version == drafts[3] and page.context["pos"] == 4
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            reverse("approve_item", args=[drafts[3].item_id]),
            approve_data(drafts[3], pos=4, after=page.context["after"]),
            headers=HTMX,
        )
    assert offsets(queries.captured_queries) == []
    assert response.context["card"].version == drafts[4] and "4 of 4" in response.content.decode()


def test_editing_before_approving_keeps_both_texts(client, owner, item, draft):
    client.force_login(owner)
    html = focus(client).content.decode()
    assert f'aria-describedby="edit-rules-{item.pk}">{draft.content}</textarea>' in html
    edited = "A sturdy oak board.\r\nOiled by hand; 40 x 25 cm."
    response = client.post(
        reverse("approve_item", args=[item.pk]), approve_data(draft, content=edited, pos=1), headers=HTMX
    )
    assert "Approved with your edits — being applied" in response.content.decode()
    approval = Approval.objects.get(item=item)
    assert approval.edited
    assert approval.final_content == "A sturdy oak board.\nOiled by hand; 40 x 25 cm."
    assert GeneratedVersion.objects.get(pk=draft.pk).content == draft.content  # the generated text is kept


# --- drafts that may no longer be approved -------------------------------------------------


@pytest.mark.parametrize(
    "change, says, refusal, now",
    [
        (
            revise,
            "The product changed after this draft was generated — a new draft is being requested.",
            "The product changed since this draft was generated; a new draft has been requested",
            ItemState.OBSOLETE,
        ),
        (
            withdraw,
            "The product was withdrawn — nothing will be published.",
            "The product was withdrawn; nothing will be published for it",
            ItemState.WITHDRAWN,
        ),
    ],
)
def test_a_draft_the_product_moved_on_from_cannot_be_approved(
    client, owner, item, draft, change, says, refusal, now
):
    change(item.product)
    client.force_login(owner)
    for url in (reverse("review_queue"), reverse("item_detail", args=[item.pk])):
        html = client.get(url).content.decode()
        assert says in html, url
        assert "disabled aria-describedby=" in html, url
    rows = listing(client).content.decode()
    assert says.rstrip(".") in rows and 'data-approvable="false"' in rows

    response = client.post(reverse("approve_item", args=[item.pk]), approve_data(draft, pos=1), headers=HTMX)
    assert response.status_code == 409
    assert f"Nothing was changed: {refusal}" in response.content.decode()
    assert not Approval.objects.exists()
    item.refresh_from_db()
    assert item.state == now and item.approved_version_id is None  # moved out of the way by the ledger
    product = Product.objects.get(pk=item.product_id)
    assert product.published_version_id is None and product.published_content == ""


def test_focus_mode_queries_do_not_grow_with_the_queue(client, owner, django_assert_max_num_queries):
    client.force_login(owner)
    queue_of(2)
    with CaptureQueriesContext(connection) as few:
        assert focus(client, pos=2).status_code == 200
    queue_of(30)
    with django_assert_max_num_queries(len(few)):
        assert focus(client, pos=20).status_code == 200


# --- the item page -------------------------------------------------------------------------


def test_the_item_page_shows_each_versions_cost_and_its_diff_against_the_published_text(client, owner):
    item = ItemFactory(awaiting_review=True)
    publish(item.product, "An oak board for bread.")
    first = add_version(item, "An oak board for <b>cheese</b>.", valid=False)
    second = add_version(item, "A walnut board for bread.")
    client.force_login(owner)
    html = client.get(reverse("item_detail", args=[item.pk])).content.decode()
    for version in (first, second):
        assert f'<span data-testid="cost-{version.number}">cost {money(version_cost(version))}</span>' in html
    assert (
        '<div class="word-diff" data-testid="diff-1">An oak board for <del>bread.</del>'
        "<ins>&lt;b&gt;cheese&lt;/b&gt;.</ins></div>"
    ) in html
    assert (
        '<div class="word-diff" data-testid="diff-2"><del>An oak </del><ins>A walnut </ins>board for bread.</div>'
        in html
    )


# --- untrusted model output ----------------------------------------------------------------


def test_a_hostile_draft_is_escaped_in_focus_mode_list_mode_and_the_diff(client, owner, item):
    publish(item.product, XSS + " The published text.")
    add_version(item, "A new text. " + XSS, reasons=[XSS])
    client.force_login(owner)
    for response in (focus(client), listing(client), client.get(reverse("item_detail", args=[item.pk]))):
        html = response.content.decode()
        assert "<script>window" not in html and "<img src=x" not in html
        assert ESCAPED_XSS[:40] in html
    diff = focus(client).context["card"].diff
    assert ("insert", "A new text. ") in diff


def test_the_desk_says_when_a_drafts_price_is_unknown_and_marks_apportioned_usage(client, owner):
    [draft] = queue_of(1, job=JobFactory(model="emulated-model"))
    GeneratedVersion.objects.filter(pk=draft.pk).update(usage={"apportioned": True})
    client.force_login(owner)
    html = focus(client).content.decode()
    assert "price unknown for emulator/emulated-model · 120 tokens in, 60 out (apportioned)" in html
    assert 'Cost <span class="money"' not in html
    listed = listing(client).content.decode()
    assert 'title="price unknown for emulator/emulated-model">price unknown</span>' in listed
