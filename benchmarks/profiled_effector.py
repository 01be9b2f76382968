"""``python -m benchmarks.profiled_effector DIR serve ...``: the effector, every thread profiled.

Runs the effector's own command line (``effector.cli.main``) with a cProfile profiler in the
main thread and in every thread started afterwards (the store's dedicated thread among them:
plain ``cProfile`` sees only the thread it runs in). When the effector exits (on SIGTERM, after
draining), each thread's statistics are written to ``DIR/<thread name>.prof``.
"""

from __future__ import annotations

import cProfile
import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from effector.cli import main as effector_main

_profiles: list[tuple[str, cProfile.Profile]] = []
_lock = threading.Lock()


def _profile_this_thread(frame: FrameType, event: str, arg: Any) -> None:
    """Installed by ``threading.setprofile``: runs once in each new thread, then hands over."""
    profiler = cProfile.Profile()
    with _lock:
        _profiles.append((threading.current_thread().name, profiler))
    profiler.enable()  # replaces this hook in this thread


def _file_name(thread_name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", thread_name)
    name, counter = base, 1
    while name in taken:
        counter += 1
        name = f"{base}-{counter}"
    taken.add(name)
    return f"{name}.prof"


def main() -> int:
    """Run the effector command line given after the output directory."""
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    threading.setprofile(_profile_this_thread)
    main_profiler = cProfile.Profile()
    main_profiler.enable()
    try:
        return effector_main(sys.argv[2:])
    finally:
        main_profiler.disable()
        threading.setprofile(None)
        taken: set[str] = set()
        for name, profiler in [("MainThread", main_profiler), *_profiles]:
            # Stopping another thread's profiler from here would stop this thread's instead;
            # the profiled threads have ended by now, and their unfinished calls are flushed.
            profiler.dump_stats(out / _file_name(name, taken))


if __name__ == "__main__":
    raise SystemExit(main())
