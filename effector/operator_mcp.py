"""The operator MCP endpoint: an assistant lists, approves and denies approvals, reads intents.

``beam-agents-effector serve --mcp-listen HOST:PORT`` serves it at ``/mcp`` (streamable HTTP,
stateless, JSON responses) from the effector's own event loop, through the console's serving
machinery (:class:`~effector.console.serve.ConsoleServer`, with the app's lifespan on). Its
tools (:mod:`effector.operator_tools`): ``list_pending_approvals(limit)``,
``approve(intent_id, reason)``, ``deny(intent_id, reason)`` and ``intent_status(intent_id)``.
Decisions record the identity configured for the token (``--mcp-identity``) as the approver.

Each tool answers with structured content (and the same JSON as text). A call it cannot carry
out (an unknown intent, a tool intent, an approval already decided, bad arguments) answers a
tool error (``isError``) saying why, never a crash. With a token, every HTTP request must
carry ``authorization: Bearer <token>`` (compared in constant time) or is answered 401.
Imported only when ``--mcp-listen`` is given: the effector without it never imports ``mcp``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from effector.addresses import is_loopback_host
from effector.console.serve import ConsoleServer
from effector.errors import StoreError
from effector.identities import Approver, Tokens
from effector.operator_tools import (
    CALLER,
    DecideArguments,
    DecisionMade,
    IntentArguments,
    IntentStatus,
    ListPendingArguments,
    OperatorTools,
    PendingApprovals,
    ToolRefusal,
)
from effector.service import EffectorService

_log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
"""Where the endpoint answers."""

_INSTRUCTIONS = (
    "Operator tools of a beam-agents effector. Agents ask for approval before some side "
    "effects; list what awaits a decision, read an intent, then approve or deny it with a "
    "reason. Every decision is recorded with this endpoint's configured identity and released "
    "to the waiting agent at once: it cannot be taken back."
)


# The MCP server -------------------------------------------------------------------------------

_Handler = Callable[[Any, str], Awaitable[BaseModel]]
_READ_ONLY = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
_DECIDING = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
)


def _tools(tools: OperatorTools) -> dict[str, tuple[types.Tool, type[BaseModel], _Handler]]:
    """Each tool's definition, its arguments model and its handler, by name."""

    async def listing(arguments: Any, client: str) -> BaseModel:
        return await tools.list_pending_approvals(arguments)

    async def status(arguments: Any, client: str) -> BaseModel:
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
        (
            "approve",
            "Approve one pending approval intent with a reason. The decision is recorded "
            "with this endpoint's configured identity as the approver and released to the "
            "agent at once; it cannot be changed later.",
            DecideArguments,
            DecisionMade,
            tools.approve,
            _DECIDING,
        ),
        (
            "deny",
            "Deny one pending approval intent with a reason. The decision is recorded with "
            "this endpoint's configured identity as the approver and released to the agent "
            "at once; it cannot be changed later.",
            DecideArguments,
            DecisionMade,
            tools.deny,
            _DECIDING,
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


def _client_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """The calling client's address, for the log."""
    client = getattr(ctx.request, "client", None)
    return f"{client.host}:{client.port}" if client is not None else "an unknown client"


def _caller_of(ctx: ServerRequestContext[Any, Any], service: EffectorService) -> Approver | None:
    """The holder of the call's bearer token, if the effector has tokens."""
    headers = getattr(ctx.request, "headers", None)
    if service.tokens is None or headers is None:
        return None
    return service.tokens.identify_bearer(headers.get("authorization"))


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
        caller = CALLER.set(_caller_of(ctx, service))
        try:
            answer = await handler(model.model_validate(params.arguments or {}), _client_of(ctx))
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
            CALLER.reset(caller)
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
    """The endpoint's ASGI app: streamable HTTP at ``/mcp``, behind the token if there is one.

    Its lifespan runs the MCP session manager, so it must be served with the lifespan on.
    ``host`` is the address it listens on: on loopback the SDK also refuses requests whose
    ``Host`` or ``Origin`` is not loopback (DNS rebinding).
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
    return ConsoleServer(app, host, port, tls=tls, what="the MCP endpoint", lifespan=True)
