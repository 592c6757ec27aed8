"""Recording, judging, approving and applying results, driven through the ledger's verbs."""

import json

import pytest

from ledger.actions.applying import apply_item, operation_key
from ledger.actions.core import NotAllowed, change_state
from ledger.actions.products import record_product
from ledger.actions.recording import MAX_INFERENCE_ATTEMPTS
from ledger.actions.reviewing import approve_version
from ledger.models import (
    Approval,
    DestinationAttempt,
    GeneratedVersion,
    Item,
    Product,
    ProductStatus,
    SourceRevision,
    Submission,
    SubmissionItem,
)
from ledger.providers.base import ResultLine
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.factories import ItemFactory, UserFactory, add_version
from tests.ledger import row_recorder

pytestmark = pytest.mark.django_db

GOOD_DRAFT = json.dumps(
    {
        "headline": "Oak chopping board",
        "description": "A chopping board made from oak. It measures 40 x 25 cm and is ready for daily use.",
    }
)


def submitted(item: Item) -> Submission:
    submission = Submission.objects.create(
        job=item.job,
        provider="emulator",
        model="m",
        intent_key=f"k{item.custom_id}",
        state=SubmissionState.ENDED,
    )
    SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
    Item.objects.filter(pk=item.pk).update(state=ItemState.SUBMITTED, submission=submission)
    return submission


def success(item: Item, content: str = GOOD_DRAFT) -> ResultLine:
    return ResultLine(
        custom_id=item.custom_id, succeeded=True, content=content, input_tokens=100, output_tokens=40
    )


def revise(product: Product, title: str) -> None:
    record_product(sku=product.sku, title=title, fields=product.current_revision.fields)


def test_a_valid_draft_waits_for_review_with_its_usage():
    item = ItemFactory()
    submission = submitted(item)

    assert row_recorder.record_result(submission, success(item)) == ItemState.AWAITING_REVIEW

    version = GeneratedVersion.objects.get(item=item)
    assert (version.number, version.valid, version.input_tokens, version.output_tokens) == (1, True, 100, 40)
    assert version.content.startswith("A chopping board made from oak")
    assert Item.objects.get(pk=item.pk).state == ItemState.AWAITING_REVIEW


def test_a_repeated_line_makes_no_second_version_even_in_a_later_collection():
    item = ItemFactory()
    submission = submitted(item)
    row_recorder.record_result(submission, success(item))

    again = row_recorder.record_result(submission, success(item, GOOD_DRAFT.replace("oak", "ash")))

    assert again == "already recorded"
    assert GeneratedVersion.objects.filter(item=item).count() == 1


def test_a_line_repeated_within_one_file_is_recorded_as_an_anomaly():
    item = ItemFactory()
    submission = submitted(item)
    seen: set[str] = set()
    row_recorder.record_result(submission, success(item), seen=seen)
    row_recorder.record_result(submission, success(item), seen=seen)

    submission.refresh_from_db()
    assert {"kind": "repeated_line", "custom_id": item.custom_id} in submission.anomalies
    assert GeneratedVersion.objects.filter(item=item).count() == 1


def test_an_unknown_custom_id_is_recorded_and_changes_no_item():
    item = ItemFactory()
    submission = submitted(item)

    result = row_recorder.record_result(
        submission, ResultLine(custom_id="bd-999999-1", succeeded=True, content="x")
    )

    assert result == "unknown"
    submission.refresh_from_db()
    assert submission.anomalies == [{"kind": "unknown_custom_id", "custom_id": "bd-999999-1"}]
    assert Item.objects.get(pk=item.pk).state == ItemState.SUBMITTED


def test_a_claim_the_source_does_not_make_fails_validation():
    item = ItemFactory()
    submission = submitted(item)
    draft = json.dumps(
        {"headline": "Board", "description": "A waterproof oak chopping board, 40 x 25 cm, for daily use."}
    )

    assert row_recorder.record_result(submission, success(item, draft)) == ItemState.VALIDATION_FAILED

    item.refresh_from_db()
    assert "waterproof" in item.reason
    assert GeneratedVersion.objects.get(item=item).valid is False


def test_output_that_breaks_the_schema_fails_validation():
    item = ItemFactory()
    submission = submitted(item)

    row_recorder.record_result(submission, success(item, json.dumps({"headline": "Only a headline"})))

    item.refresh_from_db()
    assert item.state == ItemState.VALIDATION_FAILED
    assert "schema" in item.reason


def test_a_transient_failure_retries_that_item_alone_with_a_new_custom_id():
    item = ItemFactory()
    submission = submitted(item)
    old_custom_id = item.custom_id

    outcome = row_recorder.record_result(
        submission,
        ResultLine(
            custom_id=old_custom_id,
            succeeded=False,
            error_code="batch_expired",
            reason=ReasonCode.BATCH_EXPIRED,
            transient=True,
        ),
    )

    assert outcome == "retrying"
    item.refresh_from_db()
    assert (item.state, item.inference_attempt, item.submission_id) == (ItemState.PREPARED, 2, None)
    assert item.custom_id != old_custom_id
    assert item.next_attempt_at is not None


def test_transient_failures_end_in_dead_letter_after_the_allowed_attempts():
    item = ItemFactory()
    for _ in range(MAX_INFERENCE_ATTEMPTS):
        item.refresh_from_db()
        submission = submitted(item)
        row_recorder.record_result(
            submission,
            ResultLine(
                custom_id=item.custom_id,
                succeeded=False,
                http_status=500,
                error_code="server_error",
                reason=ReasonCode.MODEL_SERVER_ERROR,
                transient=True,
            ),
        )
    item.refresh_from_db()
    assert item.state == ItemState.DEAD_LETTER
    assert "Gave up after 3 attempts" in item.reason


def test_a_permanent_failure_is_not_retried():
    item = ItemFactory()
    submission = submitted(item)

    row_recorder.record_result(
        submission,
        ResultLine(
            custom_id=item.custom_id,
            succeeded=False,
            http_status=400,
            error_code="context_length_exceeded",
            reason=ReasonCode.REQUEST_INVALID,
        ),
    )

    item.refresh_from_db()
    assert (item.state, item.inference_attempt) == (ItemState.INFERENCE_FAILED, 1)


def test_a_draft_for_a_withdrawn_product_is_kept_as_evidence_only():
    item = ItemFactory()
    submission = submitted(item)
    Product.objects.filter(pk=item.product_id).update(status=ProductStatus.WITHDRAWN)

    row_recorder.record_result(submission, success(item))

    assert Item.objects.get(pk=item.pk).state == ItemState.WITHDRAWN
    assert GeneratedVersion.objects.filter(item=item).exists()


def test_a_draft_for_an_old_revision_is_obsolete_and_the_current_revision_is_queued():
    item = ItemFactory()
    submission = submitted(item)
    revise(item.product, "Oak chopping board, large")

    row_recorder.record_result(submission, success(item))

    assert Item.objects.get(pk=item.pk).state == ItemState.OBSOLETE
    replacement = Item.objects.get(job=item.job, source_revision__number=2)
    assert replacement.state == ItemState.PREPARED


def approvable_item():
    item = ItemFactory(awaiting_review=True)
    version = add_version(item)
    return item, version


def test_approval_names_one_version_and_its_hash():
    item, version = approvable_item()
    owner = UserFactory(roles=["catalogue_owner"])

    approval = approve_version(
        item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
    )

    assert (approval.version, approval.version_hash, approval.edited) == (
        version,
        version.content_hash,
        False,
    )
    item.refresh_from_db()
    assert (item.state, item.approved_version) == (ItemState.APPROVED, version)


def test_an_edited_approval_keeps_both_texts():
    item, version = approvable_item()
    approval = approve_version(
        item_id=item.pk,
        version_id=version.pk,
        version_hash=version.content_hash,
        approver=UserFactory(),
        content="A shorter text written by the reviewer, still about the oak board.",
    )
    assert approval.edited is True
    assert approval.final_content.startswith("A shorter text")
    assert GeneratedVersion.objects.get(pk=version.pk).content == version.content


@pytest.mark.parametrize(
    "change",
    ["wrong hash", "invalid version", "newer version exists", "not awaiting review"],
)
def test_approval_is_refused_and_changes_nothing(change):
    item, version = approvable_item()
    version_hash = version.content_hash
    if change == "wrong hash":
        version_hash = "0" * 64
    elif change == "invalid version":
        GeneratedVersion.objects.filter(pk=version.pk).update(valid=False)
    elif change == "newer version exists":
        add_version(item, "A second draft about the oak chopping board, 40 x 25 cm, for the kitchen.")
    else:
        Item.objects.filter(pk=item.pk).update(state=ItemState.REJECTED)
    state_before = Item.objects.get(pk=item.pk).state

    with pytest.raises(NotAllowed):
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version_hash, approver=UserFactory()
        )

    assert Item.objects.get(pk=item.pk).state == state_before
    assert not Approval.objects.exists()


def test_a_revision_retires_drafts_awaiting_review_at_once():
    item, version = approvable_item()

    revise(item.product, "Oak chopping board, now with juice groove")

    assert Item.objects.get(pk=item.pk).state == ItemState.OBSOLETE
    assert Item.objects.get(job=item.job, source_revision__number=2).state == ItemState.PREPARED


def test_approving_a_draft_whose_product_changed_makes_it_obsolete():
    item, version = approvable_item()
    # A revision that lands between the page being shown and the click (bypassing the eager path).
    fields = {"material": "oak"}
    newer = SourceRevision.objects.create(
        product=item.product,
        number=2,
        title="Oak chopping board, now with juice groove",
        fields=fields,
        content_hash=SourceRevision.hash_content("Oak chopping board, now with juice groove", fields),
    )
    Product.objects.filter(pk=item.product_id).update(current_revision=newer)

    with pytest.raises(NotAllowed, match="changed"):
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=UserFactory()
        )

    assert Item.objects.get(pk=item.pk).state == ItemState.OBSOLETE
    assert not Approval.objects.exists()
    assert Item.objects.filter(job=item.job, state=ItemState.PREPARED).count() == 1


def approve(item, version):
    approve_version(
        item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=UserFactory()
    )


def test_applying_publishes_the_approved_text_once():
    item, version = approvable_item()
    approve(item, version)

    assert apply_item(item.pk) == ItemState.APPLIED
    assert apply_item(item.pk) == "item is applied"

    product = Product.objects.get(pk=item.product_id)
    assert (product.published_content, product.published_version, product.published_revision) == (
        version.content,
        version,
        1,
    )
    attempts = DestinationAttempt.objects.filter(item=item)
    assert [a.outcome for a in attempts] == ["applied"]


def test_a_product_withdrawn_after_approval_is_never_published():
    item, version = approvable_item()
    approve(item, version)
    Product.objects.filter(pk=item.product_id).update(status=ProductStatus.WITHDRAWN)

    assert apply_item(item.pk) == ItemState.WITHDRAWN

    assert Product.objects.get(pk=item.product_id).published_content == ""
    assert not DestinationAttempt.objects.filter(item=item).exists()


def test_a_worker_that_died_after_publishing_is_confirmed_not_repeated():
    from ledger.destinations.catalogue import CatalogueDestination

    item, version = approvable_item()
    approve(item, version)
    change_state(item.pk, to=ItemState.APPLYING)
    # The first worker published, then died before recording its attempt.
    CatalogueDestination().apply(
        item=item,
        version=version,
        approval=Approval.objects.get(version=version),
        operation_key=operation_key(version, "catalogue"),
    )
    # Meanwhile another job's draft for the same product was published on top.
    later = ItemFactory(product=item.product, awaiting_review=True)
    later_version = add_version(
        later, "A later text about the oak board, approved in another job, 40 x 25 cm."
    )
    approve(later, later_version)
    apply_item(later.pk)

    assert apply_item(item.pk) == ItemState.APPLIED
    assert DestinationAttempt.objects.get(item=item).response == "Already published by an earlier attempt"
    assert Product.objects.get(pk=item.product_id).published_content == later_version.content
