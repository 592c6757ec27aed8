"""Comments on a draft for colleagues (SPEC §8): written on the desk's card or the item's page, shown
on both and in the audit of the item's events."""

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from ledger.actions import NotAllowed
from ledger.actions.reviewing import add_comment
from ledger.models import Item

from .common import HtmxHttpRequest, form_errors, refused_page, wants_partial
from .forms import CommentForm
from .permissions import VIEWERS, role_required
from .queue import next_url


@require_POST
@login_required
@role_required(*VIEWERS)
def comment(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Add a comment; the same form sent twice adds it once. With htmx, the card's comments answer;
    otherwise the page it came from."""
    item = get_object_or_404(Item.objects.select_related("product"), pk=item_id)
    back = next_url(request, reverse("item_detail", args=[item.pk]))
    form = CommentForm(request.POST)
    if not form.is_valid():
        return refused_page(request, form_errors(form), back)
    data = form.cleaned_data
    error = ""
    try:
        add_comment(
            item_id=item.pk,
            author=request.user,
            text=data["text"],
            version_id=data["version_id"],
            form_token=data["form_token"],
        )
    except NotAllowed as exc:
        error = str(exc)
    if wants_partial(request):
        context = {
            "item": item,
            "comments": item.comments.select_related("author"),
            "comment_error": error,
            "comment_version": data["version_id"],
            "comment_token": uuid.uuid4(),
            "return_to": back,
        }
        return render(request, "_comments.html", context, status=409 if error else 200)
    if error:
        messages.error(request, f"{item.product.sku}: the comment was not added. {error}")
    else:
        messages.success(request, f"{item.product.sku}: comment added.")
    return redirect(back)
