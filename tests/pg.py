"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` into a temporary directory.

``with postgres_server() as pg:`` starts a real PostgreSQL listening on 127.0.0.1 at a free
port (and on a Unix socket inside the temporary directory), and stops it and deletes its data
on exit. ``pg.create_database()`` returns the URL of a fresh, empty database, so tests sharing
one server stay isolated. The binaries are looked up on PATH and in
``/usr/lib/postgresql/*/bin``; when there are none the calling test is skipped with a message
saying so (CI installs them, so there it never skips). PostgreSQL refuses to run as root, so
under root the server runs as the ``postgres`` system user (created if missing).

The cluster runs with ``fsync=off``: tests never crash PostgreSQL itself, only effectors, and
the setting keeps the suite fast on small machines.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

_SERVICE_USER = "postgres"
_USERADD_USER_EXISTS = 9
"""useradd's exit status for a user that already exists."""


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or ``None`` if PostgreSQL is absent."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _service_user() -> str | None:
    """The user to run PostgreSQL as: ``None`` (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        created = subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                _SERVICE_USER,
            ],
            capture_output=True,
            text=True,
        )
        # Status 9: the user exists (another test worker created it first).
        if created.returncode not in (0, _USERADD_USER_EXISTS):
            raise RuntimeError(
                f"useradd {_SERVICE_USER} failed: {created.stderr.strip()}"
            ) from None
    return _SERVICE_USER


@dataclass
class PostgresServer:
    """A running throwaway server; ``url()`` names one of its databases."""

    port: int
    superuser: str = "postgres"
    pg_ctl: Callable[[str], None] | None = field(default=None, repr=False)
    """Runs ``pg_ctl start`` or ``pg_ctl stop`` on this server (see :meth:`stop`)."""

    def stop(self) -> None:
        """Stop the server (connections are closed); :meth:`start` brings it back, same port."""
        assert self.pg_ctl is not None
        self.pg_ctl("stop")

    def start(self) -> None:
        """Start a server stopped by :meth:`stop` again, with its data, on the same port."""
        assert self.pg_ctl is not None
        self.pg_ctl("start")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "test") -> str:
        """Create an empty database and return its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _run(command: list[str], user: str | None) -> subprocess.CompletedProcess[str]:
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _pg_ctl(bin_dir: Path, data: Path, options: str, user: str | None, action: str) -> None:
    """``pg_ctl start`` (with the server's options) or ``pg_ctl stop`` (fast), waiting for it."""
    command = [str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-t", "60"]
    if action == "start":
        command += ["-o", options, "-l", str(data.parent / "server.log"), "start"]
    else:
        command += ["-m", "fast", "stop"]
    done = _run(command, user)
    if done.returncode != 0:
        raise RuntimeError(f"pg_ctl {action} failed: {done.stderr.strip()}")


@contextlib.contextmanager
def postgres_server(settings: str = "") -> Iterator[PostgresServer]:
    """Start a throwaway PostgreSQL, yield it, stop it and delete its files.

    ``settings``: more ``-c name=value`` options for the server.
    """
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql)"
        )
    user = _service_user()
    root = Path(tempfile.mkdtemp(prefix="beam-agents-pg-"))
    data = root / "data"
    if user is not None:
        shutil.chown(root, user=user)
    try:
        initdb = _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            user,
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed: {initdb.stderr.strip()}")
        server = None
        for _ in range(3):  # another process may grab the probed port before PostgreSQL binds it
            port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                f"-c max_connections=100 {settings}"
            )
            started = _run(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
                user,
            )
            if started.returncode == 0:
                server = PostgresServer(
                    port=port, pg_ctl=functools.partial(_pg_ctl, bin_dir, data, options, user)
                )
                break
        if server is None:
            log = (root / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed: {log}")
        try:
            yield server
        finally:
            _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], user)
    finally:
        shutil.rmtree(root, ignore_errors=True)
