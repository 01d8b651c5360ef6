"""MESA selector search: fit + UCB-guided policy search on a structure sweep, one search per split seed.

    memroute train mesa configs/mesa/train/default.yaml [--sweep outputs/mesa/locomo/sweep.jsonl --score f1]
    python -m train.mesa configs/mesa/train/default.yaml

Reads the ``sweep.jsonl`` of the structure sweep (one record per question: previews of the five structures and
the score / tokens of all 31 subsets), splits its episodes 2:2:6 (train / validation / test) per seed, and for
every seed runs :func:`routers.mesa.search.run_search`: policies are fitted on train and compared on validation
by J - lam * C / t_ref (J: mean ``score``, reader-free ``evidence_recall`` by default, ``f1`` for the reader;
C: mean evidence tokens; t_ref: mean all-five tokens on the train split). The test split is never read here.

Writes into ``output_dir``: ``seed<S>/trace.json`` (every candidate: round, slot, direction, UCB, policy, J, C,
objective, accepted), ``seed<S>/selector`` (the seed's chosen selector as a router export), ``summary.json``,
``search_trace.png`` (best J - lam C vs round, per seed) and ``resolved_config.yaml``; ``export_dir`` gets the
selector of ``export_seed``. A killed run, rerun with the same command, replays the traces and evaluates only
what is missing (``--resume never`` starts over; other settings than the trace's are refused).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from routers.config import check_resume_value, make_arg_parser, parse_config, save_resolved_config
from routers.io import OutputLock, atomic_write_json
from routers.logs import get_logger, setup_cli_logging
from routers.mesa.search_data import SCORES, SweepTable, split_episodes
from routers.validation import int_option, number_option, option_problems, raise_option_problems

log = get_logger(__name__)


@dataclass
class MesaTrainConfig:
    sweep: str | None = field(default=None, metadata={"help": "sweep.jsonl of the structure sweep (required)"})
    output_dir: str = "outputs/mesa/locomo/search"
    score: str = field(default="evidence_recall", metadata={"help": "evidence_recall (reader-free) or f1 (reader)"})
    lam: float = field(default=0.1, metadata={"help": "cost weight: objective = J - lam * tokens / all-five tokens"})
    beta: float = field(default=0.05, metadata={"help": "UCB exploration weight (eq. 9)"})
    rounds: int = field(default=30, metadata={"help": "search rounds (3 candidates each)"})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4], metadata={"help": "split seeds"})
    fail_margin: float = field(default=0.05, metadata={"help": "a validation question is failed when the "
                                                       "incumbent's objective is this far below the best subset's"})
    proposer: str = field(default="rule", metadata={"help": "rule (default) or llm (needs backend)"})
    backend: str | None = field(default=None, metadata={"help": "LLM backend for proposer llm (routers.backends)"})
    export_dir: str | None = field(default=None, metadata={"help": "default: <output_dir>/selector"})
    export_seed: int | None = field(default=None, metadata={"help": "seed whose selector goes to export_dir (default: first)"})
    resume: str = "auto"

    def __post_init__(self):
        raise_option_problems(option_problems([
            (bool(self.sweep), "sweep is required: the sweep.jsonl of the MESA structure sweep"),
            (self.score in SCORES, f"score must be one of {list(SCORES)}, got {self.score!r}"),
            number_option(self.lam, "lam", 0.0), number_option(self.beta, "beta", 0.0),
            number_option(self.fail_margin, "fail_margin", 0.0), int_option(self.rounds, "rounds", minimum=0),
            (bool(self.seeds), "seeds must list at least one seed"),
            (self.proposer in ("rule", "llm"), f"proposer must be rule or llm, got {self.proposer!r}"),
            (self.proposer == "rule" or bool(self.backend), "proposer llm needs --backend"),
            (self.export_seed is None or self.export_seed in self.seeds, "export_seed must be one of seeds")]))
        check_resume_value(self.resume)


def plot_traces(traces: dict, path) -> None:
    import tempfile

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for seed, tr in traces.items():
        per_round: dict = {}
        for e in tr["entries"]:
            per_round[e["round"]] = e["incumbent_objective"]
        xs = sorted(per_round)
        ax.plot(xs, [per_round[x] for x in xs], marker=".", label=f"seed {seed}")
    ax.set_xlabel("round")
    ax.set_ylabel("best validation J - lambda C")
    ax.set_title("MESA policy search (round 0 = all five)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    FigureCanvasAgg(fig)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)  # atomic, like eval.plots
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run(cfg: MesaTrainConfig) -> dict:
    from routers.mesa.search import SearchStats, run_search
    from routers.mesa.policies import Policy
    from routers.mesa.selector import MesaSelector, MesaSelectorConfig
    from routers.mesa.sweep_format import read_sweep

    records = read_sweep(cfg.sweep)  # bad data fails before anything is written
    table = SweepTable.from_records(records, cfg.score)
    if not len(table):
        raise ValueError(f"{cfg.sweep}: no question has a {cfg.score} score for every subset")
    proposer = None
    if cfg.proposer == "llm":
        from routers.backends import make_backend
        from routers.mesa.search_llm import LLMProposer

        proposer = LLMProposer(make_backend(cfg.backend))
    out = Path(cfg.output_dir)
    stats = SearchStats()
    summary = {"schema_version": 1, "config": asdict(cfg), "sweep": {"path": cfg.sweep, "questions": len(table),
               "episodes": len(set(table.episodes))}, "seeds": {}}
    traces = {}
    with OutputLock(out):
        save_resolved_config(out, cfg)
        for seed in cfg.seeds:
            split = split_episodes(table.episodes, seed)
            train, val = table.subset(split["train"]), table.subset(split["val"])
            if not len(train) or not len(val):
                raise ValueError(f"{cfg.sweep}: seed {seed}: the train or validation episodes {split['train']} / "
                                 f"{split['val']} hold no question with a {cfg.score} score for every subset")
            trace_path = out / f"seed{seed}" / "trace.json"
            if cfg.resume == "never" and trace_path.exists():
                trace_path.unlink()
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            fp = {"sweep_questions": len(table), "score": cfg.score, "rounds": cfg.rounds, "proposer": cfg.proposer,
                  "split": split}
            tr = run_search(train, val, seed=seed, lam=cfg.lam, beta=cfg.beta, rounds=cfg.rounds,
                            fail_margin=cfg.fail_margin, trace_path=trace_path, fingerprint=fp, proposer=proposer,
                            stats=stats, extra={"split": split, "score": cfg.score, "sweep": cfg.sweep})
            traces[seed] = tr
            best = tr["best"]
            sel = MesaSelector(Policy.from_dict(best["policy"]), MesaSelectorConfig(
                score=cfg.score, lam=cfg.lam, t_ref=tr["t_ref"], seed=seed,
                validation={k: best[k] for k in ("J", "C", "objective", "structures_per_query")}))
            sel.save_pretrained(out / f"seed{seed}" / "selector")
            summary["seeds"][str(seed)] = {"split": split, "init": {k: tr["entries"][0][k] for k in ("J", "C", "objective")},
                                           "best": {k: best[k] for k in ("round", "slot", "direction", "J", "C",
                                                                         "objective", "structures_per_query")},
                                           "family": best["policy"]["direction"],
                                           "repair_rules": len(best["policy"]["rules"]), "candidates": len(tr["entries"])}
            log.info("seed %d: %s J %.4f C %.0f objective %.4f (all five: %.4f)", seed, best["direction"], best["J"],
                     best["C"], best["objective"], tr["entries"][0]["objective"])
        export_seed = cfg.export_seed if cfg.export_seed is not None else cfg.seeds[0]
        export_dir = Path(cfg.export_dir or out / "selector")
        src = out / f"seed{export_seed}" / "selector"
        from routers.base import load_router

        load_router(src).save_pretrained(export_dir)
        summary.update({"evaluations": stats.evaluations, "replayed": stats.replayed, "export_dir": str(export_dir),
                        "export_seed": export_seed})
        atomic_write_json(out / "summary.json", summary)
        plot_traces(traces, out / "search_trace.png")
    return summary


def make_parser():
    return make_arg_parser([MesaTrainConfig], prog="memroute train mesa",
                           description="MESA: UCB-guided search for a query-adaptive structure selector.")


def main(argv=None) -> dict:
    from routers.models import offline_by_default

    offline_by_default()
    setup_cli_logging()
    (cfg,) = parse_config(make_parser(), [MesaTrainConfig], argv)
    return run(cfg)


if __name__ == "__main__":
    main()
