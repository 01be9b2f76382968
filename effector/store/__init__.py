"""Store backends behind one interface, chosen by URL (see :func:`open_store`).

``sqlite:///path`` opens :mod:`effector.store.sqlite`, ``postgresql://...`` the PostgreSQL one.
"""

from __future__ import annotations

from effector.errors import ConfigurationError
from effector.store.base import EffectorStore

SQLITE_SCHEMES = frozenset({"sqlite"})
POSTGRES_SCHEMES = frozenset({"postgresql", "postgres"})


async def open_store(url: str) -> EffectorStore:
    """Open the store named by ``url``: ``sqlite:///path`` or ``postgresql://...``."""
    scheme = url.partition(":")[0].lower()
    if scheme in SQLITE_SCHEMES:
        from effector.store.sqlite import SqliteStore

        return await SqliteStore.open(url)
    if scheme in POSTGRES_SCHEMES:
        from effector.store.postgres import PostgresStore

        return await PostgresStore.open(url)
    raise ConfigurationError(
        f"unsupported store URL scheme {scheme[:32]!r}: use sqlite:///path/to/file.db "
        "or postgresql://user@host/dbname"
    )


__all__ = ["EffectorStore", "open_store"]
