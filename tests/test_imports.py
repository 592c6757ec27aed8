"""Imports a reader can see (issue 26 point 7): production code imports at the top of its modules,
but where a line says why not; verbs are imported from their topic module, and the `ledger.actions`
package hands on only what the screens and the API take from it."""

import ast
import pkgutil
from pathlib import Path

import ledger.actions

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ("ledger", "review", "batchdesk")


def modules(*packages: str):
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path.relative_to(ROOT).as_posix(), path.read_text()


def local_imports_without_a_why(source: str) -> list[int]:
    """Lines of imports inside a function that neither carry a comment nor follow one: a comment
    just above a block of imports speaks for the whole block."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            above = node.lineno - 2
            while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                above -= 1
            if "#" not in lines[node.lineno - 1] and not (
                above >= 0 and lines[above].strip().startswith("#")
            ):
                found.append(node.lineno)
    return found


TOPICS = {module.name for module in pkgutil.iter_modules(ledger.actions.__path__)}


def names_taken_from_the_face(tree: ast.AST) -> set[str]:
    """What a module takes from the `ledger.actions` package itself rather than from a topic module:
    the names of `from ledger.actions import x` (a topic module aside), and `actions` for
    `from ledger import actions`."""
    taken = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "ledger.actions":
            taken |= {alias.name for alias in node.names} - TOPICS
        if isinstance(node, ast.ImportFrom) and node.module == "ledger":
            taken |= {alias.name for alias in node.names} & {"actions"}
    return taken


def test_every_function_local_import_in_production_code_says_why():
    unexplained = [
        f"{path}:{line}"
        for path, source in modules(*PRODUCTION)
        for line in local_imports_without_a_why(source)
    ]
    assert unexplained == []


def test_the_actions_package_hands_on_only_what_the_screens_and_the_api_take_from_it():
    taken_by_screens = set().union(*(names_taken_from_the_face(ast.parse(s)) for _, s in modules("review")))
    assert set(ledger.actions.__all__) == taken_by_screens


def test_ledger_and_the_tests_import_verbs_from_their_topic_module():
    through_the_face = [
        path for path, source in modules("ledger", "tests") if names_taken_from_the_face(ast.parse(source))
    ]
    assert through_the_face == []
