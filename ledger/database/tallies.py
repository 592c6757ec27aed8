"""Item and draft tallies on SQLite, the demo's database (PostgreSQL has its own statement-level
triggers, installed by migrations 0013 and 0049): the same contributions, row by row.

SQLite alters a table by building a new one and renaming it, which a trigger that names the table
stops, and which drops the table's own triggers. So the triggers are not installed by a migration
but around every `migrate`: dropped before it (`before_migrate`), then, after it, the tallies are
counted again from the rows and the triggers installed (`after_migrate`). A demo database is small."""

from datetime import timedelta

from django.db import connections

from ..states import DISCARDED_STATES, UNDECIDED_STATES, sql_list

# A draft of an item in these states waits for a decision, and an approved draft of an item in these
# may never be published: the lists ledger/money/cost_groups.py splits a job's cost by, too.
UNDECIDED = sql_list(UNDECIDED_STATES)
DISCARDED = sql_list(DISCARDED_STATES)
COLUMNS = (
    "job_id, state, items, pending_input, pending_output, approved_drafts, approved_input, "
    "approved_output, all_input, all_output, apportioned_drafts"
)
TRIGGERS = (
    "ledger_item_tally_insert",
    "ledger_item_tally_update",
    "ledger_item_tally_delete",
    "ledger_version_tally_insert",
    "ledger_version_tally_update",
    "ledger_version_tally_delete",
    "ledger_draft_tally_insert",
    "ledger_draft_tally_update",
    "ledger_draft_tally_delete",
)


def item_row(row: str, sign: int) -> str:
    return f"""
    INSERT INTO ledger_itemtally ({COLUMNS}) VALUES (
        {row}.job_id, {row}.state, {sign},
        CASE WHEN {row}.state IN {UNDECIDED} THEN {sign} * COALESCE((SELECT v.input_tokens FROM
            ledger_generatedversion v WHERE v.item_id = {row}.id ORDER BY v.number DESC LIMIT 1), 0) ELSE 0 END,
        CASE WHEN {row}.state IN {UNDECIDED} THEN {sign} * COALESCE((SELECT v.output_tokens FROM
            ledger_generatedversion v WHERE v.item_id = {row}.id ORDER BY v.number DESC LIMIT 1), 0) ELSE 0 END,
        CASE WHEN {row}.approved_version_id IS NOT NULL AND {row}.state NOT IN {DISCARDED} THEN {sign} ELSE 0 END,
        CASE WHEN {row}.state NOT IN {DISCARDED} THEN {sign} * COALESCE((SELECT v.input_tokens FROM
            ledger_generatedversion v WHERE v.id = {row}.approved_version_id), 0) ELSE 0 END,
        CASE WHEN {row}.state NOT IN {DISCARDED} THEN {sign} * COALESCE((SELECT v.output_tokens FROM
            ledger_generatedversion v WHERE v.id = {row}.approved_version_id), 0) ELSE 0 END,
        0, 0, 0);"""


def version_row(row: str, sign: int) -> str:
    pending = (
        f"i.state IN {UNDECIDED} AND NOT EXISTS (SELECT 1 FROM ledger_generatedversion later "
        f"WHERE later.item_id = {row}.item_id AND later.number > {row}.number)"
    )
    approved = f"i.approved_version_id = {row}.id AND i.state NOT IN {DISCARDED}"
    return f"""
    INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, 0,
        CASE WHEN {pending} THEN {sign} * {row}.input_tokens ELSE 0 END,
        CASE WHEN {pending} THEN {sign} * {row}.output_tokens ELSE 0 END,
        0,
        CASE WHEN {approved} THEN {sign} * {row}.input_tokens ELSE 0 END,
        CASE WHEN {approved} THEN {sign} * {row}.output_tokens ELSE 0 END,
        {sign} * {row}.input_tokens, {sign} * {row}.output_tokens,
        CASE WHEN json_extract({row}.usage, '$.apportioned') = 1 THEN {sign} ELSE 0 END
    FROM ledger_item i WHERE i.id = {row}.item_id;"""


# Draft tallies add up the drafts received in each quarter hour: a day starts on one in every time zone.
DRAFT_TALLY_PERIOD = timedelta(minutes=15)


def quarter(at: str) -> str:
    """The start of the quarter hour of the time `at`, as Django writes times on SQLite (UTC)."""
    seconds = int(DRAFT_TALLY_PERIOD.total_seconds())
    return f"datetime(CAST(strftime('%s', {at}) AS INTEGER) / {seconds} * {seconds}, 'unixepoch')"


def draft_row(row: str, sign: int) -> str:
    return f"""
    INSERT INTO ledger_drafttally (job_id, received, drafts, input_tokens, output_tokens)
    SELECT i.job_id, {quarter(f"{row}.created_at")}, {sign}, {sign} * {row}.input_tokens,
        {sign} * {row}.output_tokens
    FROM ledger_item i WHERE i.id = {row}.item_id;"""


TRIGGERS_SQL = [
    f"CREATE TRIGGER ledger_item_tally_insert AFTER INSERT ON ledger_item BEGIN {item_row('NEW', 1)} END;",
    f"""CREATE TRIGGER ledger_item_tally_update AFTER UPDATE ON ledger_item
    WHEN OLD.job_id IS NOT NEW.job_id OR OLD.state IS NOT NEW.state
        OR OLD.approved_version_id IS NOT NEW.approved_version_id
    BEGIN {item_row("OLD", -1)} {item_row("NEW", 1)} END;""",
    f"CREATE TRIGGER ledger_item_tally_delete AFTER DELETE ON ledger_item BEGIN {item_row('OLD', -1)} END;",
    f"""CREATE TRIGGER ledger_version_tally_insert AFTER INSERT ON ledger_generatedversion BEGIN
    INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, 0,
        CASE WHEN i.state IN {UNDECIDED} THEN NEW.input_tokens - COALESCE((SELECT p.input_tokens FROM
            ledger_generatedversion p WHERE p.item_id = NEW.item_id AND p.number < NEW.number
            ORDER BY p.number DESC LIMIT 1), 0) ELSE 0 END,
        CASE WHEN i.state IN {UNDECIDED} THEN NEW.output_tokens - COALESCE((SELECT p.output_tokens FROM
            ledger_generatedversion p WHERE p.item_id = NEW.item_id AND p.number < NEW.number
            ORDER BY p.number DESC LIMIT 1), 0) ELSE 0 END,
        0, 0, 0, NEW.input_tokens, NEW.output_tokens,
        CASE WHEN json_extract(NEW.usage, '$.apportioned') = 1 THEN 1 ELSE 0 END
    FROM ledger_item i WHERE i.id = NEW.item_id;
    END;""",
    f"""CREATE TRIGGER ledger_version_tally_update AFTER UPDATE ON ledger_generatedversion
    WHEN OLD.input_tokens IS NOT NEW.input_tokens OR OLD.output_tokens IS NOT NEW.output_tokens
        OR OLD.usage IS NOT NEW.usage OR OLD.item_id IS NOT NEW.item_id OR OLD.number IS NOT NEW.number
    BEGIN
    {version_row("OLD", -1)} {version_row("NEW", 1)} END;""",
    f"""CREATE TRIGGER ledger_version_tally_delete AFTER DELETE ON ledger_generatedversion BEGIN
    {version_row("OLD", -1)} END;""",
    f"""CREATE TRIGGER ledger_draft_tally_insert AFTER INSERT ON ledger_generatedversion BEGIN
    {draft_row("NEW", 1)} END;""",
    f"""CREATE TRIGGER ledger_draft_tally_update AFTER UPDATE ON ledger_generatedversion
    WHEN OLD.item_id IS NOT NEW.item_id OR OLD.created_at IS NOT NEW.created_at
        OR OLD.input_tokens IS NOT NEW.input_tokens OR OLD.output_tokens IS NOT NEW.output_tokens
    BEGIN {draft_row("OLD", -1)} {draft_row("NEW", 1)} END;""",
    f"""CREATE TRIGGER ledger_draft_tally_delete AFTER DELETE ON ledger_generatedversion BEGIN
    {draft_row("OLD", -1)} END;""",
]

# The tallies of the rows that exist, as the triggers would have written them.
COUNT_SQL = [
    f"""INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, COUNT(*),
        COALESCE(SUM(CASE WHEN i.state IN {UNDECIDED} THEN latest.input_tokens END), 0),
        COALESCE(SUM(CASE WHEN i.state IN {UNDECIDED} THEN latest.output_tokens END), 0),
        COUNT(approved.id), COALESCE(SUM(approved.input_tokens), 0), COALESCE(SUM(approved.output_tokens), 0),
        0, 0, 0
    FROM ledger_item i
    LEFT JOIN ledger_generatedversion latest ON latest.item_id = i.id
        AND latest.number = (SELECT MAX(v.number) FROM ledger_generatedversion v WHERE v.item_id = i.id)
    LEFT JOIN ledger_generatedversion approved ON approved.id = i.approved_version_id
        AND i.state NOT IN {DISCARDED}
    GROUP BY i.job_id, i.state""",
    f"""INSERT INTO ledger_itemtally ({COLUMNS})
    SELECT i.job_id, i.state, 0, 0, 0, 0, 0, 0, SUM(v.input_tokens), SUM(v.output_tokens),
        SUM(CASE WHEN json_extract(v.usage, '$.apportioned') = 1 THEN 1 ELSE 0 END)
    FROM ledger_generatedversion v JOIN ledger_item i ON i.id = v.item_id
    GROUP BY i.job_id, i.state""",
    f"""INSERT INTO ledger_drafttally (job_id, received, drafts, input_tokens, output_tokens)
    SELECT i.job_id, {quarter("v.created_at")}, COUNT(*), SUM(v.input_tokens), SUM(v.output_tokens)
    FROM ledger_generatedversion v JOIN ledger_item i ON i.id = v.item_id
    GROUP BY 1, 2""",
]


def before_migrate(*, using: str = "default", **signal_kwargs) -> None:
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        for name in TRIGGERS:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")


def after_migrate(*, using: str = "default", **signal_kwargs) -> None:
    """Count the tallies again and install the triggers, once the tables they name exist."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    if not {"ledger_item", "ledger_generatedversion", "ledger_itemtally", "ledger_drafttally"} <= set(
        connection.introspection.table_names()
    ):
        return  # a partial migrate: the next full one does this
    before_migrate(using=using)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM ledger_itemtally")
        cursor.execute("DELETE FROM ledger_drafttally")
        for statement in [*COUNT_SQL, *TRIGGERS_SQL]:
            cursor.execute(statement)
