"""The console's reading pages (GET only): overview, keys, one key's runs, intents, one intent."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import effector.console.views as views
from beam_agents._protos import IntentState
from effector.console.runs import build_runs, memory_slots
from effector.console.views import render, service_of
from effector.store.intents import intent_id_problem

WINDOWS = {15: "15 min", 60: "1 h", 360: "6 h", 1440: "24 h"}
"""The overview's windows, in minutes; it shows the last hour unless asked otherwise."""
REFRESH_S = 10
DEFAULT_RUNS = 50
MAX_RUNS = 1_000
"""Runs on a key's page: the newest 50 unless more are asked for, at most 1,000."""
LIST_LIMIT = 200
"""Rows on the keys, intents and errors lists."""
OPEN_STATES = (
    IntentState.AWAITING_DECISION,
    IntentState.PENDING,
    IntentState.RUNNING,
    IntentState.IN_DOUBT,
)
_STATES = {IntentState.Name(state): state for state in (*OPEN_STATES, IntentState.DONE)}


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
    """One key: its runs with their waterfalls, open intents, memory slots and errors."""
    key = entity_key(request)
    wanted = number(request, "runs", DEFAULT_RUNS, range(1, MAX_RUNS + 1))
    store = service_of(request).store
    events = await store.traces_for_key(key, wanted)
    open_intents = [
        record
        for state in OPEN_STATES
        for record in await store.search_intents(
            state=state, tool_name=None, entity_key=key, limit=LIST_LIMIT
        )
    ]
    errors = await store.list_errors(key, 20)
    runs = await run_in_threadpool(build_runs, events)
    context = {
        "key": key,
        "runs": runs,
        "wanted": wanted,
        "more": min(wanted * 4, MAX_RUNS) if len(runs) == wanted and wanted < MAX_RUNS else 0,
        "open_intents": open_intents,
        "slots": memory_slots(events),
        "errors": errors,
    }
    return await render(request, "key.html", context)


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


async def intent_page(request: Request) -> Response:
    """One intent: arguments, lifecycle with times, attempts, and result or error."""
    record = await service_of(request).store.get_intent(checked_intent_id(request))
    if record is None:
        raise HTTPException(404, "no such intent (unknown, or pruned after its retention)")
    return await render(request, "intent.html", {"record": record})


ROUTES = [
    Route("/", overview, name="overview"),
    Route("/keys", keys, name="keys"),
    Route("/keys/{key_hex}", key_page, name="key"),
    Route("/intents", intents, name="intents"),
    Route("/intents/{intent_id}", intent_page, name="intent"),
]
