"""Worker processes that do not outlive their parent.

A spawned pool worker that is mid-task when its parent is killed (``kill``, an OOM kill, a lost session) runs on as an
orphan: two forced-exploration workers kept both cores of a CPU machine busy for 15 minutes after their parent was
killed, slowing the run that was to resume the work. Pool initializers call :func:`exit_with_parent`; a job run in a
child process goes through :func:`run_module_in_child` (``python -m routers.workers MODULE ARGS...``), which installs
the same watch before running the module: a killed leave-out once left its trainer child training on for 15 minutes,
writing the same checkpoint folder as the rerun beside it, until the OOM killer took it."""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time

PARENT_ENV = "MEMROUTE_PARENT_PID"


def exit_with_parent(poll_s: float = 1.0, parent: int | None = None) -> threading.Thread:
    """Start a daemon thread that ends this process (exit code 1) once its parent is gone (POSIX: the orphan is
    re-parented, so ``os.getppid()`` changes). Nothing is lost: the parent records finished work, and a resumed run
    redoes only what no one recorded."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


def run_module_in_child(module: str, argv: list[str]) -> int:
    """Run ``python -m module *argv`` in a child process that ends with this one; returns its exit code."""
    import subprocess

    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    return subprocess.run([sys.executable, "-m", __name__, module, *argv], env=env, check=False).returncode


def main(argv: list[str] | None = None) -> None:
    """``python -m routers.workers MODULE ARGS...``: watch the parent, then run MODULE as ``__main__``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m routers.workers MODULE [ARGS...]")
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    if os.getppid() != parent:  # the parent died before the watch began
        raise SystemExit(1)
    exit_with_parent(parent=parent)
    sys.argv = list(argv)  # run_module puts the module's path in argv[0]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
