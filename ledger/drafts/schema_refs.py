"""Where an output schema's references may point: inside the schema only (`#` or `#/…`).

A schema is typed by a catalogue owner and read by the workers; a `$ref` to `http:`, `file:`, a
relative name or a `urn:` would have jsonschema fetch it at collection (a request from the worker
to any address, one that may never answer). So such a reference is refused when a prompt version
is made (`outside_references`), and the validator is built on `NO_RETRIEVAL`, a registry that
fetches nothing, so that even a schema stored before this rule cannot make a worker reach out.
"""

from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

REFERENCE_KEYWORDS = ("$ref", "$dynamicRef")
# Keywords whose values are data, not schemas: a "$ref" key inside them is text, never followed.
DATA_KEYWORDS = ("enum", "const", "default", "examples")
# The schema's own address while it is looked into: no network scheme, so nothing could fetch it.
OWN_URI = "urn:batchdesk:output-schema"


def refuse_retrieval(uri: str):
    """The registry's `retrieve`: nothing outside the schema is ever fetched."""
    raise NoSuchResource(ref=uri)


NO_RETRIEVAL = Registry(retrieve=refuse_retrieval)


def references(schema: object) -> list[str]:
    """Every `$ref` and `$dynamicRef` of a schema, in the order they appear."""
    found = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in REFERENCE_KEYWORDS and isinstance(value, str):
                found.append(value)
            elif key not in DATA_KEYWORDS:
                found += references(value)
    elif isinstance(schema, list):
        for value in schema:
            found += references(value)
    return found


def is_inside(reference: str) -> bool:
    return reference == "#" or reference.startswith("#/")


def reference_problems(schema: dict) -> list[str]:
    """Why a schema's references are refused: one pointing outside it, or one pointing inside it at
    nothing."""
    refs = references(schema)
    outside = [ref for ref in refs if not is_inside(ref)]
    if outside:
        shown = ", ".join(f'"{ref[:100]}"' for ref in dict.fromkeys(outside))
        return [
            f"The output schema refers outside itself ({shown}): a $ref may only point inside the "
            'schema, "#" or "#/…" (put what it names under "$defs" and write "#/$defs/<name>")'
        ]
    resolver = NO_RETRIEVAL.with_resource(
        OWN_URI,
        specification_with(str(schema.get("$schema", "")), default=DRAFT202012).create_resource(schema),
    ).resolver(base_uri=OWN_URI)
    nowhere = []
    for ref in dict.fromkeys(refs):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            nowhere.append(ref)
    if nowhere:
        shown = ", ".join(f'"{ref[:100]}"' for ref in nowhere)
        return [f"The output schema refers to {shown}, which is nowhere inside it"]
    return []
