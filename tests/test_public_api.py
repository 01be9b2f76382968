"""The one import for users: ``from beam_agents import ...``, typed, lazy, and seen by mypy.

The root lists each public name once, as an import statement that type checkers read and the
runtime reads as a table (``beam_agents._EXPORTS``); the names are imported on first use.

The mypy tests run the interpreter's own mypy from a directory outside the repository, on a
small user file, the way a user's project would check its pipeline against the installed
package (``make`` installs it editable).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import beam_agents
import beam_agents.model

ROOT = Path(__file__).resolve().parent.parent

REQUIRED = {
    "RunAgent",
    "AgentConfig",
    "RunAgentOutputs",
    "ActivationContext",
    "Complete",
    "Suspend",
    "AgentEnvelope",
    "ToolIntent",
    "ToolResult",
    "Approval",
    "LlmRequest",
    "LlmResponse",
    "tool",
    "ToolRegistry",
    "IntentInfo",
    "HitlPolicy",
    "Deny",
    "Drop",
    "Escalate",
    "SubmitIntents",
    "ReadEnvelopes",
    "EffectorConnection",
    "FakeLLM",
    "intent_id_for",
    "canonical_json",
    "__version__",
}
NEEDS_BEAM = {"RunAgent", "RunAgentOutputs", "SubmitIntents", "ReadEnvelopes", "EffectorConnection"}
"""The names whose modules import Apache Beam; every other name is importable without it."""


def test_every_required_name_is_exported_and_resolves() -> None:
    exported = set(beam_agents.__all__)
    assert exported >= REQUIRED
    assert len(beam_agents.__all__) == len(exported)
    for name in beam_agents.__all__:
        assert getattr(beam_agents, name) is not None, name
    assert set(dir(beam_agents)) >= exported


def test_the_exports_are_the_objects_of_their_home_modules() -> None:
    from beam_agents._protos import AgentEnvelope, canonical_json
    from beam_agents.core.context import ActivationContext
    from beam_agents.io import SubmitIntents
    from beam_agents.io.run_agent import RunAgent
    from beam_agents.model.client import LlmRequest
    from beam_agents.model.fake import FakeLLM
    from beam_agents.tools import tool

    assert beam_agents.RunAgent is RunAgent and beam_agents.SubmitIntents is SubmitIntents
    assert beam_agents.ActivationContext is ActivationContext
    assert beam_agents.AgentEnvelope is AgentEnvelope and beam_agents.tool is tool
    assert beam_agents.LlmRequest is LlmRequest and beam_agents.FakeLLM is FakeLLM
    assert beam_agents.canonical_json is canonical_json


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = beam_agents.Nope  # type: ignore[attr-defined]


def test_the_version_is_the_distribution_version() -> None:
    from importlib.metadata import version

    assert beam_agents.__version__ == version("beam-agents")


def test_the_import_statements_are_the_one_list_of_exports() -> None:
    """Type checkers read the import statements; the runtime table is recorded from the same."""
    tree = ast.parse((ROOT / "beam_agents" / "__init__.py").read_text())
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    listed = {
        alias.name: node.module
        for node in imports
        if node.module and node.module.startswith("beam_agents")
        for alias in node.names
    }
    # "X as X" is how a typed package says it re-exports X (mypy --strict needs it).
    assert all(
        alias.asname == alias.name
        for node in imports
        for alias in node.names
        if alias.name in listed
    )
    assert listed == beam_agents._EXPORTS
    assert beam_agents.__all__ == [*listed, "__version__"]


def test_a_name_is_imported_on_first_use() -> None:
    code = """
import sys
import beam_agents
assert "AgentConfig" not in vars(beam_agents) and "beam_agents.core.config" not in sys.modules
assert beam_agents.AgentConfig is sys.modules["beam_agents.core.config"].AgentConfig
assert vars(beam_agents)["AgentConfig"] is beam_agents.AgentConfig
import json.decoder
from beam_agents.hitl import Deny
assert json.decoder.JSONDecoder and Deny is beam_agents.Deny
"""
    python(code)


def test_the_model_package_exports_providers_errors_and_fakes() -> None:
    model = beam_agents.model
    for name in (
        "OpenAIChatProvider",
        "AnthropicMessagesProvider",
        "ProviderError",
        "RateLimitError",
        "ProviderRequestError",
        "FakeLLM",
        "respond_with_text",
        "match_contains",
        "LlmRequest",
    ):
        assert name in model.__all__, name
    for name in model.__all__:
        assert getattr(model, name) is not None, name


def python(code: str) -> set[str]:
    """Run ``code`` in a fresh interpreter; the top-level modules it has imported after."""
    script = f"{code}\nimport sys\nprint(' '.join({{m.split('.')[0] for m in sys.modules}}))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return set(done.stdout.split())


def test_importing_the_package_and_its_beam_free_names_does_not_import_beam() -> None:
    assert "apache_beam" not in python("import beam_agents, beam_agents.model, beam_agents.tools")
    beam_free = ", ".join(sorted(REQUIRED - NEEDS_BEAM))
    assert "apache_beam" not in python(f"from beam_agents import {beam_free}")
    assert "apache_beam" in python("from beam_agents import RunAgent")


USER_CODE = """
from beam_agents import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    RunAgent,
    __version__,
    canonical_json_bytes,
)


async def agent(ctx: ActivationContext) -> Complete:
    answer = await ctx.call_model(LlmRequest("m", ["hi"], None, None))
    return Complete(output=canonical_json_bytes({{"answer": answer.text}}))


{body}
"""


def mypy(tmp_path: Path, name: str, body: str) -> subprocess.CompletedProcess[str]:
    """Check a user file with mypy --strict from ``tmp_path``, outside the repository."""
    (tmp_path / f"{name}.py").write_text(USER_CODE.format(body=textwrap.dedent(body)))
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\n")
    env = {key: value for key, value in os.environ.items() if key != "MYPYPATH"}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", f"{name}.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
    )


def test_mypy_outside_the_repository_sees_the_exported_types(tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(ROOT)
    wrong = mypy(
        tmp_path,
        "wrong",
        """
        from beam_agents import RunAgnet


        async def wrong_agent(ctx: int) -> Complete:
            return Complete()


        config = AgentConfig(ttl_ms="x")
        transform = RunAgent(agent, config=1)
        version: int = __version__
        wrong_transform = RunAgent(wrong_agent)
        """,
    )
    reported = wrong.stdout
    assert wrong.returncode == 1, reported + wrong.stderr
    assert 'Module "beam_agents" has no attribute "RunAgnet"; maybe "RunAgent"?' in reported
    assert 'Argument "ttl_ms" to "AgentConfig" has incompatible type "str"' in reported
    assert 'Argument "config" to "RunAgent" has incompatible type "int"' in reported
    assert 'incompatible types in assignment (expression has type "str"' in reported.lower()
    assert 'Argument 1 to "RunAgent" has incompatible type' in reported
    assert "Found 5 errors in 1 file" in reported, reported

    right = mypy(
        tmp_path,
        "right",
        """
        config = AgentConfig(ttl_ms=60_000, provider_factory=lambda: FakeLLM([]))
        transform = RunAgent(agent, config=config)
        version: str = __version__
        """,
    )
    assert right.returncode == 0, right.stdout + right.stderr


def test_mypy_sees_no_exported_name_as_any(tmp_path: Path) -> None:
    """Every name in ``__all__`` is explicitly re-exported and has a real type for mypy."""
    names = beam_agents.__all__
    body = "import beam_agents\n" + "".join(f"reveal_type(beam_agents.{n})\n" for n in names)
    body += "from beam_agents import (\n" + "".join(f"    {n},\n" for n in names) + ")\n"
    (tmp_path / "every_name.py").write_text(body)
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\n")
    env = {key: value for key, value in os.environ.items() if key != "MYPYPATH"}
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "every_name.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    revealed = [line for line in checked.stdout.splitlines() if "Revealed type is" in line]
    assert len(revealed) == len(names), checked.stdout
    assert [line for line in revealed if line.endswith('"Any"')] == []


def test_importing_the_package_imports_no_agent_framework() -> None:
    code = "import sys, beam_agents, beam_agents.adapters, beam_agents.tools\n"
    code += "from beam_agents import RunAgent\n"
    code += "print(*[m for m in sys.modules if m.startswith('google.adk')])"
    imported = python(code)
    assert not imported & {"langgraph", "langchain_core", "pydantic_ai", "mcp", "mcp_types"}
    assert not [name for name in imported if name.startswith("google.adk")]


def stderr_of(code: str) -> str:
    """Run ``code`` in a fresh interpreter; what it wrote to stderr."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return done.stderr


def test_importing_the_package_keeps_only_beams_apitools_notice_off_the_console() -> None:
    if "apitools not found" not in stderr_of("import apache_beam"):
        pytest.skip("Beam finds apitools here, so it logs no notice to keep quiet")
    code = """
import importlib, logging
import beam_agents
importlib.reload(beam_agents)
import apache_beam
logging.warning("apitools not found, said someone else on the root logger")
logging.getLogger("mine").warning("apitools not found, on a logger of my own")
logging.warning("another root warning")
print([getattr(f, "__name__", f) for f in logging.getLogger().filters])
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stderr.splitlines() == [
        "WARNING:mine:apitools not found, on a logger of my own",
        "WARNING:root:another root warning",
    ]
    assert done.stdout.split() == ["['_drop_apitools_notice']"]  # once, though imported twice
