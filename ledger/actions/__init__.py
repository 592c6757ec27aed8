"""The verbs of the ledger, one module per topic. Each verb is a transaction that changes state
through the transition table, writes its events in the same transaction and enqueues follow-up
work on commit. Importing from `ledger.actions` reaches every one of them."""

from .applying import (  # noqa: F401
    MAX_APPLY_ATTEMPTS,
    MAY_HAVE_BEEN_APPLIED,
    apply_item,
    operation_key,
    record_attempt,
    stop_application,
)
from .collecting import (  # noqa: F401
    collect_again,
    collect_submission,
    observe_submission,
    poll_submission,
    retry_inference,
)
from .core import (  # noqa: F401
    NotAllowed,
    actor_name,
    backoff,
    change_state,
    enqueue,
    move_items,
)
from .drilling import collect_interrupted, deliver_again  # noqa: F401
from .job_states import refresh_job_state  # noqa: F401
from .jobs import (  # noqa: F401
    Arm,
    create_job,
    create_pilot_arms,
    currency_problem,
    judge_currency,
    queue_current_revision,
    resume_job,
    set_budget,
)
from .operating import (  # noqa: F401
    CANCELLABLE_ITEM_STATES,
    cancel_at_provider,
    cancel_job,
    cancellable_items,
    redrive_dead_letter,
    retry_item,
)
from .products import (  # noqa: F401
    ProductChange,
    record_product,
    retire_stale_items,
    stop_unapplied_items,
    stop_withdrawn_items,
    withdraw_product,
)
from .prompts import (  # noqa: F401
    MAX_PROMPT_JSON_DEPTH,
    MAX_PROMPT_OUTPUT_TOKENS,
    PROMPT_RULE_KEYS,
    PROMPT_TASK_PATTERN,
    PROMPT_TEMPLATE_FIELDS,
    create_prompt_version,
    output_schema_problems,
    prompt_rules_problems,
    prompt_template_problems,
)
from .recording import MAX_INFERENCE_ATTEMPTS  # noqa: F401
from .reviewing import (  # noqa: F401
    approve_version,
    reject_version,
)
from .submitting import (  # noqa: F401
    RESEND_RISK,
    LostClaim,
    adopt,
    build_requests,
    claim_planning,
    intents_waiting,
    note_anomaly,
    operator_must_decide,
    plan_submissions,
    reconcile_uncertain,
    resend_uncertain,
    send_submission,
    set_submission_state,
)
