"""A deterministic stand-in for a language model, used by the emulator.

It writes product copy only from the `Title:` line and `- key: value` fact lines of the
prompt, so a draft never claims anything the source did not say. The same request always
gets the same answer (the wording is seeded by a hash of the request body).
"""

import hashlib
import json
import random
import re
from typing import Any

OPENERS = ["Introducing the {t}.", "Meet the {t}.", "Say hello to the {t}.", "Discover the {t}."]
# (sentence, how one fact reads inside it)
FACT_FRAMES = [
    ("Its {list}.", "{k} is {v}"),
    ("Key details: {list}.", "{k} {v}"),
    ("Specifications: {list}.", "{k} {v}"),
]
CLOSERS = ["Add the {t} to your basket today.", "Order yours today.", "Find out more about the {t}."]
HEADLINES = ["{title}", "Introducing the {t}", "Meet the {t}"]
HEADLINE_NAMES = {"headline", "title", "name", "heading", "subject"}


def count_tokens(text: str) -> int:
    """Roughly four tokens per three words, like English text in a BPE tokenizer."""
    return round(len(text.split()) * 4 / 3)


def _fit(text: str, schema: dict) -> str:
    limit = schema.get("maxLength")
    if limit is not None and len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return text.ljust(schema.get("minLength", 0), ".")


def _paragraph(subject: str, facts: list[tuple[str, str]], rng: random.Random) -> str:
    """2-4 sentences: an opener, the facts in one or two sentences, sometimes a closer."""
    sentences = [rng.choice(OPENERS).format(t=subject)]
    half = (len(facts) + 1) // 2
    groups = [facts[:half], facts[half:]] if len(facts) > 3 else [facts] if facts else []
    for group, (frame, item) in zip(groups, rng.sample(FACT_FRAMES, len(groups)), strict=True):
        parts = [item.format(k=k, v=v) for k, v in group]
        listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        sentences.append(frame.format(list=listed))
    if len(sentences) < 2 or rng.random() < 0.5:
        sentences.append(rng.choice(CLOSERS).format(t=subject))
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
        return {key: _fill(sub, key, ctx) for key, sub in schema.get("properties", {}).items()}
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


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def generate(body: dict) -> tuple[str, dict]:
    """Answer one chat-completions request body: (content, usage)."""
    messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
    prompt = "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "user")
    rng = random.Random(hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest())
    match = re.search(r"^\s*Title:\s*(.+?)\s*$", prompt, re.MULTILINE)
    title = match.group(1) if match else "product"
    facts = re.findall(r"^\s*-\s*([^:\n]+?)\s*:\s*(.+?)\s*$", prompt, re.MULTILINE)
    # "Meet the The Oak Table." reads badly; so does a doubled full stop.
    subject = re.sub(r"(?i)^the\s+", "", title).rstrip(".")
    paragraph = _paragraph(subject, facts, rng)
    headline = rng.choice(HEADLINES).format(title=title, t=subject)
    ctx = {"title": title, "facts": facts, "paragraph": paragraph, "headline": headline}

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
    prompt_tokens = sum(count_tokens(_text(m.get("content"))) + 3 for m in messages)
    total = prompt_tokens + completion_tokens
    return content, {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": total,
    }
