"""MkDocs hook: the root API page lists every name in ``beam_agents.__all__``.

The page holds the marker ``<!-- beam_agents.__all__ -->``; this hook replaces it with one
mkdocstrings block per public name, in the order of ``__all__``, so the page cannot drift from
the package's one export list.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- beam_agents.__all__ -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the marker with a ``::: beam_agents.NAME`` block per public name."""
    if MARKER not in markdown:
        return markdown
    import beam_agents

    names = [name for name in beam_agents.__all__ if name != "__version__"]
    blocks = "\n\n".join(f"::: beam_agents.{name}" for name in names)
    return markdown.replace(MARKER, blocks)
