"""Every example program runs as a user would run it, exits 0 and prints what it promises.

Examples are collected from ``examples/``: every ``*.py`` with a ``__main__`` block is a
program and must be listed either in ``EXPECTED_OUTPUT`` (run here, each expected line must
appear in its output, in order) or in ``DRIVEN_BY`` (run by another example). Modules without
a ``__main__`` block (shared tools, helpers) are not programs. Examples import public names
only: nothing from a module path with a leading underscore or ``core``, and nothing from a
submodule that its package root exports.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import beam_agents
import effector
from beam_agents import ToolIntent, ToolResult, intent_id_for
from effector import EffectorToolRunner

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

EXPECTED_OUTPUT: dict[str, list[str]] = {
    "read_only_tools.py": [
        "read_only_tools: tool 'freeze_account' has side effects",
        "read_only_tools: ok",
    ],
    "fast_path.py": [
        "fast_path: alice's second activation remembered her first message",
        "fast_path: 3 events, 3 model calls, 0 intents",
        "fast_path: ok",
    ],
    "intents_and_resume.py": [
        "intents_and_resume: staged reserve_stock as be14bf1a-1337-5caf-be3a-e3dcc940a9f2",
        "intents_and_resume: staged charge_card as f052fc51-ee95-5526-9e44-6b720e36bf37",
        "intents_and_resume: ok",
    ],
    "human_in_the_loop.py": [
        "human_in_the_loop: refund r-3 paid without asking",
        "human_in_the_loop: refund r-1 approved by dana, then paid",
        "human_in_the_loop: refund r-2 denied when nobody answered in time",
        "human_in_the_loop: ok",
    ],
    "local_loop.py": [
        "local_loop: denied o-0",
        "local_loop: done o-1",
        "local_loop: done o-3",
        "local_loop: ok",
    ],
    "demo.py": ["demo: ok"],
    "refund_desk.py": [
        "refund_desk: two approvers released large-refund-two-approvers: o-2",
        "refund_desk: refund-desk/acme used 63 of 10000 tokens today",
        "refund_desk: o-1: refunded o-1",
        "refund_desk: o-2: refunded o-2",
        "refund_desk: o-3: refused: denied by effect policy: rule 'refund-ceiling'",
        "refund_desk: ok",
    ],
    "adk_agent.py": [
        "adk_agent: acct-1: risk 7, card of acct-1 held",
        "adk_agent: acct-2: risk 2, nothing to do",
        "adk_agent: ok",
    ],
    "langgraph_agent.py": [
        'langgraph_agent: refunded A-1: {"amount_cents":1200,"refund_id":"R-A-1"}',
        'langgraph_agent: refunded A-2: {"amount_cents":1200,"refund_id":"R-A-2"}',
        "langgraph_agent: ok",
    ],
    "pydantic_ai_agent.py": [
        'pydantic_ai_agent: staged issue_refund {"amount_cents":2599,"order_id":"A-1001"}',
        "pydantic_ai_agent: answer: Refunded 25.99 EUR for order A-1001 (refund R-A-1001).",
        "pydantic_ai_agent: 3 model calls, 2 replayed from the cache when the run resumed",
        "pydantic_ai_agent: ok",
    ],
    "backtest_demo.py": [
        "backtest_demo: replay: 120 runs: 120 same, 0 divergent, 0 drift (exit 0)",
        "# Backtest report",
        "| 1 | intent added: approval |",
        "backtest_demo: ok",
    ],
    "tool_loop.py": ["tool_loop: staged issue_refund", "tool_loop: answer:", "tool_loop: ok"],
    "mcp_tickets.py": [
        "mcp_tickets: db: filed OPS-",
        "mcp_tickets: web: filed OPS-",
        "mcp_tickets: replayed, the same answers; 2 tickets filed in all",
        "mcp_tickets: ok",
    ],
}

DRIVEN_BY: dict[str, str] = {"fraud_triage.py": "demo.py", "mcp_ticket_server.py": "mcp_tickets.py"}

TIMEOUT_S = 600


def example_programs() -> list[str]:
    return sorted(
        path.name
        for path in EXAMPLES.glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
    )


def test_every_example_program_is_accounted_for() -> None:
    unlisted = [
        name for name in example_programs() if name not in EXPECTED_OUTPUT and name not in DRIVEN_BY
    ]
    assert unlisted == [], f"add these to EXPECTED_OUTPUT or DRIVEN_BY in {__file__}: {unlisted}"
    missing = [name for name in [*EXPECTED_OUTPUT, *DRIVEN_BY] if not (EXAMPLES / name).exists()]
    assert missing == [], f"listed examples that do not exist: {missing}"
    assert set(DRIVEN_BY.values()) <= set(EXPECTED_OUTPUT)


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("name", sorted(EXPECTED_OUTPUT))
def test_example_runs_and_prints_what_it_promises(name: str) -> None:
    # The checkout comes first on the path, so the code under test is what the example imports.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert completed.returncode == 0, (
        f"{name} exited {completed.returncode}\n--- stdout\n{completed.stdout}\n"
        f"--- stderr\n{completed.stderr[-4000:]}"
    )
    lines = completed.stdout.splitlines()
    position = 0
    for expected in EXPECTED_OUTPUT[name]:
        found = next(
            (index for index in range(position, len(lines)) if lines[index].startswith(expected)),
            None,
        )
        assert found is not None, (
            f"{name} did not print {expected!r} (in order):\n{completed.stdout}"
        )
        position = found + 1
    # Importing beam_agents before apache_beam keeps Beam's "apitools not found" notice out.
    assert "apitools" not in completed.stdout + completed.stderr, completed.stderr
    if name == "demo.py":
        assert_the_demo_speaks_plainly(completed.stdout, completed.stderr)


def assert_the_demo_speaks_plainly(stdout: str, stderr: str) -> None:
    """No warning the user did not cause; the effector's counts named as its `status` names them."""
    lines = (stdout + stderr).splitlines()
    assert [line for line in lines if "WARNING" in line or "apitools" in line] == []
    progress = [line for line in lines if "] effector: " in line]
    assert progress, stdout
    for line in progress:
        assert "awaiting_decision=" in line and "head_offset=" in line, line
    assert not [line for line in lines if "awaiting_approval" in line or " log=" in line]
    [legend] = [line for line in lines if line.startswith("progress, once a second:")]
    assert "head_offset" in legend
    [status] = [line for line in lines if line.strip().startswith("effector status")]
    assert '"awaiting_decision": 0' in status and '"head_offset": ' in status


def test_fraud_freeze_succeeds_while_someone_reads_the_new_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo's effector runs freezes side by side on a ledger nobody has opened yet; switching
    # a SQLite file to WAL while another connection has it open fails at once ("database is
    # locked"), so the effector's tool loader must create the ledger before any freeze runs.
    monkeypatch.syspath_prepend(str(EXAMPLES))
    fraud_tools = importlib.import_module("fraud_tools")
    monkeypatch.setenv(fraud_tools.LEDGER_ENV, str(tmp_path / "bank.db"))
    registry = fraud_tools.make_effector_registry()
    intent = ToolIntent(
        intent_id=intent_id_for(b"acct-01", 0, 0),
        entity_key=b"acct-01",
        tool_name="freeze_account",
        args_json='{"account": "acct-01", "reason": "test"}',
        kind=ToolIntent.TOOL,
    )
    with contextlib.closing(sqlite3.connect(tmp_path / "bank.db")) as teller:
        teller.execute("BEGIN")
        assert teller.execute("SELECT COUNT(*) FROM freezes").fetchone() == (0,)
        result = asyncio.run(
            EffectorToolRunner().execute(registry, intent, attempt=1, clock=lambda: 0)
        )
        teller.execute("COMMIT")
        assert result.status == ToolResult.OK, result.error_message
        frozen = teller.execute("SELECT intent_id, account FROM freezes").fetchall()
    assert frozen == [(intent.intent_id, "acct-01")]


def private_imports(source: str) -> list[str]:
    """Each import in ``source`` that reaches past the public surface, as ``module:name``.

    Private: a ``beam_agents`` module path with a component that starts with ``_`` or is
    ``core``; a name imported from a ``beam_agents`` submodule while the root exports it; any
    ``effector`` submodule (the effector's public names are its root's).
    """
    roots = {"beam_agents": set(beam_agents.__all__), "effector": set(effector.__all__)}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported = [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in imported:
            root, *parts = module.split(".")
            if root not in roots:
                continue
            inner = any(p.startswith("_") or p == "core" for p in parts) or root == "effector"
            if parts and (inner or name in roots[root]):
                found.append(f"{module}:{name}")
    return found


def test_examples_import_public_names_only() -> None:
    offending = {
        path.name: private_imports(path.read_text(encoding="utf-8"))
        for path in sorted(EXAMPLES.glob("*.py"))
    }
    assert {name: found for name, found in offending.items() if found} == {}


def test_the_import_scan_finds_each_kind_of_private_import() -> None:
    source = """
import beam_agents._protos
from beam_agents._protos import TraceEvent
from beam_agents.core.context import ActivationContext
from beam_agents.model.fake import FakeLLM
from effector.launch import child_environment
def later():
    from beam_agents.core import agent
from beam_agents import RunAgent
from beam_agents.model import match_any
from beam_agents.tools.errors import SideEffectToolError
from effector import EffectorThread
import apache_beam._private
"""
    assert private_imports(source) == [
        "beam_agents._protos:",
        "beam_agents._protos:TraceEvent",
        "beam_agents.core.context:ActivationContext",
        "beam_agents.model.fake:FakeLLM",
        "effector.launch:child_environment",
        "beam_agents.core:agent",
    ]
