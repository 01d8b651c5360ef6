"""Mix sufficiency sample files into one training file (``memroute synth mix``), seeded and reproducible.

Why: continuing a router on a new context distribution (retrieval prefixes, TextWorld trajectories) without
forgetting the old one needs a mixture -- e.g. every retrieval-prefix negative, as many positives, plus a slice
of the original intervention samples. Each source is ``PATH[:n=N][:per_label=M]``:

* ``n=N``: at most N records drawn at random from the file;
* ``per_label=M``: at most M records per label, so a skewed file (retrieval prefixes of a retriever trained on
  those conversations are ~67 % sufficient) enters balanced;
* neither: the whole file.

Records are read with the trainer's reader, ``read_samples`` (errors name file and line; duplicate ids
within or across files and empty files are errors); the output is shuffled and
written atomically, with a ``.manifest.json`` beside it that records the sources, counts and seed.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from routers.io import OutputLock, atomic_write_json, atomic_write_text
from data_synthesis.sufficiency_samples import read_samples


@dataclass
class MixConfig:
    """Options of ``memroute synth mix``."""

    output: str = field(default="outputs/sufficiency_mix/train.jsonl", metadata={"help": "mixed JSONL to write"})
    sources: list[str] = field(default_factory=list, metadata={"help": "PATH[:n=N][:per_label=M] ..."})
    seed: int = 0


_OPTION = re.compile(r"^[A-Za-z_]\w*=[^/\\]*$")  # "key=value" without a path separator


def parse_source(spec: str) -> tuple[str, int | None, int | None]:
    """``PATH[:n=N][:per_label=M]`` -> (path, n, per_label).

    Options are peeled off the end; a ``:``-part that does not look like ``key=value`` belongs to the path,
    so ``C:/data/x.jsonl`` and ``/data/a:b.jsonl`` are plain paths. An unknown key or a bad value is an error.
    """
    path, n, per_label = spec, None, None
    while ":" in path:
        head, _, opt = path.rpartition(":")
        if not _OPTION.match(opt):
            break
        key, _, value = opt.partition("=")
        if key not in ("n", "per_label") or not value.isdigit() or int(value) < 1:
            raise ValueError(f"source {spec!r}: options are n=N and per_label=M with positive integers, got {opt!r}")
        if (n if key == "n" else per_label) is not None:
            raise ValueError(f"source {spec!r}: option {key} given twice")
        if key == "n":
            n = int(value)
        else:
            per_label = int(value)
        path = head
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


def _same_file(a: str | Path, b: str | Path) -> bool:
    a, b = Path(a), Path(b)
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def mix(cfg: MixConfig, lock: bool = True) -> dict:
    """Read, check and draw every source, then write the mix atomically (nothing is written on bad input).
    ``lock``: hold the lock of the output file's folder while doing so."""
    if not cfg.sources:
        raise ValueError("mix needs at least one source")
    if not cfg.output:
        raise ValueError("output: give the path of the mixed JSONL to write")
    output = Path(cfg.output)
    if output.is_dir():
        raise ValueError(f"output {cfg.output}: is a directory; give the path of the JSONL file to write")
    specs = [(spec, *parse_source(spec)) for spec in cfg.sources]
    manifest_path = output.with_suffix(".manifest.json")
    for spec, path, _, _ in specs:
        for target in (output, manifest_path):
            if _same_file(path, target):
                raise ValueError(f"source {spec!r} is also the output {target}: writing would overwrite a source; "
                                 "choose another --output")
    if lock:
        with OutputLock(output.parent):
            return mix(cfg, lock=False)
    rng = random.Random(cfg.seed)
    out, summary, seen = [], [], set()
    for spec, path, n, per_label in specs:
        records = read_samples(path)  # validated; duplicate ids in one file and an empty file are errors
        picked = draw(records, n, per_label, rng)
        dup = [r["id"] for r in picked if r["id"] in seen]
        if dup:
            raise ValueError(f"{path}: record id {dup[0]!r} already taken from an earlier source")
        seen.update(r["id"] for r in picked)
        out += picked
        summary.append({"source": spec, "available": len(records), "taken": len(picked),
                        "labels": dict(Counter(int(r["label"]) for r in picked))})
    if not out:
        raise ValueError(f"mix: no sample drawn from {cfg.sources}")
    rng.shuffle(out)

    atomic_write_text(cfg.output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    manifest = {"config": asdict(cfg), "sources": summary, "samples": len(out),
                "labels": dict(Counter(int(r["label"]) for r in out))}
    atomic_write_json(manifest_path, manifest)
    return manifest


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([MixConfig], prog="memroute synth mix",
                           description="Mix sufficiency sample files (seeded, per-file caps, label balance).")


def main(argv=None) -> dict:
    from routers.config import parse_config
    from routers.logs import setup_cli_logging

    setup_cli_logging()  # a CLI entry point (memroute synth mix, python -m data_synthesis.mix)
    (cfg,) = parse_config(make_parser(), [MixConfig], argv)
    manifest = mix(cfg)
    print({"samples": manifest["samples"], "labels": manifest["labels"], "output": cfg.output})
    return manifest


if __name__ == "__main__":
    main()
