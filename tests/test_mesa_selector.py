"""MESA selector: policies, the UCB-guided search, splits, resume, export, and the train / eval jobs, on a small
synthetic sweep with planted structure (no real data, no model).

Planted: "When ..." questions are answered by the temporal store; "Who ..." by the graph; other questions by
the vector index or the raw trace, whichever preview repeats the question's words. Evidence recall of a subset
is the best of its members; f1 is recall minus 0.05 per extra structure (reading more adds noise); tokens add
up. So "all five" has full recall at the highest cost, and a query-adaptive selector can keep the recall with
far fewer tokens.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from routers.mesa.policies import DIRECTIONS, FAMILIES, FitData, Policy, fit_policy
from routers.mesa.search import SearchState, SearchStats, run_search, ucb
from routers.mesa.search_data import SweepTable, reference_tokens, split_episodes
from routers.mesa.selector_view import ALL_FIVE, QueryView, view_of
from routers.mesa.sweep_format import ALL_SUBSET_KEYS, STRUCTURES, parse_subset, validate_record

TOKENS = {"summary": 300, "temporal": 100, "graph": 150, "vector": 200, "raw": 400}
NAMES = ["Caroline", "Melanie", "John", "Maria", "Dave", "Tim"]
PLACES = ["museum", "beach", "support group", "concert", "bakery", "library", "park"]
FILLER = "weather lunch music garden painting coffee running travel movie book dog cat".split()


def make_record(rng: random.Random, episode: str, i: int) -> dict:
    kind = rng.choice(["temporal", "graph", "vector", "raw"])
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    question = {"temporal": f"When did {name} go to the {place}?", "graph": f"Who went to the {place} with {name}?",
                "vector": f"What did {name} say about the {place}?", "raw": f"What did {name} bring to the {place}?"}[kind]
    structures = {}
    for s in STRUCTURES:
        hit = s == kind
        words = rng.sample(FILLER, 4)
        preview = " ".join(([name.lower(), place] if hit else []) + words)
        structures[s] = {"ok": True, "tokens": TOKENS[s], "preview": preview,
                         "top_score": round(rng.uniform(0.6, 0.9) if hit else rng.uniform(0.0, 0.5), 3)}
    recall = {s: (1.0 if s == kind else 0.0) for s in STRUCTURES}
    recall["summary"] = max(recall["summary"], 0.25)
    subsets = {}
    for key in ALL_SUBSET_KEYS:
        names = parse_subset(key)
        r = max(recall[s] for s in names)
        subsets[key] = {"tokens": sum(TOKENS[s] for s in names), "evidence_recall": r,
                        "f1": round(max(0.0, r * 0.8 - 0.05 * (len(names) - 1)), 4)}
    return {"schema_version": 1, "id": f"{episode}-q{i}", "episode_id": episode, "corpus": "synth",
            "question": question, "gold_answer": f"gold {kind}", "evidence_steps": [i % 7, 3],
            "structures": structures, "subsets": subsets}


def make_sweep(n_episodes: int = 10, per_episode: int = 24, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [make_record(rng, f"ep{e}", i) for e in range(n_episodes) for i in range(per_episode)]


@pytest.fixture(scope="module")
def sweep():
    recs = make_sweep()
    for r in recs:
        validate_record(r)
    return recs


@pytest.fixture(scope="module")
def splits(sweep):
    table = SweepTable.from_records(sweep)
    sp = split_episodes(table.episodes, 0)
    return table.subset(sp["train"]), table.subset(sp["val"]), table.subset(sp["test"])


def _fit_data(train, lam=0.1):
    return FitData.from_table(train, lam, reference_tokens(train))


def test_every_direction_round_trips_exactly(splits):
    train, val, _ = splits
    data = _fit_data(train)
    rng = np.random.default_rng(0)
    assert len(DIRECTIONS) == 20 and set(DIRECTIONS) == set(FAMILIES)
    for d in DIRECTIONS:
        grid = FAMILIES[d].grid
        for hyper in (None, {k: v[int(rng.integers(len(v)))] for k, v in grid.items()}):
            pol = fit_policy(d, hyper, data, rules=[{"if": "cue:temporal", "op": "add", "structure": "temporal"}])
            text = json.dumps(pol.to_dict())
            back = Policy.from_dict(json.loads(text))
            assert json.dumps(back.to_dict()) == text and back == pol, d
            assert [back.select(v) for v in val.views] == [pol.select(v) for v in val.views], d
            assert all(pol.select(v) for v in val.views), d  # never empty


def test_selector_cannot_see_gold_fields(sweep, splits):
    rec = sweep[0]
    view = view_of(rec)
    assert set(QueryView.__slots__) == {"question", "corpus", "structures", "_cache"}
    for name in ("gold_answer", "evidence_steps", "subsets", "id", "episode_id"):
        with pytest.raises(AttributeError):
            getattr(view, name)
    with pytest.raises(AttributeError):
        view.question = "x"  # read-only
    leaky = {n: {**p, "evidence_recall": 1.0, "gold": "x"} for n, p in rec["structures"].items()}
    v2 = QueryView.from_previews(rec["question"], leaky, rec["corpus"])
    assert v2.to_dict() == view.to_dict()
    assert not hasattr(v2.structures["raw"], "evidence_recall")
    pol = fit_policy("learned_gating", None, _fit_data(splits[0]))
    with pytest.raises(TypeError):
        pol.select_mask(rec)  # a raw record (with gold fields) is refused
    # scrambling every outcome field changes no selection of any fitted policy
    scrambled = json.loads(json.dumps(sweep))
    rnd = random.Random(1)
    for r in scrambled:
        r["gold_answer"], r["evidence_steps"] = "zzz", [rnd.randrange(50)]
        for s in r["subsets"].values():
            s["evidence_recall"], s["f1"] = rnd.random(), rnd.random()
    data = _fit_data(splits[0])
    for d in DIRECTIONS:
        p = fit_policy(d, None, data)
        assert [p.select(view_of(r)) for r in sweep] == [p.select(view_of(r)) for r in scrambled], d


def test_fallback_on_empty_selection(splits):
    pol = Policy("marginal_value", {"tau": 10.0}, {"value": [0.0] * 5}, default="summary+raw")
    v = splits[1].views[0]
    assert pol.select(v) == ("summary", "raw")
    removed = Policy("fixed", params={"subset": "vector"}, default="graph",
                     rules=[{"if": "always", "op": "remove", "structure": "vector"}])
    assert removed.select(v) == ("graph",)
    assert Policy.fixed().select(v) == STRUCTURES


def test_ucb_formula_exact():
    assert ucb(0.5, 2, 6, 0.1) == 0.5 + 0.1 * math.sqrt(math.log(8) / 3)
    state = SearchState()
    state.archive = [(Policy.fixed(), 0.4, "fixed")]
    state.arm_objs["lexical_demand"] = [0.6, 0.8]
    state.arm_objs["parsimony"] = [0.75]
    table = state.ucb_table(beta=0.2)
    assert table["lexical_demand"] == pytest.approx(0.7 + 0.2 * math.sqrt(math.log(5) / 3), abs=0, rel=1e-15)
    assert table["parsimony"] == 0.75 + 0.2 * math.sqrt(math.log(5) / 2)
    untried = table["coverage"]
    assert untried == 0.4 + 0.2 * math.sqrt(math.log(5) / 1)  # untried arm: mean of everything evaluated
    plan = state.plan(beta=0.2)
    assert plan["exploit"] == max(DIRECTIONS, key=lambda a: (table[a], -DIRECTIONS.index(a)))
    assert plan["explore"] not in ("lexical_demand", "parsimony", plan["exploit"])


def test_search_improves_and_never_lowers_the_objective(splits):
    train, val, _ = splits
    trace = run_search(train, val, seed=0, lam=0.1, rounds=6)
    entries = trace["entries"]
    assert entries[0]["slot"] == "init" and entries[0]["policy"]["params"]["subset"] == ALL_FIVE
    init = entries[0]["objective"]
    assert trace["best"]["objective"] > init + 0.05
    assert trace["best"]["C"] < 0.7 * entries[0]["C"] and trace["best"]["J"] >= entries[0]["J"] - 0.02
    inc = -math.inf
    for e in entries:
        assert e["accepted"] == (e["objective"] > inc + 1e-12)
        assert e["incumbent_objective"] >= inc
        inc = e["incumbent_objective"]
    assert {e["slot"] for e in entries[1:]} == {"exploit", "explore", "repair"} and len(entries) == 1 + 3 * 6
    assert all(e["direction"] in DIRECTIONS for e in entries[1:])


def test_splits_are_episode_level_and_seed_deterministic(sweep):
    eps = sorted({r["episode_id"] for r in sweep})
    a, b = split_episodes(eps, 3), split_episodes(list(reversed(eps)), 3)
    assert a == b
    assert [len(a[k]) for k in ("train", "val", "test")] == [2, 2, 6]
    assert sorted(a["train"] + a["val"] + a["test"]) == eps
    assert len({tuple(split_episodes(eps, s)["test"]) for s in range(5)}) > 1
    table = SweepTable.from_records(sweep)
    parts = [set(table.subset(a[k]).ids) for k in ("train", "val", "test")]
    assert sum(map(len, parts)) == len(sweep) and not (parts[0] & parts[1] or parts[1] & parts[2] or parts[0] & parts[2])


def test_resume_from_truncated_trace_recomputes_nothing(splits, tmp_path):
    train, val, _ = splits
    full_stats = SearchStats()
    full = run_search(train, val, seed=1, rounds=4, trace_path=tmp_path / "full.json", stats=full_stats)
    for k in (1, 5, 8, len(full["entries"])):
        t = json.loads((tmp_path / "full.json").read_text())
        t["entries"] = t["entries"][:k]
        (tmp_path / f"cut{k}.json").write_text(json.dumps(t))
        stats = SearchStats()
        resumed = run_search(train, val, seed=1, rounds=4, trace_path=tmp_path / f"cut{k}.json", stats=stats)
        new = [e for e in full["entries"][k:] if not e["duplicate"]]
        assert stats.replayed == k and stats.evaluations == len(new)
        assert stats.fits <= len(full["entries"]) - k
        assert json.dumps(resumed["entries"]) == json.dumps(full["entries"])
        assert json.loads((tmp_path / f"cut{k}.json").read_text())["entries"] == full["entries"]
    with pytest.raises(ValueError, match="other settings"):
        run_search(train, val, seed=1, rounds=4, lam=0.2, trace_path=tmp_path / "full.json")


def test_export_load_router_same_selections(splits, tmp_path):
    from routers.base import load_router
    from routers.mesa.selector import MesaSelector, MesaSelectorConfig

    train, val, test = splits
    trace = run_search(train, val, seed=0, rounds=3)
    pol = Policy.from_dict(trace["best"]["policy"])
    sel = MesaSelector(pol, MesaSelectorConfig(seed=0, validation={"objective": trace["best"]["objective"]}))
    sel.save_pretrained(tmp_path / "sel")
    assert {p.name for p in (tmp_path / "sel").iterdir()} >= {"router_config.json", "policy.json", "README.md"}
    loaded = load_router(tmp_path / "sel")
    assert type(loaded).__name__ == "MesaSelector" and loaded.policy == pol
    for v in test.views:
        previews = {n: {"ok": p.ok, "tokens": p.tokens, "preview": p.preview, "top_score": p.top_score}
                    for n, p in v.structures.items()}
        assert loaded.select(v.question, previews, v.corpus) == pol.select(v)
    assert loaded.decide(loaded.score([test.views[0].question], [{}])) == [loaded.select_key(test.views[0].question, {})]
    sel.save_pretrained(tmp_path / "sel")  # a previous export of the same kind is replaced


def test_train_and_eval_jobs_end_to_end(sweep, tmp_path):
    from eval.mesa import main as eval_main
    from train.mesa import main as train_main

    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in sweep))
    out = tmp_path / "search"
    summary = train_main(["--sweep", str(path), "--output_dir", str(out), "--rounds", "3", "--seeds", "0", "1"])
    assert set(summary["seeds"]) == {"0", "1"} and (out / "search_trace.png").stat().st_size > 0
    assert (out / "selector" / "policy.json").exists()
    again = train_main(["--sweep", str(path), "--output_dir", str(out), "--rounds", "3", "--seeds", "0", "1"])
    assert again["evaluations"] == 0  # resumed from the traces: nothing re-evaluated
    report = eval_main(["--sweep", str(path), "--search_dir", str(out), "--output_dir", str(tmp_path / "eval")])
    rows = report["methods"]
    assert rows["llm_zero_shot"]["evidence_recall"] is None  # no backend configured: n/a
    mesa, allf = rows["mesa"], rows["all_five"]
    assert mesa["evidence_tokens"]["mean"] < 0.7 * allf["evidence_tokens"]["mean"]
    assert mesa["evidence_recall"]["mean"] >= allf["evidence_recall"]["mean"] - 0.02
    assert mesa["f1"]["mean"] > rows["route_to_one"]["f1"]["mean"] - 1e-9
    assert (tmp_path / "eval" / "mesa_eval.png").exists() and (tmp_path / "eval" / "mesa_eval.md").exists()


class FakeBackend:
    name = "fake"

    def __init__(self, reply: str):
        self.reply, self.calls = reply, 0

    def generate(self, conversations, max_new_tokens: int = 64):
        self.calls += len(conversations)
        return [self.reply] * len(conversations)


def test_llm_proposer_and_zero_shot_with_a_fake_backend(splits):
    from routers.mesa.search_llm import LLMProposer, zero_shot_select

    train, val, _ = splits
    assert zero_shot_select(FakeBackend("Read temporal, and Raw."), val.views[:2]) == [("temporal", "raw")] * 2
    assert zero_shot_select(FakeBackend("no idea"), val.views[:1]) == [STRUCTURES]  # falls back to all five
    grid = FAMILIES["parsimony"].grid
    good = LLMProposer(FakeBackend('Sure: {"mu": 0.02, "max_size": 2}'))
    assert good(arm="parsimony", slot="exploit", hyper={}, grid=grid, archive=[]) == {"mu": 0.02, "max_size": 2}
    bad = LLMProposer(FakeBackend('{"mu": 7, "max_size": 2}'))  # a value off the grid is refused
    assert bad(arm="parsimony", slot="exploit", hyper={}, grid=grid, archive=[]) is None
    always = LLMProposer(FakeBackend("{}"))
    trace = run_search(train, val, seed=0, rounds=2, proposer=always)
    assert {e["note"] for e in trace["entries"] if e["slot"] in ("exploit", "explore")} == {"rule-based"}
