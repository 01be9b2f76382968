"""The console's Starlette application: its routes, guard, static files and error pages."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from effector.console.actions import ROUTES as ACTION_ROUTES
from effector.console.pages import ROUTES as PAGE_ROUTES
from effector.console.security import ConsoleGuard, LoginThrottle, Sessions
from effector.console.views import environment, render
from effector.service import EffectorService, Tokens
from effector.store.errors import StoreError

STATIC = Path(__file__).resolve().parent / "static"

_log = logging.getLogger(__name__)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return await render(request, "problem.html", {"problem": exc.detail}, exc.status_code)


async def _store_error(request: Request, exc: Exception) -> Response:
    _log.warning(
        "console %s %s answered 503, the store failed: %s: %s",
        request.method,
        request.url.path,
        type(exc).__name__,
        exc,
    )
    problem = "the effector's store is unavailable; try again shortly"
    return await render(request, "problem.html", {"problem": problem}, 503)


def create_app(
    service: EffectorService,
    *,
    token: str | None,
    tokens: Tokens | None = None,
    loopback_only: bool = False,
    https: bool = False,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The console over ``service``; with ``token`` (or any named ``tokens``), pages need a login.

    ``loopback_only`` refuses requests addressed to any other host name (DNS rebinding).
    ``https`` marks the session cookie Secure.
    """
    sessions = Sessions(token, clock, tokens=tokens)
    routes: list[BaseRoute] = [
        *PAGE_ROUTES,
        *ACTION_ROUTES,
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(ConsoleGuard, sessions=sessions, loopback_only=loopback_only)],
        exception_handlers={HTTPException: _http_error, StoreError: _store_error},
    )
    app.state.service = service
    app.state.sessions = sessions
    app.state.throttle = LoginThrottle(clock)
    app.state.https = https
    app.state.templates = environment()
    return app
