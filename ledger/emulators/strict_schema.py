"""OpenAI's strict Structured Outputs subset (reference/providers.md §8.1), judged as OpenAI judges
a `response_format` of `{"type": "json_schema", "json_schema": {..., "strict": true}}`: the first
place the schema leaves the subset, in OpenAI's words, which name the place as a Python tuple:
`Invalid schema for response_format 'output': In context=('properties', 'headline'), 'minLength'
is not permitted.`

Written apart from the adapters' schema dialects on purpose, and importing nothing of them: the
emulators use it to refuse what OpenAI refuses, so it judges what the adapters send.
"""

from typing import Any

# The keywords strict mode takes; any other keyword is "not permitted" (minLength, maxLength,
# uniqueItems, default, patternProperties, propertyNames, min/maxProperties, not, if/then/else,
# allOf, oneOf, contains, dependentRequired, ...).
ACCEPTED_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",  # the older name, which OpenAI's own SDK keeps beside $defs in strict schemas
    "description",
    "title",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
}
ACCEPTED_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
REQUIRED_MESSAGE = (
    "'required' is required to be supplied and to be an array including every key in properties."
)


def refusal(response_format: Any) -> str | None:
    """Why OpenAI refuses this `response_format` (its error message, answered 400 with
    `param: "response_format"`), or None when it takes it: only a strict json_schema is judged."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    json_schema = response_format.get("json_schema")
    if not isinstance(json_schema, dict) or json_schema.get("strict") is not True:
        return None
    problem = schema_problem(json_schema.get("schema"))
    if problem is None:
        return None
    return f"Invalid schema for response_format '{json_schema.get('name')}': {problem}"


def schema_problem(schema: Any) -> str | None:
    """The first way `schema` leaves the strict subset, or None when it stays inside it."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind != "object":
        got = "None" if kind is None else kind
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'."
    return _node_problem(schema, ())


def _node_problem(node: Any, context: tuple[str, ...]) -> str | None:
    where = f"In context={context!r}, "
    if not isinstance(node, dict):
        return where + "schema must be a JSON object."
    for keyword in node:
        if keyword not in ACCEPTED_KEYWORDS:
            return where + f"'{keyword}' is not permitted."
    if "$ref" in node:
        others = sorted(set(node) - {"$ref"})
        if others:
            return where + "$ref cannot have keywords {" + ", ".join(map(repr, others)) + "}."
        if not (isinstance(node["$ref"], str) and node["$ref"].startswith("#")):
            return where + "'$ref' must point inside the schema ('#/...')."
        return None
    if not {"type", "anyOf", "enum"} & set(node):
        return where + "schema must have a 'type' key."
    if "format" in node and node["format"] not in ACCEPTED_FORMATS:
        return where + f"'{node['format']}' is not a valid format."
    kinds = node.get("type")
    kinds = {kinds} if isinstance(kinds, str) else set(kinds) if isinstance(kinds, list) else set()
    if "object" in kinds or "properties" in node:
        problem = _object_problem(node, context, where)
        if problem:
            return problem
    if "array" in kinds and "items" not in node:
        return where + "array schema missing items."
    children: list[tuple[tuple[str, ...], Any]] = []
    if "items" in node:
        children.append(((*context, "items"), node["items"]))
    children += [((*context, "anyOf", str(n)), branch) for n, branch in enumerate(_listed(node, "anyOf"))]
    for keyword in ("$defs", "definitions"):
        children += [((*context, keyword, name), inner) for name, inner in _mapped(node, keyword).items()]
    for inner_context, inner in children:
        problem = _node_problem(inner, inner_context)
        if problem:
            return problem
    return None


def _object_problem(node: dict, context: tuple[str, ...], where: str) -> str | None:
    """Every object is closed and requires each of its properties; then its properties are judged."""
    if node.get("additionalProperties") is not False:
        return where + "'additionalProperties' is required to be supplied and to be false."
    properties = _mapped(node, "properties")
    required = node.get("required") if isinstance(node.get("required"), list) else []
    missing = [name for name in properties if name not in required]
    if missing:
        return where + f"{REQUIRED_MESSAGE} Missing '{missing[0]}'."
    for name, inner in properties.items():
        problem = _node_problem(inner, (*context, "properties", name))
        if problem:
            return problem
    return None


def _listed(node: dict, keyword: str) -> list:
    value = node.get(keyword)
    return value if isinstance(value, list) else []


def _mapped(node: dict, keyword: str) -> dict:
    value = node.get(keyword)
    return value if isinstance(value, dict) else {}
