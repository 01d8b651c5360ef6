"""Mix sufficiency sample files into one training file (``memroute synth mix``), seeded and reproducible.

Why: continuing a router on a new context distribution (retrieval prefixes, TextWorld trajectories) without
forgetting the old one needs a mixture -- e.g. every retrieval-prefix negative, as many positives, plus a slice
of the original intervention samples. Each source is ``PATH[:n=N][:per_label=M]``:

* ``n=N``: at most N records drawn at random from the file;
* ``per_label=M``: at most M records per label, so a skewed file (retrieval prefixes of a retriever trained on
  those conversations are ~67 % sufficient) enters balanced;
* neither: the whole file.

Records are validated like the trainer's input (errors name file and line); the output is shuffled and
written atomically, with a ``.manifest.json`` beside it that records the sources, counts and seed.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_synthesis.jsonl import atomic_write_json, atomic_write_text, read_jsonl
from data_synthesis.sufficiency import SAMPLE_FIELDS, validate_sample


@dataclass
class MixConfig:
    """Options of ``memroute synth mix``."""

    output: str = field(default="outputs/sufficiency_mix/train.jsonl", metadata={"help": "mixed JSONL to write"})
    sources: list[str] = field(default_factory=list, metadata={"help": "PATH[:n=N][:per_label=M] ..."})
    seed: int = 0


def parse_source(spec: str) -> tuple[str, int | None, int | None]:
    """``PATH[:n=N][:per_label=M]`` -> (path, n, per_label)."""
    parts = spec.split(":")
    path, n, per_label = parts[0], None, None
    for opt in parts[1:]:
        key, _, value = opt.partition("=")
        if key not in ("n", "per_label") or not value.isdigit() or int(value) < 1:
            raise ValueError(f"source {spec!r}: options are n=N and per_label=M with positive integers, got {opt!r}")
        if key == "n":
            n = int(value)
        else:
            per_label = int(value)
    if not path:
        raise ValueError(f"source {spec!r}: no path")
    return path, n, per_label


def draw(records: list[dict], n: int | None, per_label: int | None, rng: random.Random) -> list[dict]:
    if per_label is not None:
        picked = []
        for label in (0, 1):
            group = [r for r in records if r["label"] == label]
            picked += rng.sample(group, min(per_label, len(group)))
        records = picked
    if n is not None and n < len(records):
        records = rng.sample(records, n)
    return records


def mix(cfg: MixConfig) -> dict:
    if not cfg.sources:
        raise ValueError("mix needs at least one source")
    rng = random.Random(cfg.seed)
    out, summary, seen = [], [], set()
    for spec in cfg.sources:
        path, n, per_label = parse_source(spec)
        records = list(read_jsonl(path, required=SAMPLE_FIELDS, validate=validate_sample))
        picked = draw(records, n, per_label, rng)
        dup = [r["id"] for r in picked if r["id"] in seen]
        if dup:
            raise ValueError(f"{path}: record id {dup[0]!r} already taken from an earlier source")
        seen.update(r["id"] for r in picked)
        out += picked
        summary.append({"source": spec, "available": len(records), "taken": len(picked),
                        "labels": dict(Counter(int(r["label"]) for r in picked))})
    rng.shuffle(out)

    atomic_write_text(cfg.output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    manifest = {"config": asdict(cfg), "sources": summary, "samples": len(out),
                "labels": dict(Counter(int(r["label"]) for r in out))}
    atomic_write_json(Path(cfg.output).with_suffix(".manifest.json"), manifest)
    return manifest


def make_parser():
    from train.config import make_arg_parser

    return make_arg_parser([MixConfig], prog="memroute synth mix",
                           description="Mix sufficiency sample files (seeded, per-file caps, label balance).")


def main(argv=None) -> dict:
    from train.config import parse_config

    (cfg,) = parse_config(make_parser(), [MixConfig], argv)
    manifest = mix(cfg)
    print({"samples": manifest["samples"], "labels": manifest["labels"], "output": cfg.output})
    return manifest


if __name__ == "__main__":
    main()
