"""Prometheus metrics of one effector server, in a registry of its own.

Each server gets its own ``CollectorRegistry`` (never the process-global one), so several
servers in one process, as in tests, keep separate counts. ``serve`` exposes the text format
over HTTP when ``--metrics-listen`` is given.
"""

from __future__ import annotations

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
        self.accepted = Counter(
            "effector_intents_accepted",
            "Intents recorded for the first time.",
            registry=self.registry,
        )
        self.duplicates = Counter(
            "effector_intents_duplicate",
            "Submits of an intent already recorded with identical content.",
            registry=self.registry,
        )
        self.redelivered = Counter(
            "effector_results_redelivered",
            "Result envelopes of DONE intents appended to the log again on a duplicate submit "
            "that asked for redelivery.",
            registry=self.registry,
        )
        self.rejected = Counter(
            "effector_intents_rejected",
            "Submitted intents refused: malformed (not recorded), invalid (recorded as REJECTED) "
            "or conflict (same id, different content; the first is kept).",
            ["cause"],
            registry=self.registry,
        )
        self.executed = Counter(
            "effector_intents_executed",
            "Execution attempts whose result was recorded, by result status.",
            ["status"],
            registry=self.registry,
        )
        self.expired = Counter(
            "effector_intents_expired",
            "Intents refused as EXPIRED before they were claimed or decided.",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "effector_intents_in_flight",
            "Intents this server has claimed and is executing or recording.",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "effector_queue_depth",
            "Intents in the store not yet DONE (PENDING, RUNNING or AWAITING_DECISION).",
            registry=self.registry,
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
