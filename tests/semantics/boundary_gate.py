# mypy: disallow-untyped-calls=False
"""The bad-input gate's boundary helpers: hostile values, what each must get, and the readers.

- Hostile values: times at and past the bounds of years 1-9999 and of int64, JSON nested
  past the depth limit, text full of bidi and control characters, payloads of megabytes.
- Expectations written from the protos and issue 42: a value out of range is refused per item
  (:data:`MUST`), a value in range is taken (:data:`VALID`), and for values the contract does not
  pin either way (:data:`EITHER`) only the readers that follow are held to account.
- :class:`Readers`: after every batch, every console page (logged in with the token) and the
  operator MCP endpoint's read tools; none may answer 500 or a tool error, and no page may show
  a bidi or control character raw. It also re-drives stored errors and denies approvals.
- :func:`delivered_by_pipeline`: every envelope of the log, read by ``ReadEnvelopes`` on Beam's
  FnApiRunner until the log is idle.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import grpc
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import beam_agents._protos as pb
from beam_agents._protos import AgentEnvelope, time_problem
from beam_agents.io import ReadEnvelopes
from effector.console.actions import ROUTES as ACTION_ROUTES
from effector.console.pages import ROUTES as PAGE_ROUTES
from effector.launch import child_environment
from tests.io.io_harness import Collector, run_pipeline

Expectation = Literal["valid", "must", "either"]
VALID: Expectation = "valid"
"""In range: must be taken (recorded, appended, accepted)."""
MUST: Expectation = "must"
"""Out of range as the contract states it: must be refused, alone."""
EITHER: Expectation = "either"
"""Odd but not pinned by the contract: taken or refused, and every reader must survive it."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
YEAR_10000_MS = pb.MAX_TIME_MS + 1
OUT_OF_RANGE_TIMES = (INT64_MIN, INT64_MAX, 2**62, -(2**62), YEAR_10000_MS, pb.MIN_TIME_MS - 1)
"""Times no message may carry: int64's ends, 2**62 both ways, year 10000, year 0."""
EDGE_TIMES = (pb.MIN_TIME_MS, pb.MAX_TIME_MS, -1, 1)
"""Times at the edges of what messages may carry: year 1, the last ms of 9999, around 1970."""
HOSTILE_CHARS = "\u202e\u202d\u2066\u2067\u2069\u200f\u200e\x00\x07\x08\x1b\x7f\r\n\t\u0085\u2028"
SPOOF = "acct-\u202e4321-evil\x1b[2J\x00"
"""The issue's right-to-left override, with a terminal escape and a NUL for good measure."""
DEEP = 1_000
VERY_DEEP = 200_000
BIG_ENVELOPE_BYTES = 9 * 1024 * 1024
"""Two of them exceed one Read answer (the issue's point 5); each fits in one on its own."""
MESSAGE_CAP_BYTES = 16 * 1024 * 1024
"""The largest gRPC message the effector and its clients take (their documented default)."""
CALL_TIMEOUT_S = 30.0
REPO = Path(__file__).resolve().parents[2]


def deep_json(depth: int, leaf: str = "1") -> str:
    """JSON arrays nested ``depth`` deep around ``leaf``."""
    return "[" * depth + leaf + "]" * depth


def deep_object(depth: int) -> str:
    """A JSON object whose ``note`` value nests ``depth`` deep (a tool's argument shape)."""
    return '{"note":' + deep_json(depth - 1, '"x"') + "}"


def time_in_range(value_ms: int) -> bool:
    """Whether a message may carry ``value_ms`` (years 1-9999)."""
    return time_problem("t", value_ms) is None


# -- what each item must get --------------------------------------------------------------


def envelope_expectation(envelope: AgentEnvelope) -> Expectation:
    """What ``Publish`` owes one envelope: refused with a problem, appended, or either."""
    if not envelope.entity_key or envelope.WhichOneof("payload") != "external_event":
        return MUST
    if envelope.event_time_ms and not time_in_range(envelope.event_time_ms):
        return MUST
    if envelope.ByteSize() > 1024 * 1024 or len(envelope.entity_key) > 4_096:
        return EITHER  # the size cap is the effector's to choose; Read must then serve it
    return VALID


def intent_time_problem(intent: pb.ToolIntent) -> str | None:
    """An intent time out of range: the intent must be refused (REJECTED), never a crash."""
    problem = time_problem("created_at_ms", intent.created_at_ms)
    if problem is None and intent.expires_at_ms:
        problem = time_problem("expires_at_ms", intent.expires_at_ms)
    return problem


def trace_expectation(event: pb.TraceEvent) -> Expectation:
    """What ``RecordTraces`` owes one event, from its times alone (the rest is either)."""
    if not (time_in_range(event.start_ms) and time_in_range(event.end_ms)):
        return MUST
    return EITHER


def error_expectation(error: pb.AgentError) -> Expectation:
    """What ``RecordErrors`` owes one dead letter, from its event time alone."""
    return MUST if not time_in_range(error.event_time_ms) else EITHER


def record_expectation(record: pb.ActivationRecord) -> Expectation:
    """What ``RecordActivations`` owes one record, from its envelope's event time alone."""
    return MUST if not time_in_range(record.envelope.event_time_ms) else EITHER


# -- the readers ---------------------------------------------------------------------------

_HREF = re.compile(r'href="([^"#]+)"')
_ERROR_PAGE = re.compile(r"/errors/[0-9a-f]+")
RAW_MARKS = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Bidi and control characters a page or the CLI must show as visible marks, never raw."""
FIXED_PAGES = (
    "/",
    "/?window=1440",
    "/keys",
    "/keys?q=%E2%80%AE",
    "/intents",
    *(
        f"/intents?state={state}"
        for state in ("PENDING", "RUNNING", "IN_DOUBT", "AWAITING_DECISION", "DONE", "WITHDRAWN")
    ),
    "/intents?tool=touch",
    "/approvals",
    "/errors",
)
GET_ROUTES = [
    route
    for route in (*PAGE_ROUTES, *ACTION_ROUTES)
    if "GET" in (route.methods or ()) and not route.path.startswith("/login")
]
"""Every page the console serves (its login aside): each sweep of a gate run must reach all."""
PAGES_PER_SWEEP = 80
LINK_LEVELS = 2
LINKS_PER_ROUTE = 6
"""Links followed per console route at each level of a sweep."""
"""Pages past the fixed ones each sweep fetches at most: hostile items first, then the rest."""


@dataclass
class Touched:
    """The keys and intents a batch touched; hostile ones are always swept."""

    keys: dict[bytes, bool] = field(default_factory=dict)
    intents: dict[str, bool] = field(default_factory=dict)

    def key(self, key: bytes, hostile: bool = False) -> None:
        if key:
            self.keys[key] = self.keys.get(key, False) or hostile

    def intent(self, intent_id: str, hostile: bool = False) -> None:
        self.intents[intent_id] = self.intents.get(intent_id, False) or hostile

    def take(self, limit: int) -> tuple[list[bytes], list[str]]:
        """Up to ``limit`` keys and intents (hostile first), then forget them all."""
        keys = sorted(self.keys, key=lambda k: (not self.keys[k], k))[: limit // 2]
        intents = sorted(self.intents, key=lambda i: (not self.intents[i], i))[: limit // 2]
        self.keys.clear()
        self.intents.clear()
        return keys, intents


@dataclass
class Readers:
    """The console (logged in with the token) and the operator MCP endpoint of one effector."""

    console_url: str
    mcp_url: str
    token: str
    failures: list[str] = field(default_factory=list)
    pages: int = 0
    mcp_calls: int = 0
    seconds: float = 0.0
    touched: Touched = field(default_factory=Touched)
    broken: set[str] = field(default_factory=set)
    """Pages that have failed (each is reported once)."""
    reached: set[str] = field(default_factory=set)
    """The console routes (their path patterns) some fetched page belonged to."""
    _http: httpx.Client | None = None

    def _console(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(
                base_url=self.console_url.rstrip("/"), follow_redirects=False, timeout=60
            )
            login = self._http.post("/login", data={"token": self.token, "next": "/"})
            assert login.status_code == 303, (login.status_code, login.text[:500])
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def sweep(self, batch: str) -> None:
        """Every fixed page, the pages of what the batch touched and the links on them, and MCP."""
        started = time.monotonic()
        keys, intents = self.touched.take(PAGES_PER_SWEEP)
        paths = [*FIXED_PAGES, *(f"/keys/{key.hex()}" for key in keys)]
        paths += [f"/intents/{intent_id}" for intent_id in intents]
        paths += [f"/intents/{intent_id}/raw/args" for intent_id in intents[:5]]
        seen: set[str] = set()
        found: list[str] = []
        for path in paths:
            found += self._page(batch, path, seen)
        # Two levels of links from those pages (error pages, their raw values and re-drive
        # forms, runs, other keys and intents), a few of each route's at each level.
        for _ in range(LINK_LEVELS):
            following, found = _a_few_of_each_route(found, seen), []
            for path in following:
                found += self._page(batch, path, seen)
        asyncio.run(self._mcp(batch, intents))
        self.seconds += time.monotonic() - started

    def _page(self, batch: str, path: str, seen: set[str]) -> list[str]:
        """Fetch one page (a failure unless it renders); the local GET links it holds."""
        seen.add(path)
        self.pages += 1
        bare = path.split("?", 1)[0]
        self.reached.update(r.path for r in GET_ROUTES if r.path_regex.fullmatch(bare))
        started = time.monotonic()
        try:
            answer = self._get(path)
        except httpx.HTTPError as error:
            self._broken(batch, path, f"failed: {error!r}")
            return []
        elapsed = time.monotonic() - started
        if answer.headers.get("location", "").startswith("/login"):
            self._broken(batch, path, "sent to the login: the session was lost, nothing rendered")
        elif answer.status_code >= 500 or answer.status_code in (401, 403):
            snippet = re.sub(r"\s+", " ", answer.text)[:200]
            self._broken(batch, path, f"-> {answer.status_code} {snippet}")
        elif elapsed > 30:
            self._broken(batch, path, f"took {elapsed:.0f}s")
        elif _is_page(answer) and (raw := RAW_MARKS.search(answer.text)) is not None:
            around = answer.text[max(0, raw.start() - 60) : raw.end() + 20]
            self._broken(batch, path, f"shows a raw {raw.group()!r} in {around!r}")
        if answer.status_code != 200 or not _is_page(answer):
            return []
        links = [_local(path, href) for href in _HREF.findall(answer.text)]
        if _ERROR_PAGE.fullmatch(path):  # its raw values are linked only when cut short
            links += [f"{path}/raw/envelope", f"{path}/raw/detail"]
        return [link for link in links if link is not None]

    def unreached(self) -> list[str]:
        """The console's pages no sweep has fetched."""
        return sorted({route.path for route in GET_ROUTES} - self.reached)

    def deny_by_mcp(self, intent_ids: Sequence[str]) -> None:
        """Deny each approval through the MCP endpoint with a spoofing reason; each must apply."""
        asyncio.run(self._deny(list(intent_ids)))

    async def _deny(self, intent_ids: list[str]) -> None:
        headers = {"authorization": f"Bearer {self.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(self.mcp_url, http_client=http)) as client,
        ):
            for intent_id in intent_ids:
                self.mcp_calls += 1
                arguments = {"intent_id": intent_id, "reason": SPOOF}
                result = await client.call_tool("deny", arguments)
                if result.is_error:
                    text = " ".join(getattr(c, "text", "") for c in result.content)[:200]
                    self.failures.append(f"MCP deny {intent_id} -> error {text}")

    def redrive_errors(self, batch: str) -> int:
        """Re-drive every error the errors page lists that offers it; how many were published.

        None may answer 500, and one that says it published must name a real offset.
        """
        listing = self._get("/errors")
        ids = dict.fromkeys(re.findall(r'href="/errors/([0-9a-f]+)"', listing.text))
        published = 0
        for error_id in ids:
            confirm = self._get(f"/errors/{error_id}/redrive")
            csrf = re.search(r'name="csrf_token" value="([0-9a-f]+)"', confirm.text)
            if confirm.status_code != 200 or csrf is None:
                continue
            form = {"csrf_token": csrf.group(1), "requester": SPOOF}
            answer = self._console().post(f"/errors/{error_id}/redrive", data=form)
            location = answer.headers.get("location", "")
            if answer.status_code >= 500:
                self._broken(batch, f"POST /errors/{error_id}/redrive", f"-> {answer.status_code}")
            elif answer.status_code == 303 and "offset=" in location:
                offset = location.rsplit("offset=", 1)[1]
                if not offset.isdigit() or int(offset) < 1:
                    self.failures.append(
                        f"after {batch}: POST /errors/{error_id}/redrive says it published "
                        f"at {location!r}"
                    )
                published += 1
        return published

    def _get(self, path: str) -> httpx.Response:
        """GET ``path``; once more on a fresh connection if the kept-alive one was dropped."""
        try:
            return self._console().get(path)
        except httpx.TransportError:
            # A server drops a connection after a 500; the next request on it then fails.
            return self._console().get(path, headers={"connection": "close"})

    def _broken(self, batch: str, path: str, what: str) -> None:
        """Report a page that fails, once: the batch after which it first failed."""
        if path not in self.broken:
            self.broken.add(path)
            self.failures.append(f"after {batch}: GET {path[:120]} {what}")

    async def _mcp(self, batch: str, intents: Sequence[str]) -> None:
        headers = {"authorization": f"Bearer {self.token}"}
        statuses: list[int] = []

        async def record(response: httpx2.Response) -> None:
            statuses.append(response.status_code)

        async with (
            httpx2.AsyncClient(
                headers=headers, timeout=60, event_hooks={"response": [record]}
            ) as http,
            Client(streamable_http_client(self.mcp_url, http_client=http)) as client,
        ):
            calls: list[tuple[str, dict[str, Any]]] = [("list_pending_approvals", {"limit": 100})]
            calls += [("intent_status", {"intent_id": intent_id}) for intent_id in intents]
            for tool, arguments in calls:
                self.mcp_calls += 1
                try:
                    result = await client.call_tool(tool, arguments)
                except Exception as error:  # a protocol error is a failure like any other
                    self.failures.append(f"after {batch}: MCP {tool} {arguments} raised {error!r}")
                    continue
                if result.is_error:
                    text = " ".join(getattr(c, "text", "") for c in result.content)[:200]
                    self.failures.append(f"after {batch}: MCP {tool} {arguments} -> error {text}")
        if any(status >= 500 for status in statuses):
            self.failures.append(f"after {batch}: MCP HTTP statuses {sorted(set(statuses))}")


def _a_few_of_each_route(links: Iterable[str], seen: set[str]) -> list[str]:
    """Up to ``LINKS_PER_ROUTE`` of ``links`` not fetched yet per console route, in order."""
    taken: dict[str, int] = {}
    chosen = []
    for link in dict.fromkeys(links):
        if link in seen:
            continue
        bare = link.split("?", 1)[0]
        route = next((r.path for r in GET_ROUTES if r.path_regex.fullmatch(bare)), bare)
        if taken.get(route, 0) < LINKS_PER_ROUTE:
            taken[route] = taken.get(route, 0) + 1
            chosen.append(link)
    return chosen


def _is_page(answer: httpx.Response) -> bool:
    """An HTML page to read (not a download of raw stored bytes, which are shown as they are)."""
    html = "html" in answer.headers.get("content-type", "")
    return html and "attachment" not in answer.headers.get("content-disposition", "")


def _local(base: str, href: str) -> str | None:
    """``href`` as a path of the console worth a GET, or ``None`` (static, off-site, actions)."""
    href = href.replace("&amp;", "&")
    parts = urlsplit(urljoin("http://console" + base, href))
    if parts.netloc != "console" or parts.path.startswith(("/static", "/logout", "/login")):
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


# -- talking to a token-guarded effector ---------------------------------------------------


class BearerToken(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer <token>`` to every unary call of a channel."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        metadata = [*(details.metadata or ()), self._metadata]
        return continuation(details._replace(metadata=metadata), request)


def walk_the_log(stub: Any, head: int, failures: list[str]) -> int:
    """``Read`` from offset 1 to ``head`` with the server's default bounds; reads it took.

    Each answer must come back (no RESOURCE_EXHAUSTED) and move forward (issue 42, point 5).
    """
    offset, reads = 1, 0
    while offset <= head:
        reads += 1
        try:
            answer = stub.Read(pb.ReadRequest(from_offset=offset), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            failures.append(f"Read from_offset={offset} (head {head}) -> {error.code().name}")
            return reads
        if not answer.records:
            failures.append(f"Read from_offset={offset} (head {head}) answered no record")
            return reads
        offset = answer.next_offset
    return reads


PIPELINE_TIMEOUT_S = 120.0
"""Far longer than reading any fuzzed log takes; a reader that retries forever hits it."""


def delivered_by_pipeline(address: str, token: str, scratch: Path) -> list[AgentEnvelope]:
    """Every envelope ``ReadEnvelopes`` delivers from the start of the log until it is idle.

    The pipeline runs in a child process (``python -m tests.semantics.boundary_gate``), so a
    reader that never finishes is stopped: ``TimeoutError`` then, ``RuntimeError`` if it fails.
    """
    out = scratch / "delivered.bin"
    command = [sys.executable, "-m", "tests.semantics.boundary_gate", address, str(out)]
    # The repository, and the effector tests' helpers that the I/O harness imports.
    environment = child_environment(REPO, REPO / "tests" / "effector", GATE_TOKEN_ENV=token)
    try:
        finished = subprocess.run(
            command,
            env=environment,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=PIPELINE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"ReadEnvelopes did not finish in {PIPELINE_TIMEOUT_S:.0f}s") from None
    if finished.returncode != 0:
        tail = "\n".join(finished.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"ReadEnvelopes failed (exit {finished.returncode}): {tail}")
    data, envelopes, position = out.read_bytes(), [], 0
    while position < len(data):
        size = int.from_bytes(data[position : position + 4], "big")
        envelopes.append(AgentEnvelope.FromString(data[position + 4 : position + 4 + size]))
        position += 4 + size
    return envelopes


def _deliver(address: str, out: Path) -> None:
    """The child's side: run the pipeline, then write each envelope length-prefixed to ``out``."""
    collector = Collector.new()
    transform = ReadEnvelopes(
        address, token=os.environ["GATE_TOKEN_ENV"], stop_when_idle_s=2.0, poll_wait_ms=50
    )
    run_pipeline(lambda pipeline: pipeline | transform | collector.sink())
    with out.open("wb") as sink:
        for _, envelope in collector.values():
            raw = envelope.SerializeToString()
            sink.write(len(raw).to_bytes(4, "big") + raw)


def counts_of(envelopes: Iterable[AgentEnvelope]) -> dict[tuple[bytes, bytes], int]:
    """How often each (key, external event) occurs among ``envelopes``."""
    counts: dict[tuple[bytes, bytes], int] = {}
    for envelope in envelopes:
        if envelope.WhichOneof("payload") == "external_event":
            entry = (envelope.entity_key, envelope.external_event)
            counts[entry] = counts.get(entry, 0) + 1
    return counts


def failures_logged(log: str) -> list[str]:
    """Each distinct exception in an effector's log, with the project frame it came from."""
    found: dict[str, str] = {}
    lines = log.splitlines()
    for start, line in enumerate(lines):
        if not line.startswith("Traceback"):
            continue
        end, frame = start + 1, ""
        while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end]):
            if "/effector/" in lines[end] or "/beam_agents/" in lines[end]:
                frame = lines[end].strip()
            end += 1
        exception = lines[end][:300] if end < len(lines) else "?"
        found.setdefault(re.sub(r"\d+", "N", exception), f"{exception}\n    at {frame}")
    return list(found.values())


if __name__ == "__main__":
    _deliver(sys.argv[1], Path(sys.argv[2]))
