"""The effector's durable record, chosen by URL: SQLite (one process) or PostgreSQL (replicas).

Both are :class:`~effector.store.sql.SqlStore`s. The store imports nothing else of the effector.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import TYPE_CHECKING

from effector.store.errors import ConfigurationError

if TYPE_CHECKING:
    from effector.store.sql import SqlStore


SQLITE_SCHEMES = frozenset({"sqlite"})
POSTGRES_SCHEMES = frozenset({"postgresql", "postgres"})

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
"""What a URL starts with (two characters at least, so ``C:`` stays part of a path)."""


def store_url(location: str) -> str:
    """``location`` as a store URL: a URL stays, a file path becomes SQLite's."""
    if _SCHEME.match(location):
        return location
    return "sqlite:///" + urllib.parse.quote(location, safe="/:")


async def open_store(url: str) -> SqlStore:
    """Open the store named by ``url``: ``sqlite:///path``, a file path, or ``postgresql://...``."""
    url = store_url(url)
    scheme = url.partition(":")[0].lower()
    if scheme in SQLITE_SCHEMES:
        from effector.store.sqlite import SqliteStore

        return await SqliteStore.open(url)
    if scheme in POSTGRES_SCHEMES:
        from effector.store.postgres import PostgresStore

        return await PostgresStore.open(url)
    supported = ", ".join(sorted(SQLITE_SCHEMES | POSTGRES_SCHEMES))
    raise ConfigurationError(
        f"unsupported store URL scheme {scheme[:32]!r} (supported: {supported}): use a file path "
        "or sqlite:///path/to/file.db for SQLite, or postgresql://user@host/dbname"
    )


__all__ = ["open_store", "store_url"]
