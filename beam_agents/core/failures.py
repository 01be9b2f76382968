"""What an exception that failed an activation says on ``.errors``: its detail and traceback.

:func:`explain` is called only on the failure path. The traceback keeps the frames a reader
needs: the runtime's own frames (``beam_agents``, ``asyncio``, Apache Beam) are dropped, except
the innermost one, where the exception was raised; at most :data:`MAX_FRAMES` frames are kept
per exception of a chain, and the text is cut to its last :data:`MAX_CHARS` characters. The
detail names the innermost frame of the agent's code, found as the innermost frame outside the
runtime, the standard library and installed packages (or in the agent function's own file).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import sysconfig
import traceback
from collections.abc import Iterator

MAX_FRAMES = 20
"""Frames kept per exception of a chain (the innermost ones)."""
MAX_CHARS = 8192
"""The traceback's size bound, in characters (its end is kept)."""

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # beam_agents/
_RUNTIME_DIRS = (
    _PACKAGE_DIR + os.sep,
    os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
)
_BEAM_DIR = f"{os.sep}apache_beam{os.sep}"
_LIBRARY_DIRS = tuple(
    sorted(
        {
            os.path.abspath(path) + os.sep
            for name in ("stdlib", "platstdlib", "purelib", "platlib")
            if (path := sysconfig.get_paths().get(name))
        }
    )
)


def explain(failure: BaseException, agent: object = None) -> tuple[str, str]:
    """``(detail, traceback)`` for ``failure``; ``agent`` is the function that was run, if any.

    The detail is ``Type: message``, then ``(at file.py:42 in function)`` when a frame of the
    agent's code is found, then the exception's notes.
    """
    summary = traceback.TracebackException.from_exception(failure, lookup_lines=False)
    where = _agent_frame(summary.stack, _source_file(agent))
    head = f"{type(failure).__name__}: {failure}"
    if where is not None:
        head += f" (at {os.path.basename(where.filename)}:{where.lineno} in {where.name})"
    notes = getattr(failure, "__notes__", None) or ()
    for link in _chain(summary):
        link.stack = traceback.StackSummary.from_list(_kept(link.stack))
    return "; ".join([head, *notes]), _bounded("".join(summary.format()))


def _is_runtime(filename: str) -> bool:
    return filename.startswith(_RUNTIME_DIRS) or _BEAM_DIR in filename


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen ")


def _kept(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    last = len(stack) - 1
    kept = [frame for i, frame in enumerate(stack) if i == last or not _is_runtime(frame.filename)]
    return kept[-MAX_FRAMES:]


def _agent_frame(
    stack: traceback.StackSummary, agent_file: str | None
) -> traceback.FrameSummary | None:
    """The innermost frame of the agent's code in ``stack``, if there is one."""
    for frame in reversed(stack):
        filename = frame.filename
        if filename == agent_file or not (_is_runtime(filename) or _is_library(filename)):
            return frame
    return None


def _source_file(agent: object) -> str | None:
    """The file the agent function is defined in (through partials and decorators)."""
    while isinstance(agent, functools.partial):
        agent = agent.func
    with contextlib.suppress(ValueError):  # a cycle of __wrapped__
        agent = inspect.unwrap(agent)  # type: ignore[arg-type]
    code = getattr(agent, "__code__", None)
    return None if code is None else str(code.co_filename)


def _chain(summary: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """``summary`` and every exception it carries: causes, contexts and group members."""
    pending, seen = [summary], set()
    while pending:
        link = pending.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        pending.extend(x for x in (link.__cause__, link.__context__) if x is not None)
        pending.extend(link.exceptions or ())


def _bounded(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    tail = text[len(text) - MAX_CHARS + 64 :]  # room for the line saying what was dropped
    cut = tail.find("\n") + 1  # start at a whole line when one is in reach
    dropped = len(text) - len(tail) + cut
    return f"[{dropped} characters of the traceback dropped]\n" + tail[cut:]
