"""How the console shows things: keys, times, durations, JSON, bar charts, and the templates.

Formatting is pure (the current time is passed in); templates never format values themselves.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from beam_agents._protos import BudgetWindow, IntentState, ToolIntent, ToolResult
from effector.console.security import CSRF_FIELD, Sessions
from effector.observability import display_key
from effector.readable import (
    SHOWN_CHARS,
    cut,
    enum_name,
    hidden_characters,
    moment,
    out_of_range,
    parsed_json,
    visible,
)
from effector.service import EffectorService
from effector.store.intents import DEFAULT_RULE, IntentRecord, expiry_deadline_ms


def key_from_hex(text: str) -> bytes | None:
    """The key a URL carries as hex, or ``None`` if ``text`` is not hex."""
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def key_from_search(text: str) -> bytes:
    """What a search box means: ``0x`` and hex digits are those bytes, anything else UTF-8."""
    stripped = text.strip()
    if stripped.startswith("0x"):
        as_hex = key_from_hex(stripped[2:])
        if as_hex is not None:
            return as_hex
    return stripped.encode("utf-8")


def when(ms: int | None) -> str:
    """Epoch milliseconds as ``YYYY-MM-DD HH:MM:SS.mmm UTC``; ``-`` for none or 0.

    A time outside years 1-9999 is shown as ``out of range (N ms)``.
    """
    if not ms:
        return "-"
    return instant(ms)


def instant(ms: int) -> str:
    """Epoch milliseconds as :func:`when` shows them, 0 included (the epoch: a window's start)."""
    found = moment(ms)
    if found is None:
        return out_of_range(ms)
    return found.strftime("%Y-%m-%d %H:%M:%S.") + f"{found.microsecond // 1000:03d} UTC"


def duration(ms: float | None) -> str:
    """A duration in the largest unit that keeps it readable: ``850 µs``, ``12 ms``, ``3.4 s``."""
    if ms is None or math.isnan(ms):
        return "-"
    if round(ms * 1000) < 1000:
        return f"{ms * 1000:.0f} µs"
    if ms < 1_000:
        return f"{ms:.3g} ms" if ms < 10 else f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7_200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.0f} d"


def age(ms: int | None, now_ms: int) -> str:
    """How long ago ``ms`` was (``3 min ago``), or how far ahead (``in 20 s``)."""
    if not ms:
        return "-"
    if moment(ms) is None:
        return "out of range"
    delta = now_ms - ms
    return f"{duration(abs(delta))} ago" if delta >= 0 else f"in {duration(-delta)}"


@dataclass(frozen=True, slots=True)
class Shown:
    """A stored value as a page shows it: bounded, its hiding characters marked and named."""

    text: str
    left_out: int = 0
    """Characters not shown (the raw bytes have them all)."""
    hidden: list[str] = field(default_factory=list)
    """The hiding characters it holds, named (``U+202E RIGHT-TO-LEFT OVERRIDE``)."""

    @property
    def html(self) -> Markup:
        """The text escaped for a page, whole (bounded already, so no field cut applies)."""
        return escape(self.text)


def pretty_json(value: str | bytes) -> Shown:
    """JSON indented for reading when small and shallow enough; else its text, cut to a bound.

    Bytes that are not UTF-8 are shown as ``0x`` and hex.
    """
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            shown, left_out = cut("0x" + value[: SHOWN_CHARS // 2].hex())
            return Shown(shown, left_out + 2 * max(len(value) - SHOWN_CHARS // 2, 0))
    else:
        text = value
    if not text:
        return Shown("-")
    parsed = parsed_json(text)
    if parsed is not None or text.strip() == "null":
        text = json.dumps(parsed, indent=2, sort_keys=True, ensure_ascii=False)
    return plain(text)


def plain(text: str, limit: int = SHOWN_CHARS) -> Shown:
    """Text as a page shows it, cut to ``limit``, its hiding characters marked and named."""
    shown, left_out = cut(text or "-", limit)
    return Shown(visible(shown), left_out, hidden_characters(shown))


def deadline(record: IntentRecord) -> int:
    """When the effector expires the intent (its wall clock, epoch ms); 0 for never."""
    return expiry_deadline_ms(record.intent, record.received_at_ms)


def decision(payload: bytes) -> str:
    """A decided approval's stored result as a sentence: ``approved by dana: fine``."""
    try:
        decided = json.loads(payload)
        verdict = "approved" if decided["approved"] else "denied"
        text = f"{verdict} by {decided.get('approver') or 'someone unnamed'}"
    except (ValueError, TypeError, KeyError, RecursionError):
        return pretty_json(payload).text
    return f"{text}: {decided['reason']}" if decided.get("reason") else text


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar of a chart, in the chart's 0-100 coordinates (``x`` and ``width`` per cent)."""

    x: float
    width: float
    height: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """A small bar chart drawn by the server as SVG: one bar per point, scaled to the peak."""

    bars: list[Bar]
    peak: int
    total: int
    latest: int


def chart(points: Sequence[tuple[int, int]], unit: str) -> Chart:
    """Bars for ``(minute start ms, value)`` points, oldest first; labels name minute and value."""
    peak = max((value for _, value in points), default=0)
    count = max(len(points), 1)
    slot = 100 / count
    bars = [
        Bar(
            x=index * slot,
            width=slot * 0.8,
            height=0.0 if peak == 0 else max(value / peak * 100, 2.0 if value else 0.0),
            label=f"{when(start)[11:16]} UTC: {value} {unit}",
        )
        for index, (start, value) in enumerate(points)
    ]
    latest = points[-1][1] if points else 0
    return Chart(bars=bars, peak=peak, total=sum(value for _, value in points), latest=latest)


LEDGER_CHARS = 512
"""The most characters of a budget ledger's name the budgets page shows (the API's bound)."""


def dollars(micros: int) -> str:
    """Micro-dollars as dollars, exactly, to the cent at least: ``$1.50``, ``$0.000125``."""
    whole, fraction = divmod(abs(micros), 1_000_000)
    digits = f"{fraction:06d}".rstrip("0").ljust(2, "0")
    return f"{'-' if micros < 0 else ''}${whole:,}.{digits}"


_SPANS = ((86_400_000, "d"), (3_600_000, "h"), (60_000, "min"), (1_000, "s"))


def span(ms: int) -> str:
    """A window's length exactly, in the largest whole unit: ``1 d``, ``90 min``, ``1,500 ms``."""
    if ms <= 0:
        return "-"
    unit_ms, unit = next(((size, name) for size, name in _SPANS if ms % size == 0), (1, "ms"))
    return f"{ms // unit_ms:,} {unit}"


def share(part: int, whole: int) -> float:
    """``part`` as per cent of ``whole``, from 0 to 100 (0 unless both are positive)."""
    if part <= 0 or whole <= 0:
        return 0.0
    return round(min(part / whole * 100, 100.0), 2)


@dataclass(frozen=True, slots=True)
class Measure:
    """One measure of a budget window (tokens, or cost) as the budgets page shows it."""

    name: str
    capped: bool
    """Whether the window has a cap on it (a cap of 0 is none)."""
    cap: str
    debited: str
    leased: str
    """Held by live leases and not debited yet."""
    remaining: str
    """The cap less debited and leased, never below 0."""
    over: str
    """How far debited and leased exceed the cap; empty when they do not."""
    debited_share: float
    leased_share: float
    remaining_share: float
    """Per cent of the cap each part of the bar takes: debited, then leased, then remaining."""

    @property
    def remaining_x(self) -> float:
        """Where the bar's remaining part begins (per cent of the cap)."""
        return round(self.debited_share + self.leased_share, 2)

    @property
    def label(self) -> str:
        """What the bar shows, in words."""
        return (
            f"debited {self.debited_share:g}%, leased {self.leased_share:g}%, "
            f"remaining {self.remaining_share:g}% of the cap"
        )


def measure(name: str, cap: int, debited: int, leased: int, micros: bool = False) -> Measure:
    """One measure of a window; ``micros``: amounts are micro-dollars, shown as dollars."""
    shown = dollars if micros else (lambda amount: f"{amount:,}")
    remaining = max(cap - debited - leased, 0)
    debited_share = share(debited, cap)
    leased_share = min(share(leased, cap), round(100 - debited_share, 2))
    remaining_share = min(share(remaining, cap), round(100 - debited_share - leased_share, 2))
    return Measure(
        name=name,
        capped=cap != 0,
        cap=shown(cap),
        debited=shown(debited),
        leased=shown(leased),
        remaining=shown(remaining),
        over=shown(debited + leased - cap) if cap and debited + leased > cap else "",
        debited_share=debited_share,
        leased_share=leased_share,
        remaining_share=max(remaining_share, 0.0),
    )


@dataclass(frozen=True, slots=True)
class BudgetRow:
    """One fleet budget window as the budgets page shows it."""

    ledger: Shown
    start_ms: int
    start: str
    length: str
    state: str
    """Where the effector's clock is: before the window, in it, or past it."""
    tokens: Measure
    cost: Measure
    requests: Measure
    live_leases: int
    debits: int


def window_state(start_ms: int, length_ms: int, now_ms: int) -> str:
    """Whether a window has begun, is current or has ended, and when, as the clock reads."""

    def at(ms: int) -> str:
        return f" {age(ms, now_ms)}" if ms and moment(ms) is not None else ""

    if now_ms < start_ms:
        return f"not begun, begins{at(start_ms)}" if at(start_ms) else "not begun"
    if length_ms <= 0:
        return "length unknown: only debits recorded, no lease"
    end_ms = start_ms + length_ms
    if now_ms >= end_ms:
        return f"ended{at(end_ms)}"
    return f"current, ends{at(end_ms)}" if at(end_ms) else "current"


def budget_row(window: BudgetWindow, now_ms: int) -> BudgetRow:
    """A window's row: its ledger, times and its three measures, each against its cap."""
    return BudgetRow(
        ledger=plain(window.ledger, LEDGER_CHARS),
        start_ms=window.window_start_ms,
        start=instant(window.window_start_ms),
        length=span(window.window_ms),
        state=window_state(window.window_start_ms, window.window_ms, now_ms),
        tokens=measure("tokens", window.cap_tokens, window.debited_tokens, window.leased_tokens),
        cost=measure(
            "cost",
            window.cap_cost_micros,
            window.debited_cost_micros,
            window.leased_cost_micros,
            micros=True,
        ),
        requests=measure(
            "requests", window.cap_requests, window.debited_requests, window.leased_requests
        ),
        live_leases=window.live_leases,
        debits=window.debits,
    )


TEMPLATES = Path(__file__).resolve().parent / "templates"


FIELD_CHARS = 1_000
"""The most characters of one field (a reason, a tool's name) a page prints; values are Shown."""


def readable(value: Any) -> Any:
    """What every ``{{ }}`` of a template prints: text cut to a field, hiding characters marked."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    shown, left_out = cut(value, FIELD_CHARS)
    shown = visible(shown)
    return f"{shown}… ({left_out} more characters)" if left_out else shown


def environment() -> jinja2.Environment:
    """The templates, with autoescaping on, strict undefined names and the view filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=readable,
    )
    env.filters.update(
        when=when,
        duration=duration,
        key_text=display_key,
        hex=lambda value: Markup(value.hex()),  # hex digits only: safe, and never cut
        pretty_json=pretty_json,
        plain=plain,
        state_name=functools.partial(enum_name, IntentState),
        status_name=functools.partial(enum_name, ToolResult.Status),
        kind_name=functools.partial(enum_name, ToolIntent.Kind),
        decision=decision,
    )
    env.globals.update(age=age, deadline=deadline, csrf_field=CSRF_FIELD, default_rule=DEFAULT_RULE)
    return env


def service_of(request: Request) -> EffectorService:
    """The effector service the console acts through."""
    service: EffectorService = request.app.state.service
    return service


async def render(
    request: Request, template: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """Render ``template`` with ``context`` and what every page needs (CSRF token, clock)."""
    sessions: Sessions = request.app.state.sessions
    session: str | None = getattr(request.state, "session", None)
    page = {
        "request": request,
        "csrf_token": sessions.csrf_token(session) if session else "",
        "login_required": sessions.login_required,
        "signed_in": session is not None,
        "identity": sessions.approver_of(session),
        "now_ms": service_of(request).clock(),
        **context,
    }
    templates: jinja2.Environment = request.app.state.templates
    html = await run_in_threadpool(templates.get_template(template).render, page)
    return HTMLResponse(html, status_code)


def raw_download(value: bytes, name: str) -> Response:
    """``value`` byte for byte, as a file to save (never rendered by the browser)."""
    return Response(
        value,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{name}.bin"'},
    )
