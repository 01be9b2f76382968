"""Prometheus metrics of one effector server, in a registry of its own.

Each server gets its own ``CollectorRegistry`` (never the process-global one), so several
servers in one process, as in tests, keep separate counts. ``serve`` exposes the text format
over HTTP when ``--metrics-listen`` is given.
"""

from __future__ import annotations

import functools
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS_S = (
    *(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)


class EffectorMetrics:
    """The counters, gauges and histogram one effector server maintains."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        self.accepted = counter("effector_intents_accepted", "Intents recorded for the first time.")
        self.duplicates = counter(
            "effector_intents_duplicate",
            "Submits of an intent already recorded with identical content.",
        )
        self.redelivered = counter(
            "effector_results_redelivered",
            "Result envelopes of DONE intents appended to the log again on a duplicate submit "
            "that asked for redelivery.",
        )
        self.rejected = counter(
            "effector_intents_rejected",
            "Submitted intents refused: malformed (not recorded), invalid (recorded as REJECTED) "
            "or conflict (same id, different content; the first is kept).",
            ["cause"],
        )
        self.executed = counter(
            "effector_intents_executed",
            "Execution attempts whose result was recorded, by result status.",
            ["status"],
        )
        self.expired = counter(
            "effector_intents_expired",
            "Intents refused as EXPIRED before they were claimed or decided.",
        )
        self.reconciliations = counter(
            "effector_reconciliations",
            "Reconciler calls for intents whose earlier execution recorded no result, by outcome: "
            "found (the effect had happened; recorded, not executed), not_found (executed "
            "again) or failed (left IN_DOUBT, asked again later).",
            ["outcome"],
        )
        self.in_doubt = gauge(
            "effector_intents_in_doubt",
            "Intents IN_DOUBT: their reconciler failed, so they are neither executed again nor "
            "DONE, and they hold their key.",
        )
        self.telemetry_recorded = counter(
            "effector_telemetry_recorded",
            "Trace events and error records stored for the first time, by kind.",
            ["kind"],
        )
        self.telemetry_duplicates = counter(
            "effector_telemetry_duplicate",
            "Trace events and error records sent again (already stored; kept as they were).",
            ["kind"],
        )
        self.telemetry_rejected = counter(
            "effector_telemetry_rejected",
            "Trace events and error records refused as invalid (not stored), by kind.",
            ["kind"],
        )
        self.in_flight = gauge(
            "effector_intents_in_flight",
            "Intents this server has claimed and is executing or recording.",
        )
        self.queue_depth = gauge(
            "effector_queue_depth",
            "Intents in the store not yet DONE (PENDING, RUNNING or AWAITING_DECISION).",
        )
        self.tool_latency = Histogram(
            "effector_tool_latency_seconds",
            "Wall time of one tool execution attempt, by tool.",
            ["tool"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._http: WSGIServer | None = None

    def serve(self, host: str, port: int) -> int:
        """Serve the text exposition format on ``host:port`` (0: a free port); returns the port."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(self._http.server_port)

    def close(self) -> None:
        """Stop serving, if serving."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
