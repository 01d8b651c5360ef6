"""Issue 21 on one GPU: the leave-one-corpus-out table of the GPU recipe (configs/sufficiency/train/general_gpu.yaml).

Every router is trained at once on the one GPU (phase A), then scored by the repository's own leave-out evaluator
(phase B), so the whole table fits one device call. For each mix ``TAG=MANIFEST[@SEEDS]`` (a ``memroute synth mix``
manifest; seeds default 0):

- phase A: for each corpus C the router without C at every seed (``WORK/TAG/lo_C/C/router``, ``.../seed1/router``,
  exactly where ``memroute eval sufficiency --leave_out C`` looks for them) and the general router (the whole mix)
  at every seed; at most ``--parallel`` trainings at a time (first seeds of every mix first), none started after
  ``--budget_a`` seconds;
- phase B: per mix and corpus, ``memroute eval sufficiency --leave_out C`` reusing those routers (base, router
  without C, its other seeds, the general router as in-corpus, calibration travel), and the general router at its
  other seeds on every held-out file; all at once.

Writes ``$OUT/summary.json`` (per corpus AUROCs, per run wall seconds and exit codes, machine, versions) and
``$OUT/results.tgz`` (reports, scores, logs, trainer states; no weights), also when a phase runs out of time.

    python eval/reports/leave_out/sufficiency_gpu/run_gpu.py \
        default=outputs/leave_out_default/mix/train.manifest.json@0,1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

T0 = time.time()
PY = sys.executable


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mixes", nargs="+", help="TAG=MANIFEST[@SEED,SEED...]")
    p.add_argument("--recipe", default="configs/sufficiency/train/general_gpu.yaml")
    p.add_argument("--work", default="/tmp/lo_gpu")
    p.add_argument("--out", default=os.environ.get("OUT", "results/lo_gpu"))
    p.add_argument("--parallel", type=int, default=6)
    p.add_argument("--budget_a", type=float, default=330, help="no training starts after this many seconds")
    p.add_argument("--deadline_a", type=float, default=380, help="trainings still running then are stopped")
    p.add_argument("--deadline_b", type=float, default=540, help="scoring still running then is stopped")
    p.add_argument("--train_args", default="--report_to none")
    p.add_argument("--eval_args", default="--batch_size 32")
    return p.parse_args(argv)


def elapsed() -> float:
    return round(time.time() - T0, 1)


def log(msg: str) -> None:
    print(f"[{elapsed():7.1f}s] {msg}", flush=True)


class Pool:
    """Child processes, ``parallel`` at a time; each logs to its own file; a deadline stops the rest."""

    def __init__(self, logs: Path, parallel: int):
        self.logs, self.parallel, self.queue, self.running, self.done = logs, parallel, [], {}, {}
        logs.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, argv: list[str], ready=lambda: True) -> None:
        self.queue.append((name, argv, ready))

    def run(self, start_until: float, deadline: float) -> dict:
        while self.queue or self.running:
            for name, (proc, t, f) in list(self.running.items()):
                if proc.poll() is not None:
                    f.close()
                    self.done[name] = {"rc": proc.returncode, "wall_s": round(time.time() - t, 1)}
                    log(f"{name}: exit {proc.returncode} after {self.done[name]['wall_s']} s")
                    del self.running[name]
            while self.queue and len(self.running) < self.parallel and elapsed() < start_until:
                name, argv, ready = self.queue.pop(0)
                if not ready():
                    self.done[name] = {"rc": None, "skipped": "its input is missing"}
                    continue
                f = open(self.logs / f"{name}.log", "w")
                log(f"start {name}: {' '.join(argv[2:])}")
                self.running[name] = (subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT), time.time(), f)
            if elapsed() >= start_until:
                for name, _, _ in self.queue:
                    self.done[name] = {"rc": None, "skipped": "budget"}
                self.queue = []
            if elapsed() >= deadline:
                for name, (proc, t, f) in self.running.items():
                    proc.kill()
                    proc.wait()
                    f.close()
                    self.done[name] = {"rc": "killed at deadline", "wall_s": round(time.time() - t, 1)}
                    log(f"{name}: killed at the deadline")
                self.running = {}
            time.sleep(2)
        return self.done


def exported(router: Path) -> bool:
    return (router / "router_config.json").exists()


def parse_mix(item: str) -> tuple[str, str, list[int]]:
    tag, sep, rest = item.partition("=")
    if not sep:
        tag, rest = "default", item
    manifest, _, seeds = rest.partition("@")
    return tag, manifest, [int(x) for x in seeds.split(",")] if seeds else [0]


def main(argv=None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, os.getcwd())
    from eval.leave_out import LeaveOutConfig, _held_out, corpus_sources, write_train_without

    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    mixes = {}
    for item in args.mixes:
        tag, manifest, seeds = parse_mix(item)
        sources = corpus_sources(LeaveOutConfig(manifest=manifest))
        mixes[tag] = {"manifest": manifest, "seeds": seeds, "sources": sources}
    summary = {"config": vars(args), "mixes": {t: {"manifest": m["manifest"], "seeds": m["seeds"],
                                                   "corpora": sorted(m["sources"]), "results": {}}
                                               for t, m in mixes.items()}, "runs": {}}
    try:
        from routers.base import library_versions
        from routers.machine import machine_info

        import torch
        summary["machine"] = machine_info("cuda" if torch.cuda.is_available() else None)
        summary["versions"] = library_versions()
    except Exception as e:  # provenance must not stop the run
        summary["machine"] = {"error": repr(e)}
    train = [PY, "-m", "train.sufficiency", args.recipe] + args.train_args.split()
    pool = Pool(work / "logs", args.parallel)
    try:
        # -- phase A: every router at once (first seeds of every mix first) -------------------------------------
        jobs = []
        for tag, m in mixes.items():
            mix_train = Path(m["manifest"].removesuffix(".manifest.json") + ".jsonl")
            for i, seed in enumerate(m["seeds"]):
                for c in sorted(m["sources"]):
                    root = work / tag / f"lo_{c}" / c
                    if i == 0:
                        info = write_train_without("sufficiency", m["sources"], c, root / "train_without.jsonl", seed=0)
                        row = summary["mixes"][tag]["results"].setdefault(c, {})
                        row["train_without_samples"] = info.get("samples")
                    run = root if i == 0 else root / f"seed{seed}"
                    jobs.append((i, f"{tag}_without_{c}_s{seed}", train + [
                        "--train_file", str(root / "train_without.jsonl"), "--output_dir", str(run / "train"),
                        "--export_dir", str(run / "router"), "--seed", str(seed)]))
                g = work / tag / "general" / f"s{seed}"
                jobs.append((i, f"{tag}_general_s{seed}", train + [
                    "--train_file", str(mix_train), "--output_dir", str(g / "train"), "--export_dir", str(g / "router"),
                    "--seed", str(seed)]))
        for _, name, argv in sorted(jobs, key=lambda j: j[0]):
            if not exported(Path(argv[argv.index("--export_dir") + 1])):  # a rerun trains only what is missing
                pool.add(name, argv)
        summary["runs"]["A"] = pool.run(args.budget_a, args.deadline_a)
        # -- phase B: the leave-out evaluator, reusing the routers ---------------------------------------------
        pool = Pool(work / "logs", 16)
        for tag, m in mixes.items():
            s0, extra = m["seeds"][0], m["seeds"][1:]
            general0 = work / tag / "general" / f"s{s0}" / "router"
            for c in sorted(m["sources"]):
                root = work / tag / f"lo_{c}" / c
                cmd = [PY, "-m", "routers.cli", "eval", "sufficiency", "--leave_out", c, "--manifest", m["manifest"],
                       "--surface_baseline", "false", "--output_dir", str(root.parent), "--eval_args", args.eval_args]
                seeds = [s for s in extra if exported(root / f"seed{s}" / "router")]
                if seeds:
                    cmd += ["--extra_train_seeds", *map(str, seeds)]
                if exported(general0):
                    cmd += ["--router_in_corpus", f"{c}={general0}"]
                pool.add(f"{tag}_leave_out_{c}", cmd, ready=lambda r=root: exported(r / "router"))
            for s in extra:
                gen = work / tag / "general" / f"s{s}" / "router"
                for c in sorted(m["sources"]):
                    pool.add(f"{tag}_general_s{s}_on_{c}", [
                        PY, "-m", "routers.cli", "eval", "sufficiency", "--data", str(_held_out(m["sources"][c], c)),
                        "--router", str(gen), "--base_model", "none", "--output_dir", str(gen.parent / f"on_{c}")]
                        + args.eval_args.split(), ready=lambda g=gen: exported(g))
        summary["runs"]["B"] = pool.run(args.deadline_b, args.deadline_b)
    finally:
        collect(work, out, mixes, summary)


def collect(work: Path, out: Path, mixes: dict, summary: dict) -> None:
    """Per-corpus AUROCs into summary.json; reports, scores, logs and trainer states (no weights) into results.tgz."""
    for tag, m in mixes.items():
        for c in sorted(m["sources"]):
            res = summary["mixes"][tag]["results"].setdefault(c, {})
            lo = work / tag / f"lo_{c}" / "leave_out.json"
            if lo.exists():
                row = json.loads(lo.read_text())["results"][c]
                res.update({k: row[k] for k in ("base", "without", "in_corpus", "without_seeds", "calibration")
                            if k in row})
            for s in m["seeds"][1:]:
                metrics = work / tag / "general" / f"s{s}" / f"on_{c}" / "metrics.json"
                if metrics.exists():
                    models = json.loads(metrics.read_text())["models"]
                    res[f"general_s{s}"] = {k: v.get("auroc") for k, v in models.items()}
    summary["wall_s"] = elapsed()
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    skip = (".safetensors", ".bin", ".pt", ".pth", "train_without.jsonl", "optimizer", "rng_state", "tokenizer",
            "score_cache", "chat_template")
    with tarfile.open(out / "results.tgz", "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if path.is_file() and not any(k in path.name for k in skip) and "/checkpoint-" not in str(path):
                tar.add(path, arcname=str(path.relative_to(work)))
    log(f"wrote {out / 'summary.json'} and results.tgz")


if __name__ == "__main__":
    main()
