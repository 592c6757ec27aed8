"""A deterministic stand-in for a language model, used by the emulator.

It writes product copy only from the `Title:` line and `- key: value` fact lines of the
prompt, so a draft never claims anything the source did not say. The same request always
gets the same answer: the wording is chosen by a hash of the request's messages.

It answers every request of every emulated batch, a million at the bench's largest size, on
the cores the workers use: a request costs a few tens of microseconds (one hash, one regular
expression, string formatting), not a JSON dump and a seeded random generator each.
"""

import functools
import hashlib
import json
import re
from typing import Any, NamedTuple

# The templates are filled by str.replace, not str.format: a few tenths of a microsecond less each,
# fifteen times a request.
OPENERS = ["Introducing the {t}.", "Meet the {t}.", "Say hello to the {t}.", "Discover the {t}."]
# (sentence, what stands between a fact's key and its value inside it)
FACT_FRAMES = [
    ("Its {list}.", " is "),
    ("Key details: {list}.", " "),
    ("Specifications: {list}.", " "),
]
# The orders two groups of facts may take the frames in (the second group's frame is another one).
FRAME_PAIRS = [(a, b) for a in range(len(FACT_FRAMES)) for b in range(len(FACT_FRAMES)) if a != b]
CLOSERS = ["Add the {t} to your basket today.", "Order yours today.", "Find out more about the {t}."]
HEADLINES = ["{title}", "Introducing the {t}", "Meet the {t}"]
HEADLINE_NAMES = {"headline", "title", "name", "heading", "subject"}
TITLE = re.compile(r"^\s*Title:\s*(.+?)\s*$", re.MULTILINE)
LEADING_THE = re.compile(r"(?i)^the\s+")


def count_tokens(text: str) -> int:
    """Roughly four tokens per three words, like English text in a BPE tokenizer."""
    return round(len(text.split()) * 4 / 3)


# A unit's requests share their instructions (the system message): counted once, not once a request.
_instruction_tokens = functools.lru_cache(maxsize=64)(count_tokens)


def _fit(text: str, schema: dict) -> str:
    limit = schema.get("maxLength")
    if limit is not None and len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return text.ljust(schema.get("minLength", 0), ".")


def facts_in(prompt: str) -> list[tuple[str, str]]:
    """The prompt's `- key: value` lines, in order, each read on its own line (a key or value
    left empty makes no fact)."""
    facts = []
    for line in prompt.split("\n"):
        text = line.strip()
        if text[:1] == "-":
            key, colon, value = text[1:].partition(":")
            key, value = key.strip(), value.strip()
            if colon and key and value:
                facts.append((key, value))
    return facts


def _listed(facts: list[tuple[str, str]], between: str) -> str:
    parts = [key + between + value for key, value in facts]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _paragraph(subject: str, facts: list[tuple[str, str]], dice: bytes) -> str:
    """2-4 sentences: an opener, the facts in one or two sentences, sometimes a closer. `dice`:
    the request's hash, a byte for each choice."""
    sentences = [OPENERS[dice[0] % len(OPENERS)].replace("{t}", subject)]
    half = (len(facts) + 1) // 2
    groups = [facts[:half], facts[half:]] if len(facts) > 3 else [facts] if facts else []
    frames = FRAME_PAIRS[dice[1] % len(FRAME_PAIRS)]
    for group, frame in zip(groups, frames, strict=False):
        sentence, between = FACT_FRAMES[frame]
        sentences.append(sentence.replace("{list}", _listed(group, between)))
    if len(sentences) < 2 or dice[2] < 128:
        sentences.append(CLOSERS[dice[3] % len(CLOSERS)].replace("{t}", subject))
    return " ".join(sentences)


def _fill(schema: dict, name: str, ctx: dict) -> Any:
    """A value for `schema` (a JSON Schema node), chosen by the property's name."""
    if "anyOf" in schema or "oneOf" in schema:
        return _fill((schema.get("anyOf") or schema["oneOf"])[0], name, ctx)
    if "const" in schema or "enum" in schema:
        return schema["const"] if "const" in schema else schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if kind == "object":
        optionals, required = ctx["optionals"], schema.get("required", [])
        return {
            key: None if optionals == "null" and _takes_null(sub) else _fill(sub, key, ctx)
            for key, sub in schema.get("properties", {}).items()
            if optionals != "left_out" or key in required
        }
    if kind == "array":
        bullets = [f"{k[:1].upper()}{k[1:]}: {v}" for k, v in ctx["facts"]] or [ctx["title"]]
        count = min(schema.get("maxItems", len(bullets)), max(schema.get("minItems", 0), len(bullets)))
        items = schema.get("items", {"type": "string"})
        if items.get("type", "string") == "string":
            return [_fit(bullets[i % len(bullets)], items) for i in range(count)]
        return [_fill(items, name, ctx) for _ in range(count)]
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False  # a yes/no claim is never made up
    if kind == "null":
        return None
    is_headline = name.lower() in HEADLINE_NAMES or name.lower().endswith("headline")
    return _fit(ctx["headline"] if is_headline else ctx["paragraph"], schema)


def _takes_null(schema: Any) -> bool:
    """Whether a property's schema, as the model was sent it, lets it answer null."""
    if not isinstance(schema, dict):
        return schema is True
    kind = schema.get("type")
    branches = schema.get("anyOf") or schema.get("oneOf") or []
    return (
        kind == "null"
        or (isinstance(kind, list) and "null" in kind)
        or None in schema.get("enum", [1])
        or ("const" in schema and schema["const"] is None)
        or any(_takes_null(branch) for branch in branches)
    )


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def generate(body: dict, optionals: str = "written") -> tuple[str, dict]:
    """Answer one chat-completions request body: (content, usage). `optionals`: how a property the
    model need not write is answered (`knobs.OPTIONAL_ANSWERS`): written, null wherever its schema
    takes null, or left out unless required."""
    messages = [
        (m.get("role"), _text(m.get("content"))) for m in body.get("messages", []) if isinstance(m, dict)
    ]
    prompt = "\n".join([text for role, text in messages if role == "user"])
    # What the words depend on: every message, in order, with its role.
    said = "\x00".join([f"{role}\x01{text}" for role, text in messages])
    dice = hashlib.blake2b(said.encode(), digest_size=8).digest()
    match = TITLE.search(prompt)
    title = match.group(1) if match else "product"
    facts = facts_in(prompt)
    # "Meet the The Oak Table." reads badly; so does a doubled full stop.
    subject = LEADING_THE.sub("", title).rstrip(".")
    paragraph = _paragraph(subject, facts, dice)
    headline = HEADLINES[dice[4] % len(HEADLINES)].format(title=title, t=subject)
    ctx = {
        "title": title,
        "facts": facts,
        "paragraph": paragraph,
        "headline": headline,
        "optionals": optionals,
    }

    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema", {})
        content = json.dumps(_fill(schema, "", ctx))
    else:
        content = paragraph
    completion_tokens = count_tokens(content)
    # Like a real model, stop mid-output at the token budget (which may break the JSON) and
    # report the whole budget as used: callers read that as finish_reason "length".
    budget = body.get("max_completion_tokens") or body.get("max_tokens")
    if budget and completion_tokens > budget:
        content = " ".join(content.split(" ")[: max(1, int(budget * 3 / 4))])
        completion_tokens = budget
    prompt_tokens = sum(
        (count_tokens(text) if role == "user" else _instruction_tokens(text)) + 3 for role, text in messages
    )
    total = prompt_tokens + completion_tokens
    return content, {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": total,
    }


# How an answer knob shapes a model's answer (`answer`): cut off at the output-token limit, refused,
# the JSON wrapped in a Markdown code fence, or prose where JSON was asked for.
TRUNCATED, REFUSED, FENCED, PROSE = "truncated", "refused", "fenced", "prose"
REFUSAL = "I'm sorry, but I can't help with that request."


class Answer(NamedTuple):
    """What the model wrote and how it stopped: `complete`, `truncated` (at the output-token limit)
    or `refused` (`content` is then the model's refusal, which each protocol puts in its own place)."""

    content: str
    usage: dict
    stopped: str


def answer(body: dict, shape: str = "", optionals: str = "written") -> Answer:
    """`generate`'s answer to a chat-completions body, shaped as an answer knob says (`shape`: one
    of TRUNCATED, REFUSED, FENCED, PROSE, or "" for as asked; `optionals`: as `generate` reads it).
    An answer that ran into the body's token budget by itself is truncated too."""
    if shape == PROSE:
        body = {key: value for key, value in body.items() if key != "response_format"}
    content, usage = generate(body, optionals)
    budget = body.get("max_completion_tokens") or body.get("max_tokens")
    if shape == REFUSED:
        content = REFUSAL
    elif shape == TRUNCATED:
        # Half of it, so JSON no longer parses, and the whole budget spent, as a real cut-off reads.
        content = content[: max(1, len(content) // 2)]
    elif shape == FENCED:
        content = f"```json\n{content}\n```\n"
    if shape in (REFUSED, TRUNCATED):
        used = budget if shape == TRUNCATED and budget else count_tokens(content)
        usage = {**usage, "completion_tokens": used, "total_tokens": usage["prompt_tokens"] + used}
    if shape == REFUSED:
        return Answer(content, usage, "refused")
    cut = shape == TRUNCATED or (budget and usage["completion_tokens"] >= budget)
    return Answer(content, usage, "truncated" if cut else "complete")
