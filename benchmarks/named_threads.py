"""Run a module with each Python thread's name given to the kernel.

``python -m benchmarks.named_threads MODULE ARGS...`` is ``python -m MODULE ARGS...`` except that
every thread Python starts names itself in the kernel (``prctl(PR_SET_NAME)``, the name ``/proc``
shows as ``comm``) when it starts: Python 3.11 leaves every thread it starts named ``python``, so
benchmark 6 could not otherwise tell the store's pool threads from gRPC's poller. Nothing runs
per call: one system call per thread start. Names keep the kernel's 15 bytes: ``effector-`` is
dropped, and an unnamed thread (``Thread-3 (target)``) is named after its target.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import runpy
import sys
import threading
from collections.abc import Sequence
from typing import Any

_PR_SET_NAME = 15
_UNNAMED = re.compile(r"Thread-\d+ \((?P<target>.+)\)")


def kernel_name(name: str) -> bytes:
    """A Python thread's name as the kernel will keep it (module doc)."""
    unnamed = _UNNAMED.fullmatch(name)
    if unnamed is not None:
        name = unnamed["target"]
    return name.removeprefix("effector-").encode()[:15]


def _install() -> None:
    """Make every thread started from now on name itself before it runs."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(thread: threading.Thread, *args: Any) -> None:
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(kernel_name(thread.name)), 0, 0, 0)
        bootstrap(thread, *args)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]


def command(module_command: Sequence[str]) -> list[str]:
    """A ``python -m MODULE ...`` command line run through this module instead."""
    arguments = list(module_command)
    if arguments[1:2] != ["-m"] or len(arguments) < 3:
        raise ValueError(f"not a `python -m` command line: {arguments[:3]}")
    return [*arguments[:2], __name__, *arguments[2:]]


def main() -> None:
    """Run the module named first, with the arguments after it."""
    module, sys.argv = sys.argv[1], sys.argv[1:]
    if sys.platform.startswith("linux"):
        _install()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
