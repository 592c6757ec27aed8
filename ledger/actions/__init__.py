"""The verbs of the ledger, one module per topic. Each verb is a transaction that changes state
through the transition table, writes its events in the same transaction and enqueues follow-up
work on commit. A verb is imported from its topic module (`ledger.actions.submitting`, …); this
package hands on only the few names the screens and the API take from it."""

from .core import NotAllowed
from .jobs import create_job, currency_problem, resume_job, set_budget
from .operating import CANCELLABLE_ITEM_STATES, cancel_job, redrive_dead_letter, retry_item
from .prompts import (
    MAX_PROMPT_OUTPUT_TOKENS,
    PROMPT_TASK_PATTERN,
    output_schema_problems,
    prompt_rules_problems,
    prompt_template_problems,
    rejection_reasons_problems,
)
from .submitting import RESEND_RISK, operator_must_decide, reconcile_uncertain, resend_uncertain

__all__ = [
    "CANCELLABLE_ITEM_STATES",
    "MAX_PROMPT_OUTPUT_TOKENS",
    "PROMPT_TASK_PATTERN",
    "RESEND_RISK",
    "NotAllowed",
    "cancel_job",
    "create_job",
    "currency_problem",
    "operator_must_decide",
    "output_schema_problems",
    "prompt_rules_problems",
    "prompt_template_problems",
    "reconcile_uncertain",
    "rejection_reasons_problems",
    "redrive_dead_letter",
    "resend_uncertain",
    "resume_job",
    "retry_item",
    "set_budget",
]
