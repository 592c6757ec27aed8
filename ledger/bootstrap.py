"""What every `migrate` puts in place, so that `migrate` then `qcluster` is all a deployment does
(SPEC rule 14): the roles, the default prompt and the collector's schedule. Connected to
`post_migrate` by `ledger.apps`; safe to run any number of times, and it never changes what
people have made of them since."""

from django.contrib.auth.models import Group
from django.utils import timezone
from django_q.models import Schedule

from .models import CurrentPromptChoice, PromptVersion
from .roles import ROLES

CLAIM_WORDS = [
    "waterproof",
    "water-resistant",
    "organic",
    "eco-friendly",
    "sustainable",
    "hypoallergenic",
    "certified",
    "guaranteed",
    "award-winning",
    "best-selling",
    "clinically proven",
    "bpa-free",
    "vegan",
    "handmade",
    "lifetime warranty",
    "non-toxic",
    "dishwasher safe",
    "fireproof",
]

DEFAULT_PROMPT = {
    "task": "product_description",
    "version": 1,
    "system_message": (
        "You write product descriptions for a retail catalogue. Use only the facts given. "
        "Never claim a property, certification or guarantee the facts do not state."
    ),
    "template": (
        "Write a headline and a description of two to four sentences for this product.\n"
        "Title: {title}\n"
        "Facts:\n"
        "{facts}"
    ),
    "output_schema": {
        "type": "object",
        "properties": {
            "headline": {"type": "string", "minLength": 3, "maxLength": 120},
            "description": {"type": "string", "minLength": 40, "maxLength": 1200},
        },
        "required": ["headline", "description"],
        "additionalProperties": False,
    },
    "rules": {
        "text_field": "description",
        "min_length": 40,
        "max_length": 1200,
        "claim_words": CLAIM_WORDS,
    },
    "max_output_tokens": 600,
}


def ensure_roles_and_prompt(*, using: str = "default", **signal_kwargs) -> None:
    """The default task gets its prompt, made current (by "system"), only when it has no current
    version: a job started without naming one works out of the box, and a version people made
    current since is left current."""

    for name in ROLES:
        Group.objects.using(using).get_or_create(name=name)
    versions = PromptVersion.objects.using(using).filter(task=DEFAULT_PROMPT["task"])
    if versions.current().exists():
        return
    default = versions.filter(version=DEFAULT_PROMPT["version"]).first() or versions.create(**DEFAULT_PROMPT)
    CurrentPromptChoice.objects.using(using).create(task=default.task, prompt_version=default)


def install_schedules(*, using: str = "default", **signal_kwargs) -> None:
    """The collector's schedule and the daily retention pass's, once, whatever the number of migrates."""

    Schedule.objects.using(using).update_or_create(
        name="collector",
        defaults={
            "func": "ledger.tasks.collect_round",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
        },
        create_defaults={
            "func": "ledger.tasks.collect_round",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )
    # Unusable drafts' text erased once it is older than BATCHDESK_RETAIN_UNUSABLE_DAYS (SPEC §11).
    Schedule.objects.using(using).update_or_create(
        name="retention",
        defaults={"func": "ledger.tasks.apply_retention", "schedule_type": Schedule.DAILY, "repeats": -1},
        create_defaults={
            "func": "ledger.tasks.apply_retention",
            "schedule_type": Schedule.DAILY,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )


def after_migrate(*, using: str = "default", apps=None, **signal_kwargs) -> None:
    if apps is not None:
        try:
            for app_label, model in (
                ("auth", "Group"),
                ("ledger", "PromptVersion"),
                ("ledger", "CurrentPromptChoice"),
                ("django_q", "Schedule"),
            ):
                apps.get_model(app_label, model)
        except LookupError:
            return  # a partial migrate (say, `migrate ledger 0001`): the next full one does this
    ensure_roles_and_prompt(using=using)
    install_schedules(using=using)
