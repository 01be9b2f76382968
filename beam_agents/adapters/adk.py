"""Google ADK agents as ``RunAgent`` agents: ``AdkAgent``, ``BeamLlm``, ``beam_tools``.

Every activation runs the ADK agent with ``google.adk.runners.Runner`` (one per adapter, built
with the agent) from the run's start: the key's committed session (working memory, bound for
the activation), the run's event as the user message. Model calls go through
``ctx.call_model`` (``BeamLlm``), so a resumed activation gets the earlier answers back from
the replay cache; registry tools run inline or become intents (``beam_tools``); an
ADK tool confirmation becomes an approval intent and, once decided, is answered in the same
activation as ADK expects (a ``FunctionResponse`` to ``adk_request_confirmation``). Anything
unanswered suspends the run; the session is written back only when the run completes.

No network: ``BeamLlm`` replaces string model names, nothing else is reached (no artifact or
memory service, no Gemini client), and ADK's OpenTelemetry spans go nowhere unless the process
installs an exporter itself. See ``beam_agents/adapters/README.md``.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.llm_agent import LlmAgent
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.runners import Runner
from google.adk.tools.base_toolset import BaseToolset
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from beam_agents._protos import canonical_json
from beam_agents.adapters._adk_model import (
    AdkTranslationError,
    BeamLlm,
    content_of,
    neutral_request,
    text_part,
)
from beam_agents.adapters._adk_session import (
    SESSION_SLOT,
    ActivationSessionService,
    AdkSessionTooLargeError,
    MemorySessionService,
    SessionLimits,
    bind_sessions,
    load_session,
    release_sessions,
    save_session,
    trim_events,
)
from beam_agents.adapters._adk_tools import (
    PENDING_STATUS,
    BeamTool,
    ConfirmationRule,
    beam_tools,
    call_position,
)
from beam_agents.adapters._bridge import ActivationBridge, FrameworkAgent, Pending

if TYPE_CHECKING:
    from beam_agents import Complete, Suspend

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
"""The function call ADK emits when a tool asks for confirmation."""

DEFAULT_MAX_ROUNDS = 16
"""How many ADK invocations (the first plus confirmation answers) one activation may run."""

_log = logging.getLogger(__name__)
_warned_tools: set[str] = set()
_warned_lock = threading.Lock()


class AdkRunError(RuntimeError):
    """The ADK agent cannot run as configured, or did not settle within ``max_rounds``."""


def _prompt_text(event: bytes) -> str:
    return event.decode("utf-8")


def _same_text(text: str) -> object:
    return text


class AdkAgent(FrameworkAgent[BaseAgent]):
    """A ``RunAgent`` agent running an ADK agent; picklable when given a builder.

    Args:
        agent: A zero-argument function returning the ADK agent (built once per process, on
            first use; pass a module-level function so ``RunAgent`` can pickle it), or the
            agent itself. String model names of ``LlmAgent``s are replaced by
            ``BeamLlm(model=<the name>)``; another ``BaseLlm`` than ``BeamLlm`` is refused.
            Tools that are not ``beam_tools`` run in the pipeline on every activation of a
            run; the build logs a warning for each.
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

    def __init__(
        self,
        agent: BaseAgent | Callable[[], BaseAgent],
        *,
        app_name: str = "beam_agents",
        prompt: Callable[[bytes], str] = _prompt_text,
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

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_shared_runner"] = None
        state["_closes_toolsets"] = False
        return state

    def _runner(self) -> Runner:
        """The ``Runner`` every activation of this adapter uses (built once, with the agent).

        Its session service is an :class:`ActivationSessionService`: each activation binds its
        own ``MemorySessionService`` (the key's session) for the length of its run.
        """
        agent = self.agent
        runner = getattr(self, "_shared_runner", None)
        if runner is None or runner.agent is not agent or runner.app_name != self.app_name:
            _skip_missing_a2a()
            runner = Runner(app_name=self.app_name, agent=agent, session_service=_SESSIONS)
            self._shared_runner = runner
            self._closes_toolsets = _has_toolsets(agent)
        return runner

    async def activate(self, bridge: ActivationBridge) -> Complete | Suspend:
        """One activation: re-walk the run from the key's committed session."""
        ctx = bridge.ctx
        user_id = session_user(ctx.entity_key)
        memory = ctx.memory
        session = load_session(memory, app_name=self.app_name, user_id=user_id)
        runner = self._runner()
        event = bridge.event
        message = content_of("user", [text_part(self.prompt(event))])
        delta = dict(self.state(event)) if self.state is not None else None
        text = ""
        token = bind_sessions(MemorySessionService([session]))
        try:
            for _ in range(self.max_rounds):
                events = await _invoke(runner, user_id, message, delta)
                delta = None
                text = _final_text(events, text)
                if bridge.waiting:
                    return bridge.suspend(timeout_ms=self.suspend_timeout_ms)
                answers = _answer_confirmations(bridge, events, session.events)
                if bridge.waiting:
                    return bridge.suspend(timeout_ms=self.suspend_timeout_ms)
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
                if self._closes_toolsets:
                    # What closing a Runner of its own did: the toolsets' cleanup (the runner
                    # has no plugins, and the activation's session service buffers nothing).
                    await runner.close()
            finally:
                release_sessions(token)
        save_session(memory, session, self.session_limits)
        return bridge.finish(self.output(text), timeout_ms=self.suspend_timeout_ms)


_SESSIONS = ActivationSessionService()
"""The session service of every adapter's ``Runner`` (each activation binds its own)."""


_A2A_AGENT_MODULE = "google.adk.agents.remote_a2a_agent"


def _skip_missing_a2a() -> None:
    """Let ADK's per-invocation import of its optional A2A agent fail at once, as it will.

    Every ADK invocation (``build_node``) tries ``from ...agents.remote_a2a_agent import
    RemoteA2aAgent`` and ignores the ``ImportError`` when the ``a2a`` package is missing; a
    failed import is not cached, so each try reads and runs the module again (hundreds of
    calls). Once it has failed here, ``None`` in ``sys.modules`` makes every later try raise
    ``ImportError`` straight away; with ``a2a`` installed the import succeeds and is cached.
    """
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
    bridge: ActivationBridge, events: list[Event], session_events: Sequence[Event]
) -> list[types.Part]:
    """Ask for each confirmation ADK requested; the answers, once every one is decided.

    An approval is keyed by the request's place in the session too, so a later turn's request
    for the same call id and arguments is asked again rather than answered by this one.
    """
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
            decision = bridge.request_approval(payload, call_key=key)
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
    """Warn (once per tool name per process) of ADK tools that are not ``beam_tools``.

    Such a tool is plain Python in the pipeline: every activation of a run re-walks the run
    from its start, so it runs again each time, effects and all.
    """
    if isinstance(agent, LlmAgent):
        for tool in agent.tools:
            if isinstance(tool, BeamTool):
                continue
            if isinstance(tool, BaseToolset):
                name = f"{type(tool).__name__} (a toolset)"
            else:
                name = str(getattr(tool, "name", None) or getattr(tool, "__name__", repr(tool)))
            with _warned_lock:
                if name in _warned_tools:
                    continue
                _warned_tools.add(name)
            _log.warning(
                "tool %s is not in AgentConfig.tool_registry: it runs in the pipeline on every "
                "activation of the run; make it a registry tool (side_effect=True if it has "
                "effects)",
                name,
            )
    for child in agent.sub_agents:
        _warn_of_pipeline_tools(child)
