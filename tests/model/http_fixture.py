"""A real HTTP server on 127.0.0.1 that answers with scripted replies and records requests.

Used to test the model providers' wire formats offline: each test scripts the replies, the
provider talks to the server over a real socket, and the test inspects what arrived.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP response; ``delay_s`` holds it back before anything is sent."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def json_reply(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    """A reply whose body is ``payload`` as JSON."""
    return Reply(
        status=status,
        body=json.dumps(payload).encode("utf-8"),
        headers={"content-type": "application/json", **(headers or {})},
    )


@dataclass(frozen=True)
class ReceivedRequest:
    """A request as the server saw it; header names are lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close, so a test leaves no thread behind.
    daemon_threads = False
    block_on_close = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: deque[Reply] = deque()
        self.requests: list[ReceivedRequest] = []
        self.unscripted = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self.lock:
            self.connections.add(connection)
        return connection, address

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (a read timeout) leaves a broken pipe behind: expected here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        server = self.server
        with server.lock:
            server.requests.append(
                ReceivedRequest(
                    method="POST",
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                )
            )
            reply = server.replies.popleft() if server.replies else None
            if reply is None:
                server.unscripted += 1
        if reply is None:
            reply = Reply(status=599, body=b"no scripted reply")
        if reply.delay_s and server.stopping.wait(reply.delay_s):
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""


class ScriptedHttpServer:
    """Context manager running :class:`_Server` in a thread; stops it and its handlers on exit.

    Exiting raises if a request arrived that no reply was scripted for.
    """

    def __init__(self) -> None:
        self._server = _Server()
        # A short poll interval keeps teardown fast: shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._server.lock:
            return list(self._server.requests)

    def open_connections(self) -> int:
        with self._server.lock:
            return len(self._server.connections)

    def wait_until_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until every client connection is closed; return whether that happened."""
        deadline = time.monotonic() + timeout_s
        while self.open_connections():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def script(self, *replies: Reply) -> None:
        with self._server.lock:
            self._server.replies.extend(replies)

    def __enter__(self) -> ScriptedHttpServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        server = self._server
        server.stopping.set()
        server.shutdown()
        with server.lock:
            connections = list(server.connections)
        for connection in connections:
            # Wakes handler threads blocked reading the next request of a kept-alive connection.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        server.server_close()
        self._thread.join()
        if exc_type is None and server.unscripted:
            raise AssertionError(f"{server.unscripted} request(s) arrived with no scripted reply")


def unused_local_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
