"""Stored values as a person reads them: times in range, hidden characters shown, sizes bounded.

The console, the operator MCP endpoint and the command line show whatever the store holds, so
nothing here raises on a value a client could have sent: a time outside years 1-9999 becomes
text, characters that hide or reorder text (bidi controls, control characters) become visible
``⟨U+202E⟩`` marks, and text past a bound is cut with a note saying how much is left out.
"""

from __future__ import annotations

import datetime
import json
import unicodedata
from typing import Any, Protocol

from beam_agents._protos import MAX_JSON_DEPTH, MAX_TIME_MS, MIN_TIME_MS, json_depth

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_HIDING_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
"""Control, format (bidi overrides, zero-width), separator, surrogate and private-use characters."""
_LAYOUT = frozenset("\n\t")
SHOWN_CHARS = 65_536
"""The most characters of one value a page or answer shows; the rest is left out, and said so."""


class _Enum(Protocol):
    def Name(self, number: int) -> str: ...


def enum_name(enum: _Enum, number: int) -> str:
    """A protobuf enum value's name; ``UNKNOWN (7)`` for a number the enum does not define."""
    try:
        return enum.Name(number)
    except ValueError:
        return f"UNKNOWN ({number})"


def moment(ms: int) -> datetime.datetime | None:
    """Epoch milliseconds as an aware UTC datetime, or ``None`` outside years 1-9999."""
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        return None
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def out_of_range(ms: int) -> str:
    """How a time no calendar holds is shown: ``out of range (9223372036854775807 ms)``."""
    return f"out of range ({ms} ms)"


def iso_time(ms: int) -> str:
    """``2026-01-01T00:05:00.000Z``, or :func:`out_of_range` text."""
    found = moment(ms)
    if found is None:
        return out_of_range(ms)
    return found.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def is_hiding(char: str) -> bool:
    """Whether ``char`` hides, reorders or breaks text (U+202E, ESC, U+2028): pages and logs."""
    return unicodedata.category(char) in _HIDING_CATEGORIES


def mark(char: str) -> str:
    """The visible stand-in of one hiding character: ``⟨U+202E⟩``."""
    return f"⟨U+{ord(char):04X}⟩"


def visible(text: str, *, keep_layout: bool = True) -> str:
    """``text`` with every hiding character replaced by its mark (line breaks and tabs kept)."""
    if text.isprintable():
        return text
    kept = _LAYOUT if keep_layout else frozenset()
    return "".join(mark(c) if c not in kept and is_hiding(c) else c for c in text)


def hidden_characters(text: str) -> list[str]:
    """The distinct hiding characters in ``text`` (layout aside), named: ``U+202E RIGHT-TO-...``."""
    if text.isprintable():
        return []
    found = sorted({c for c in text if c not in _LAYOUT and is_hiding(c)})
    return [f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in found]


def cut(text: str, limit: int = SHOWN_CHARS) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters, and how many were left out."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def one_line(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` for one terminal line: hiding characters (newlines, ESC too) marked, cut."""
    shown, left_out = cut(text, limit)
    shown = visible(shown, keep_layout=False)
    return f"{shown}… ({left_out} more characters)" if left_out else shown


def parsed_json(text: str, limit: int = SHOWN_CHARS) -> Any | None:
    """``text`` parsed as JSON when it is small and shallow enough to handle; else ``None``."""
    if not text or len(text) > limit or json_depth(text) > MAX_JSON_DEPTH:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
