"""``beam-agents-effector`` / ``python -m effector``: run an effector, or talk to one.

``serve`` runs one through :func:`effector.launch.running_server` (console and MCP as asked).
The other commands exit 0 when the call did what was asked, 1 when it did not, and 2 with one
line on stderr when misconfigured. Every flag can also come from ``BEAM_AGENTS_EFFECTOR_<FLAG>``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc

from beam_agents._protos import (
    GetIntentResponse,
    IntentState,
    PoliciesResponse,
    ToolIntent,
    ToolResult,
)
from beam_agents.tools import Tool, ToolRegistry
from effector.client import EffectorClient
from effector.launch import (
    CONSOLE_PREFIX,
    MCP_PREFIX,
    METRICS_PREFIX,
    READY_PREFIX,
    env_name,
    running_server,
)
from effector.observability import display_key, payload_text
from effector.policy import PolicyError, load_policy, policy_answer
from effector.readable import enum_name, iso_time, one_line
from effector.server import DEFAULT_MCP_IDENTITY, ServerSettings, check_tls_pair, check_token
from effector.service import (
    DEFAULT_BUDGET_LEASE_MS,
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    Tokens,
    format_host_port,
    parse_host_port,
    parse_tokens,
)
from effector.store.errors import ConfigurationError, StoreError
from effector.worker import WorkerSettings

PROG = "beam-agents-effector"
DEFAULT_ADDRESS = "127.0.0.1:50051"

_log = logging.getLogger("effector")


class _Parser(argparse.ArgumentParser):
    """Reports a usage error as one line on stderr and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(minimum: int, text: str) -> int:
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}")
    return value


_positive_int = functools.partial(_int_at_least, 1)
_non_negative_int = functools.partial(_int_at_least, 0)


def _host_port(text: str) -> str:
    try:
        parse_host_port(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _flag_value(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _option(
    parser: argparse.ArgumentParser,
    flag: str,
    help_text: str,
    *,
    default: str | None = None,
    **kwargs: Any,
) -> None:
    """Add ``flag`` with its environment variable as the default (argparse converts it)."""
    variable = env_name(flag)
    shown = f"; default {default}" if default else ""
    parser.add_argument(
        flag,
        default=os.environ.get(variable, default),
        help=f"{help_text} [env {variable}{shown}]",
        **kwargs,
    )


def _switch(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    variable = env_name(flag)
    try:
        default = _flag_value(os.environ.get(variable, ""))
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{variable}: {exc}")
    parser.add_argument(
        flag, action="store_true", default=default, help=f"{help_text} [env {variable}]"
    )


def _add_auth_options(parser: argparse.ArgumentParser) -> None:
    _option(
        parser,
        "--token",
        "shared secret for 'authorization: Bearer <token>'; prefer --token-file or the "
        "environment, since command lines are visible to other users",
        metavar="TOKEN",
    )
    _option(
        parser,
        "--token-file",
        "file holding the shared secret, or (serve) one 'name:token[:channel,...]' line per "
        "approver: decisions record the name, limited to those channels",
        metavar="PATH",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = _Parser(
        prog=PROG,
        description="The beam-agents effector: executes each side-effecting intent once and "
        "serves the ordered stream of result envelopes over gRPC.",
        epilog="Every flag may also be set through the environment variable shown beside it.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run an effector server",
        description="Run an effector: gRPC server, worker and, if asked, metrics, web console "
        "and MCP endpoint. Prints 'effector listening on HOST:PORT' when ready, then 'effector "
        "console on URL', 'effector mcp on URL' and 'effector metrics on URL' (with the port "
        "picked for port 0) if served; SIGTERM/SIGINT drain and exit 0.",
    )
    _option(
        serve,
        "--tools",
        "the tools to execute: MODULE:ATTRIBUTE naming a ToolRegistry or a zero-argument "
        "callable returning one (the working directory is importable)",
        metavar="MODULE:ATTR",
    )
    _option(
        serve,
        "--store",
        "where intents and results are recorded: a file path (SQLite), sqlite:///relative.db, "
        "sqlite:////absolute/path.db (add ?synchronous=normal to trade power-loss durability "
        "for speed), or postgresql://user@host/dbname for a store shared by replicas",
        metavar="URL",
    )
    _option(
        serve,
        "--listen",
        "address to serve gRPC on; port 0 picks a free port (printed when ready). A "
        "non-loopback host needs a token or --allow-insecure-bind",
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        type=_host_port,
    )
    _option(
        serve,
        "--lease-ms",
        "how long a claim on an intent stays valid without renewal; a crashed replica's "
        "intents are claimed again after it runs out",
        default="30000",
        metavar="MS",
        type=_positive_int,
    )
    _option(
        serve,
        "--tool-timeout-ms",
        "how long one tool call may run before its result is ERROR",
        default="30000",
        metavar="MS",
        type=_positive_int,
    )
    _option(
        serve,
        "--result-retention-s",
        "how long DONE intents and published envelopes are kept; a duplicate submitted "
        "within this time is still recognised",
        default=str(7 * 24 * 3600),
        metavar="SECONDS",
        type=_positive_int,
    )
    _option(
        serve,
        "--telemetry-retention-s",
        "how long trace events and error records sent by WriteTraces and WriteErrors are kept",
        default=str(7 * 24 * 3600),
        metavar="SECONDS",
        type=_positive_int,
    )
    _option(
        serve,
        "--concurrency",
        "how many intents (each of a different entity key) execute at once; 0 serves "
        "ingest-only: it records and publishes but executes nothing, leaving that to the other "
        "replicas on the same PostgreSQL store",
        default="64",
        metavar="N",
        type=_non_negative_int,
    )
    _option(
        serve,
        "--policy",
        "an effect policy file (TOML with CEL rules) every TOOL intent passes at intake: allow, "
        "deny (a published REJECTED result naming the rule) or require approval; reloaded when "
        "it changes and on SIGHUP (a bad file keeps the last good one); a bad file at start "
        "refuses to serve",
        metavar="FILE",
    )
    _option(
        serve,
        "--budget-lease-ms",
        "how long a fleet budget allowance leased to a worker lasts; a dead worker's unspent "
        "allowance returns to its budget after it",
        default=str(DEFAULT_BUDGET_LEASE_MS),
        metavar="MS",
        type=_positive_int,
    )
    _add_auth_options(serve)
    _option(serve, "--tls-cert", "PEM certificate chain; serve TLS only", metavar="PATH")
    _option(serve, "--tls-key", "PEM private key of --tls-cert", metavar="PATH")
    _option(
        serve,
        "--metrics-listen",
        "serve Prometheus metrics over HTTP on this address (off unless given); port 0 picks a "
        "free port (printed when ready)",
        metavar="HOST:PORT",
        type=_host_port,
    )
    _option(
        serve,
        "--console-listen",
        "serve the web console (beam-agents[console]: overview, keys and their runs, intents, "
        "approvals inbox, errors) over HTTP on this address (off unless given; HTTPS with "
        "--tls-cert and --tls-key); port 0 picks a free port (printed when ready). With a "
        "token the console asks for it at login; a non-loopback host needs a token or "
        "--allow-insecure-bind",
        metavar="HOST:PORT",
        type=_host_port,
    )
    _option(
        serve,
        "--mcp-listen",
        "serve the operator MCP endpoint (/mcp; beam-agents[console]): list, approve, deny "
        "approvals, read intents; port 0 picks a port. With a token requests need "
        "'authorization: Bearer <token>'; without one it serves on loopback only",
        metavar="HOST:PORT",
        type=_host_port,
    )
    _option(
        serve,
        "--mcp-identity",
        "the identity configured for the token: the approver recorded for MCP decisions",
        default=DEFAULT_MCP_IDENTITY,
        metavar="NAME",
    )
    _switch(
        serve,
        "--allow-insecure-bind",
        "allow a non-loopback --listen or --console-listen without a token "
        "(anyone who can connect can submit, decide and publish)",
    )
    _option(
        serve,
        "--log-level",
        "logging threshold on stderr",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
    )

    status = commands.add_parser(
        "status", help="print a running effector's counts as JSON", description="Print counts."
    )
    pending = commands.add_parser(
        "pending",
        help="list the approval intents awaiting a decision",
        description="Print the approval intents awaiting a decision, oldest first, one per line: "
        "INTENT_ID ENTITY_KEY ARGS_JSON. ENTITY_KEY is the key as text when it is printable "
        "UTF-8 without whitespace (and does not start with 0x), otherwise 0x and its hex. Says "
        "so on stderr when nothing is pending.",
    )
    failed = commands.add_parser(
        "failed",
        help="list the intents whose result is not OK",
        description="Print the DONE intents whose result is ERROR, EXPIRED or REJECTED, oldest "
        "first, one per line: INTENT_ID ENTITY_KEY TOOL STATUS ERROR_MESSAGE (ENTITY_KEY as for "
        "pending). Says so on stderr when there are none.",
    )
    for listing in (pending, failed):
        _option(
            listing,
            "--limit",
            f"list at most this many (the server caps it at {MAX_LIST_LIMIT})",
            default=str(DEFAULT_LIST_LIMIT),
            metavar="N",
            type=_positive_int,
        )
    policies = commands.add_parser(
        "policies",
        help="print the effect policy in force and its newest decisions",
        description="Print the effect policy a running effector enforces: its file, digest and "
        "default, one line per counter and per rule (NAME OUTCOME DECISIONS line N: WHEN), a "
        "failed reload's error, then its newest decisions, one per line: INTENT_ID ENTITY_KEY "
        "TOOL RULE OUTCOME STATE. With --check FILE, parse FILE here instead (no effector is "
        "asked): exits 0 and prints its rules if it is valid, 2 naming the line if not.",
    )
    _option(
        policies,
        "--check",
        "validate this policy file locally instead of asking an effector",
        metavar="FILE",
    )
    _option(
        policies,
        "--limit",
        f"list at most this many decisions (the server caps it at {MAX_LIST_LIMIT})",
        default="20",
        metavar="N",
        type=_positive_int,
    )
    budgets = commands.add_parser(
        "budgets",
        help="print the fleet budgets' windows: cap, debited, leased, left",
        description="Print the newest fleet budget windows, one per line: LEDGER WINDOW_START "
        "WINDOW_MS ms tokens T cost C USD requests R, LIVE_LEASES leases, DEBITS debits. Each "
        "capped measure prints as DEBITED+LEASED/CAP (LEFT left), an uncapped one as DEBITED "
        "(no cap). Says so on stderr when there are none.",
    )
    _option(
        budgets,
        "--limit",
        f"list at most this many windows (the server caps it at {MAX_LIST_LIMIT})",
        default=str(DEFAULT_LIST_LIMIT),
        metavar="N",
        type=_positive_int,
    )
    show = commands.add_parser(
        "show",
        help="print everything recorded about one intent",
        description="Print one intent as the effector recorded it, one field per line: its "
        "kind, state, key, tool and arguments, attempts, creation and expiry times (the "
        "pipeline's event time) and, once it is DONE or WITHDRAWN, its result's status, "
        "completion time (the effector's wall clock), payload and error. Each time is labelled "
        "with its clock; control and bidi characters print as ⟨U+XXXX⟩ marks. Exits 1 if the "
        "effector has no such intent.",
    )
    show.add_argument("intent_id", metavar="INTENT_ID", help="the intent's id")
    approve = commands.add_parser(
        "approve",
        help="approve an approval intent",
        description="Approve an APPROVAL intent; exits 1, saying why, if the decision was not "
        "applied (unknown, already decided, expired or withdrawn).",
    )
    deny = commands.add_parser(
        "deny",
        help="deny an approval intent",
        description="Deny an APPROVAL intent; exits 1, saying why, if the decision was not "
        "applied (unknown, already decided, expired or withdrawn).",
    )
    for client_command in (status, pending, failed, policies, budgets, show, approve, deny):
        _option(
            client_command,
            "--target",
            "the effector to talk to",
            default=DEFAULT_ADDRESS,
            metavar="HOST:PORT",
        )
        _add_auth_options(client_command)
        _option(
            client_command,
            "--tls-root-cert",
            "PEM root certificate to verify the server with (turns TLS on)",
            metavar="PATH",
        )
        _option(
            client_command,
            "--timeout-s",
            "deadline for the call",
            default="10",
            metavar="SECONDS",
            type=_positive_int,
        )
    for decision in (approve, deny):
        decision.add_argument("intent_id", metavar="INTENT_ID", help="the approval intent's id")
        _option(
            decision, "--approver", "who decides (recorded; a named token's name wins)", default=""
        )
        _option(decision, "--reason", "free text recorded with the decision", default="")
        _option(
            decision,
            "--digest",
            "the args digest 'show' printed: the decision is refused if the approval's arguments "
            "are not those (default: the digest of its arguments now)",
            default="",
            metavar="HEX",
        )
    _option(
        approve,
        "--edit",
        "approve these arguments instead (a JSON object the gated tool accepts)",
        default="",
        metavar="JSON",
    )
    return parser


def load_registry(spec: str) -> ToolRegistry:
    """Resolve ``module:attribute`` to a ``ToolRegistry`` (or a callable returning one)."""
    module_name, separator, attribute = spec.partition(":")
    if not separator or not module_name or not attribute:
        raise ConfigurationError(f"--tools must be MODULE:ATTRIBUTE, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import tools module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attribute!r}") from None
    if isinstance(found, Tool):
        raise ConfigurationError(
            f"{spec} is a tool ({found.name!r}), not a ToolRegistry: name a "
            f"ToolRegistry([...]) holding it, or a zero-argument callable returning one"
        )
    if not isinstance(found, ToolRegistry) and callable(found):
        try:
            found = found()
        except Exception as exc:
            raise ConfigurationError(
                f"calling {spec} failed: {type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(found, ToolRegistry):
        raise ConfigurationError(
            f"{spec} is a {type(found).__name__}, not a ToolRegistry or a callable returning one"
        )
    return found


def read_file(path: str, what: str) -> bytes:
    """The bytes of ``path``; a ``ConfigurationError`` naming ``what`` if it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path!r}: {exc.strerror}") from None


def load_tokens(token: str | None, token_file: str | None) -> Tokens | None:
    """The tokens given by ``--token`` or ``--token-file`` (not both); ``None`` without either."""
    if token and token_file:
        raise ConfigurationError("give the token once: --token or --token-file, not both")
    if token_file:
        text = read_file(token_file, "token file").decode("utf-8", "replace")
        return parse_tokens(text, token_file)
    if token is None:
        return None
    check_token(token)
    return Tokens.single(token.strip())


def _server_settings(args: argparse.Namespace) -> ServerSettings:
    if not args.tools:
        raise ConfigurationError(f"--tools is required (or {env_name('--tools')})")
    if not args.store:
        raise ConfigurationError(f"--store is required (or {env_name('--store')})")
    check_tls_pair(args.tls_cert or None, args.tls_key or None)  # before reading either file
    tokens = load_tokens(args.token, args.token_file)
    return ServerSettings(
        listen=args.listen,
        token=None if tokens is None else tokens.primary,
        tokens=tokens if tokens is not None and tokens.named else None,
        tls_cert=read_file(args.tls_cert, "TLS certificate") if args.tls_cert else None,
        tls_key=read_file(args.tls_key, "TLS key") if args.tls_key else None,
        allow_insecure_bind=args.allow_insecure_bind,
        metrics_listen=args.metrics_listen,
        console_listen=args.console_listen,
        mcp_listen=args.mcp_listen,
        mcp_identity=args.mcp_identity,
        tool_timeout_ms=args.tool_timeout_ms,
        telemetry_retention_s=args.telemetry_retention_s,
        policy_file=args.policy or None,
        budget_lease_ms=args.budget_lease_ms,
        worker=WorkerSettings(
            concurrency=args.concurrency,
            lease_ms=args.lease_ms,
            result_retention_ms=args.result_retention_s * 1000,
        ),
    )


async def _serve(args: argparse.Namespace) -> int:
    settings = _server_settings(args)
    settings.check()
    registry = load_registry(args.tools)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with running_server(args.store, registry, settings) as server:
        if server.policy is not None:
            loop.add_signal_handler(signal.SIGHUP, server.reload_policy)
        print(f"{READY_PREFIX}{server.address}", flush=True)
        for prefix, url in (
            (CONSOLE_PREFIX, server.console_url),
            (MCP_PREFIX, server.mcp_url),
            (METRICS_PREFIX, metrics_url(server.metrics_port, args.metrics_listen)),
        ):
            if url is not None:
                print(f"{prefix}{url}", flush=True)
        await stop.wait()
        _log.info("signal received, draining")
    return 0


def metrics_url(port: int | None, listen: str | None) -> str | None:
    """The metrics endpoint's URL on the port it bound (the one picked when 0 was asked)."""
    if port is None or listen is None:
        return None
    host, _ = parse_host_port(listen)
    return f"http://{format_host_port(host, port)}/metrics"


def _with_client(
    command: Callable[[EffectorClient, argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``command`` run with a client connected as the arguments say, closed after."""

    def run(args: argparse.Namespace) -> int:
        root = read_file(args.tls_root_cert, "TLS root certificate") if args.tls_root_cert else None
        tokens = load_tokens(args.token, args.token_file)
        token = None if tokens is None else tokens.primary
        with EffectorClient(
            args.target, token=token, root_certificates=root, timeout_s=args.timeout_s
        ) as client:
            return command(client, args)

    return run


def status(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the counts of intents in each state and the log head, as one JSON object."""
    counts = client.status()
    fields = {field.name: getattr(counts, field.name) for field in counts.DESCRIPTOR.fields}
    print(json.dumps(fields, sort_keys=True))
    return 0


def pending(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the approvals awaiting a decision, oldest first, one per line."""
    intents = client.list_intents(IntentState.AWAITING_DECISION, limit=args.limit)
    for intent in intents:
        print(inbox_line(intent))
    if not intents:
        print("nothing pending: no approval awaits a decision", file=sys.stderr)
    return 0


def failed(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the DONE intents whose result is not OK, oldest first, one per line."""
    entries = client.list_failed(limit=args.limit)
    for intent, result in entries:
        print(failed_line(intent, result))
    if not entries:
        print("nothing failed: every DONE intent has an OK result", file=sys.stderr)
    return 0


def show(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print everything the effector recorded about one intent, one field per line."""
    response = client.get_intent(args.intent_id)
    if not response.found:
        print(f"no intent {args.intent_id}", file=sys.stderr)
        return 1
    lines = intent_report(response)
    target_id = response.intent.withdraws_intent_id
    if response.intent.kind == ToolIntent.WITHDRAWAL and target_id:
        lines.append(("outcome", withdrawal_outcome(client.get_intent(target_id))))
    for name, value in lines:
        print(f"{name + ':':<14}{value}")
    return 0


def withdrawal_outcome(target: GetIntentResponse) -> str:
    """What a WITHDRAWAL did to its target, as its target's record tells it now."""
    if not target.found:
        return "its target is not recorded (not yet, or pruned): it is WITHDRAWN if it arrives"
    if target.state == IntentState.WITHDRAWN:
        return "withdrew its target before it started"
    state = enum_name(IntentState, target.state)
    return f"too late: its target had started or finished ({state}), so it was not withdrawn"


def send_decision(client: EffectorClient, args: argparse.Namespace, *, approved: bool) -> int:
    """Approve or deny (``--digest``, else the one shown now); exit 1 if it was not applied."""
    digest = args.digest
    if not digest:
        shown = client.get_intent(args.intent_id)
        if not shown.found:
            print(f"no intent {args.intent_id}", file=sys.stderr)
            return 1
        digest = shown.args_digest  # a WITHDRAWN one is still sent: the effector logs why not
    decision = client.decide(
        args.intent_id,
        approved=approved,
        approver=args.approver,
        reason=args.reason,
        args_digest=digest,
        edited_args_json=getattr(args, "edit", ""),
    )
    if not decision.applied:
        if decision.state == IntentState.INTENT_STATE_UNSPECIFIED:
            print(f"no intent {args.intent_id}", file=sys.stderr)
        else:
            state = enum_name(IntentState, decision.state)
            print(f"not applied: {one_line(decision.reason)} (state {state})", file=sys.stderr)
        return 1
    if decision.state == IntentState.AWAITING_DECISION:
        print(f"voted on {args.intent_id}: {one_line(decision.reason)}")
        return 0
    if decision.result.status != ToolResult.OK:
        status_name = enum_name(ToolResult.Status, decision.result.status)
        print(
            f"not applied: the approval is {status_name}: "
            f"{one_line(decision.result.error_message) or '-'}",
            file=sys.stderr,
        )
        return 1
    print(f"{'approved' if approved else 'denied'} {args.intent_id}")
    return 0


def withdrawn_text(response: GetIntentResponse) -> str:
    """Why a WITHDRAWN intent was withdrawn, on one line."""
    reason = one_line(response.result.error_message) if response.HasField("result") else ""
    return f"intent {response.intent.intent_id} was withdrawn: {reason or 'no reason recorded'}"


def inbox_line(intent: ToolIntent) -> str:
    """``<intent_id> <entity_key> <args_json>``: one approval awaiting a decision, on one line.

    Line breaks, escapes and bidi controls in the arguments show as ``⟨U+...⟩`` marks.
    """
    # Recorded approvals hold valid JSON, where a raw line break can only be insignificant
    # whitespace, so replacing it keeps the arguments intact and the entry on one line.
    args_json = (intent.args_json or "{}").replace("\r", " ").replace("\n", " ")
    return f"{one_line(intent.intent_id)} {display_key(intent.entity_key)} {one_line(args_json)}"


def failed_line(intent: ToolIntent, result: ToolResult) -> str:
    """``<intent_id> <entity_key> <tool> <STATUS> <error>``: one failed intent, on one line."""
    status_name = enum_name(ToolResult.Status, result.status)
    error = one_line(" ".join(result.error_message.split()))
    line = (
        f"{one_line(intent.intent_id)} {display_key(intent.entity_key)} "
        f"{one_line(intent.tool_name)} {status_name}"
    )
    return f"{line} {error}" if error else line


EVENT_TIME = "pipeline event time"
WALL_CLOCK = "effector wall clock"


def intent_report(response: GetIntentResponse) -> list[tuple[str, str]]:
    """The ``(field, value)`` lines ``show`` prints for one recorded intent, each one line."""
    intent = response.intent
    lines = [
        ("intent_id", intent.intent_id),
        ("kind", enum_name(ToolIntent.Kind, intent.kind)),
        ("state", enum_name(IntentState, response.state)),
        ("entity_key", display_key(intent.entity_key)),
        ("seq", str(intent.seq)),
        ("step_index", str(intent.step_index)),
        ("tool", intent.tool_name or "-"),
        ("args", intent.args_json or "{}"),
    ]
    if intent.kind == ToolIntent.APPROVAL:
        lines.append(("channel", intent.channel or "-"))
    if intent.compensates_intent_id:
        lines.append(("compensates", intent.compensates_intent_id))
    if intent.withdraws_intent_id:
        lines.append(("withdraws", intent.withdraws_intent_id))
    if response.policy_rule:
        lines.append(("policy", f"rule {response.policy_rule}: {response.policy_outcome}"))
    if response.policy_gate_id and response.state == IntentState.AWAITING_DECISION:
        lines.append(("held_for", f"approval {response.policy_gate_id}"))
    if intent.policy_gate_for:
        lines.append(
            ("opened_by", f"policy rule {intent.policy_rule} for {intent.policy_gate_for}")
        )
    lines += approval_lines(response)
    if response.state == IntentState.WITHDRAWN:
        lines.append(("withdrawn", withdrawn_text(response)))
    lines += [
        ("attempts", str(response.attempts)),
        *_in_doubt_lines(response),
        ("received_at", f"{timestamp(response.received_at_ms)} [{WALL_CLOCK}]"),
        (
            "deadline",
            f"{timestamp(response.deadline_ms)} [{WALL_CLOCK}]"
            if response.deadline_ms
            else "never",
        ),
        ("staged_at", f"{timestamp(intent.created_at_ms)} [{EVENT_TIME}]"),
    ]
    if response.HasField("result"):
        result = response.result
        lines += [
            ("result", enum_name(ToolResult.Status, result.status)),
            ("completed_at", f"{timestamp(result.completed_at_ms)} [{WALL_CLOCK}]"),
            ("payload", _shown_payload(result.payload)),
            ("error", " ".join(result.error_message.split()) or "-"),
        ]
    else:
        lines.append(("result", "- (not DONE yet)"))
    return [(name, one_line(value)) for name, value in lines]


def _shown_payload(payload: bytes) -> str:
    """A payload as text when it is UTF-8 (``one_line`` then marks what hides), else hex."""
    try:
        return payload.decode("utf-8") or "-"
    except UnicodeDecodeError:
        return payload_text(payload)


def approval_lines(response: GetIntentResponse) -> list[tuple[str, str]]:
    """An approval's digest, gated tool, quorum and votes; a tool intent's edit lineage."""
    intent = response.intent
    if intent.HasField("edited_from"):
        edit = intent.edited_from
        return [
            ("edited_from", edit.approval_intent_id),
            ("edited_by", edit.edited_by),
            ("edit_diff", edit.diff_json),
        ]
    if intent.kind != ToolIntent.APPROVAL:
        return []
    lines = [("args_digest", response.args_digest or "-"), ("gates_tool", intent.gated_tool or "-")]
    if intent.required_approvals > 1:
        lines.append(("quorum", f"{len(response.votes)} of {intent.required_approvals} approvals"))
        lines += [("vote", f"{vote.approver}: {vote.reason or '-'}") for vote in response.votes]
    return lines


def _in_doubt_lines(response: GetIntentResponse) -> list[tuple[str, str]]:
    """Why an IN_DOUBT intent's reconciler failed, and when it is asked again."""
    if response.state != IntentState.IN_DOUBT:
        return []
    reason = " ".join(response.in_doubt_reason.split()) or "-"
    return [("in_doubt", reason), ("retry_at", f"{timestamp(response.retry_at_ms)} [{WALL_CLOCK}]")]


def timestamp(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC with the number: ``...T12:00:00.000Z (ms)``; or out of range."""
    shown = iso_time(ms)
    return shown if shown.startswith("out of range") else f"{shown} ({ms})"


def policies(args: argparse.Namespace) -> int:
    """Print the policy in force and its newest decisions (``--check``: a local file's rules)."""
    if not args.check:
        return _with_client(lambda client, _: _print_policies(client.policies(args.limit)))(args)
    try:
        policy = load_policy(args.check)
    except PolicyError as exc:
        raise ConfigurationError(str(exc)) from None
    return _print_policies(policy_answer(policy))


def _print_policies(answer: PoliciesResponse) -> int:
    if not answer.enforced:
        print("no effect policy: every effect is allowed (serve --policy FILE sets one)")
        return 0
    loaded = f" loaded {timestamp(answer.loaded_at_ms)}" if answer.loaded_at_ms else ""
    print(
        f"policy {one_line(answer.source)} sha256 {answer.digest}{loaded} "
        f"default {answer.default_outcome}"
    )
    for counter in answer.counters:
        print(
            f"counter {counter.name} counts {one_line(counter.tool)} per {counter.per} "
            f"over {counter.window_ms} ms"
        )
    for rule in answer.rules:
        print(
            f"rule {rule.name} {rule.outcome} {rule.decisions} line {rule.line}: "
            f"{one_line(' '.join(rule.when.split()))}"
        )
    if answer.reload_error:
        print(f"reload refused (the policy above is in force): {one_line(answer.reload_error)}")
    for decision in answer.recent:
        print(
            f"{decision.intent_id} {display_key(decision.entity_key)} "
            f"{one_line(decision.tool_name) or '-'} {decision.rule} {decision.outcome} "
            f"{enum_name(IntentState, decision.state)}"
        )
    return 0


def budgets(client: EffectorClient, args: argparse.Namespace) -> int:
    """Print the newest budget windows, one per line."""
    windows = client.budgets(args.limit)
    for window in windows:
        tokens = _measure(window.cap_tokens, window.debited_tokens, window.leased_tokens, "")
        cost = _measure(
            window.cap_cost_micros, window.debited_cost_micros, window.leased_cost_micros, " USD"
        )
        requests = _measure(
            window.cap_requests, window.debited_requests, window.leased_requests, ""
        )
        print(
            f"{one_line(window.ledger)} {iso_time(window.window_start_ms)} "
            f"{window.window_ms} ms tokens {tokens} cost {cost} requests {requests}, "
            f"{window.live_leases} leases, {window.debits} debits"
        )
    if not windows:
        print("no budget windows: no worker has leased from a fleet budget", file=sys.stderr)
    return 0


def _measure(cap: int, debited: int, leased: int, unit: str) -> str:
    """``DEBITED+LEASED/CAP (LEFT left)`` of one measure; micro-dollars shown as dollars."""

    def shown(amount: int) -> str:
        return f"{amount / 1_000_000:.6f}" if unit else str(amount)

    if not cap:
        return f"{shown(debited)} (no cap)"
    left = max(cap - debited - leased, 0)
    return f"{shown(debited)}+{shown(leased)}/{shown(cap)}{unit} ({shown(left)} left)"


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "serve": lambda args: asyncio.run(_serve(args)),
    "status": _with_client(status),
    "pending": _with_client(pending),
    "failed": _with_client(failed),
    "policies": policies,
    "budgets": _with_client(budgets),
    "show": _with_client(show),
    "approve": _with_client(functools.partial(send_decision, approved=True)),
    "deny": _with_client(functools.partial(send_decision, approved=False)),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(
            level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    try:
        return _COMMANDS[args.command](args)
    except (ConfigurationError, StoreError) as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        print(f"{PROG}: {args.command} failed: {code}: {_one_line(detail)}", file=sys.stderr)
        return 1


def _one_line(text: str) -> str:
    return one_line(" ".join(text.split()))
