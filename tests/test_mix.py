"""`memroute synth mix`: per-file caps, label balance, determinism, clear errors."""

from __future__ import annotations

import json

import pytest

from routers.io import RecordError
from data_synthesis.mix import MixConfig, main, mix, parse_source
from routers import cli


def _write(path, prefix, labels):
    path.write_text("".join(json.dumps({"id": f"{prefix}{i}", "question": "q", "context": "c", "label": y}) + "\n"
                            for i, y in enumerate(labels)), encoding="utf-8")
    return str(path)


@pytest.fixture
def sources(tmp_path):
    skewed = _write(tmp_path / "prefix.jsonl", "p", [1] * 30 + [0] * 8)
    other = _write(tmp_path / "orig.jsonl", "o", [0, 1] * 10)
    return skewed, other


def _ids(path):
    return [json.loads(line)["id"] for line in open(path, encoding="utf-8")]


def test_balance_caps_and_manifest(tmp_path, sources):
    skewed, other = sources
    out = tmp_path / "mix" / "train.jsonl"
    m = mix(MixConfig(output=str(out), sources=[f"{skewed}:per_label=10", f"{other}:n=5"], seed=3))
    ids = _ids(out)
    assert len(ids) == len(set(ids)) == 8 + 10 + 5 == m["samples"]
    taken = {s["source"]: s for s in m["sources"]}
    assert taken[f"{skewed}:per_label=10"]["labels"] == {0: 8, 1: 10}  # each label capped apart; only 8 negatives exist
    assert taken[f"{other}:n=5"]["taken"] == 5 and taken[f"{other}:n=5"]["available"] == 20
    assert sum(i.startswith("p") for i in ids) == 18 and sum(i.startswith("o") for i in ids) == 5
    on_disk = json.loads((tmp_path / "mix" / "train.manifest.json").read_text())
    assert on_disk["samples"] == 23 and on_disk["config"]["seed"] == 3
    # Same seed -> same file; another seed -> another draw or order.
    again = tmp_path / "again.jsonl"
    mix(MixConfig(output=str(again), sources=[f"{skewed}:per_label=10", f"{other}:n=5"], seed=3))
    assert _ids(again) == ids
    other_seed = tmp_path / "other.jsonl"
    mix(MixConfig(output=str(other_seed), sources=[f"{skewed}:per_label=10", f"{other}:n=5"], seed=4))
    assert _ids(other_seed) != ids


def test_whole_file_and_cli(tmp_path, sources):
    skewed, other = sources
    out = tmp_path / "all.jsonl"
    cli.main(["synth", "mix", "--output", str(out), "--sources", skewed, other])
    assert sorted(_ids(out)) == sorted([f"p{i}" for i in range(38)] + [f"o{i}" for i in range(20)])


def test_errors(tmp_path, sources):
    skewed, _ = sources
    with pytest.raises(ValueError, match="options are n=N and per_label=M"):
        parse_source(f"{skewed}:k=3")
    with pytest.raises(ValueError, match="options are"):
        parse_source(f"{skewed}:n=0")
    with pytest.raises(ValueError, match="already taken"):
        mix(MixConfig(output=str(tmp_path / "d.jsonl"), sources=[skewed, skewed]))
    with pytest.raises(ValueError, match="at least one source"):
        mix(MixConfig(output=str(tmp_path / "e.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "context": "c", "label": 1}\n{"id": "b", "question": "q"}\n')
    with pytest.raises(RecordError, match=r"bad\.jsonl:2"):
        main(["--output", str(tmp_path / "f.jsonl"), "--sources", str(bad)])
    assert not (tmp_path / "f.jsonl").exists()  # nothing written on bad input
