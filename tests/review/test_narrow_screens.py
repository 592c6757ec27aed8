"""Every screen at a phone's 390 px (issue 18, point 8; SPEC §8): for each role that may see it, no page
(nor the login and not-found pages) is wider than the screen (a wide table scrolls inside its own box); a skip link leads past the
navigation; the review desk's single-key shortcuts can be turned off."""

from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from ledger.actions.budgeting import pause
from ledger.catalogue import store_upload
from ledger.models import Approval, CatalogueImport, ImportState, Item, Job, PauseReason
from ledger.states import ItemState
from ledger.tasks import import_catalogue_file
from review.models import Preferences
from review.operations import attention_groups
from review.permissions import ADMIN, CATALOGUE_OWNER, OPERATOR
from tests.factories import ItemFactory, JobFactory, UserFactory
from tests.pilots import known_pilot, same_sample_arms
from tests.review.browser import log_in
from tests.review.test_screenshots import realistic_job

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

PHONE = {"width": 390, "height": 844}

# What makes a page wider than the screen: each element reaching past its right edge that is not
# inside a box that scrolls, deepest first, so a failure names the culprit.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
    const x = getComputedStyle(p).overflowX; if (x === 'auto' || x === 'scroll' || x === 'hidden') return true; } return false; };
  return [...document.body.querySelectorAll('*')]
    .filter((el) => el.getBoundingClientRect().right > width + 0.5 && !scrolls(el))
    .slice(-3)
    .map((el) => `${el.tagName.toLowerCase()}${el.className ? '.' + String(el.className).split(' ').join('.') : ''} ` +
                 `(${Math.round(el.getBoundingClientRect().right)} px): ${el.textContent.trim().replace(/\\s+/g, ' ').slice(0, 50)}`);
}"""


def screens(job) -> dict[str, list[str]]:
    """Every screen with real content, and the roles that may open it."""
    viewers, approvers, admins = [CATALOGUE_OWNER, OPERATOR, ADMIN], [CATALOGUE_OWNER, ADMIN], [ADMIN]
    rejected = Item.objects.filter(job=job, state=ItemState.REJECTED).first()
    applied = Item.objects.filter(job=job, state=ItemState.APPLIED).first()
    failed = next(group for group in attention_groups() if group.state == ItemState.INFERENCE_FAILED)
    upload = CatalogueImport.objects.create(
        file_name="spring-catalogue.csv", size=2048, uploaded_by=job.owner
    )
    # A price change of a product at work: its import stops at a preview (the widest import page).
    product = Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).first().product
    prices = f"sku,title,price\n{product.sku},{product.current_revision.title},1234.50\n".encode()
    previewed = store_upload(
        SimpleUploadedFile("spring-prices.csv", prices, content_type="text/csv"),
        uploaded_by=job.owner,
        skip_invalid=False,
    )
    import_catalogue_file(previewed.pk)
    assert CatalogueImport.objects.get(pk=previewed.pk).state == ImportState.PREVIEWED
    approval = Approval.objects.filter(item__job=job, edited=True).first()
    pilot = known_pilot(job.owner)
    arms = same_sample_arms(job.owner, products=2)
    # A job paused by its budget: the pause's words, the budget's figures and its form.
    paused = JobFactory(owner=job.owner, budget=Decimal("25.00"), budget_currency="GBP")
    ItemFactory(job=paused)
    pause(
        paused,
        PauseReason.BUDGET_REACHED,
        "The next unit (5,000 requests) could cost up to 12.34 GBP; 20.00 is spent or held of the 25.00 "
        "budget. Raise it by at least 7.34 GBP to go on",
    )
    return {
        reverse("dashboard"): viewers,
        reverse("job_list"): viewers,
        reverse("job_start"): viewers,
        reverse("job_detail", args=[job.pk]): viewers,
        reverse("job_detail", args=[paused.pk]): viewers,
        reverse("pilot_report", args=[pilot.pk]): viewers,
        reverse("pilot_report", args=[arms[1].pk]): viewers,
        reverse("pilot_compare", args=[arms[0].pk]): viewers,
        reverse("item_detail", args=[applied.pk]): viewers,
        reverse("item_detail", args=[rejected.pk]): viewers,
        reverse("review_queue"): viewers,
        reverse("review_queue") + "?mode=list": viewers,
        reverse("catalogue"): viewers,
        reverse("catalogue_product", args=[applied.product.sku]): viewers,
        reverse("edit_product", args=[applied.product.sku]): approvers,
        reverse("withdraw_product", args=[applied.product.sku]): approvers,
        reverse("catalogue_import"): viewers,
        reverse("import_detail", args=[upload.pk]): viewers,
        reverse("import_detail", args=[previewed.pk]): viewers,
        reverse("import_history"): viewers,
        reverse("prompts"): viewers,
        reverse("prompt_detail", args=[job.prompt_version_id]): viewers,
        reverse("prompt_new"): viewers,
        reverse("operations"): viewers,
        f"{reverse('operations')}?group={failed.key}": viewers,
        reverse("quality"): viewers,
        f"{reverse('quality')}?period=day&job={job.pk}": viewers,
        reverse("audit"): admins,
        reverse("audit_events", args=[approval.item_id]): admins,
        reverse("preferences"): viewers,
    }


@pytest.mark.parametrize("role", [CATALOGUE_OWNER, OPERATOR, ADMIN])
def test_no_screen_is_wider_than_a_phone(page, live_server, role):
    job = realistic_job()
    person = UserFactory(username=f"narrow-{role}", roles=[role])
    page.set_viewport_size(PHONE)
    allowed = {address: roles for address, roles in screens(job).items() if role in roles}
    assert len(allowed) >= (28 if role == ADMIN else 26)
    too_wide = {}

    def measure(address: str) -> None:
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            too_wide[address] = (width, page.evaluate(OVERFLOWING))

    page.goto(live_server.url + reverse("login"))
    measure(reverse("login"))
    first, *_ = allowed
    log_in(page, live_server, person, then=first)
    assert page.goto(live_server.url + "/no-such-screen/").status == 404
    measure("/no-such-screen/")
    for address in allowed:
        response = page.goto(live_server.url + address)
        assert response.status == 200, address
        measure(address)
    assert not too_wide, "\n".join(
        f"{address}: {width} px wide, past the edge: {' | '.join(culprits)}"
        for address, (width, culprits) in too_wide.items()
    )


def test_the_navigation_wraps_and_a_wide_table_scrolls_inside_its_box(page, live_server):
    job = realistic_job()
    page.set_viewport_size(PHONE)
    log_in(page, live_server, job.owner, then=reverse("job_detail", args=[job.pk]))
    links = page.get_by_role("navigation", name="Main").get_by_role("link")
    assert links.count() == 8
    rows = {round(box["y"]) for box in (links.nth(i).bounding_box() for i in range(links.count()))}
    assert len(rows) > 1, "the navigation stays on one line wider than the screen"
    for i in range(links.count()):
        assert links.nth(i).bounding_box()["x"] + links.nth(i).bounding_box()["width"] <= PHONE["width"]
    # The submissions table is wider than a phone: its panel scrolls, the page does not.
    table = page.get_by_test_id("submissions")
    box = table.locator("xpath=ancestor::section[1]")
    assert table.evaluate("t => t.scrollWidth") > box.evaluate("b => b.clientWidth")
    assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto"
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_a_skip_link_leads_past_the_navigation(page, live_server):
    job = realistic_job()
    log_in(page, live_server, job.owner, then=reverse("job_list"))
    page.keyboard.press("Tab")
    skip = page.locator(":focus")
    assert skip.inner_text() == "Skip to content"
    assert skip.is_visible()  # shown when focused, though out of sight otherwise
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.closest('header')") is None, "focus went back to the top bar"


def test_single_key_shortcuts_can_be_turned_off_and_on_again(page, live_server):
    from playwright.sync_api import expect

    job = realistic_job()
    desk = live_server.url + reverse("review_queue")
    log_in(page, live_server, job.owner, then=reverse("review_queue"))
    expect(page.get_by_test_id("position")).to_have_text("1 of 12")
    page.keyboard.press("j")
    expect(page.get_by_test_id("position")).to_have_text("2 of 12")

    page.get_by_test_id("desk-keys").get_by_role("link", name="Turn single-key shortcuts off").click()
    page.get_by_label("Single-key shortcuts on the review desk").uncheck()
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_test_id("messages")).to_contain_text("single-key shortcuts are off")
    assert Preferences.objects.get(user=job.owner).keyboard_shortcuts is False

    page.goto(desk)
    expect(page.get_by_test_id("desk-keys")).to_contain_text("Single-key shortcuts are off")
    expect(page.get_by_test_id("position")).to_have_text("1 of 12")
    for key in "jae":
        page.keyboard.press(key)
    expect(page.get_by_test_id("position")).to_have_text("1 of 12")
    assert Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == 12
    assert not page.locator("[data-edit]").first.evaluate("d => d.open")

    page.get_by_test_id("desk-keys").get_by_role("link", name="Turn them on").click()
    page.get_by_label("Single-key shortcuts on the review desk").check()
    page.get_by_role("button", name="Save").click()
    page.goto(desk)
    page.keyboard.press("j")
    expect(page.get_by_test_id("position")).to_have_text("2 of 12")


def test_a_job_with_the_longest_reference_widens_no_screen(page, live_server):
    """A reference is up to 200 characters and may have no space: in the job page's heading, the
    review desk's job filter and its notes, it breaks or shrinks instead of widening the page."""
    job = realistic_job()
    Job.objects.filter(pk=job.pk).update(reference="R" * 200)
    page.set_viewport_size(PHONE)
    desk = reverse("review_queue")
    addresses = [
        reverse("job_detail", args=[job.pk]),
        desk,
        f"{desk}?job={job.pk}",
        f"{desk}?mode=list",
        f"{desk}?mode=list&job={job.pk}&confirm=all",
    ]
    log_in(page, live_server, job.owner, then=addresses[0])
    too_wide = {}
    for address in addresses:
        assert page.goto(live_server.url + address).status == 200, address
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            too_wide[address] = (width, page.evaluate(OVERFLOWING))
    assert not too_wide, too_wide
