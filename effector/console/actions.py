"""The console's acting pages: the approvals inbox, errors and their re-drive, login and logout.

Every change is a POST whose form passes :func:`~effector.console.security.checked_form`. It
goes through :meth:`EffectorService.decide` or :meth:`EffectorService.publish`, so the console
can do nothing gRPC cannot. Logins and re-drives are logged with the client's address, never the
token; a decision is logged once, by :meth:`EffectorService.decide`.
"""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from beam_agents._protos import (
    MAX_TEXT_FIELD_CHARS,
    AgentEnvelope,
    approval_digest,
)
from effector.console.pages import LIST_LIMIT, checked_intent_id
from effector.console.security import (
    SESSION_COOKIE,
    LoginThrottle,
    Sessions,
    checked_form,
    client_address,
    local_path,
    set_session_cookie,
)
from effector.console.views import raw_download, render, service_of
from effector.observability import display_key
from effector.service import (
    external_event_problem,
)
from effector.store.intents import ErrorRecord, intent_id_problem

_log = logging.getLogger(__name__)

_DECISIONS = {"approve": True, "deny": False}
INBOX_LIMIT = LIST_LIMIT
"""Approvals the inbox shows at most: the oldest, the closest to their deadlines."""


async def approvals(request: Request) -> Response:
    """The inbox: approvals awaiting a decision, oldest first, and the last decision made."""
    store = service_of(request).store
    waiting, pending = await service_of(request).pending_approvals(INBOX_LIMIT)
    decided_id = request.query_params.get("decided", "")
    decided = None
    if decided_id and intent_id_problem(decided_id) is None:
        decided = await store.get_intent(decided_id)
    votes = {
        r.intent.intent_id: await store.approval_votes(r.intent.intent_id)
        for r in waiting
        if r.intent.required_approvals > 1
    }
    context = {
        "waiting": waiting,
        "pending": pending,
        "decided": decided,
        "digest": approval_digest,
        "votes": votes,
    }
    return await render(request, "approvals.html", context)


async def send_decision(request: Request) -> Response:
    """Approve or deny one approval, as ``Decide`` does, recording who decided and why."""
    intent_id = checked_intent_id(request)
    form = await checked_form(request)
    decision, approver = str(form.get("decision", "")), str(form.get("approver", "")).strip()
    identity = request.app.state.sessions.approver_of(request.state.session)
    if identity is not None:  # logged in with a named token: its name is what is recorded
        approver = identity.name
    if decision not in _DECISIONS:
        raise HTTPException(400, "choose approve or deny")
    if not approver:
        raise HTTPException(400, "say who decides: the approver's name is recorded")
    try:
        outcome = await service_of(request).decide(
            intent_id,
            approved=_DECISIONS[decision],
            approver=approver,
            reason=str(form.get("reason", "")),
            args_digest=str(form.get("args_digest", "")),
            edited_args_json=str(form.get("edited_args", "")).strip(),
            identity=identity,
            origin=f"console from {request.client.host if request.client else 'unknown'}",
        )
    except ValueError as refused:
        raise HTTPException(400, str(refused)) from None
    if not outcome.applied:
        raise HTTPException(409, f"the decision was not applied: {outcome.reason}")
    return RedirectResponse(f"/approvals?decided={intent_id}", 303)


async def errors(request: Request) -> Response:
    """Stored ``.errors`` records, newest first."""
    found = await service_of(request).store.list_errors(None, LIST_LIMIT)
    return await render(request, "errors.html", {"errors": found, "limit": LIST_LIMIT})


async def _error(request: Request) -> tuple[ErrorRecord, AgentEnvelope | None, str | None]:
    """The error a path names, its envelope, and why it cannot be re-driven (if it cannot)."""
    error_id: str = request.path_params["error_id"]
    record = await service_of(request).store.get_error(error_id)
    if record is None:
        raise HTTPException(404, "no such error (unknown, or pruned after its retention)")
    if not record.error.envelope:
        return record, None, "it has no envelope: a timer (a deadline), not an input, caused it"
    try:
        envelope = AgentEnvelope.FromString(record.error.envelope)
    except DecodeError:
        return record, None, "its envelope bytes do not parse as an AgentEnvelope"
    problem = external_event_problem(envelope)
    if problem is None and envelope.entity_key != record.error.entity_key:
        # A key_mismatch error, or a forged one: re-driving would publish to a key this page
        # does not name.
        problem = (
            f"names key {display_key(envelope.entity_key)[:64]!r}, not this error's key, so "
            "re-driving it would reach another key"
        )
    return record, envelope, None if problem is None else f"its envelope {problem}"


async def error_page(request: Request) -> Response:
    """One error: reason, detail, traceback, the envelope, and whether it can be re-driven."""
    record, envelope, problem = await _error(request)
    offset = request.query_params.get("offset", "")
    context = {
        "record": record,
        "envelope": envelope,
        "problem": problem,
        "published_at": int(offset) if offset.isascii() and offset.isdigit() else None,
    }
    return await render(request, "error.html", context)


async def error_raw(request: Request) -> Response:
    """One of an error's stored values, byte for byte, as a download."""
    record, envelope, _ = await _error(request)
    values = {
        "detail": record.error.detail.encode(),
        "traceback": record.error.traceback.encode(),
        "envelope": record.error.envelope,
        "external_event": b"" if envelope is None else envelope.external_event,
    }
    what: str = request.path_params["what"]
    if what not in values:
        raise HTTPException(404, f"an error has no value {what!r}; ask for {', '.join(values)}")
    return raw_download(values[what], f"error-{record.error_id}-{what}")


async def confirm_redrive(request: Request) -> Response:
    """Ask before publishing an error's envelope again."""
    record, envelope, problem = await _error(request)
    if problem is not None:
        raise HTTPException(409, f"this error cannot be re-driven: {problem}")
    return await render(request, "redrive.html", {"record": record, "envelope": envelope})


async def redrive(request: Request) -> Response:
    """Claim an error as re-driven, then publish its envelope back (again only if the form says)."""
    form = await checked_form(request)
    record, envelope, problem = await _error(request)
    if envelope is None or problem is not None:
        raise HTTPException(409, f"this error cannot be re-driven: {problem}")
    identity = request.app.state.sessions.approver_of(request.state.session)
    requester = identity.name if identity is not None else str(form.get("requester", "")).strip()
    if not requester or len(requester) > MAX_TEXT_FIELD_CHARS:
        raise HTTPException(400, "say who re-drives, in a few words: the name is logged")
    service = service_of(request)
    again = form.get("again") == "yes"
    if not await service.store.mark_redriven(record.error_id, service.clock(), again=again):
        raise HTTPException(
            409,
            "this error was already re-driven (by another click or tab, or earlier), so nothing "
            "was published; to publish it once more, confirm re-driving it again from its page",
        )
    client = client_address(request)
    try:
        [offset] = await service.publish([envelope])
    except ValueError as refused:
        _log.warning("console: re-drive of error %s refused: %s", record.error_id, refused)
        raise HTTPException(409, f"this error cannot be re-driven: {refused}") from None
    _log.info(
        "console: error %s re-driven%s by %r from %s: its envelope is at offset %d",
        record.error_id,
        " again" if again else "",
        requester,
        client,
        offset,
    )
    return RedirectResponse(f"/errors/{record.error_id}?offset={offset}", 303)


async def login_form(request: Request) -> Response:
    """The login form (straight on to the console when no token is needed)."""
    sessions: Sessions = request.app.state.sessions
    target = local_path(request.query_params.get("next"))
    if not sessions.login_required or request.state.session is not None:
        return RedirectResponse(target, 303)
    return await render(request, "login.html", {"next": target, "failed": False})


async def login(request: Request) -> Response:
    """Start a session when the posted token is the effector's; back off failed logins."""
    sessions: Sessions = request.app.state.sessions
    throttle: LoginThrottle = request.app.state.throttle
    form = await request.form()
    target = local_path(str(form.get("next", "/")))
    if not sessions.login_required:
        return RedirectResponse(target, 303)
    client = client_address(request)
    wait_s = throttle.wait_s(client)
    if wait_s > 0:
        _log.warning("console: login from %s refused unchecked: it failed too often", client)
        context = {"next": target, "failed": False, "wait_s": int(wait_s) + 1}
        answer = await render(request, "login.html", context, 429)
        answer.headers["Retry-After"] = str(context["wait_s"])
        return answer
    holder = sessions.login(str(form.get("token", "")))
    if holder is None:
        failures = throttle.failed(client)
        _log.warning(
            "console: failed login from %s: not the effector's token (%d in a row)",
            client,
            failures,
        )
        return await render(request, "login.html", {"next": target, "failed": True}, 403)
    throttle.succeeded(client)
    _log.info("console: login from %s", client)
    response = RedirectResponse(target, 303)
    set_session_cookie(request, response, sessions.new(holder.name))
    return response


async def logout(request: Request) -> Response:
    """End the session, on the server too: its cookie no longer opens the console."""
    await checked_form(request)
    sessions: Sessions = request.app.state.sessions
    session: str | None = request.state.session
    if session is not None and sessions.login_required:
        sessions.revoke(session)
        _log.info("console: logout from %s", client_address(request))
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


ROUTES = [
    Route("/approvals", approvals, name="approvals"),
    Route("/approvals/{intent_id}", send_decision, methods=["POST"], name="decide"),
    Route("/errors", errors, name="errors"),
    Route("/errors/{error_id}", error_page, name="error"),
    Route("/errors/{error_id}/raw/{what}", error_raw, name="error_raw"),
    Route("/errors/{error_id}/redrive", confirm_redrive, name="confirm_redrive"),
    Route("/errors/{error_id}/redrive", redrive, methods=["POST"], name="redrive"),
    Route("/login", login_form, name="login_form"),
    Route("/login", login, methods=["POST"], name="login"),
    Route("/logout", logout, methods=["POST"], name="logout"),
]
