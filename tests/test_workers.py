"""Pool workers end with their parent (routers.workers.exit_with_parent)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")

PARENT = textwrap.dedent("""
    import sys, time
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from routers.workers import exit_with_parent

    def pid_then_sleep(path):
        import os
        open(path, "w").write(str(os.getpid()))
        time.sleep(60)

    if __name__ == "__main__":
        init = exit_with_parent if sys.argv[2] == "watch" else None
        pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=init,
                                   initargs=(0.05,) if init else ())
        pool.submit(pid_then_sleep, sys.argv[1])
        time.sleep(60)
""")


# a parent that runs a module job in a child process (as the leave-out trains each router); the child writes its
# pid, then sleeps
CHILD_JOB = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
PARENT_OF_JOB = textwrap.dedent("""
    import subprocess, sys
    from routers.workers import run_module_in_child

    if sys.argv[2] == "watch":
        run_module_in_child("routers_job_sleeper", [sys.argv[1]])
    else:
        subprocess.run([sys.executable, "-m", "routers_job_sleeper", sys.argv[1]])
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a dead orphan nobody has reaped yet is a zombie


def _orphan_after_parent_killed(tmp_path, mode: str, parent_script: str = PARENT) -> bool:
    script, pid_file = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(parent_script)
    (tmp_path / "routers_job_sleeper.py").write_text(CHILD_JOB)
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file), mode], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        return _alive(worker)
    finally:
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        parent.kill()


def test_a_worker_ends_when_its_parent_is_killed(tmp_path):
    assert not _orphan_after_parent_killed(tmp_path, "watch")


def test_without_the_watch_the_worker_outlives_its_parent(tmp_path):
    # the failure the watch prevents: a plain spawned pool worker runs on as an orphan
    assert _orphan_after_parent_killed(tmp_path, "plain")


def test_a_module_job_in_a_child_ends_when_its_parent_is_killed(tmp_path):
    # the leave-out's trainer child: killing the leave-out once left it training beside the rerun
    assert not _orphan_after_parent_killed(tmp_path, "watch", PARENT_OF_JOB)


def test_a_plain_child_process_outlives_its_parent(tmp_path):
    assert _orphan_after_parent_killed(tmp_path, "plain", PARENT_OF_JOB)


def test_run_module_in_child_runs_the_module_as_main_with_its_arguments(tmp_path, monkeypatch):
    from routers.workers import run_module_in_child

    (tmp_path / "routers_job_echo.py").write_text(
        "import sys\nif __name__ == '__main__':\n    open(sys.argv[1], 'w').write(' '.join(sys.argv[2:]))\n"
        "    sys.exit(int(sys.argv[2]))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parents[1]), str(tmp_path)]))
    out = tmp_path / "argv.txt"
    assert run_module_in_child("routers_job_echo", [str(out), "3", "--flag"]) == 3
    assert out.read_text() == "3 --flag"


def test_the_exploration_pool_initializer_installs_the_watch(monkeypatch):
    import routers.memagent.rollout as R
    import routers.workers as W

    calls = []
    monkeypatch.setattr(W, "exit_with_parent", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(R, "build_context", lambda cfg: "ctx")
    monkeypatch.setattr(R, "_WORKER", {})  # the module's worker state stays as other tests left it
    R.init_worker(R.RolloutConfig())
    assert calls == [()] and R._WORKER["ctx"] == "ctx"
