"""Prompt versions: checked, then added as the next version of their task; never edited. A new
version is not current: someone makes it so, and that choice is recorded (`make_prompt_current`)."""

import re
import string

import jsonschema
from django.db import IntegrityError, transaction
from django.db.models import Max

from ..drafts.json_values import json_value_problem, text_problem
from ..drafts.schema_refs import reference_problems
from ..models import CurrentPromptChoice, PromptVersion
from ..states import default_rejection_reasons
from .core import NotAllowed, actor_name

PROMPT_TASK_PATTERN = r"[a-z][a-z0-9_]{0,63}"


# What `validation.render_user_message` fills a template with.
PROMPT_TEMPLATE_FIELDS = ("title", "facts")


PROMPT_RULE_KEYS = ("min_length", "max_length", "text_field", "claim_words")


MAX_PROMPT_OUTPUT_TOKENS = 100_000


MAX_PROMPT_JSON_DEPTH = 32


def prompt_template_problems(template: str) -> list[str]:
    """A template is filled by `str.format(title=…, facts=…)`: it must use both, written plainly as
    {title} and {facts}, and nothing else. A format spec, conversion, index or attribute is refused:
    `{title:>999999999}` would pad every request to a gigabyte, `{title.upper}` reaches into Python
    objects, and none of them says anything a plain placeholder cannot."""
    if problem := text_problem(template):
        return [f"The template {problem}"]
    try:
        placeholders = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        return [f"The template does not format ({exc}); write {{{{ and }}}} for a literal brace"]
    # As written, and by the name they start with: `{title.upper}` and `{facts[0]}` are about title and facts.
    written = [
        "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        for name, spec, conversion in placeholders
    ]
    bases = [re.match(r"[^.\[]*", name).group() for name, _, _ in placeholders]
    problems = [
        f"The template must contain {{{field}}}" for field in PROMPT_TEMPLATE_FIELDS if field not in bases
    ]
    decorated = sorted(
        {text for text, base in zip(written, bases, strict=True) if base in PROMPT_TEMPLATE_FIELDS}
        - {f"{{{field}}}" for field in PROMPT_TEMPLATE_FIELDS}
    )
    if decorated:
        problems.append(
            f"The template writes {', '.join(decorated)}: write {{title}} and {{facts}} plainly, without a "
            "format (:…), conversion (!r), index ([0]) or attribute (.name)"
        )
    unknown = sorted(
        {text for text, base in zip(written, bases, strict=True) if base not in PROMPT_TEMPLATE_FIELDS}
    )
    if unknown:
        problems.append(
            f"The template uses {', '.join(unknown)}, which nothing fills in; only {{title}} and {{facts}} are "
            "filled in (write {{ and }} for a literal brace)"
        )
    return problems


def output_schema_problems(schema: object) -> list[str]:
    """The output schema must be a JSON Schema for an object: providers return structured output as one."""
    if not isinstance(schema, dict):
        return ["The output schema must be a JSON object"]
    # Stored and sent as JSON: no NUL, no NaN, and nesting that a schema walker survives.
    if problem := json_value_problem(schema, "The output schema", max_depth=MAX_PROMPT_JSON_DEPTH):
        return [problem]
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"The output schema is not a valid JSON Schema: {exc.message}"]
    if schema.get("type") != "object":
        return ['The output schema must describe a JSON object ("type": "object")']
    return reference_problems(schema)


def prompt_rules_problems(rules: object, schema: object) -> list[str]:
    """The validation rules `validation.check_draft` reads, and nothing it would silently ignore."""
    if not isinstance(rules, dict):
        return ["The rules must be a JSON object"]
    if problem := json_value_problem(rules, "The rules", max_depth=MAX_PROMPT_JSON_DEPTH):
        return [problem]
    problems = []
    unknown = sorted(set(rules) - set(PROMPT_RULE_KEYS))
    if unknown:
        problems.append(f"Unknown rules: {', '.join(unknown)}; known: {', '.join(PROMPT_RULE_KEYS)}")
    for key in ("min_length", "max_length"):
        value = rules.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            problems.append(f"{key} must be a whole number, 0 or more")
    low, high = rules.get("min_length"), rules.get("max_length")
    if isinstance(low, int) and isinstance(high, int) and high and low > high:
        problems.append("min_length is greater than max_length")
    text_field = rules.get("text_field")
    if text_field is not None:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(text_field, str) or not text_field:
            problems.append("text_field must be the name of a property of the output schema")
        elif isinstance(properties, dict) and text_field not in properties:
            problems.append(f'text_field "{text_field}" is not a property of the output schema')
    words = rules.get("claim_words")
    if words is not None and (
        not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words)
    ):
        problems.append("claim_words must be a list of words or phrases")
    return problems


# A rejection reason's code: what exports and /quality/ count by.
REASON_CODE_PATTERN = r"[a-z][a-z0-9_]{0,31}"
MAX_REJECTION_REASONS = 20


def rejection_reasons_problems(reasons: object) -> list[str]:
    """The reviewers' list of reasons (SPEC §8): 1 to 20 of `{code, label}`, each code once."""
    if not isinstance(reasons, list) or not 1 <= len(reasons) <= MAX_REJECTION_REASONS:
        return [f"The rejection reasons must be a list of 1 to {MAX_REJECTION_REASONS} reasons"]
    problems, seen = [], set()
    for reason in reasons:
        if not isinstance(reason, dict) or set(reason) != {"code", "label"}:
            problems.append("Each rejection reason is a code and its label")
            continue
        code, label = reason["code"], reason["label"]
        if not isinstance(code, str) or not re.fullmatch(REASON_CODE_PATTERN, code):
            problems.append(f"The reason code {code!r} must be lower-case letters, digits and _, at most 32")
        elif code in seen:
            problems.append(f"The reason code {code!r} is listed twice")
        seen.add(code)
        if not isinstance(label, str) or not label.strip() or len(label) > 200:
            problems.append(f"The label of {code!r} must be text of 1 to 200 characters")
        elif problem := text_problem(label):
            problems.append(f"The label of {code!r} {problem}")
    return problems


def create_prompt_version(
    *,
    task: str,
    system_message: str,
    template: str,
    output_schema: dict,
    rules: dict,
    max_output_tokens: int,
    rejection_reasons: list[dict] | None = None,
) -> PromptVersion:
    """Add the next version of a task's prompt. Versions are never edited: a change is a new one.
    The new version is not current (not even a task's first): jobs go on using the current one until
    someone makes this one current."""
    problems = []
    if not re.fullmatch(PROMPT_TASK_PATTERN, task):
        problems.append("The task name must be lower-case letters, digits and _, starting with a letter")
    if not system_message.strip():
        problems.append("The system message is empty")
    elif problem := text_problem(system_message):
        problems.append(f"The system message {problem}")
    if (
        isinstance(max_output_tokens, bool)
        or not isinstance(max_output_tokens, int)
        or not 1 <= max_output_tokens <= MAX_PROMPT_OUTPUT_TOKENS
    ):
        problems.append(f"max_output_tokens must be a whole number from 1 to {MAX_PROMPT_OUTPUT_TOKENS}")
    problems += prompt_template_problems(template)
    problems += output_schema_problems(output_schema)
    problems += prompt_rules_problems(rules, output_schema)
    if rejection_reasons is None:
        rejection_reasons = default_rejection_reasons()
    problems += rejection_reasons_problems(rejection_reasons)
    if problems:
        raise NotAllowed("; ".join(problems))
    for _ in range(3):
        try:
            with transaction.atomic():
                latest = PromptVersion.objects.filter(task=task).aggregate(n=Max("version"))["n"] or 0
                return PromptVersion.objects.create(
                    task=task,
                    version=latest + 1,
                    system_message=system_message,
                    template=template,
                    output_schema=output_schema,
                    rules=rules,
                    max_output_tokens=max_output_tokens,
                    rejection_reasons=rejection_reasons,
                )
        except IntegrityError:
            continue  # another version of this task took the number at the same moment; take the next
    raise NotAllowed(f"Versions of {task!r} are being created too fast; try again")


# `make_prompt_current` without `replacing`: whichever version is current now is replaced (the API).
ANY_CURRENT = object()


def make_prompt_current(
    *, prompt: PromptVersion, actor, replacing=ANY_CURRENT
) -> tuple[CurrentPromptChoice, bool]:
    """Make `prompt` the version of its task that jobs naming no version use, recorded with who and
    when: (the choice, True). Already current: nothing is written, (the choice that made it so,
    False). With `replacing` (the id of the version current when the person decided, or None for
    none), refused if another became current meanwhile: a form sent again after someone else's
    choice does not undo it."""
    with transaction.atomic():
        # The task's versions locked: two choices for one task are made one after the other.
        list(PromptVersion.objects.select_for_update().filter(task=prompt.task).values_list("pk"))
        newest = CurrentPromptChoice.objects.filter(task=prompt.task).order_by("-pk").first()
        current_id = newest.prompt_version_id if newest else None
        if current_id == prompt.pk:
            return newest, False
        if replacing is not ANY_CURRENT and replacing != current_id:
            raise NotAllowed(
                f"{newest.prompt_version} was made current by {newest.actor_name} since this page was "
                f"shown: look again before choosing"
                if newest
                else "The current version changed since this page was shown: look again before choosing"
            )
        choice = CurrentPromptChoice.objects.create(
            task=prompt.task,
            prompt_version=prompt,
            replaced_id=current_id,
            actor=actor,
            actor_name=actor_name(actor),
        )
    return choice, True
