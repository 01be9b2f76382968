"""The package as a user gets it: build the sdist and wheel, install the wheel, run the quick start.

``python -m build`` makes the sdist and then the wheel from it, so a file the sdist leaves out
is missing from the wheel too. The wheel goes into a fresh virtual environment outside the
checkout, with its dependencies from the package index, and the README's quick start runs there
from a directory outside the checkout.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_docs import quick_start, run_quick_start

# The fresh venv installs every dependency from the package index inside a fixture, which the
# per-test timeout counts.
pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel of this checkout, built into a temporary directory."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_build_makes_a_wheel_and_an_sdist(dist: Path) -> None:
    assert sorted(path.name for path in dist.iterdir()) == [
        f"beam_agents-{VERSION}-py3-none-any.whl",
        f"beam_agents-{VERSION}.tar.gz",
    ]


def test_the_wheel_carries_its_package_data(dist: Path) -> None:
    names = zipfile.ZipFile(dist / f"beam_agents-{VERSION}-py3-none-any.whl").namelist()
    assert "beam_agents/py.typed" in names
    assert "effector/py.typed" in names
    assert any(name.startswith("beam_agents/_protos/") and name.endswith(".pyi") for name in names)
    assert any(name.endswith(".html") and "/templates/" in name for name in names)
    assert any("/static/" in name and name.endswith(".css") for name in names)
    assert not any(name.startswith(("tests/", "benchmarks/", "examples/")) for name in names)


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment outside the checkout, with the wheel and no extras."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = dist / f"beam_agents-{VERSION}-py3-none-any.whl"
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    return venv


def test_the_quick_start_runs_from_the_installed_wheel(venv: Path, tmp_path: Path) -> None:
    python = str(venv / "bin" / "python")
    _, expected = quick_start()
    assert sorted(run_quick_start(python, tmp_path)) == sorted(expected)

    where = subprocess.run(
        [python, "-c", "import beam_agents; print(beam_agents.__file__, beam_agents.__version__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(venv)
    assert not Path(where[0]).is_relative_to(REPO)
    assert where[1] == VERSION


TOOLS = """
from beam_agents import ToolRegistry, tool


@tool(side_effect=True)
def refund(order_id: str) -> str:
    \"\"\"Refund an order.\"\"\"
    return f"refunded {order_id}"


registry = ToolRegistry([refund])
"""


def test_the_effector_serves_without_the_console_extra(venv: Path, tmp_path: Path) -> None:
    python = str(venv / "bin" / "python")
    missing = subprocess.run([python, "-c", "import starlette"], capture_output=True, timeout=60)
    assert missing.returncode != 0  # the console's packages come only with the extra
    (tmp_path / "shop_tools.py").write_text(TOOLS)
    serve = [
        str(venv / "bin" / "beam-agents-effector"),
        "serve",
        "--tools",
        "shop_tools:registry",
        "--store",
        f"sqlite:///{tmp_path}/effector.db",
        "--listen",
        "127.0.0.1:0",
    ]
    with subprocess.Popen(
        serve, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as effector:
        try:
            assert effector.stdout is not None
            ready = effector.stdout.readline()
            assert ready.startswith("effector listening on 127.0.0.1:"), ready
        finally:
            effector.send_signal(signal.SIGTERM)
            _, errors = effector.communicate(timeout=60)
    assert effector.returncode == 0, errors
