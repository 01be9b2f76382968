"""Keeps Beam's import-time "apitools not found" notice off the command's stderr.

Imported by the package before anything imports ``apache_beam``: a bad-input exit must print
exactly one line. Only that root-logger record is dropped.
"""

from __future__ import annotations

import logging


def _not_the_notice(record: logging.LogRecord) -> bool:
    return not (record.name == "root" and record.getMessage().startswith("apitools not found"))


logging.getLogger().addFilter(_not_the_notice)
