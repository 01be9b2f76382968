"""Imported first by the example programs: keeps one Beam import-time warning out of their output.

``import apache_beam`` logs ``apitools not found, and bigquery client libraries are not
available ...`` at WARNING on the root logger when the optional Google Cloud libraries are not
installed: nothing a user of these examples did, nor needs. Importing this module adds a filter
to the root logger that drops that one record; every other record, Beam's included, still gets
through. It must come before ``apache_beam`` is imported (``# isort: skip`` keeps it first).
"""

from __future__ import annotations

import logging

APITOOLS_NOTICE = "apitools not found"
"""How the dropped record's message starts."""


class DropApitoolsNotice(logging.Filter):
    """Drops Beam's "apitools not found" record from the root logger, and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False (drop) only for that record."""
        return not (record.name == "root" and record.getMessage().startswith(APITOOLS_NOTICE))


def install() -> None:
    """Add the filter to the root logger, once."""
    root = logging.getLogger()
    if not any(isinstance(existing, DropApitoolsNotice) for existing in root.filters):
        root.addFilter(DropApitoolsNotice())


install()
