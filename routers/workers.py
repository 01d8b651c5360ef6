"""Worker processes that do not outlive their parent.

A spawned pool worker that is mid-task when its parent is killed (``kill``, an OOM kill, a lost session) runs on as an
orphan: two forced-exploration workers kept both cores of a CPU machine busy for 15 minutes after their parent was
killed, slowing the run that was to resume the work. Pool initializers call :func:`exit_with_parent`."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(poll_s: float = 1.0) -> threading.Thread:
    """Start a daemon thread that ends this process (exit code 1) once its parent is gone (POSIX: the orphan is
    re-parented, so ``os.getppid()`` changes). Nothing is lost: the parent records finished work, and a resumed run
    redoes only what no one recorded."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread
