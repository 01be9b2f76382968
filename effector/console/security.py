"""The console's guard: sessions, the token login, CSRF, same-origin checks and headers.

A session cookie ``ISSUED.NONCE.MAC`` is keyed from the token and a per-process salt: it never
holds the token and ends with the process. Every POST must come from the console's origin and
carry the CSRF token bound to its session. Failed logins back off per client.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from urllib.parse import quote, urlsplit

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from effector.service import Approver, Tokens, is_loopback_host

SESSION_COOKIE = "beam_agents_console"
CSRF_FIELD = "csrf_token"
SESSION_LIFETIME_S = 12 * 3600
"""How long a session lasts after the login (or, without a token, after the first visit)."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
        "object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
PUBLIC_PATHS = ("/login", "/static/")
"""What answers without a session: the login form and the style sheet."""


class Sessions:
    """Mints, checks and revokes session cookies and the CSRF tokens bound to them."""

    def __init__(
        self,
        token: str | None,
        clock: Callable[[], float] = time.time,
        *,
        tokens: Tokens | None = None,
    ) -> None:
        self._tokens = tokens if tokens is not None else Tokens.single(token) if token else None
        token = self._tokens.primary if self._tokens is not None else None
        self._token = token
        salt = secrets.token_bytes(32)
        self._key = hmac.digest(salt, token.encode(), "sha256") if token else salt
        self._clock = clock
        self._revoked: dict[str, int] = {}
        """Nonces of sessions logged out, with when they were issued (kept until they expire)."""

    @property
    def login_required(self) -> bool:
        """Whether a session starts only with the token (the effector has one)."""
        return self._token is not None

    def _mac(self, purpose: str, text: str) -> str:
        return hmac.new(self._key, f"{purpose}|{text}".encode(), hashlib.sha256).hexdigest()

    def new(self, approver: str = "") -> str:
        """A fresh session cookie value, for ``approver`` (the name of the token logged in)."""
        issued, nonce, holder = (
            str(int(self._clock())),
            secrets.token_hex(16),
            approver.encode().hex(),
        )
        signed = f"{issued}.{nonce}.{holder}"
        return f"{signed}.{self._mac('session', signed)}"

    def is_valid(self, value: str | None) -> bool:
        """Whether ``value`` is a session this console minted, not run out nor logged out."""
        if not value or value.count(".") != 3:
            return False
        issued, nonce, holder, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac("session", f"{issued}.{nonce}.{holder}")):
            return False
        age = self._clock() - int(issued) if issued.isascii() and issued.isdigit() else -1
        return 0 <= age < SESSION_LIFETIME_S and nonce not in self._revoked

    def approver_of(self, value: str | None) -> Approver | None:
        """The named token a valid session logged in with (``None``: unnamed, or none)."""
        if self._tokens is None or not self._tokens.named or not self.is_valid(value):
            return None
        assert value is not None
        name = bytes.fromhex(value.split(".")[2]).decode()
        return next((a for a in self._tokens.approvers if a.name and a.name == name), None)

    def revoke(self, value: str) -> None:
        """End a valid session now: it is refused from then on, whoever holds the cookie."""
        if not self.is_valid(value):
            return
        issued, nonce, _, _ = value.split(".")
        expired = int(self._clock()) - SESSION_LIFETIME_S
        for old in [old for old, when in self._revoked.items() if when <= expired]:
            del self._revoked[old]
        self._revoked[nonce] = int(issued)

    def csrf_token(self, session: str) -> str:
        """The CSRF token of ``session``: what its forms carry in the hidden field."""
        return self._mac("csrf", session)

    def csrf_matches(self, session: str, supplied: str) -> bool:
        """Whether ``supplied`` is the session's CSRF token (constant time)."""
        return hmac.compare_digest(supplied.encode(), self.csrf_token(session).encode())

    def login(self, supplied: str) -> Approver | None:
        """Whose token ``supplied`` is, any of the effector's (constant time); else ``None``."""
        if self._tokens is None:
            return None
        return self._tokens.identify(supplied.strip())


def is_cross_site(request: Request) -> bool:
    """Whether a request comes from another site, by ``Sec-Fetch-Site`` or ``Origin``."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return False
    return urlsplit(origin).netloc != request.headers.get("host", "")


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this console, else ``/`` (no open redirects)."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def client_address(request: Request) -> str:
    """The address the request came from (the peer's: proxy headers are not trusted)."""
    return request.client.host if request.client is not None else "an unknown address"


def set_session_cookie(request: Request, response: Response, value: str) -> None:
    """Send the session cookie: HttpOnly, SameSite=Strict, Secure over HTTPS, for all paths."""
    secure = bool(request.app.state.https) or request.url.scheme == "https"
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=SESSION_LIFETIME_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )


class ConsoleGuard(BaseHTTPMiddleware):
    """Refuses what lacks a session or comes from another site; adds the security headers."""

    def __init__(self, app: ASGIApp, *, sessions: Sessions, loopback_only: bool = False) -> None:
        super().__init__(app)
        self._sessions = sessions
        self._loopback_only = loopback_only

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Check the request, run it, and add the headers to whatever answers it."""
        response = await self._checked(request, call_next)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _checked(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if self._loopback_only and not is_loopback_host(request.url.hostname or ""):
            return PlainTextResponse("this console answers only on a loopback address", 421)
        if request.method not in ("GET", "HEAD", "POST"):
            return PlainTextResponse("method not allowed", 405)
        if request.method == "POST" and is_cross_site(request):
            return PlainTextResponse("cross-site request refused", 403)
        cookie = request.cookies.get(SESSION_COOKIE)
        session = cookie if self._sessions.is_valid(cookie) else None
        fresh = None
        if session is None and not self._sessions.login_required:
            session = fresh = self._sessions.new()
        request.state.session = session
        public = request.url.path.startswith(PUBLIC_PATHS)
        if session is None and not public:
            if request.method == "POST":
                return PlainTextResponse("log in first: this console needs the token", 403)
            wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(wanted, safe='')}", 303)
        response = await call_next(request)
        if fresh is not None:
            set_session_cookie(request, response, fresh)
        return response


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token matches the session's; 403 otherwise."""
    form = await request.form()
    supplied = form.get(CSRF_FIELD)
    session: str | None = request.state.session
    sessions: Sessions = request.app.state.sessions
    if session is None or not isinstance(supplied, str):
        raise HTTPException(403, "missing CSRF token: reload the page and try again")
    if not sessions.csrf_matches(session, supplied):
        raise HTTPException(403, "CSRF token does not match: reload the page and try again")
    return form


FREE_FAILURES = 3
"""Failed logins a client may make before it has to wait."""
MAX_WAIT_S = 60.0
FORGET_AFTER_S = 15 * 60.0
"""A client's failures are forgotten this long after its last one."""
MAX_CLIENTS = 10_000
"""Clients remembered at most (the longest-quiet are forgotten first)."""


class LoginThrottle:
    """Counts failed logins per client and says how long each must wait before the next."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}
        """Client address: failures in a row and when the last was; oldest last failure first."""

    def wait_s(self, client: str) -> float:
        """How long ``client`` must wait before its next login is checked; 0 for now."""
        count, last = self._failures.get(client, (0, 0.0))
        if count < FREE_FAILURES:
            return 0.0
        delay = min(MAX_WAIT_S, 2.0 ** (count - FREE_FAILURES))
        return max(0.0, last + delay - self._clock())

    def failed(self, client: str) -> int:
        """Count a failed login of ``client``; returns its failures in a row."""
        now = self._clock()
        count = self._failures.pop(client, (0, 0.0))[0] + 1
        self._failures[client] = (count, now)
        for quiet, (_, last) in list(self._failures.items()):
            if last > now - FORGET_AFTER_S and len(self._failures) <= MAX_CLIENTS:
                break
            del self._failures[quiet]
        return count

    def succeeded(self, client: str) -> None:
        """``client`` gave the right token: forget its failures."""
        self._failures.pop(client, None)
