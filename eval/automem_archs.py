"""Held-out replay of named architectures, without a search: ``memroute eval automem CONFIG --archs KEY ...``.

A search's picks are architecture keys (``workflow|json|cbr_rerank|json_full``); replaying them under other memory
options (``--memory_guards_first true``, ``--memory_world_scope true``) or beside a hand-designed system needs the
held-out tasks and the memory options, not the search's traces. Plays no memory and each key on the first ``n_test``
tasks of ``test_split`` (after ``warmup_split``, as the main evaluation) and writes ``output_dir``:
``evaluations.jsonl`` (the same store as the main evaluation: a rerun, or a key the search's evaluation already
played with the same settings, replays), ``results.json`` (per key: accuracy, per task family, gain over no memory,
tokens, wall time; machine, versions, options) and ``heldout_by_arch.png``.
"""

from __future__ import annotations

from pathlib import Path

from routers.base import git_revision, library_versions
from routers.io import atomic_write_json
from routers.logs import get_logger
from routers.machine import machine_info

log = get_logger(__name__)


def check_archs(keys) -> list[str]:
    """The keys, validated (a bad key names itself and what is wrong before anything is played)."""
    from routers.automem.space import Arch, violations

    out = []
    for key in keys:
        try:
            arch = Arch.parse(key)
        except (ValueError, KeyError) as err:
            raise ValueError(f"--archs {key!r}: not an architecture key 'encode+...|store|retrieve|manage' "
                             f"({err})") from None
        problems = violations(arch)
        if problems:
            raise ValueError(f"--archs {key!r}: invalid architecture: {'; '.join(problems)}")
        out.append(arch.key)
    return out


def plot_archs(results: dict, path) -> None:
    """Held-out accuracy per task family: no memory and each named architecture side by side."""
    from matplotlib.figure import Figure

    from eval.plots import finish_and_save

    rows = {"no memory": results["no_memory"], **results["archs"]}
    families = list(results["no_memory"]["by_family"])
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(rows)
    for j, (name, r) in enumerate(rows.items()):
        ys = [(r["by_family"].get(f) or {}).get("accuracy", 0.0) for f in families]
        ax.bar([i + (j - (len(rows) - 1) / 2) * width for i in range(len(families))], ys, width,
               label=f"{name}: {r['accuracy']:.3f}" if r["accuracy"] is not None else name)
    ax.set_xticks(range(len(families)), families)
    finish_and_save(fig, ax, path, "held-out task family", "held-out accuracy",
                    "Named architectures held-out (legend: overall accuracy)")


def run_archs(cfg, keys: list[str], tasks, held_out, memory_options: dict) -> dict:
    """``keys``: as ``check_archs`` returned them; ``held_out(arch_key_or_None) -> dict`` plays (or replays) one
    system on ``tasks``; the caller holds the output directory's lock. ``results.json`` is rewritten after every
    system (a killed run keeps what it had)."""
    out = Path(cfg.output_dir)
    results: dict = {"schema_version": 1, "test_split": cfg.test_split, "n_test": len(tasks),
                     "warmup_split": cfg.warmup_split, "memory_options": memory_options,
                     "machine": machine_info(), "versions": library_versions(), "git_revision": git_revision()}
    none = held_out(None)
    results.update(no_memory=none, archs={})
    for key in keys:
        r = held_out(key)
        r["gain"] = None if r["accuracy"] is None or none["accuracy"] is None else r["accuracy"] - none["accuracy"]
        results["archs"][key] = r
        log.info("%s: held-out %s (no memory %.3f)", key, r["accuracy"], none["accuracy"] or 0.0)
        atomic_write_json(out / "results.json", results)
    plot_archs(results, out / "heldout_by_arch.png")
    return results
