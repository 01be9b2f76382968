"""Where and how ``ExportTraces`` sends spans: built with the pipeline, read on each worker.

A module of its own so that ``otlp`` (imported with ``beam_agents``) and ``_otlp_spans`` (which
loads the OpenTelemetry SDK, on workers only) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportSettings:
    """What ``ExportTraces`` was given, for the OpenTelemetry SDK's exporter."""

    endpoint: str
    """The collector's traces URL."""
    headers: dict[str, str] | None
    """Sent with every request."""
    service_name: str
    """The resource's ``service.name``."""
    timeout_s: float
    """The exporter's time per batch, its retries included."""
