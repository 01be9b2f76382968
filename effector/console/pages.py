"""The console's reading pages (GET only): overview, keys, runs, intents, policies, budgets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import effector.console.views as views
from beam_agents._protos import IntentState, ToolIntent, ToolResult
from effector.console.runs import (
    SPANS_PER_PAGE,
    closing_events,
    memory_slots,
    page_of_run,
    run_spans,
    spans_per_run,
)
from effector.console.views import raw_download, render, service_of
from effector.policy import Outcome
from effector.store.intents import IntentRecord, gate_id_for, intent_id_problem
from effector.store.sql import SqlStore

WINDOWS = {15: "15 min", 60: "1 h", 360: "6 h", 1440: "24 h"}
"""The overview's windows, in minutes; it shows the last hour unless asked otherwise."""
REFRESH_S = 10
DEFAULT_RUNS = 50
MAX_RUNS = 1_000
"""Runs on a key's page: the newest 50 unless more are asked for, at most 1,000."""
LIST_LIMIT = 200
WITHDRAWN_SHOWN = 20
"""Withdrawn intents a key's page lists, newest first."""
"""Rows on the keys, intents and errors lists."""
DEFAULT_DECISIONS = 50
MAX_DECISIONS = 1_000
"""Policy decisions the policies page lists: the newest 50 unless more are asked for."""
WHEN_CHARS = 4_000
"""The most characters of one rule's condition the policies page shows."""
DEFAULT_BUDGET_WINDOWS = 100
MAX_BUDGET_WINDOWS = 1_000
"""Budget windows the budgets page lists: the newest 100 unless more are asked for."""
OPEN_STATES = (
    IntentState.AWAITING_DECISION,
    IntentState.PENDING,
    IntentState.RUNNING,
    IntentState.IN_DOUBT,
)
_STATES = {
    IntentState.Name(state): state
    for state in (*OPEN_STATES, IntentState.DONE, IntentState.WITHDRAWN)
}


def number(request: Request, name: str, default: int, allowed: range | tuple[int, ...]) -> int:
    """Query parameter ``name`` as an integer in ``allowed``, else ``default``."""
    text = request.query_params.get(name, "")
    value = int(text) if text.isascii() and text.isdigit() else default
    return value if value in allowed else default


def entity_key(request: Request) -> bytes:
    """The key a page's path names in hex; 404 if it is not hex."""
    key = views.key_from_hex(request.path_params["key_hex"])
    if key is None or not key:
        raise HTTPException(404, "no such key: keys in console addresses are hex")
    return key


def checked_intent_id(request: Request) -> str:
    """The intent id a page's path names; 404 if it cannot be one."""
    intent_id: str = request.path_params["intent_id"]
    if intent_id_problem(intent_id) is not None:
        raise HTTPException(404, "no such intent")
    return intent_id


async def overview(request: Request) -> Response:
    """Intents by state, activity per minute, tool latency, approvals waiting, oldest open."""
    service = service_of(request)
    window = number(request, "window", 60, tuple(WINDOWS))
    figures = await service.store.overview(service.clock(), window * 60_000)
    counts = figures.counts
    states = [
        ("PENDING", counts.pending),
        ("RUNNING", counts.running),
        ("IN_DOUBT", counts.in_doubt),
        ("AWAITING_DECISION", counts.awaiting_decision),
        ("DONE", counts.done),
        ("WITHDRAWN", counts.withdrawn),
    ]
    context = {
        "figures": figures,
        "states": states,
        "state_peak": max(count for _, count in states) or 1,
        "charts": [
            ("executions", "per minute", views.chart(figures.executions_per_minute, "executed")),
            ("errors", "per minute", views.chart(figures.errors_per_minute, "errors")),
            ("model tokens", "per minute", views.chart(figures.tokens_per_minute, "tokens")),
        ],
        "window": window,
        "windows": WINDOWS,
        "refresh_s": REFRESH_S,
    }
    return await render(request, "overview.html", context)


async def keys(request: Request) -> Response:
    """Keys containing the search text (all keys without one), most recently seen first."""
    search = request.query_params.get("q", "")
    found = await service_of(request).store.list_keys(views.key_from_search(search), LIST_LIMIT)
    return await render(request, "keys.html", {"search": search, "keys": found})


async def key_page(request: Request) -> Response:
    """One key: its runs (one page of spans each), open intents, memory slots and errors."""
    key = entity_key(request)
    wanted = number(request, "runs", DEFAULT_RUNS, range(1, MAX_RUNS + 1))
    store = service_of(request).store
    heads = await store.trace_runs(key, wanted)
    open_intents = [
        record
        for state in OPEN_STATES
        for record in await store.search_intents(
            state=state, tool_name=None, entity_key=key, limit=LIST_LIMIT
        )
    ]
    withdrawn = await store.search_intents(
        state=IntentState.WITHDRAWN, tool_name=None, entity_key=key, limit=WITHDRAWN_SHOWN
    )
    errors = await store.list_errors(key, 20)
    runs, limit = [], spans_per_run(len(heads))
    for head in heads:
        events = await run_spans(store, key, head, 1, limit)
        runs.append(await run_in_threadpool(page_of_run, head, heads, events, 1, errors))
    seqs = len({head.seq for head in heads})
    context = {
        "key": key,
        "runs": runs,
        "wanted": wanted,
        "more": min(wanted * 4, MAX_RUNS) if seqs == wanted and wanted < MAX_RUNS else 0,
        "open_intents": open_intents,
        "withdrawn": withdrawn,
        "spans_per_run": limit,
        "slots": memory_slots(await closing_events(store, key)),
        "errors": errors,
    }
    return await render(request, "key.html", context)


async def run_page(request: Request) -> Response:
    """One run of a key, one page of its spans at a time."""
    key = entity_key(request)
    trace_id: str = request.path_params["trace_id"]
    store = service_of(request).store
    head = await store.trace_run(key, trace_id)
    if head is None:
        raise HTTPException(404, "no such run of this key (unknown, or pruned)")
    pages = max(-(-head.spans // SPANS_PER_PAGE), 1)
    page = number(request, "page", 1, range(1, pages + 1))
    events = await run_spans(store, key, head, page)
    errors = [e for e in await store.list_errors(key, LIST_LIMIT) if e.error.trace_id == trace_id]
    run = await run_in_threadpool(page_of_run, head, [head], events, page, errors)
    return await render(request, "run.html", {"key": key, "run": run})


async def intents(request: Request) -> Response:
    """Intents filtered by state, tool and key, newest first."""
    params = request.query_params
    state_name = params.get("state", "")
    state = _STATES.get(state_name)
    tool = params.get("tool", "").strip()
    key_text = params.get("key", "")
    found = await service_of(request).store.search_intents(
        state=state,
        tool_name=tool or None,
        entity_key=views.key_from_search(key_text) if key_text.strip() else None,
        limit=LIST_LIMIT,
    )
    context = {
        "intents": found,
        "states": list(_STATES),
        "state": state_name if state is not None else "",
        "tool": tool,
        "key_search": key_text,
        "limit": LIST_LIMIT,
    }
    return await render(request, "intents.html", context)


@dataclass(frozen=True, slots=True)
class IntentLinks:
    """The intents one intent's page links to: what it undoes or withdraws, what allowed it."""

    compensates: str = ""
    compensated_by: str = ""
    approved_by: str = ""
    """The approval that allowed this tool intent (edited, or gating these same arguments)."""
    allowed: list[str] = field(default_factory=list)
    """The tool intents this approval allowed."""
    withdraws: str = ""
    policy_gate: str = ""
    """The approval an effect policy opened to hold this tool intent (require_approval)."""
    policy_holds: str = ""
    """The tool intent this approval, opened by an effect policy, holds until it is decided."""


def _approved(record: IntentRecord) -> bool:
    """Whether an approval's stored decision approved it."""
    result = record.result
    if result is None or result.status != ToolResult.OK:
        return False
    try:
        decided = json.loads(result.payload)
    except (ValueError, RecursionError):
        return False
    return isinstance(decided, dict) and decided.get("approved") is True


def _allows(approval: IntentRecord, tool: ToolIntent) -> bool:
    """Whether ``approval`` is the approval that allowed ``tool`` to run."""
    asked = approval.intent
    if tool.HasField("edited_from"):
        return tool.edited_from.approval_intent_id == asked.intent_id
    return (
        asked.kind == ToolIntent.APPROVAL
        and asked.seq == tool.seq
        and asked.gated_tool == tool.tool_name
        and asked.args_json == tool.args_json  # the same arguments: the same args digest
        and _approved(approval)
    )


async def intent_links(store: SqlStore, record: IntentRecord) -> IntentLinks:
    """How ``record`` relates to the other intents of its key (among its newest)."""
    intent = record.intent
    neighbours = await store.search_intents(
        state=None, tool_name=None, entity_key=intent.entity_key, limit=LIST_LIMIT
    )
    compensated_by = next(
        (
            n.intent.intent_id
            for n in neighbours
            if n.intent.compensates_intent_id == intent.intent_id
        ),
        "",
    )
    approved_by, allowed, policy_gate = "", [], ""
    if intent.kind == ToolIntent.TOOL:
        approved_by = next(
            (n.intent.intent_id for n in neighbours if _allows(n, intent)),
            intent.edited_from.approval_intent_id,
        )
        held = record.state == IntentState.AWAITING_DECISION
        if held or record.policy_outcome == Outcome.REQUIRE_APPROVAL.value:
            policy_gate = gate_id_for(intent.intent_id)
    elif intent.kind == ToolIntent.APPROVAL:
        allowed = [
            n.intent.intent_id
            for n in neighbours
            if n.intent.kind == ToolIntent.TOOL and _allows(record, n.intent)
        ]
    return IntentLinks(
        compensates=intent.compensates_intent_id,
        compensated_by=compensated_by,
        approved_by=approved_by,
        allowed=allowed,
        withdraws=intent.withdraws_intent_id,
        policy_gate=policy_gate,
        policy_holds=intent.policy_gate_for if intent.kind == ToolIntent.APPROVAL else "",
    )


async def _intent(request: Request) -> IntentRecord:
    record = await service_of(request).store.get_intent(checked_intent_id(request))
    if record is None:
        raise HTTPException(404, "no such intent (unknown, or pruned after its retention)")
    return record


async def intent_page(request: Request) -> Response:
    """One intent: arguments, lifecycle with times, attempts, result or error, related intents."""
    record = await _intent(request)
    links = await intent_links(service_of(request).store, record)
    return await render(request, "intent.html", {"record": record, "links": links})


async def intent_raw(request: Request) -> Response:
    """One of an intent's stored values, byte for byte, as a download."""
    record = await _intent(request)
    result = record.result or ToolResult()
    values = {
        "args": record.intent.args_json.encode(),
        "payload": result.payload,
        "error": result.error_message.encode(),
    }
    what: str = request.path_params["what"]
    if what not in values:
        raise HTTPException(404, f"an intent has no value {what!r}; ask for {', '.join(values)}")
    return raw_download(values[what], f"intent-{record.intent.intent_id}-{what}")


async def policies(request: Request) -> Response:
    """The effect policy in force: file, rules, counters, a refused reload, newest decisions."""
    wanted = number(request, "recent", DEFAULT_DECISIONS, range(1, MAX_DECISIONS + 1))
    policy = await service_of(request).policies(wanted)
    truncated = len(policy.recent) == wanted and wanted < MAX_DECISIONS
    more = min(wanted * 4, MAX_DECISIONS) if truncated else 0
    context = {"policy": policy, "wanted": wanted, "more": more, "when_chars": WHEN_CHARS}
    return await render(request, "policies.html", context)


async def budgets(request: Request) -> Response:
    """Fleet budget windows, newest first: per measure its cap, debited, leased and remaining."""
    wanted = number(request, "windows", DEFAULT_BUDGET_WINDOWS, range(1, MAX_BUDGET_WINDOWS + 1))
    service = service_of(request)
    now_ms = service.clock()
    windows = await service.store.budget_windows(wanted, now_ms)
    truncated = len(windows) == wanted and wanted < MAX_BUDGET_WINDOWS
    context = {
        "rows": [views.budget_row(window, now_ms) for window in windows],
        "wanted": wanted,
        "more": min(wanted * 4, MAX_BUDGET_WINDOWS) if truncated else 0,
    }
    return await render(request, "budgets.html", context)


ROUTES = [
    Route("/", overview, name="overview"),
    Route("/keys", keys, name="keys"),
    Route("/keys/{key_hex}", key_page, name="key"),
    Route("/keys/{key_hex}/runs/{trace_id}", run_page, name="run"),
    Route("/intents", intents, name="intents"),
    Route("/intents/{intent_id}", intent_page, name="intent"),
    Route("/intents/{intent_id}/raw/{what}", intent_raw, name="intent_raw"),
    Route("/policies", policies, name="policies"),
    Route("/budgets", budgets, name="budgets"),
]
