"""What a model name may be, per provider: one rule, checked when a job is made (`create_job`, and
its forms for a per-field message) and again by the adapters that put the name in an address.

A model name is text a person typed, and it is sent with the provider's key. Gemini puts it in the
path (`/models/{model}:batchGenerateContent`), Cloudflare too (`/accounts/{id}/ai/run/{model}`):
a name like `../../../../user/tokens/verify` would send the key to another address on the
provider's host. So a name is only the characters real model ids use, with no `..`, `?`, `#`, `%`,
space or control character, and a slash only where the provider's ids have one:
- OpenAI (and the emulator), Anthropic: one segment (`gpt-4o-mini`, `ft:gpt-4o-mini:org::id`,
  `claude-haiku-4-5`);
- an OpenAI-compatible server: Hugging Face style `org/name` is normal for vLLM
  (`meta-llama/Llama-3.1-8B-Instruct`); the name only goes in the JSON body, never the path. A
  server started on a local directory serves it under a name of its own (vLLM's
  `--served-model-name`), not `/models/…`;
- Gemini: one segment, optionally after `models/` or `tunedModels/`; no `:`, which would name
  another method of the model;
- Cloudflare: exactly `@cf/<author>/<model>` or `@hf/<author>/<model>`, a path of three segments
  under `/ai/run/` (its API takes the slashes as they are), each one segment of plain characters.
"""

import re

from .base import NotSent

MAX_MODEL_NAME = 128

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SEGMENT_WITH_COLONS = r"[A-Za-z0-9][A-Za-z0-9._:-]*"

# (pattern, how a good name looks) by provider.
MODEL_NAMES: dict[str, tuple[re.Pattern, str]] = {
    "openai": (re.compile(_SEGMENT_WITH_COLONS), "one name without slashes, like gpt-4o-mini"),
    "emulator": (re.compile(_SEGMENT_WITH_COLONS), "one name without slashes, like gpt-4o-mini"),
    "anthropic": (re.compile(_SEGMENT_WITH_COLONS), "one name without slashes, like claude-haiku-4-5"),
    "openai_compatible": (
        re.compile(rf"{_SEGMENT_WITH_COLONS}(?:/{_SEGMENT_WITH_COLONS})*"),
        "the name the server serves, like meta-llama/Llama-3.1-8B-Instruct",
    ),
    "gemini": (
        re.compile(rf"(?:models/|tunedModels/)?{_SEGMENT}"),
        "a model name like gemini-2.5-flash or models/gemini-2.5-flash",
    ),
    "cloudflare": (
        re.compile(rf"@(?:cf|hf)/{_SEGMENT}/{_SEGMENT}"),
        "@cf/<author>/<model>, like @cf/meta/llama-3.3-70b-instruct-fp8-fast",
    ),
}


def model_name_problem(provider: str, model: str) -> str | None:
    """Why `model` cannot be asked of `provider`, or None when it can."""
    if not model:
        return "a model name is needed"
    if len(model) > MAX_MODEL_NAME:
        return f"a model name is at most {MAX_MODEL_NAME} characters"
    pattern, looks_like = MODEL_NAMES.get(provider, MODEL_NAMES["openai"])
    if ".." in model or not pattern.fullmatch(model):
        return f"{model[:MAX_MODEL_NAME]!r} is not a model name for {provider}: write {looks_like}"
    return None


def check_model_name(provider: str, model: str) -> None:
    """The adapters' check, just before a name goes into an address: a bad one is refused for good,
    as a request that never left (a job made before this rule may still hold one)."""
    if problem := model_name_problem(provider, model):
        raise NotSent(problem, status=400)
