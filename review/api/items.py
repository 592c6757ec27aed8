"""Items (SPEC §6): an item with its versions, approvals, destination attempts and events; approving
or rejecting one of its versions; retrying it."""

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.actions.operating import retry_item
from ledger.actions.reviewing import (
    EditRefused,
    ReasonCodeUnknown,
    add_comment,
    approve_version,
    reject_version,
    undo_decision,
)
from ledger.models import GeneratedVersion, Item

from ..permissions import APPROVERS, OPERATORS, VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import ApiError
from .inputs import ApproveBody, CommentBody, RejectBody, RetryBody, read_json
from .shapes import comment_json, item_detail_json, item_json, items


def item_or_404(item_id: int) -> Item:
    found = items().select_related("job", "product__current_revision").filter(pk=item_id).first()
    if found is None:
        raise ApiError(404, "not_found", f"No item {item_id}")
    return found


def version_or_404(item_id: int, version_id: int) -> GeneratedVersion:
    item_or_404(item_id)
    version = GeneratedVersion.objects.filter(pk=version_id, item_id=item_id).first()
    if version is None:
        raise ApiError(404, "not_found", f"Item {item_id} has no version {version_id}")
    return version


@door(BEARER_TOKEN, GET=VIEWERS)
def item_detail(request: HttpRequest, item_id: int) -> HttpResponse:
    return JsonResponse(item_detail_json(request, item_or_404(item_id)))


@door(BEARER_TOKEN, POST=APPROVERS)
def approve(request: HttpRequest, item_id: int, version_id: int) -> HttpResponse:
    body = ApproveBody.read(request).checked()
    content, note = body["content"], body["note"] or ""
    version = version_or_404(item_id, version_id)
    # There is no screen here that showed a hash: the caller approves the version as it is stored.
    try:
        approval = approve_version(
            item_id=item_id,
            version_id=version.pk,
            version_hash=version.content_hash,
            approver=request.user,
            content=content,
            note=note,
        )
    except EditRefused as refusal:  # the edited text is bad input: 400 with its reasons (rule 15)
        raise ApiError(400, "invalid", str(refusal), {"content": "; ".join(refusal.reasons)}) from None
    answer = item_json(request, item_or_404(item_id))
    answer["approval"] = {"id": approval.pk, "version": version.pk, "edited": approval.edited}
    return JsonResponse(answer)


@door(BEARER_TOKEN, POST=APPROVERS)
def reject(request: HttpRequest, item_id: int, version_id: int) -> HttpResponse:
    body = RejectBody.read(request).checked()
    version = version_or_404(item_id, version_id)
    try:
        reject_version(
            item_id=item_id,
            version_id=version.pk,
            reviewer=request.user,
            reason=body["reason"] or "",
            reason_code=body["reason_code"] or "",
        )
    except ReasonCodeUnknown as refusal:  # bad input, not a state the item is in
        raise ApiError(400, "invalid", str(refusal), {"reason_code": str(refusal)}) from None
    return JsonResponse(item_json(request, item_or_404(item_id)))


@door(BEARER_TOKEN, POST=APPROVERS)
def undo(request: HttpRequest, item_id: int) -> HttpResponse:
    """The caller's last decision on the item, undone within BATCHDESK_UNDO_SECONDS (409 after it, or
    once applying started)."""
    read_json(request, allowed=())
    item_or_404(item_id)
    undo_decision(item_id=item_id, actor=request.user)
    return JsonResponse(item_json(request, item_or_404(item_id)))


@door(BEARER_TOKEN, POST=VIEWERS)
def comment(request: HttpRequest, item_id: int) -> HttpResponse:
    body = CommentBody.read(request).checked()
    item_or_404(item_id)
    if body["version"] is not None:
        version_or_404(item_id, body["version"])
    written = add_comment(item_id=item_id, author=request.user, text=body["text"], version_id=body["version"])
    return JsonResponse(comment_json(written), status=201)


@door(BEARER_TOKEN, POST=OPERATORS)
def retry(request: HttpRequest, item_id: int) -> HttpResponse:
    unit = RetryBody.read(request).checked()["unit"]
    item_or_404(item_id)
    retry_item(item_id, unit=unit, actor=request.user)
    return JsonResponse(item_json(request, item_or_404(item_id)))
