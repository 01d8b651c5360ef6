"""The MESA sweep: 31 subset keys, record format + validator (file:line errors), resume without recompute."""

from __future__ import annotations

import json
import re

import pytest

from data_synthesis.mesa import MesaSweep, MesaSweepConfig, drop_records_needing_reader
from data_synthesis.mesa_reader import reader_selection
from routers.io import RecordError
from routers.memory.schema import QA, Episode, Step
from routers.mesa.compose import TokenCounter
from routers.mesa.library import MemoryLibrary, default_structures
from routers.mesa.sweep_format import (ALL_SUBSET_KEYS, STRUCTURES, all_subsets, parse_subset, read_sweep,
                                       subset_key, validate_record)
from routers.mesa.vector import HashingEncoder


def test_31_canonical_subset_keys():
    assert len(ALL_SUBSET_KEYS) == 31 == len(set(ALL_SUBSET_KEYS))
    assert ALL_SUBSET_KEYS[0] == "summary" and ALL_SUBSET_KEYS[-1] == "summary+temporal+graph+vector+raw"
    assert subset_key(["raw", "summary"]) == "summary+raw"
    assert all(parse_subset(subset_key(s)) == s for s in all_subsets())
    with pytest.raises(ValueError, match="not canonical"):
        parse_subset("raw+summary")
    with pytest.raises(ValueError, match="unknown structure"):
        subset_key(["summary", "table"])


def _episodes(n_eps=2, n_q=3):
    eps = []
    for e in range(n_eps):
        steps = [Step(f"T{i}", i, f"> take item{e}{i}\nYou take the item{e}{i} from the box{i}.", speaker="agent")
                 for i in range(10)]
        qa = [QA(f"ep{e}/q{j}", f"What did the player take at step {j + 2}?", f"item{e}{j + 2}", [f"T{j + 2}"])
              for j in range(n_q)]
        eps.append(Episode(f"ep{e}", steps, qa=qa, source="textworld"))
    return eps


class CountingBackend:
    name = "counting"

    def __init__(self):
        self.prompts = 0

    def generate(self, conversations, max_new_tokens=64):
        self.prompts += len(conversations)
        out = []
        for conv in conversations:
            text = conv[0]["content"]  # answers from the temporal section only, else gives up
            section = text.split("# Temporal Turns")[1].split("\n#")[0] if "# Temporal Turns" in text else ""
            item = re.search(r"item\d+", section.split("\n", 1)[-1])
            out.append(f"Answer: {item.group(0)}" if item else "I do not know")
        return out


class Crash(Exception):
    pass


def _sweep(tmp_path, backend=None, n_reader=None, **kw):
    cfg = MesaSweepConfig(output_dir=str(tmp_path), corpus="textworld", encoder="hashing", token_counter="whitespace",
                          reader="counting" if backend else "none", max_reader_questions=n_reader, progress=False, **kw)
    lib = MemoryLibrary(default_structures(encoder=HashingEncoder()), cache_dir=tmp_path / "structures")
    return MesaSweep(cfg, library=lib, reader_backend=backend, count=TokenCounter("whitespace")), lib


def test_sweep_records_are_valid_and_scored(tmp_path):
    backend = CountingBackend()
    sweep, _ = _sweep(tmp_path, backend)
    report = sweep.run(_episodes())
    recs = read_sweep(tmp_path / "sweep.jsonl")
    assert len(recs) == 6 and report["questions"] == 6
    r = recs[0]
    assert set(r["subsets"]) == set(ALL_SUBSET_KEYS) and set(r["structures"]) == set(STRUCTURES)
    assert r["evidence_steps"] == [2]
    assert r["subsets"]["temporal"]["evidence_recall"] == 1.0  # "step 2" names it exactly
    assert r["subsets"]["temporal"]["f1"] == 0.0 or r["subsets"]["temporal"]["f1"] == 1.0
    assert r["subsets"]["summary+temporal"]["tokens"] == (r["structures"]["summary"]["tokens"]
                                                         + r["structures"]["temporal"]["tokens"])
    assert all(r["subsets"][k]["f1"] == (1.0 if "temporal" in k else 0.0) for k in ALL_SUBSET_KEYS)
    assert backend.prompts == 6 * 31  # every subset prompt differs here
    assert report["structures"]["temporal"]["evidence_recall_mean"] == 1.0


def test_resume_recomputes_nothing(tmp_path, monkeypatch):
    eps = _episodes()
    backend = CountingBackend()
    sweep, lib = _sweep(tmp_path, backend)
    import data_synthesis.mesa as mesa

    real = mesa.score_question
    calls = {"n": 0}

    def crash_after_four(*a, **k):  # killed after the 5th question was answered, before its record was written
        calls["n"] += 1
        rec = real(*a, **k)
        if calls["n"] == 5:
            raise Crash()
        return rec

    monkeypatch.setattr(mesa, "score_question", crash_after_four)
    with pytest.raises(Crash):
        sweep.run(eps)
    assert len(read_sweep(tmp_path / "sweep.jsonl")) == 4
    first_prompts = backend.prompts
    assert first_prompts == 5 * 31  # the 5th question was answered (cached) before the crash
    monkeypatch.setattr(mesa, "score_question", real)
    backend2 = CountingBackend()
    sweep2, lib2 = _sweep(tmp_path, backend2)
    sweep2.run(eps)
    recs = read_sweep(tmp_path / "sweep.jsonl")
    assert sorted(r["id"] for r in recs) == sorted(q.qa_id for e in eps for q in e.qa)
    assert sum(lib2.build_calls.values()) == 0  # every structure came from the cache
    assert backend2.prompts == 1 * 31  # only the last question; the 5th question's answers were cached
    backend3 = CountingBackend()
    sweep3, lib3 = _sweep(tmp_path, backend3)
    sweep3.run(eps)
    assert backend3.prompts == 0 and sum(lib3.build_calls.values()) == 0


def test_extending_the_reader_budget_rescores_only_new_questions(tmp_path):
    eps = _episodes()
    ids = [q.qa_id for e in eps for q in e.qa]
    assert reader_selection(ids, 2) <= reader_selection(ids, 4)  # a larger budget keeps the smaller one
    backend = CountingBackend()
    sweep, _ = _sweep(tmp_path, backend, n_reader=2)
    sweep.run(eps)
    recs = read_sweep(tmp_path / "sweep.jsonl")
    assert sum(r["subsets"]["raw"]["f1"] is not None for r in recs) == 2 and backend.prompts == 2 * 31
    backend2 = CountingBackend()
    sweep2, _ = _sweep(tmp_path, backend2, n_reader=4)
    sweep2.run(eps)
    recs = read_sweep(tmp_path / "sweep.jsonl")
    assert len(recs) == 6 and sum(r["subsets"]["raw"]["f1"] is not None for r in recs) == 4
    assert backend2.prompts == 2 * 31  # only the two newly selected questions
    assert drop_records_needing_reader(tmp_path / "sweep.jsonl", set()) == 0


def test_failed_structure_subsets_use_working_members(tmp_path):
    sweep, lib = _sweep(tmp_path)

    class Broken:
        def fingerprint(self):
            return {}

        def build(self, episode):
            raise RuntimeError("no")

    lib.structures["summary"] = Broken()
    report = sweep.run(_episodes(1, 1))
    (r,) = read_sweep(tmp_path / "sweep.jsonl")
    assert r["structures"]["summary"] == {"ok": False, "tokens": 0, "preview": "", "top_score": None}
    assert r["subsets"]["summary"] == {"tokens": 0, "evidence_recall": 0.0, "f1": None}
    assert r["subsets"]["summary+temporal"] == r["subsets"]["temporal"]
    assert report["structures"]["summary"]["failures"][0]["episode_id"] == "ep0"


def test_validator_errors_name_file_and_line(tmp_path):
    sweep, _ = _sweep(tmp_path)
    sweep.run(_episodes(1, 2))
    path = tmp_path / "sweep.jsonl"
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["subsets"]["graph+raw"]
    path.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"sweep\.jsonl:2: subsets: missing field\(s\) \['graph\+raw'\]"):
        read_sweep(path)
    good = json.loads(lines[0])
    for mutate, msg in [(lambda r: r["subsets"]["raw"].update(evidence_recall=1.5), "evidence_recall"),
                        (lambda r: r["structures"]["vector"].update(ok="yes"), "ok must be a boolean"),
                        (lambda r: r.update(evidence_steps=["T2"]), "evidence_steps"),
                        (lambda r: r.update(extra=1), "unknown field")]:
        rec = json.loads(json.dumps(good))
        mutate(rec)
        with pytest.raises(ValueError, match=msg):
            validate_record(rec)
    path.write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(RecordError, match=r":2: duplicate id"):
        read_sweep(path)


def test_reader_dtype_reaches_the_backend_and_is_checked(tmp_path, monkeypatch):
    import data_synthesis.mesa as mesa
    from routers import backends

    seen = {}
    monkeypatch.setattr(backends, "make_backend", lambda spec, **kw: seen.update(spec=spec, **kw) or CountingBackend())
    cfg = MesaSweepConfig(output_dir=str(tmp_path), corpus="textworld", reader="smollm2", reader_dtype="auto",
                          encoder="hashing", token_counter="whitespace", progress=False)
    mesa.MesaSweep(cfg, library=MemoryLibrary(default_structures(encoder=HashingEncoder())),
                   count=TokenCounter("whitespace"))
    assert seen["spec"] == "smollm2" and seen["dtype"] == "auto"
    with pytest.raises(ValueError, match="reader_dtype must be float32, bfloat16, float16 or auto, got 'int8'"):
        MesaSweepConfig(output_dir=str(tmp_path), reader_dtype="int8")
