"""What the effector tells its operators: Prometheus metrics and one log line per refusal.

:class:`EffectorMetrics` keeps one server's metrics in a registry of its own. The audit
functions log every intent the effector refuses or fails, once, when recorded, and every
decision attempt; :class:`EscapingFilter` keeps what a client sent from forging log lines.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from beam_agents._protos import ToolIntent, ToolResult
from effector.readable import is_hiding


def escape_text(text: str) -> str:
    """``text`` with every character that hides or breaks text (as pages mark them) escaped."""
    if text.isprintable():
        return text
    return "".join(ascii(char)[1:-1] if is_hiding(char) else char for char in text)


class EscapingFilter(logging.Filter):
    """Escapes the unsafe characters of every argument of a log line, so none forges a line."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record.args`` in place (numbers stay numbers); always keep the record."""
        if isinstance(record.args, tuple):
            record.args = tuple(
                arg if isinstance(arg, int | float) else escape_text(str(arg))
                for arg in record.args
            )
        return True


_log = logging.getLogger("effector.audit")
_log.addFilter(EscapingFilter())

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
            "Submitted intents refused: malformed (not recorded), invalid (recorded as REJECTED), "
            "conflict (same id, different content; the first is kept) or policy (an effect "
            "policy denied it; recorded as REJECTED).",
            ["cause"],
        )
        self.rejected_malformed = self.rejected.labels("malformed")
        self.rejected_invalid = self.rejected.labels("invalid")
        self.rejected_conflict = self.rejected.labels("conflict")
        self.rejected_policy = self.rejected.labels("policy")
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
        self.policy_decisions = counter(
            "effector_policy_decisions",
            'TOOL intents an effect policy decided at intake, by rule ("" for the file\'s '
            "default) and outcome (allow, deny, require_approval).",
            ["rule", "outcome"],
        )
        self.policy_reload_failures = counter(
            "effector_policy_reload_failures",
            "Policy file reloads refused as invalid (the last good policy stays in force).",
        )
        self.budget_refusals = counter(
            "effector_budget_refusals",
            "LeaseBudget requests granted nothing: the budget window is exhausted.",
        )
        self._decided: dict[tuple[str, str], Any] = {}
        self._http: WSGIServer | None = None

    def count_decision(self, rule: str, outcome: str, count: int = 1) -> None:
        """Count ``count`` policy decisions (the labelled child is bound once per pair)."""
        child = self._decided.get((rule, outcome))
        if child is None:
            child = self._decided[rule, outcome] = self.policy_decisions.labels(rule, outcome)
        child.inc(count)

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


def display_key(entity_key: bytes) -> str:
    """The key as text if printable UTF-8 without whitespace (nor a ``0x`` start), else hex."""
    try:
        text = entity_key.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    readable = text.isprintable() and not any(c.isspace() for c in text)
    if text and readable and not text.startswith("0x"):
        return text
    return "0x" + entity_key.hex()


CONFLICT_HINT = "set AgentConfig.namespace when two agents or pipelines share an effector"
"""What a conflict's log line suggests: the usual cause is two minters of the same ids."""

_SHOWN_CHARS = 120


def payload_text(payload: bytes) -> str:
    """A payload as text if it is printable UTF-8, else ``0x`` and its hex; ``-`` if empty."""
    if not payload:
        return "-"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + payload.hex()
    return text if text.isprintable() else "0x" + payload.hex()


def describe(intent: ToolIntent) -> str:
    """``intent <id> (key <key>, tool '<name>')``: how every line names an intent."""
    return (
        f"intent {_cut(intent.intent_id)} (key {_cut(display_key(intent.entity_key))}, "
        f"tool {_cut(repr(intent.tool_name))})"
    )


def differences(recorded: ToolIntent, submitted: ToolIntent) -> str:
    """Each field whose value differs, as ``field: recorded ... submitted ...``."""
    parts = []
    for field in ToolIntent.DESCRIPTOR.fields:
        kept, new = getattr(recorded, field.name), getattr(submitted, field.name)
        if kept != new:
            parts.append(
                f"{field.name}: recorded {_shown(field.name, kept)}, submitted "
                f"{_shown(field.name, new)}"
            )
    return "; ".join(parts) or "no field differs (only their encoding)"


def _shown(name: str, value: object) -> str:
    if name == "kind" and isinstance(value, int):
        known = value in ToolIntent.Kind.values()
        return ToolIntent.Kind.Name(value) if known else str(value)
    return _cut(display_key(value) if isinstance(value, bytes) else repr(value))


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def conflict(submitted: ToolIntent, recorded: ToolIntent | None) -> None:
    """An intent was refused because its id is recorded with different content."""
    what = "unknown" if recorded is None else differences(recorded, submitted)
    _log.warning(
        "REJECTED %s: conflict, its id is already recorded with different content (%s); the "
        "first submission is kept. Two agents or pipelines minting the same ids? %s",
        describe(submitted),
        what,
        CONFLICT_HINT,
    )


def rejected(intent: ToolIntent, reason: str) -> None:
    """An intent was refused without running (malformed or invalid)."""
    _log.warning("REJECTED %s: %s", describe(intent), reason)


def expired(intents: Sequence[ToolIntent]) -> None:
    """Intents were refused as EXPIRED: a tool intent at WARNING, an approval at INFO."""
    for intent in intents:
        if intent.kind == ToolIntent.APPROVAL:
            _log.info("EXPIRED %s: no decision before its deadline", describe(intent))
        else:
            _log.warning("EXPIRED %s: its TTL ran out before it was run", describe(intent))


def tool_failed(intent: ToolIntent, result: ToolResult, error: BaseException | None) -> None:
    """A tool ran and failed (raised, timed out, returned what is not JSON): its ERROR result."""
    _log.warning("ERROR %s, attempt %d: %s", describe(intent), result.attempt, result.error_message)
    if error is not None and _log.isEnabledFor(logging.DEBUG):
        _log.debug("traceback of %s, attempt %d", describe(intent), result.attempt, exc_info=error)


def reconciled(intent: ToolIntent, attempt: int) -> None:
    """An intent's effect was found by its reconciler and recorded as its result, not re-run."""
    _log.info(
        "RECONCILED %s, attempt %d: its effect had already happened; recorded without "
        "executing again",
        describe(intent),
        attempt,
    )


def in_doubt(intent: ToolIntent, attempt: int, reason: str, retry_in_ms: int) -> None:
    """An intent's reconciler failed: it is IN_DOUBT, held, and asked again after a backoff."""
    _log.warning(
        "IN_DOUBT %s, attempt %d: its reconciler failed (%s); not executed again, its key is "
        "held, asking again in %d ms",
        describe(intent),
        attempt,
        reason,
        retry_in_ms,
    )


def not_needed(intent: ToolIntent, reason: str) -> None:
    """A compensation was recorded NOT_NEEDED: the intent it undoes never ran."""
    _log.info("NOT_NEEDED %s: %s", describe(intent), reason)


def decision(
    intent_id: str, approved: bool, approver: str, applied: bool, reason: str, origin: str = ""
) -> None:
    """A decision was attempted (by gRPC, the console, MCP or the CLI): applied, or why not."""
    outcome = "applied" if applied else "not applied"
    _log.info(
        "DECISION %s intent %s by %s%s: %s%s",
        "approve" if approved else "deny",
        _cut(intent_id),
        _cut(repr(approver)),
        f" via {_cut(origin)}" if origin else "",
        outcome,
        f" ({reason})" if reason else "",
    )


def policy_decided(intent: ToolIntent, rule: str, outcome: str, reason: str) -> None:
    """An effect policy rule decided a TOOL intent at intake (a default allow is not logged)."""
    level = logging.INFO if outcome == "allow" else logging.WARNING
    _log.log(
        level,
        "POLICY %s %s: rule %r%s",
        outcome,
        describe(intent),
        rule or "(default)",
        f": {reason}" if reason else "",
    )
