"""The docs a person reads: the README's quick start runs as written, and the site builds.

The quick start is the README's first ``python`` block; the ``text`` block after it is what it
prints (in any order). The site's home page includes the README's overview, quick start among it,
with a ``pymdownx.snippets`` section marker instead of a copy. ``mkdocs build --strict``
fails on any warning, including a link to a missing page or anchor.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import beam_agents

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def code_blocks(path: Path, language: str) -> list[str]:
    """The fenced blocks of ``language`` in a Markdown file, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", path.read_text(), re.S | re.M)


def quick_start() -> tuple[str, list[str]]:
    """The README's quick start and the lines it prints."""
    return code_blocks(README, "python")[0], code_blocks(README, "text")[0].splitlines()


def run_quick_start(python: str, workdir: Path) -> list[str]:
    """Run the quick start with ``python`` in ``workdir``; return the lines it printed."""
    program, _ = quick_start()
    script = workdir / "quickstart.py"
    script.write_text(program)
    done = subprocess.run(
        [python, str(script)], cwd=workdir, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_readme_quick_start_prints_what_the_readme_says(tmp_path: Path) -> None:
    _, expected = quick_start()
    assert sorted(run_quick_start(sys.executable, tmp_path)) == sorted(expected)


def test_the_quick_start_uses_root_names_and_is_about_25_lines() -> None:
    program, _ = quick_start()
    imports = [line for line in program.splitlines() if line.startswith(("from ", "import "))]
    assert all(
        line.startswith(("import apache_beam", "from beam_agents import ")) for line in imports
    ), imports
    code = [line for line in program.splitlines() if line.strip()]
    assert len(code) <= 27


def readme_section(name: str) -> str:
    """The README's lines between ``--8<-- [start:name]`` and ``--8<-- [end:name]``."""
    found = re.search(
        rf"--8<-- \[start:{name}\][^\n]*\n(.*?)^[^\n]*--8<-- \[end:{name}\]",
        README.read_text(),
        re.S | re.M,
    )
    assert found, name
    return found.group(1)


def test_the_site_home_includes_the_readme_quick_start() -> None:
    home = (REPO / "docs" / "index.md").read_text()
    sections = re.findall(r'^--8<-- "README\.md:([a-z][-_0-9a-z]*)"$', home, re.M)
    included = "".join(readme_section(name) for name in sections)
    program, expected = quick_start()
    assert program in included
    assert "\n".join(expected) in included
    assert not code_blocks(REPO / "docs" / "index.md", "python")  # included, not copied


def test_the_readme_is_short_and_shows_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "make test" in text
    assert "make demo" in text


def test_the_readme_links_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local
    missing = [link for link in local if not (REPO / link).exists()]
    assert not missing


def test_every_import_the_docs_show_works() -> None:
    pages = [README, *sorted((REPO / "docs").rglob("*.md"))]
    imports = sorted(
        {
            line.strip()
            for page in pages
            for block in code_blocks(page, "python")
            for line in block.splitlines()
            if line.strip().startswith(("from beam_agents", "from effector"))
        }
    )
    assert imports
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(imports)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "index.html").exists()
    api = (tmp_path / "reference" / "beam_agents" / "index.html").read_text()
    headed = set(re.findall(r'class="doc doc-heading">\s*beam_agents\.(\w+)\s*<', api))
    assert headed == set(beam_agents.__all__) - {"__version__"}
