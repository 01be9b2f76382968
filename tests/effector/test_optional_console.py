"""The console and the operator MCP endpoint are the ``[console]`` extra: the core runs without it.

A subprocess hides Starlette, Jinja2, uvicorn, python-multipart and the MCP SDK behind a meta
path finder (what an interpreter without the extra finds), then imports the effector's core
modules, runs the command line's ``--help``, serves and drains a store over gRPC, and asks
for ``--console-listen`` and ``--mcp-listen``, which must each fail with one line naming the
extra.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from effector_harness import cli_environment

PROBE = """
import asyncio, contextlib, io, sys

HIDDEN = ("starlette", "jinja2", "uvicorn", "multipart", "python_multipart", "mcp", "mcp_types")


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
import effector, effector.server, effector.service, effector.worker, effector.store, effector.cli
from effector.cli import main
from effector.launch import running_server
from effector.server import ServerSettings
from effector_test_tools import make_registry

with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(["serve", "--help"])
    except SystemExit as exit:
        assert exit.code == 0


async def serve():
    async with running_server(sys.argv[1], make_registry(), ServerSettings()) as server:
        assert server.console_url is None and server.mcp_url is None


asyncio.run(serve())
for flag in ("--console-listen", "--mcp-listen"):
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        status = main(["serve", "--tools", "effector_test_tools:make_registry", "--store",
                       sys.argv[1], "--listen", "127.0.0.1:0", flag, "127.0.0.1:0"])
    assert status == 2, status
    [line] = errors.getvalue().splitlines()
    assert "pip install 'beam-agents[console]'" in line and flag in line, line
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN or "effector.console" in m)
print(loaded or "ok")
"""


def test_the_effector_runs_without_the_console_extra(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, f"sqlite:///{tmp_path / 's.db'}"],
        capture_output=True,
        text=True,
        env=cli_environment(),
        timeout=120,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr
