"""Rendering the console's pages: the Jinja2 environment and what every page receives.

Templates are Jinja2 with autoescaping on and strict undefined names; :func:`render` adds the
session's CSRF token and the effector's clock to every page and renders it off the event loop,
which the gRPC server shares. The filters are the formatting helpers of :mod:`views`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse

import effector.console.views as views
from beam_agents._protos import IntentState, ToolIntent, ToolResult
from effector.console.security import CSRF_FIELD, Sessions
from effector.service import EffectorService

TEMPLATES = Path(__file__).resolve().parent / "templates"


def environment() -> jinja2.Environment:
    """The templates, with autoescaping on, strict undefined names and the view filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=views.when,
        duration=views.duration,
        key_text=views.key_text,
        hex=bytes.hex,
        pretty_json=views.pretty_json,
        state_name=IntentState.Name,
        status_name=ToolResult.Status.Name,
        kind_name=ToolIntent.Kind.Name,
        decision=views.decision,
    )
    env.globals.update(age=views.age, deadline=views.deadline, csrf_field=CSRF_FIELD)
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
        "now_ms": service_of(request).clock(),
        **context,
    }
    templates: jinja2.Environment = request.app.state.templates
    html = await run_in_threadpool(templates.get_template(template).render, page)
    return HTMLResponse(html, status_code)
