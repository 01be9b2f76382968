"""Google ADK agents as ``RunAgent`` agents: ``AdkAgent``, ``BeamLlm``, ``beam_tools``.

The session is one ``ctx.memory`` slot, written when a run completes, trimmed to ``SessionLimits``.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.llm_agent import LlmAgent
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.tools.base_toolset import BaseToolset
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from beam_agents._protos import canonical_json
from beam_agents.adapters.adk._calls import (
    PENDING_STATUS,
    AdkTranslationError,
    BeamLlm,
    BeamTool,
    ConfirmationRule,
    beam_tools,
    call_position,
    content_of,
    filled,
    neutral_request,
    text_part,
)
from beam_agents.adapters.base import (
    AdapterActivation,
    FrameworkAgent,
    Pending,
    utf8_prompt,
    warn_outside_registry,
)
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.context import WorkingMemory
from beam_agents.core.state import MEMORY_CAP_BYTES

__all__ = [
    "ADK_ADAPTER",
    "PENDING_STATUS",
    "SESSION_SLOT",
    "AdkAgent",
    "AdkRunError",
    "AdkSessionTooLargeError",
    "AdkTranslationError",
    "BeamLlm",
    "BeamTool",
    "ConfirmationRule",
    "MemorySessionService",
    "SessionLimits",
    "beam_tools",
    "neutral_request",
    "trim_events",
]

ADK_ADAPTER = "beam_agents.adapters.adk"
"""The ``Suspend.adapter`` of this adapter's suspensions."""

REQUEST_CONFIRMATION = "adk_request_confirmation"
DEFAULT_MAX_ROUNDS = 16

_log = logging.getLogger(__name__)


class AdkRunError(RuntimeError):
    """The ADK agent cannot run as configured, or did not settle within ``max_rounds``."""


def _same_text(text: str) -> object:
    return text


class AdkAgent(FrameworkAgent[BaseAgent]):
    """A ``RunAgent`` agent running an ADK agent; picklable when given a builder.

    Args:
        agent: A zero-argument function returning the ADK agent, or the agent itself. Model
            names become ``BeamLlm(model=<the name>)``; another ``BaseLlm`` is refused.
        app_name: The ADK app name of the runner and session.
        prompt: The user message for the run's event (default: the event as UTF-8).
        state: Session-state updates for the run's event (applied with the user message), e.g.
            facts a ``require_confirmation`` rule reads from ``tool_context.state``.
        output: Turns the final response text into the run's output (default: the text).
        session_limits: How much of the key's session is kept between runs.
        max_rounds: Most ADK invocations per activation (confirmation answers included).
        suspend_timeout_ms: ``Suspend.timeout_ms`` of the adapter's suspensions.
    """

    adapter = ADK_ADAPTER
    _not_pickled: ClassVar[dict[str, Any]] = {"_shared_runner": None, "_closes_toolsets": False}

    def __init__(
        self,
        agent: BaseAgent | Callable[[], BaseAgent],
        *,
        app_name: str = "beam_agents",
        prompt: Callable[[bytes], str] = utf8_prompt,
        state: Callable[[bytes], Mapping[str, Any]] | None = None,
        output: Callable[[str], object] = _same_text,
        session_limits: SessionLimits | None = None,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        suspend_timeout_ms: int | None = None,
    ) -> None:
        if not isinstance(agent, BaseAgent) and not callable(agent):
            raise TypeError(f"agent must be an ADK agent or a builder, got {agent!r}")
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_rounds must be a positive int, got {max_rounds!r}")
        super().__init__(agent)
        self.app_name = app_name
        self.prompt = prompt
        self.state = state
        self.output = output
        self.session_limits = session_limits or SessionLimits()
        self.max_rounds = max_rounds
        self.suspend_timeout_ms = suspend_timeout_ms
        self._closes_toolsets = False

    @property
    def agent(self) -> BaseAgent:
        """The ADK agent, built on first use (models made ``BeamLlm``)."""
        return self.built()

    def build(self, source: BaseAgent | Callable[[], BaseAgent]) -> BaseAgent:
        """The ADK agent from ``source``, its models made ``BeamLlm``, other tools warned of."""
        built = source if isinstance(source, BaseAgent) else source()
        if not isinstance(built, BaseAgent):
            raise AdkRunError(f"the agent builder returned {built!r}, not an ADK agent")
        _use_beam_models(built, root=True)
        _warn_of_pipeline_tools(built)
        return built

    def _runner(self) -> Runner:
        """The ``Runner`` every activation uses (built once, with the agent)."""
        agent = self.agent
        runner = getattr(self, "_shared_runner", None)
        if runner is None or runner.agent is not agent or runner.app_name != self.app_name:
            _skip_missing_a2a()
            runner = Runner(app_name=self.app_name, agent=agent, session_service=_SESSIONS)
            self._shared_runner = runner
            self._closes_toolsets = _has_toolsets(agent)
        return runner

    async def activate(self, activation: AdapterActivation) -> Complete | Suspend:
        """One activation: re-walk the run from the key's committed session."""
        ctx = activation.ctx
        user_id = session_user(ctx.entity_key)
        memory = ctx.memory
        session = load_session(memory, app_name=self.app_name, user_id=user_id)
        runner = self._runner()
        event = activation.event
        message = content_of("user", [text_part(self.prompt(event))])
        delta = dict(self.state(event)) if self.state is not None else None
        text = ""
        token = _BOUND.set(MemorySessionService([session]))
        try:
            for _ in range(self.max_rounds):
                events = await _invoke(runner, user_id, message, delta)
                delta = None
                text = _final_text(events, text)
                if activation.waiting:
                    return activation.suspend(timeout_ms=self.suspend_timeout_ms)
                answers = _answer_confirmations(activation, events, session.events)
                if activation.waiting:
                    return activation.suspend(timeout_ms=self.suspend_timeout_ms)
                if not answers:
                    break
                message = types.Content(role="user", parts=answers)
            else:
                raise AdkRunError(
                    f"the ADK agent still asked for confirmations after {self.max_rounds} "
                    "invocations in one activation; raise AdkAgent(max_rounds=...)"
                )
        finally:
            try:
                if self._closes_toolsets:  # the toolsets' cleanup
                    await runner.close()
            finally:
                _BOUND.reset(token)
        save_session(memory, session, self.session_limits)
        return activation.finish(self.output(text), timeout_ms=self.suspend_timeout_ms)


_A2A_AGENT_MODULE = "google.adk.agents.remote_a2a_agent"


def _skip_missing_a2a() -> None:
    """Let ADK's per-invocation import of its optional A2A agent fail at once (cached as None)."""
    if _A2A_AGENT_MODULE in sys.modules:
        return
    try:
        importlib.import_module(_A2A_AGENT_MODULE)
    except ImportError:
        sys.modules.setdefault(_A2A_AGENT_MODULE, None)  # type: ignore[arg-type]


def _has_toolsets(agent: BaseAgent) -> bool:
    """Whether the ADK agent tree has a toolset (``Runner.close`` has something to clean up)."""
    if isinstance(agent, LlmAgent) and any(isinstance(tool, BaseToolset) for tool in agent.tools):
        return True
    return any(_has_toolsets(child) for child in agent.sub_agents)


def session_user(entity_key: bytes) -> str:
    """The ADK user id and session id of a key: its UTF-8 text, or ``hex:<hex>``."""
    try:
        text = entity_key.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + entity_key.hex()
    return text if text.isprintable() and text else "hex:" + entity_key.hex()


async def _invoke(
    runner: Runner, user_id: str, message: types.Content, delta: dict[str, Any] | None
) -> list[Event]:
    """One ADK invocation (a new message, or confirmation answers resuming the last one)."""
    events: list[Event] = []
    async for event in runner.run_async(
        user_id=user_id, session_id=user_id, new_message=message, state_delta=delta
    ):
        events.append(event)
    return events


def _final_text(events: list[Event], previous: str) -> str:
    """The text of the last complete agent answer among ``events`` (else ``previous``)."""
    text = previous
    for event in events:
        if event.author == "user" or event.partial or event.content is None:
            continue
        if event.get_function_calls() or event.get_function_responses():
            continue
        parts = [part.text for part in event.content.parts or () if part.text and not part.thought]
        if parts:
            text = "".join(parts)
    return text


def _answer_confirmations(
    activation: AdapterActivation, events: list[Event], session_events: Sequence[Event]
) -> list[types.Part]:
    """Ask for each confirmation ADK requested (keyed by its place in the session); the answers."""
    answers: list[types.Part] = []
    for event in events:
        waiting_ids = event.long_running_tool_ids or set()
        for call in event.get_function_calls():
            if call.name != REQUEST_CONFIRMATION or call.id not in waiting_ids:
                continue
            args = call.args or {}
            original = args.get("originalFunctionCall") or {}
            asked = ToolConfirmation.model_validate(args.get("toolConfirmation") or {})
            payload: dict[str, Any] = {
                "tool": original.get("name", ""),
                "arguments": original.get("args") or {},
                "call_id": original.get("id", ""),
                "hint": asked.hint,
            }
            if asked.payload is not None:
                payload["payload"] = asked.payload
            position = call_position(session_events, call.id or "", REQUEST_CONFIRMATION)
            key = ("adk-confirmation", position, payload["call_id"], canonical_json(payload))
            decision = activation.request_approval(payload, call_key=key)
            if isinstance(decision, Pending):
                continue
            confirmation = ToolConfirmation(
                hint=asked.hint, confirmed=decision.approved, payload=decision.as_dict()
            )
            answers.append(
                types.Part(
                    function_response=types.FunctionResponse(
                        id=call.id,
                        name=REQUEST_CONFIRMATION,
                        response=confirmation.model_dump(by_alias=True, exclude_none=True),
                    )
                )
            )
    return answers


def _use_beam_models(agent: BaseAgent, *, root: bool) -> None:
    """Give every ``LlmAgent`` of the tree a ``BeamLlm`` (string names kept as model ids)."""
    if isinstance(agent, LlmAgent):
        model = agent.model
        if isinstance(model, str):
            if model or root:
                agent.model = BeamLlm(model=model)
        elif isinstance(model, BaseLlm) and not isinstance(model, BeamLlm):
            raise AdkRunError(
                f"ADK agent {agent.name!r} uses {type(model).__name__}, which calls its model "
                "directly; give it a model name or BeamLlm(model=...) so calls go through "
                "ctx.call_model"
            )
    for child in agent.sub_agents:
        _use_beam_models(child, root=False)


def _warn_of_pipeline_tools(agent: BaseAgent) -> None:
    """Warn (once per tool name per process) of ADK tools that are not ``beam_tools``."""
    if isinstance(agent, LlmAgent):
        for tool in agent.tools:
            if isinstance(tool, BeamTool):
                continue
            if isinstance(tool, BaseToolset):
                name = f"{type(tool).__name__} (a toolset)"
            else:
                name = str(getattr(tool, "name", None) or getattr(tool, "__name__", repr(tool)))
            warn_outside_registry(_log, name)
    for child in agent.sub_agents:
        _warn_of_pipeline_tools(child)


# -- the session in ctx.memory ------------------------------------------------------------
SESSION_SLOT = "beam_agents.adk.session.v1"
"""The working-memory slot holding the key's ADK session (its JSON)."""


class AdkSessionTooLargeError(RuntimeError):
    """The key's ADK session is over ``SessionLimits.hard_max_bytes`` even after trimming."""


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How much of a key's ADK session is kept between runs: whole turns, the latest always.

    A session still over ``hard_max_bytes`` fails the run with :class:`AdkSessionTooLargeError`.
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
    """An ADK session service over one activation's copy of the key's session (no I/O)."""

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


class ActivationSessionService(MemorySessionService):
    """The shared ``Runner``'s session service: the running activation's own sessions."""

    def __init__(self) -> None:
        """Hold no sessions of its own."""

    @property
    def _sessions(self) -> dict[tuple[str, str, str], Session]:  # type: ignore[override]
        service = _BOUND.get()
        if service is None:
            raise RuntimeError("the ADK adapter's session service was used outside an activation")
        return service._sessions


_SESSIONS = ActivationSessionService()


_EMPTY_SESSION = Session(id="", app_name="", user_id="")
_NEW_SESSION_FIELDS = ("id", "app_name", "user_id")


def load_session(memory: WorkingMemory, *, app_name: str, user_id: str) -> Session:
    """The key's committed session, or a new empty one."""
    blob = memory.get(SESSION_SLOT)
    if blob is None:
        if type(user_id) is not str or type(app_name) is not str:
            return Session(id=user_id, app_name=app_name, user_id=user_id)
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


def save_session(memory: WorkingMemory, session: Session, limits: SessionLimits) -> None:
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
    """The whole session's JSON when :func:`trim_events` would keep every event, else ``None``."""
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
