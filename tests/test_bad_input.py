"""Hostile and careless input, end to end through the ``memroute`` command (../shared/reviews/bad-input-probe.md).

Each row of ``CASES`` is one command a user might type. It must exit 2 with ONE line that names the file,
option or record (no traceback), and leave the files it was pointed at untouched. Add a row for every new
user error: ``setup`` builds the situation in ``tmp_path`` and returns the command line after ``memroute``.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

from routers import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class Case:
    id: str
    setup: Callable[[Path, dict], list[str]]  # (tmp_path, fixtures) -> argv after "memroute"
    error: str  # must appear in the one-line message
    kept: tuple[str, ...] = ()  # files (relative to tmp_path) that must survive byte-identical


def _precious(tmp: Path, name: str = "precious") -> Path:
    d = tmp / name
    (d / "sub").mkdir(parents=True)
    (d / "important.txt").write_text("notes\n")
    (d / "sub" / "data.txt").write_text("more\n")
    return d


def _recipe(tmp: Path, values: dict, name: str = "recipe.yaml") -> str:
    path = tmp / name
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _samples(tmp: Path, records: list[dict], name: str = "train.jsonl") -> str:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


GOOD = [{"id": f"s{i}", "question": f"q{i}?", "context": f"c{i}", "label": i % 2} for i in range(6)]

CASES = [
    # -- exports never destroy what they are pointed at (defect 1) ------------------------------------------
    Case("export-into-user-files",
         lambda t, f: ["export", "sufficiency", "--checkpoint", f["tiny"], "--export_dir", str(_precious(t))],
         "refusing to replace it", kept=("precious/important.txt", "precious/sub/data.txt")),
    Case("export-into-a-file",
         lambda t, f: (t.joinpath("notes.txt").write_text("x\n"),
                       ["export", "sufficiency", "--checkpoint", f["tiny"], "--export_dir", str(t / "notes.txt")])[1],
         "is not a directory", kept=("notes.txt",)),
    Case("export-over-the-checkpoint",
         lambda t, f: ["export", "sufficiency", "--checkpoint", f["tiny"], "--export_dir", f["tiny"]],
         "refusing"),
    # -- recipes and flags (defect 2, 9) -----------------------------------------------------------------------
    Case("config-equals-form-is-read",
         lambda t, f: ["synth", "mix", f"--config={_recipe(t, {'sorces': ['a.jsonl']})}"], "unknown option(s) ['sorces']"),
    Case("config-without-value", lambda t, f: ["synth", "mix", "--config"], "--config needs a value"),
    Case("config-followed-by-a-flag",
         lambda t, f: ["synth", "mix", "--config", "--seed", "3"], "--config needs a value"),
    Case("missing-recipe", lambda t, f: ["synth", "mix", str(t / "nope.yaml")], "nope.yaml: recipe not found"),
    Case("recipe-is-a-directory", lambda t, f: ["synth", "mix", "--config", str(t)], "is a directory"),
    Case("recipe-given-twice",
         lambda t, f: ["synth", "mix", _recipe(t, {"seed": 1}), "--config", _recipe(t, {"seed": 2}, "b.yaml")],
         "give the recipe once"),
]


@pytest.fixture
def fixtures(tiny_llama_dir):
    return {"tiny": tiny_llama_dir}


def _snapshot(root: Path, rels) -> dict:
    return {r: (root / r).read_bytes() for r in rels}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_user_error_is_one_line_and_loses_nothing(case, tmp_path, fixtures, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    argv = case.setup(tmp_path, fixtures)
    before = _snapshot(tmp_path, case.kept)
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    errors = [line for line in err.splitlines() if line.startswith("memroute: error: ")]
    assert len(errors) == 1 and case.error in errors[0], err  # one line naming the problem (+ the --debug hint)
    assert "Traceback" not in err, err
    assert _snapshot(tmp_path, case.kept) == before


def test_debug_shows_the_traceback(tmp_path, capsys):
    with pytest.raises(Exception, match="recipe not found"):
        cli.main(["synth", "mix", str(tmp_path / "nope.yaml"), "--debug"])


def test_version_and_group_help(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("memroute ")
    assert cli.main(["synth", "--help"]) == 0
    out = capsys.readouterr().out
    assert "sufficiency" in out and "mix" in out
    assert cli.main(["trian", "sufficiency"]) == 2
    assert "did you mean 'train'" in capsys.readouterr().err


# -- export targets (routers.base.atomic_directory) ---------------------------------------------------------------
def test_atomic_directory_replaces_only_what_memroute_wrote(tmp_path, monkeypatch):
    from routers.base import ExportTargetError, atomic_directory

    monkeypatch.chdir(tmp_path)
    target = tmp_path / "export"
    with atomic_directory(target, "sufficiency") as tmp:  # absent: fine
        (tmp / "router_config.json").write_text(json.dumps({"router_type": "sufficiency"}))
        (tmp / "v1").write_text("1")
    with atomic_directory(target, "sufficiency") as tmp:  # a previous export of the same kind: replaced
        (tmp / "router_config.json").write_text(json.dumps({"router_type": "sufficiency"}))
    assert not (target / "v1").exists()
    with pytest.raises(ExportTargetError, match="saved 'sufficiency'"):  # another kind: refused
        with atomic_directory(target, "retriever"):
            pass
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_directory(empty, "vector_index") as tmp:  # an empty directory: fine
        (tmp / "index.json").write_text(json.dumps({"format": "memroute.vector_index"}))
    with atomic_directory(empty, "vector_index"):
        pass
    user = _precious(tmp_path)
    with pytest.raises(ExportTargetError, match="did not write"):
        with atomic_directory(user, "sufficiency"):
            pass
    assert (user / "important.txt").read_text() == "notes\n"
    for bad in (tmp_path, Path(".")):  # the working directory (or a parent of it)
        with pytest.raises(ExportTargetError, match="working directory"):
            with atomic_directory(bad, "sufficiency"):
                pass
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    for bad in (run, tmp_path / "runs"):
        with pytest.raises(ExportTargetError, match="is or contains"):
            with atomic_directory(bad, "sufficiency", protect=(run,)):
                pass
    assert not list(tmp_path.glob(".*tmp-*"))  # no temporary directory left behind


def test_atomic_directory_rechecks_before_the_rename(tmp_path, monkeypatch):
    """A user file that appears in the target while the export is being written is not deleted."""
    from routers.base import ExportTargetError, atomic_directory

    monkeypatch.chdir(tmp_path)
    target = tmp_path / "export"
    with pytest.raises(ExportTargetError):
        with atomic_directory(target, "sufficiency") as tmp:
            (tmp / "router_config.json").write_text(json.dumps({"router_type": "sufficiency"}))
            target.mkdir()
            (target / "late.txt").write_text("keep me")
    assert (target / "late.txt").read_text() == "keep me"


def test_saving_a_router_over_user_files_is_refused(tmp_path, smollm2_tokenizer, monkeypatch):
    from conftest import make_tiny_llama
    from routers.base import ExportTargetError
    from routers.memory.index import VectorIndex
    from routers.sufficiency import SufficiencyRouter

    monkeypatch.chdir(tmp_path)
    router = SufficiencyRouter.from_model(make_tiny_llama(smollm2_tokenizer), smollm2_tokenizer)
    user = _precious(tmp_path)
    with pytest.raises(ExportTargetError):
        router.save_pretrained(user)
    assert (user / "important.txt").exists() and (user / "sub" / "data.txt").exists()
    router.save_pretrained(tmp_path / "r")
    router.save_pretrained(tmp_path / "r")  # re-export over itself: fine
    import numpy as np

    index = VectorIndex.from_embeddings(["a", "b"], np.eye(2, dtype=np.float32))
    with pytest.raises(ExportTargetError, match="saved 'sufficiency'"):
        index.save(tmp_path / "r")  # an index never replaces a router
    index.save(tmp_path / "idx")
    index.save(tmp_path / "idx")


# -- output permissions (defect 12) ---------------------------------------------------------------------------------
def test_outputs_follow_the_umask(tmp_path, smollm2_tokenizer, monkeypatch):
    from conftest import make_tiny_llama
    from routers.io import atomic_write_json
    from routers.sufficiency import SufficiencyRouter

    monkeypatch.chdir(tmp_path)
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "m.json", {"a": 1})
        assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644
        router = SufficiencyRouter.from_model(make_tiny_llama(smollm2_tokenizer), smollm2_tokenizer)
        out = router.save_pretrained(tmp_path / "export")
        assert stat.S_IMODE(out.stat().st_mode) == 0o755
        for f in out.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
        os.umask(0o077)  # a private umask is respected too
        atomic_write_json(tmp_path / "p.json", {"a": 1})
        assert stat.S_IMODE((tmp_path / "p.json").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_plots_follow_the_umask(tmp_path):
    from eval.plots import reliability_diagram

    old = os.umask(0o022)
    try:
        path = reliability_diagram({"m": ([0, 1, 1, 0], [0.1, 0.9, 0.7, 0.4])}, tmp_path / "r.png")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# -- one run per output folder (defect 4) ---------------------------------------------------------------------------
def test_a_second_run_into_a_locked_output_dir_fails(tmp_path):
    from routers.io import LOCK_FILE, OutputLock, OutputLockedError

    with OutputLock(tmp_path / "out"):
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()}"):
            OutputLock(tmp_path / "out").acquire()
    with OutputLock(tmp_path / "out"):  # released on exit: the next run proceeds
        assert (tmp_path / "out" / LOCK_FILE).exists()


def test_the_lock_is_released_when_the_holder_dies(tmp_path):
    import subprocess
    import sys

    from routers.io import OutputLock

    repo = Path(__file__).resolve().parents[1]
    code = ("import os; from routers.io import OutputLock; "
            f"OutputLock({str(tmp_path / 'out')!r}).acquire(); os._exit(0)")  # dies holding it
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(repo)})
    with OutputLock(tmp_path / "out"):
        pass
