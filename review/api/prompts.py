"""A task's current prompt version (SPEC §6): read it, or make another version current."""

import re

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.actions.prompts import PROMPT_TASK_PATTERN, make_prompt_current
from ledger.models import PromptVersion

from ..permissions import APPROVERS, VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import invalid, not_found
from .inputs import PromptChoiceBody
from .shapes import current_prompt_json


@door(BEARER_TOKEN, GET=VIEWERS, POST=APPROVERS)
def prompt_current(request: HttpRequest, task: str) -> HttpResponse:
    """GET: the task's current prompt version. POST `{version}`: make that version current (SPEC §6),
    recorded with who and when; `changed` is false when it was current already."""
    if not re.fullmatch(PROMPT_TASK_PATTERN, task) or not PromptVersion.objects.filter(task=task).exists():
        return not_found(request, "No prompt task")
    if request.method == "GET":
        return JsonResponse(current_prompt_json(task))
    version = PromptChoiceBody.read(request).checked()["version"]
    prompt = PromptVersion.objects.filter(task=task, version=version).first()
    if prompt is None:
        raise invalid({"version": f"the task {task} has no version {version}"})
    _, changed = make_prompt_current(prompt=prompt, actor=request.user)
    return JsonResponse({**current_prompt_json(task), "changed": changed})
