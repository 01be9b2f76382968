"""The package as a user gets it: build the sdist and wheel, install the wheel, run the quick start.

``python -m build`` makes the sdist and then the wheel from it, so a file the sdist leaves out
is missing from the wheel too. The wheel goes into a fresh virtual environment outside the
checkout, with its dependencies from the package index, and the README's quick start runs there
from a directory outside the checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_docs import quick_start, run_quick_start

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


def test_the_quick_start_runs_from_the_installed_wheel(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    wheel = dist / f"beam_agents-{VERSION}-py3-none-any.whl"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr

    workdir = tmp_path / "work"
    workdir.mkdir()
    _, expected = quick_start()
    assert sorted(run_quick_start(python, workdir)) == sorted(expected)

    where = subprocess.run(
        [python, "-c", "import beam_agents; print(beam_agents.__file__, beam_agents.__version__)"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(venv)
    assert not Path(where[0]).is_relative_to(REPO)
    assert where[1] == VERSION
