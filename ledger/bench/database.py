"""A PostgreSQL database of the bench's own, on the server DATABASE_URL names, dropped at the end
whatever happens (failure, Ctrl-C, SIGTERM)."""

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

DEFAULT_SERVER = "postgres://127.0.0.1:5432"
PREFIX = "bd_bench_"


def server_url(database_url: str) -> str:
    """The server of DATABASE_URL when it names a PostgreSQL one, else the local default."""
    parts = urlsplit(database_url or "")
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        return DEFAULT_SERVER
    return urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))


def database_url(server: str, name: str) -> str:
    parts = urlsplit(server)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def _admin_connection(server: str) -> psycopg.Connection:
    # The maintenance database: CREATE and DROP DATABASE cannot run inside the one they name.
    return psycopg.connect(database_url(server, "postgres"), autocommit=True)


def exists(server: str, name: str) -> bool:
    with _admin_connection(server) as admin:
        return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """Yields the new database's name; drops it (closing any connection left to it) on the way out."""
    name = f"{PREFIX}{secrets.token_hex(4)}"
    with _admin_connection(server) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with _admin_connection(server) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
