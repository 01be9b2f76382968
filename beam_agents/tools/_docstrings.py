"""Read a tool's description and per-parameter descriptions from its docstring.

Google, NumPy, Sphinx (reST) and Epydoc styles are recognised by ``docstring-parser``. The tool
description is the prose part (summary line plus any long description); parameter, return and
raise sections feed the parameter descriptions or are left out, since the schema already says
what they would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import docstring_parser

from beam_agents.tools.errors import ToolDefinitionError


@dataclass(frozen=True)
class DocstringInfo:
    """What a docstring contributes to a tool: its description and parameter descriptions."""

    description: str = ""
    parameters: Mapping[str, str] = field(default_factory=dict)


def read_docstring(docstring: str | None, *, tool_name: str) -> DocstringInfo:
    """Parse ``docstring`` (any supported style); an unparsable one is a ``ToolDefinitionError``."""
    if not docstring or not docstring.strip():
        return DocstringInfo()
    try:
        parsed = docstring_parser.parse(docstring)
    except docstring_parser.ParseError as error:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: its docstring cannot be parsed ({error}); fix the docstring "
            f"or pass description=... to @tool",
            tool_name=tool_name,
        ) from error
    # Rejoin the prose the way it was written, so a docstring without sections comes back as is.
    separator = "\n\n" if parsed.blank_after_short_description else "\n"
    prose = [part for part in (parsed.short_description, parsed.long_description) if part]
    parameters = {
        parameter.arg_name: parameter.description
        for parameter in parsed.params
        if parameter.description
    }
    return DocstringInfo(description=separator.join(prose), parameters=parameters)
