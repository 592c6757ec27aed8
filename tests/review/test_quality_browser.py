"""The quality page in the system Chromium: its charts drawn by static/quality.js under the
Content-Security-Policy, and nothing wider than a phone's 390 px."""

import pytest
from django.urls import reverse

from ledger.actions.reviewing import approve_version, reject_version
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version
from tests.review.browser import log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

PHONE = {"width": 390, "height": 844}

# Whether each chart's canvas has been drawn on: Chart.js knows it, and some of its pixels are not
# transparent.
CANVASES_DRAWN = """() => [...document.querySelectorAll('canvas[data-chart]')].map((canvas) => {
  const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) painted++;
  return [canvas.dataset.chart, Boolean(window.Chart.getChart(canvas)), canvas.width, painted];
})"""


@pytest.fixture
def decisions():
    """Drafts of two categories decided through the verbs: two approvals (one edited), a rejection."""
    reviewer = UserFactory(username="rosa", roles=["catalogue_owner"])
    job = JobFactory(reference="autumn-" + "long-reference-" * 8)
    items = [
        ItemFactory(
            job=job,
            product=ProductFactory(revision__fields={"category": category, "material": "oak"}),
            awaiting_review=True,
        )
        for category in ("kitchen", "kitchen", "garden and outdoor furniture")
    ]
    drafts = [add_version(item) for item in items]
    approve_version(
        item_id=items[0].pk, version_id=drafts[0].pk, version_hash=drafts[0].content_hash, approver=reviewer
    )
    approve_version(
        item_id=items[1].pk,
        version_id=drafts[1].pk,
        version_hash=drafts[1].content_hash,
        approver=reviewer,
        content=drafts[1].content.replace("daily use", "everyday kitchen use"),
    )
    reject_version(item_id=items[2].pk, version_id=drafts[2].pk, reviewer=reviewer, reason="Too vague")
    return job


def test_the_charts_are_drawn_and_the_page_fits_a_phone(page, live_server, operator, decisions):
    blocked: list[str] = []
    page.on(
        "console",
        lambda message: blocked.append(message.text) if "Content Security Policy" in message.text else None,
    )
    page.set_viewport_size(PHONE)
    log_in(page, live_server, operator, then=reverse("quality"))
    page.wait_for_function("document.querySelectorAll('canvas[data-chart]').length === 6")
    page.wait_for_function(
        "[...document.querySelectorAll('canvas[data-chart]')].every((c) => window.Chart && Chart.getChart(c))"
    )
    drawn = page.evaluate(CANVASES_DRAWN)
    assert [name for name, *_ in drawn] == [
        "over-time-rates",
        "over-time-decisions",
        "by-prompt_version",
        "by-provider",
        "by-model",
        "by-category",
    ]
    for name, known, width, painted in drawn:
        assert known and width > 0 and painted > 100, f"{name} is not drawn"
        # As wide as its panel allows at 390 px, never wider.
        assert width <= PHONE["width"] * page.evaluate("devicePixelRatio")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.get_by_test_id("acceptance").inner_text() == "66.7%"
    assert blocked == []

    # Narrowed to the job, by day: the same figures, still within the phone's width.
    page.goto(live_server.url + reverse("quality") + f"?job={decisions.pk}&period=day")
    page.wait_for_function("Chart.getChart(document.querySelector('canvas[data-chart]'))")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert blocked == []


def test_the_cost_chart_fits_a_phone(page, live_server, operator, decisions, pounds):
    page.set_viewport_size(PHONE)
    log_in(page, live_server, operator, then=reverse("quality"))
    assert page.get_by_test_id("cost-chart").count() == 0  # asked for, not read at each visit
    page.get_by_role("link", name="Cost by category").click()
    chart = page.get_by_test_id("cost-chart")
    bars = chart.locator(".cost-bar")
    assert bars.count() == 2  # kitchen, garden and outdoor furniture
    widths = [bar.bounding_box()["width"] for bar in bars.all()]
    assert widths[0] > widths[1] > 0  # two kitchen drafts against one
    assert "£" in chart.inner_text()
    assert page.get_by_test_id("table-cost").is_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
