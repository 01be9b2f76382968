"""The operator MCP endpoint: an assistant lists, approves and denies approvals, reads intents.

Served at ``/mcp`` (streamable HTTP, stateless). A decision goes through
:meth:`EffectorService.decide` with ``--mcp-identity`` as the approver. A call it cannot carry
out answers a tool error saying why. With a token, a request without it is answered 401.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Literal

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from beam_agents._protos import (
    MAX_TEXT_FIELD_CHARS,
    IntentState,
    ToolIntent,
    ToolResult,
    approval_digest,
    canonical_json,
)
from effector.console.serve import ConsoleServer
from effector.observability import display_key, payload_text
from effector.readable import cut, enum_name, hidden_characters, iso_time, parsed_json
from effector.service import (
    Approver,
    EffectorService,
    Tokens,
    caller,
    is_loopback_host,
    recorded_approver,
)
from effector.store.errors import StoreError
from effector.store.intents import Decision, IntentRecord, expiry_deadline_ms, intent_id_problem

_log = logging.getLogger(__name__)

CALLER: ContextVar[Approver | None] = ContextVar("effector_mcp_caller", default=None)
"""Who holds the token of the MCP call being handled (set around each call): a named token
is the approver its decisions record, and may be limited to channels."""

DEFAULT_PENDING_LIMIT = 20
MAX_PENDING_LIMIT = 100


class ToolRefusal(Exception):
    """A tool call that cannot be carried out; its message is shown to the caller."""


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListPendingArguments(_Arguments):
    """Arguments of ``list_pending_approvals``."""

    limit: int = Field(
        DEFAULT_PENDING_LIMIT,
        ge=1,
        le=MAX_PENDING_LIMIT,
        description="How many approvals to list at most (oldest first).",
    )


class IntentArguments(_Arguments):
    """Arguments naming one intent."""

    intent_id: str = Field(description="The intent's id (a canonical UUID).")


class DecideArguments(IntentArguments):
    """Arguments of ``approve`` and ``deny``."""

    reason: str = Field(
        min_length=1,
        max_length=MAX_TEXT_FIELD_CHARS,
        pattern=r"\S",
        description="Why: recorded with the decision and passed to the waiting agent.",
    )
    args_digest: str = Field(
        default="",
        description="The args_digest list_pending_approvals showed: the decision is refused "
        "if the approval's arguments are not those you saw. Default: their digest now.",
    )
    edited_args: dict[str, Any] | None = Field(
        default=None,
        description="approve only: approve these arguments instead (validated against the "
        "tool the approval gates).",
    )


WALL_CLOCK = "the effector's wall clock, ms since the epoch (UTC)"
"""The one clock of every time the endpoint answers with."""
_ARGS = (
    "The arguments under approval: parsed JSON, or their text (cut to a bound) when too large "
    "or too deep to parse; warnings say so."
)


class PendingApproval(BaseModel):
    """One approval awaiting a decision."""

    intent_id: str
    entity_key: str = Field(description="The agent's key: text, or 0x and its hex.")
    tool: str = Field(description="The tool the approval is about; empty if none is named.")
    args: Any = Field(description=_ARGS)
    channel: str = Field(description="The channel the approval was asked on; may be empty.")
    received_at_ms: int = Field(description=f"When the effector received it: {WALL_CLOCK}.")
    deadline_ms: int = Field(description=f"When it expires undecided: {WALL_CLOCK}; 0 for never.")
    deadline: str = Field(description="deadline_ms as ISO 8601 UTC text, or 'never'.")
    args_digest: str = Field(description="The digest of args: send it back with a decision.")
    gated_tool: str = Field(description="The tool whose call it gates (edits are checked).")
    required_approvals: int = Field(description="Distinct approvers needed (any deny denies).")
    warnings: list[str] = Field(
        description="What to look at closely before deciding: characters that hide or reorder "
        "text (a right-to-left override), arguments cut for size."
    )


class PendingApprovals(BaseModel):
    """The answer of ``list_pending_approvals``."""

    approvals: list[PendingApproval]
    pending: int = Field(description="How many approvals await a decision in all.")
    clock: str = Field(default=WALL_CLOCK, description="The clock of every time listed.")


class DecisionInfo(BaseModel):
    """A recorded approval decision."""

    approved: bool
    approver: str
    reason: str
    decided_at_ms: int


class DecisionMade(DecisionInfo):
    """The answer of ``approve`` and ``deny``: the decision recorded."""

    intent_id: str
    decision: Literal["approved", "denied"]
    quorum: str | None = Field(
        default=None,
        description="Set while a quorum is gathered: the vote was recorded, not yet decided.",
    )


class ResultInfo(BaseModel):
    """An intent's terminal result."""

    status: str = Field(description="OK, ERROR, EXPIRED, REJECTED, NOT_NEEDED or WITHDRAWN.")
    payload: Any = Field(description="The result: parsed JSON, else text or 0x hex; null if none.")
    error: str | None
    completed_at_ms: int


class IntentStatus(BaseModel):
    """The answer of ``intent_status``."""

    intent_id: str
    kind: str = Field(description="TOOL, APPROVAL or WITHDRAWAL.")
    state: str = Field(
        description="PENDING, RUNNING, IN_DOUBT, AWAITING_DECISION, DONE or WITHDRAWN (its run "
        "stopped waiting for it: it never runs nor can be decided; result.error says why)."
    )
    entity_key: str
    tool: str
    args: Any = Field(description=_ARGS)
    attempts: int
    created_at_ms: int = Field(description="When the pipeline created it: its event time (ms).")
    deadline_ms: int = Field(
        description=f"When it expires at the effector: {WALL_CLOCK}; 0 for never."
    )
    warnings: list[str] = Field(description="Characters that hide or reorder text; cut values.")
    result: ResultInfo | None = Field(description="Once DONE: its result.")
    decision: DecisionInfo | None = Field(description="For a decided approval: the decision.")


def _json_value(text: str) -> tuple[Any, list[str]]:
    """``text`` parsed as JSON (else its text, cut), and what a reader should look closely at."""
    warnings = [f"holds {name}" for name in hidden_characters(text)]
    parsed = parsed_json(text)
    if parsed is not None or text.strip() == "null":
        return parsed, warnings
    shown, left_out = cut(text)
    if left_out:
        warnings.append(f"cut: {left_out} more characters not shown (too large to list whole)")
    return shown, warnings


def _payload(payload: bytes) -> Any:
    """A payload: parsed JSON, else printable text or ``0x`` hex (cut); ``None`` if empty."""
    if not payload:
        return None
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return cut(payload_text(payload))[0]
    parsed = parsed_json(text)
    return parsed if parsed is not None else cut(payload_text(payload))[0]


def _deadline_text(deadline_ms: int) -> str:
    return "never" if not deadline_ms else iso_time(deadline_ms)


def _decision_of(record: IntentRecord) -> DecisionInfo | None:
    """The decision stored as a decided approval's OK result, if there is one."""
    result = record.result
    if (
        record.intent.kind != ToolIntent.APPROVAL
        or result is None
        or result.status != ToolResult.OK
    ):
        return None
    try:
        return DecisionInfo.model_validate_json(result.payload)
    except ValidationError:
        return None


def _pending(record: IntentRecord) -> PendingApproval:
    """One approval as ``list_pending_approvals`` lists it, every time on the effector's clock."""
    intent = record.intent
    args, warnings = _json_value(intent.args_json or "{}")
    deadline_ms = expiry_deadline_ms(intent, record.received_at_ms)
    return PendingApproval(
        intent_id=intent.intent_id,
        entity_key=display_key(intent.entity_key),
        tool=intent.tool_name,
        args=args,
        channel=intent.channel,
        received_at_ms=record.received_at_ms,
        deadline_ms=deadline_ms,
        deadline=_deadline_text(deadline_ms),
        args_digest=approval_digest(intent.args_json),
        gated_tool=intent.gated_tool,
        required_approvals=max(intent.required_approvals, 1),
        warnings=warnings,
    )


def _checked_id(intent_id: str) -> str:
    problem = intent_id_problem(intent_id)
    if problem is not None:
        raise ToolRefusal(f"bad intent_id: {problem}")
    return intent_id


class OperatorTools:
    """The endpoint's tools over one effector's service, deciding as ``identity``."""

    def __init__(self, service: EffectorService, identity: str) -> None:
        self._service = service
        self._identity = identity

    async def list_pending_approvals(self, arguments: ListPendingArguments) -> PendingApprovals:
        """The approvals awaiting a decision, oldest first, with their deadlines."""
        waiting, pending = await self._service.pending_approvals(arguments.limit)
        return PendingApprovals(approvals=[_pending(r) for r in waiting], pending=pending)

    async def intent_status(self, arguments: IntentArguments) -> IntentStatus:
        """Everything recorded about one intent, as ``show`` prints it."""
        record = await self._service.store.get_intent(_checked_id(arguments.intent_id))
        if record is None:
            raise ToolRefusal(f"no intent {arguments.intent_id} (unknown, or pruned)")
        intent, result = record.intent, record.result
        args, warnings = _json_value(intent.args_json or "{}")
        return IntentStatus(
            intent_id=intent.intent_id,
            kind=enum_name(ToolIntent.Kind, intent.kind),
            state=enum_name(IntentState, record.state),
            entity_key=display_key(intent.entity_key),
            tool=intent.tool_name,
            args=args,
            warnings=warnings,
            attempts=record.attempts,
            created_at_ms=intent.created_at_ms,
            deadline_ms=expiry_deadline_ms(intent, record.received_at_ms),
            result=None
            if result is None
            else ResultInfo(
                status=enum_name(ToolResult.Status, result.status),
                payload=_payload(result.payload),
                error=cut(result.error_message)[0] or None,
                completed_at_ms=result.completed_at_ms,
            ),
            decision=_decision_of(record),
        )

    async def decide(self, arguments: DecideArguments, *, approved: bool) -> DecisionMade:
        """Approve or deny one approval intent as the configured identity, with the reason."""
        intent_id = _checked_id(arguments.intent_id)
        digest = arguments.args_digest
        if not digest:
            record = await self._service.store.get_intent(intent_id)
            digest = "" if record is None else approval_digest(record.intent.args_json)
        edited = arguments.edited_args
        try:
            outcome = await self._service.decide(
                intent_id,
                approved=approved,
                approver=self._identity,
                reason=arguments.reason,
                args_digest=digest,
                edited_args_json="" if edited is None else canonical_json(edited),
                identity=CALLER.get(),
                origin="the operator MCP endpoint",
            )
        except ValueError as refused:
            raise ToolRefusal(str(refused)) from None
        if not outcome.applied:
            raise ToolRefusal(await self._not_applied(intent_id, outcome))
        verdict: Literal["approved", "denied"] = "approved" if approved else "denied"
        if outcome.result is None:  # a vote towards a quorum
            approver = recorded_approver(CALLER.get(), self._identity)
            return DecisionMade(
                intent_id=intent_id,
                decision=verdict,
                approved=approved,
                approver=approver,
                reason=arguments.reason,
                decided_at_ms=0,
                quorum=outcome.reason,
            )
        decided = DecisionInfo.model_validate_json(outcome.result.payload)
        return DecisionMade(intent_id=intent_id, decision=verdict, **decided.model_dump())

    async def _not_applied(self, intent_id: str, outcome: Decision) -> str:
        """Why a decision was not applied, in words an operator can act on."""
        if outcome.state == IntentState.INTENT_STATE_UNSPECIFIED:
            return f"no intent {intent_id} (unknown, or pruned): nothing was decided"
        record = await self._service.store.get_intent(intent_id)
        if record is not None and record.intent.kind != ToolIntent.APPROVAL:
            return f"intent {intent_id} is a tool call, not an approval: only approvals are decided"
        if record is not None and record.state == IntentState.WITHDRAWN:
            why = record.result.error_message if record.result is not None else ""
            return (
                f"approval {intent_id} was withdrawn: {why or 'its run no longer waits for it'}; "
                "nothing was decided"
            )
        earlier = None if record is None else _decision_of(record)
        if outcome.reason == "already decided" and earlier is not None:
            verdict = "approved" if earlier.approved else "denied"
            return (
                f"approval {intent_id} was already {verdict} by {earlier.approver!r}"
                f" ({earlier.reason or 'no reason given'}): a decision cannot be changed"
            )
        return f"the decision on approval {intent_id} was not applied: {outcome.reason}"


MCP_PATH = "/mcp"

_INSTRUCTIONS = (
    "Operator tools of a beam-agents effector. Agents ask for approval before some side "
    "effects; list what awaits a decision, read an intent, then approve or deny it with a "
    "reason. Every decision is recorded with this endpoint's configured identity and released "
    "to the waiting agent at once: it cannot be taken back."
)

_RECORDED = (
    "The decision is recorded with this endpoint's configured identity as the approver and "
    "released to the agent at once; it cannot be changed later."
)
_Handler = Callable[[Any], Awaitable[BaseModel]]
_READ_ONLY = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
_DECIDING = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)


def _tools(tools: OperatorTools) -> dict[str, tuple[types.Tool, type[BaseModel], _Handler]]:
    """Each tool's definition, its arguments model and its handler, by name."""

    async def listing(arguments: Any) -> BaseModel:
        return await tools.list_pending_approvals(arguments)

    async def status(arguments: Any) -> BaseModel:
        return await tools.intent_status(arguments)

    entries: list[tuple[str, str, type[BaseModel], type[BaseModel], _Handler, Any]] = [
        (
            "list_pending_approvals",
            "List the approval intents awaiting a decision, oldest first: id, agent key, tool, "
            "arguments and deadline of each, and how many are pending in all.",
            ListPendingArguments,
            PendingApprovals,
            listing,
            _READ_ONLY,
        ),
        *(
            (
                verb.lower(),
                f"{verb} one pending approval intent with a reason. {_RECORDED}",
                DecideArguments,
                DecisionMade,
                handler,
                _DECIDING,
            )
            for verb, handler in (
                ("Approve", functools.partial(tools.decide, approved=True)),
                ("Deny", functools.partial(tools.decide, approved=False)),
            )
        ),
        (
            "intent_status",
            "Read one intent (a tool call or an approval): its state, tool and arguments, "
            "attempts, deadline, its result (status, payload, error) once done, and for a "
            "decided approval the decision (approved, approver, reason).",
            IntentArguments,
            IntentStatus,
            status,
            _READ_ONLY,
        ),
    ]
    return {
        name: (
            types.Tool(
                name=name,
                description=description,
                input_schema=arguments.model_json_schema(),
                output_schema=result.model_json_schema(mode="serialization"),
                annotations=annotations,
            ),
            arguments,
            handler,
        )
        for name, description, arguments, result, handler, annotations in entries
    }


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


def _argument_problems(error: ValidationError) -> str:
    problems = [
        f"{'.'.join(str(part) for part in detail['loc']) or 'arguments'}: {detail['msg']}"
        for detail in error.errors()
    ]
    return "invalid arguments: " + "; ".join(problems)


def _caller_of(ctx: ServerRequestContext[Any, Any], service: EffectorService) -> Approver | None:
    """The holder of the call's bearer token, if the effector has tokens."""
    headers = getattr(ctx.request, "headers", None)
    return caller(service.tokens, None if headers is None else headers.items())


def create_mcp_server(service: EffectorService, identity: str) -> Server[Any]:
    """The low-level MCP server holding the operator tools over ``service``."""
    tools = _tools(OperatorTools(service, identity))

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool for tool, _, _ in tools.values()])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in tools:
            return _error(f"unknown tool {params.name!r}; the tools are {', '.join(tools)}")
        _, model, handler = tools[params.name]
        reset = CALLER.set(_caller_of(ctx, service))
        try:
            answer = await handler(model.model_validate(params.arguments or {}))
        except ValidationError as invalid:
            return _error(_argument_problems(invalid))
        except ToolRefusal as refused:
            return _error(str(refused))
        except StoreError as exc:
            _log.warning("mcp: %s failed: %s", params.name, exc)
            return _error("the effector's store is unavailable; try again later")
        except Exception:
            _log.exception("mcp: %s failed", params.name)
            return _error("internal error in the effector")
        finally:
            CALLER.reset(reset)
        structured = answer.model_dump(mode="json")
        text = json.dumps(structured, sort_keys=True, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )

    def input_schema(name: str) -> Mapping[str, Any] | None:
        return tools[name][0].input_schema if name in tools else None

    return Server(
        "beam-agents-effector",
        title="beam-agents effector operator",
        instructions=_INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


class BearerGuard:
    """ASGI middleware: answers 401 to an HTTP request without ``authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str | Tokens) -> None:
        self._app = app
        self._tokens = Tokens.single(token) if isinstance(token, str) else token

    def _authorized(self, scope: Scope) -> bool:
        supplied = [value for name, value in scope["headers"] if name == b"authorization"]
        # Compared with every token, each in time independent of where the bytes differ.
        return len(supplied) == 1 and self._tokens.identify_bearer(supplied[0]) is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorized requests (and the lifespan) on; refuse the rest."""
        if scope["type"] == "http" and not self._authorized(scope):
            client = scope.get("client")
            _log.warning(
                "mcp: refused a request from %s: missing or invalid bearer token",
                f"{client[0]}:{client[1]}" if client else "an unknown client",
            )
            refusal = JSONResponse(
                {"error": "invalid_token", "error_description": "missing or invalid bearer token"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
            await refusal(scope, receive, send)
            return
        await self._app(scope, receive, send)


def create_mcp_app(
    service: EffectorService, *, identity: str, token: str | None, host: str
) -> ASGIApp:
    """The endpoint's ASGI app at ``/mcp``, behind the token if there is one.

    Its lifespan runs the MCP session manager, so it must be served with the lifespan on.
    """
    app = create_mcp_server(service, identity).streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        host=host,
        transport_security=_loopback_only(host),
    )
    return app if not token else BearerGuard(app, service.tokens or token)


def _loopback_only(host: str) -> TransportSecuritySettings | None:
    """On any loopback address, refuse a ``Host`` or ``Origin`` that is not loopback."""
    if not is_loopback_host(host):
        return None  # reachable from elsewhere: the token is the guard
    bare = host.strip("[]")
    names = {"127.0.0.1", "localhost", "[::1]", f"[{bare}]" if ":" in bare else bare.lower()}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:*" for name in sorted(names)],
        allowed_origins=[
            f"{scheme}://{name}:*" for name in sorted(names) for scheme in ("http", "https")
        ],
    )


def bind_mcp_endpoint(
    service: EffectorService,
    host: str,
    port: int,
    *,
    identity: str,
    token: str | None,
    tls: tuple[bytes, bytes] | None = None,
) -> ConsoleServer:
    """The endpoint's HTTP(S) server, bound but not started (the effector starts and stops it)."""
    app = create_mcp_app(service, identity=identity, token=token, host=host)
    return ConsoleServer(
        app, host, port, tls=tls, what="the MCP endpoint", path=MCP_PATH, lifespan=True
    )
