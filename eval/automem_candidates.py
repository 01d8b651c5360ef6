"""Does the accuracy a search climbs predict held-out accuracy? Plays a search's candidates on the held-out tasks.

AutoMem can only beat random search held-out if the search batch it climbs, or the validation batch it picks by,
ranks architectures the way the held-out tasks do. ``memroute eval automem ... --score_candidates N`` plays the N
best distinct candidates of the search (pooled over seeds and methods, by search accuracy; ``--candidate_selection
spread``: N evenly spaced over that ranking; -1: every one) and every reported pick held-out, and writes
``candidates.json`` (per architecture: search, validation and held-out accuracy; Spearman and Kendall rank
correlations of search and of validation accuracy with held-out accuracy, with their p-values; search accuracy also
over the validated rows alone, the same range validation is judged on) and
``search_vs_heldout.png``. A correlation near zero says the testbed cannot show a better search, whatever the search.
"""

from __future__ import annotations

from pathlib import Path

from routers.io import atomic_write_json
from routers.logs import get_logger

log = get_logger(__name__)
SELECTIONS = ("top", "spread")


def pooled_candidates(traces: dict) -> list[dict]:
    """Distinct successfully evaluated architectures over every seed and method: search accuracy (one search batch
    for all seeds), validation accuracy where some trace validated it, and who evaluated it."""
    by_arch: dict[str, dict] = {}
    for seed, by_method in traces.items():
        for method, tr in by_method.items():
            for p in tr.get("evaluations", []):
                if p.get("failed") or p.get("accuracy") is None:
                    continue
                row = by_arch.setdefault(p["arch"], {"arch": p["arch"], "search_accuracy": p["accuracy"],
                                                     "validation_accuracy": None, "evaluated_by": []})
                row["evaluated_by"].append(f"{method}/seed{seed}")
            for v in tr.get("validations", []):
                if v.get("arch") in by_arch and v.get("accuracy") is not None:
                    by_arch[v["arch"]]["validation_accuracy"] = v["accuracy"]
    return list(by_arch.values())


def select_candidates(rows: list[dict], n: int, how: str = "top", keep=()) -> list[dict]:
    """Ranked by search accuracy, then validation accuracy (unvalidated last), then key: ``how='top'`` the ``n``
    best (the pool a search picks from), ``'spread'`` ``n`` evenly spaced ranks from best to worst (the whole range:
    does the objective predict held-out at all?); ``n < 0``: all. Architectures in ``keep`` (the reported picks)
    are always included."""
    if how not in SELECTIONS:
        raise ValueError(f"candidate selection must be 'top' or 'spread', got {how!r}")
    ranked = sorted(rows, key=lambda r: (-r["search_accuracy"], -(r["validation_accuracy"] if r[
        "validation_accuracy"] is not None else -1.0), r["arch"]))
    if n < 0 or n >= len(ranked):
        return ranked
    if how == "top" or n < 2:
        picked = set(range(n))
    else:
        picked = {round(i * (len(ranked) - 1) / (n - 1)) for i in range(n)}
    keep = set(keep)
    return [r for i, r in enumerate(ranked) if i in picked or r["arch"] in keep]


def rank_correlations(rows: list[dict], key: str) -> dict | None:
    """Spearman and Kendall correlation of ``key`` with held-out accuracy over the rows that have both (None when
    fewer than 3 do, or either side is constant)."""
    from scipy.stats import kendalltau, spearmanr

    pairs = [(r[key], r["heldout_accuracy"]) for r in rows
             if r.get(key) is not None and r.get("heldout_accuracy") is not None]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    if len(pairs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    rho, p_rho = spearmanr(xs, ys)
    tau, p_tau = kendalltau(xs, ys)
    return {"n": len(pairs), "spearman": float(rho), "spearman_p": float(p_rho), "kendall": float(tau),
            "kendall_p": float(p_tau)}


def plot_search_vs_heldout(rows: list[dict], none: dict, path) -> None:
    from matplotlib.figure import Figure

    from eval.plots import finish_and_save

    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    val = [r for r in rows if r["validation_accuracy"] is not None]
    rest = [r for r in rows if r["validation_accuracy"] is None]
    ax.scatter([r["search_accuracy"] for r in rest], [r["heldout_accuracy"] for r in rest], color="tab:gray",
               label="candidate")
    sc = ax.scatter([r["search_accuracy"] for r in val], [r["heldout_accuracy"] for r in val],
                    c=[r["validation_accuracy"] for r in val], cmap="viridis", edgecolors="black",
                    label="validated (colour: validation accuracy)")
    if val:
        fig.colorbar(sc, ax=ax, label="validation accuracy")
    if none.get("accuracy") is not None:
        ax.axhline(none["accuracy"], color="gray", linewidth=0.8, linestyle=":", label="no memory (held-out)")
    finish_and_save(fig, ax, path, "search-batch accuracy", "held-out accuracy",
                    "Does the search objective predict held-out?")


def score_candidates(traces: dict, n: int, play, none: dict, out, how: str = "top") -> dict:
    """Plays the selected candidates and every trace's reported pick held-out (``play(arch_key) -> dict`` with
    ``accuracy``; a replay when the store has it) and writes ``candidates.json`` and ``search_vs_heldout.png``."""
    from tqdm.auto import tqdm

    picks = {tr["best"]["arch"] for by_method in traces.values() for tr in by_method.values() if tr.get("best")}
    rows = select_candidates(pooled_candidates(traces), n, how, keep=picks)
    for r in rows:
        r["reported_pick"] = r["arch"] in picks
    for r in tqdm(rows, desc="candidates held-out", unit="arch"):
        h = play(r["arch"])
        r.update(heldout_accuracy=None if h["failed"] else h["accuracy"], heldout_tokens=h["tokens"],
                 heldout_failed=h["failed"], heldout_by_family=h.get("by_family"))
        r["heldout_gain"] = None if r["heldout_accuracy"] is None else r["heldout_accuracy"] - (none["accuracy"] or 0)
    # the validated candidates are the search's top: search accuracy over the same few rows is the fair comparison
    # with validation accuracy (the full-range correlation is inflated by range, not only by a better objective)
    validated = [r for r in rows if r["validation_accuracy"] is not None]
    report = {"schema_version": 1, "selection": how, "n_candidates": len(rows), "no_memory_heldout": none["accuracy"],
              "search_vs_heldout": rank_correlations(rows, "search_accuracy"),
              "validation_vs_heldout": rank_correlations(rows, "validation_accuracy"),
              "search_vs_heldout_validated": rank_correlations(validated, "search_accuracy"), "candidates": rows}
    out = Path(out)
    atomic_write_json(out / "candidates.json", report)
    plot_search_vs_heldout([r for r in rows if r["heldout_accuracy"] is not None], none,
                           out / "search_vs_heldout.png")
    log.info("candidates held-out: search vs held-out %s (on the validated: %s) | validation vs held-out %s",
             report["search_vs_heldout"], report["search_vs_heldout_validated"], report["validation_vs_heldout"])
    return report
