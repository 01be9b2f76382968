"""The key's ADK session in working memory: ``MemorySessionService`` and its bounds.

One key is one ADK session. Its events and state are kept as the session's JSON in one memory
slot, loaded at the start of every activation and written back only when the run completes, so
every activation of a run re-walks from the same committed session. Written sessions are
trimmed to the latest whole turns that fit ``SessionLimits``; a session still over
``hard_max_bytes`` after trimming raises :class:`AdkSessionTooLargeError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Protocol

from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session

from beam_agents.adapters._adk_model import filled
from beam_agents.adapters._bridge import MEMORY_CAP_BYTES

__all__ = [
    "SESSION_SLOT",
    "ActivationSessionService",
    "AdkSessionTooLargeError",
    "MemorySessionService",
    "SessionLimits",
    "bind_sessions",
    "bound_sessions",
    "load_session",
    "release_sessions",
    "save_session",
    "trim_events",
]

SESSION_SLOT = "beam_agents.adk.session.v1"
"""The working-memory slot holding the key's ADK session (its JSON)."""


class Slots(Protocol):
    """The working memory's slots, as far as the session needs them (``ctx.memory``)."""

    def get(self, key: str) -> bytes | None:
        """The value in slot ``key``, or ``None``."""

    def set(self, key: str, value: bytes) -> None:
        """Put ``value`` in slot ``key``."""


class AdkSessionTooLargeError(RuntimeError):
    """The key's ADK session is over ``SessionLimits.hard_max_bytes`` even after trimming."""


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How much of a key's ADK session is kept between runs.

    A completed run's session keeps the latest whole turns (a turn starts with a user message,
    so function calls and their responses stay together) within ``max_events`` events and
    ``max_bytes`` of JSON; the latest turn is always kept. A session that is still over
    ``hard_max_bytes`` fails the run with :class:`AdkSessionTooLargeError`.
    """

    max_events: int = 200
    max_bytes: int = 256 * 1024
    hard_max_bytes: int = 768 * 1024

    def __post_init__(self) -> None:
        for name in ("max_events", "max_bytes", "hard_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SessionLimits.{name} must be a positive int, got {value!r}")
        if self.hard_max_bytes > MEMORY_CAP_BYTES:
            raise ValueError(
                f"SessionLimits.hard_max_bytes must be at most the {MEMORY_CAP_BYTES}-byte "
                f"working-memory cap, got {self.hard_max_bytes}"
            )


class MemorySessionService(BaseSessionService):
    """An ADK session service over one activation's copy of the key's session.

    It holds the sessions of this activation only (no I/O); the adapter reads the session in
    from working memory and writes it back when the run completes.
    """

    def __init__(self, sessions: list[Session] | None = None) -> None:
        self._sessions: dict[tuple[str, str, str], Session] = {}
        for session in sessions or ():
            self._sessions[(session.app_name, session.user_id, session.id)] = session

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new, empty session (``session_id`` is required: one key is one session)."""
        if not session_id:
            raise ValueError("MemorySessionService needs a session_id (one key is one session)")
        session = Session(id=session_id, app_name=app_name, user_id=user_id, state=state or {})
        self._sessions[(app_name, user_id, session_id)] = session
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The stored session itself (events appended to it are this activation's)."""
        session = self._sessions.get((app_name, user_id, session_id))
        if session is None or config is None:
            return session
        events = session.events
        if config.after_timestamp is not None:
            events = [event for event in events if event.timestamp >= config.after_timestamp]
        if config.num_recent_events is not None:
            keep = config.num_recent_events
            events = events[len(events) - keep :] if keep else []
        return session.model_copy(update={"events": list(events)})

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions held, without events or state."""
        return ListSessionsResponse(
            sessions=[
                Session(id=s.id, app_name=s.app_name, user_id=s.user_id)
                for (app, user, _), s in self._sessions.items()
                if app == app_name and (user_id is None or user == user_id)
            ]
        )

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Forget the session (the next run starts a new one)."""
        self._sessions.pop((app_name, user_id, session_id), None)

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append to ``session`` and, for a filtered copy, to the stored session too."""
        event = await super().append_event(session, event)
        stored = self._sessions.get((session.app_name, session.user_id, session.id))
        if stored is not None and stored is not session and not event.partial:
            self._commit_event_to_session(stored, event)
        return event


_BOUND: ContextVar[MemorySessionService | None] = ContextVar(
    "beam_agents_adk_sessions", default=None
)


class ActivationSessionService(BaseSessionService):
    """The session service of a ``Runner`` shared by activations: each one's own sessions.

    Every call goes to the ``MemorySessionService`` the running activation bound with
    :func:`bound_sessions` (a context variable, so concurrent activations, each in its own
    asyncio task, never see each other's sessions), so one ``Runner`` serves them all.
    """

    @staticmethod
    def bound() -> MemorySessionService:
        """The running activation's session service."""
        service = _BOUND.get()
        if service is None:
            raise RuntimeError("the ADK adapter's session service was used outside an activation")
        return service

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """``create_session`` of the activation's service."""
        return await self.bound().create_session(
            app_name=app_name, user_id=user_id, state=state, session_id=session_id
        )

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """``get_session`` of the activation's service."""
        return await self.bound().get_session(
            app_name=app_name, user_id=user_id, session_id=session_id, config=config
        )

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """``list_sessions`` of the activation's service."""
        return await self.bound().list_sessions(app_name=app_name, user_id=user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """``delete_session`` of the activation's service."""
        await self.bound().delete_session(app_name=app_name, user_id=user_id, session_id=session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """``get_user_state`` of the activation's service."""
        return await self.bound().get_user_state(app_name=app_name, user_id=user_id)

    async def append_event(self, session: Session, event: Event) -> Event:
        """``append_event`` of the activation's service."""
        return await self.bound().append_event(session, event)

    async def flush(self) -> None:
        """``flush`` of the activation's service (nothing, outside an activation)."""
        service = _BOUND.get()
        if service is not None:
            await service.flush()


def bind_sessions(service: MemorySessionService) -> Token[MemorySessionService | None]:
    """Make ``service`` the one :class:`ActivationSessionService` calls go to, until released.

    :func:`bound_sessions` without the context manager: pass the token to
    :func:`release_sessions` (in a ``finally``).
    """
    return _BOUND.set(service)


def release_sessions(token: Token[MemorySessionService | None]) -> None:
    """Undo the :func:`bind_sessions` that returned ``token``."""
    _BOUND.reset(token)


@contextmanager
def bound_sessions(service: MemorySessionService) -> Iterator[MemorySessionService]:
    """Make ``service`` the one :class:`ActivationSessionService` calls go to, in the block."""
    token = _BOUND.set(service)
    try:
        yield service
    finally:
        _BOUND.reset(token)


_EMPTY_SESSION = Session(id="", app_name="", user_id="")
_NEW_SESSION_FIELDS = ("id", "app_name", "user_id")


def load_session(memory: Slots, *, app_name: str, user_id: str) -> Session:
    """The key's committed session, or a new empty one."""
    blob = memory.get(SESSION_SLOT)
    if blob is None:
        if type(user_id) is not str or type(app_name) is not str:
            return Session(id=user_id, app_name=app_name, user_id=user_id)
        # Session(id=..., app_name=..., user_id=...) without re-validating two str fields.
        update = {
            "id": user_id,
            "app_name": app_name,
            "user_id": user_id,
            "state": {},
            "events": [],
        }
        return filled(_EMPTY_SESSION, update, _NEW_SESSION_FIELDS)
    session = Session.model_validate_json(blob)
    if session.app_name != app_name:
        session = session.model_copy(update={"app_name": app_name})
    return session


def save_session(memory: Slots, session: Session, limits: SessionLimits) -> None:
    """Trim ``session`` to ``limits`` and stage it in working memory."""
    blob = _untrimmed_blob(session, limits)
    if blob is None:
        kept = trim_events(session.events, limits)
        trimmed = session.model_copy(update={"events": kept})
        blob = trimmed.model_dump_json(exclude_none=True).encode("utf-8")
    if len(blob) > limits.hard_max_bytes:
        raise AdkSessionTooLargeError(
            f"the ADK session of this key is {len(blob)} bytes after trimming to its latest "
            f"turn, over SessionLimits.hard_max_bytes={limits.hard_max_bytes}; keep large data "
            "out of the conversation and session state"
        )
    memory.set(SESSION_SLOT, blob)


def _untrimmed_blob(session: Session, limits: SessionLimits) -> bytes | None:
    """The whole session's JSON when :func:`trim_events` would keep every event, else ``None``.

    The session's JSON holds each event's JSON (as ``Event``: hence the exact-type check), so
    when it is within ``max_bytes`` and ``max_events``, so are the events: one encoding, and
    none of the per-event sizing trimming needs.
    """
    events = session.events
    if len(events) > limits.max_events:
        return None
    for event in events:
        if type(event) is not Event:
            return None
    blob = session.model_dump_json(exclude_none=True).encode("utf-8")
    return blob if len(blob) <= limits.max_bytes else None


def trim_events(events: list[Event], limits: SessionLimits) -> list[Event]:
    """The latest whole turns of ``events`` within ``limits`` (the latest turn always kept)."""
    if not events:
        return []
    starts = [index for index, event in enumerate(events) if _starts_turn(event)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    sizes = [len(event.model_dump_json(exclude_none=True)) + 1 for event in events]
    suffix_bytes = [0] * (len(events) + 1)
    for index in range(len(events) - 1, -1, -1):
        suffix_bytes[index] = suffix_bytes[index + 1] + sizes[index]
    for start in starts:
        if len(events) - start <= limits.max_events and suffix_bytes[start] <= limits.max_bytes:
            return list(events[start:])
    return list(events[starts[-1] :])


def _starts_turn(event: Event) -> bool:
    """A user message (not a function response): no call or response pairs across it."""
    if event.author != "user" or event.content is None:
        return False
    return not event.get_function_responses() and not event.get_function_calls()
