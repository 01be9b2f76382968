"""MkDocs hook: the root API page lists every name in ``beam_agents.__all__``.

The page holds the marker ``<!-- beam_agents.__all__ -->``; this hook replaces it with one
mkdocstrings block per public name, in the order of ``__all__``, so the page cannot drift from
the package's one export list. Each block documents the object where it is defined, headed by
its public name, so the reference does not depend on how the root imports it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- beam_agents.__all__ -->"


def _definition(name: str, value: object) -> str:
    """The dotted path of the module attribute that defines ``value``, public as ``name``."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if isinstance(module, str) and module.startswith("beam_agents.") and qualname == name:
        return f"{module}.{name}"
    # A value without a module of its own (a type alias): the module that assigns it.
    assigned = re.compile(rf"^{re.escape(name)}\b\s*(?::[^=\n]*)?=", re.MULTILINE)
    for module_name, loaded in sorted(sys.modules.items()):
        if not module_name.startswith("beam_agents.") or loaded.__name__ != module_name:
            continue  # another package, or a module entered in sys.modules under a second name
        source = getattr(loaded, "__file__", None)
        if vars(loaded).get(name) is value and source and assigned.search(Path(source).read_text()):
            return f"{module_name}.{name}"
    return f"beam_agents.{name}"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the marker with a ``::: PATH`` block per public name, headed by that name."""
    if MARKER not in markdown:
        return markdown
    import beam_agents

    blocks = []
    for name in beam_agents.__all__:
        if name == "__version__":
            continue
        path = _definition(name, getattr(beam_agents, name))
        blocks.append(
            f"::: {path}\n    options:\n      heading: beam_agents.{name}\n      toc_label: {name}"
        )
    return markdown.replace(MARKER, "\n\n".join(blocks))
