"""The MESA sweep record: canonical structure names, subset keys and a record validator.

One JSON line per question (``<output_dir>/sweep.jsonl``)::

    {"schema_version": 1, "id": <qa id>, "episode_id": str, "corpus": str, "question": str,
     "gold_answer": str, "evidence_steps": [int, ...],
     "structures": {name: {"ok": bool, "tokens": int, "preview": str, "top_score": float|null}},  # all 5 names
     "subsets": {subset_key: {"tokens": int, "evidence_recall": float, "f1": float|null}}}         # all 31 keys

``evidence_steps`` are step *indices* (``Step.index``). A subset key joins its member names with ``+`` in the
canonical order ``summary, temporal, graph, vector, raw`` (``subset_key(["raw", "summary"]) == "summary+raw"``).
A subset containing a failed structure is composed from its working members; if none work, tokens 0 and
scores 0. ``f1`` is null when the reader was not run for that question.

The selector/search side imports :data:`STRUCTURES`, :func:`subset_key`, :func:`all_subsets`,
:func:`parse_subset` and :func:`validate_record` (or :func:`read_sweep`, whose errors name file:line).
"""

from __future__ import annotations

import math
import os
from itertools import combinations
from typing import Iterable

SCHEMA_VERSION = 1
STRUCTURES: tuple[str, ...] = ("summary", "temporal", "graph", "vector", "raw")
SHORT = {"summary": "S", "temporal": "T", "graph": "G", "vector": "V", "raw": "R"}
SEPARATOR = "+"
RECORD_FIELDS = ("schema_version", "id", "episode_id", "corpus", "question", "gold_answer", "evidence_steps",
                 "structures", "subsets")
STRUCTURE_FIELDS = ("ok", "tokens", "preview", "top_score")
SUBSET_FIELDS = ("tokens", "evidence_recall", "f1")
_RANK = {name: i for i, name in enumerate(STRUCTURES)}


def subset_key(names: Iterable[str]) -> str:
    """The canonical key of a non-empty subset: its names in canonical order, joined by '+'."""
    names = list(names)
    unknown = [n for n in names if n not in _RANK]
    if unknown:
        raise ValueError(f"unknown structure name(s) {unknown}; expected some of {list(STRUCTURES)}")
    if not names:
        raise ValueError("a subset must contain at least one structure")
    if len(set(names)) != len(names):
        raise ValueError(f"repeated structure name in {names}")
    return SEPARATOR.join(sorted(names, key=_RANK.__getitem__))


def parse_subset(key: str) -> tuple[str, ...]:
    """Inverse of :func:`subset_key`; a non-canonical key is an error."""
    names = tuple(key.split(SEPARATOR)) if isinstance(key, str) and key else ()
    if subset_key(names) != key:
        raise ValueError(f"subset key {key!r} is not canonical (expected {subset_key(names)!r})")
    return names


def all_subsets() -> list[tuple[str, ...]]:
    """The 31 non-empty subsets, by size then canonical order."""
    return [combo for k in range(1, len(STRUCTURES) + 1) for combo in combinations(STRUCTURES, k)]


ALL_SUBSET_KEYS: tuple[str, ...] = tuple(subset_key(s) for s in all_subsets())


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def _check_keys(obj: dict, expected: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object, got {type(obj).__name__}")
    missing = [k for k in expected if k not in obj]
    unknown = sorted(k for k in obj if k not in expected)
    if missing or unknown:
        parts = ([f"missing field(s) {missing}"] if missing else []) + (
            [f"unknown field(s) {unknown}"] if unknown else [])
        raise ValueError(f"{where}: " + "; ".join(parts))


def _unit(x, where: str) -> None:
    if not _is_num(x) or not 0.0 <= x <= 1.0:
        raise ValueError(f"{where} must be a number in [0, 1], got {x!r:.60}")


def validate_record(rec: dict) -> None:
    """Raise ValueError naming the field when ``rec`` is not a well-formed sweep record."""
    _check_keys(rec, RECORD_FIELDS, "record")
    if rec["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"schema_version must be {SCHEMA_VERSION}, got {rec['schema_version']!r:.40}")
    if not isinstance(rec["id"], (str, int)) or isinstance(rec["id"], bool):
        raise ValueError(f"id must be a string or an integer, got {rec['id']!r:.60}")
    for key in ("episode_id", "corpus", "question", "gold_answer"):
        if not isinstance(rec[key], str):
            raise ValueError(f"{key} must be a string, got {rec[key]!r:.60}")
    ev = rec["evidence_steps"]
    if not isinstance(ev, list) or not all(_is_int(x) and x >= 0 for x in ev):
        raise ValueError(f"evidence_steps must be a list of non-negative integers, got {ev!r:.80}")
    _check_keys(rec["structures"], STRUCTURES, "structures")
    for name in STRUCTURES:
        s = rec["structures"][name]
        where = f"structures.{name}"
        _check_keys(s, STRUCTURE_FIELDS, where)
        if not isinstance(s["ok"], bool):
            raise ValueError(f"{where}.ok must be a boolean, got {s['ok']!r:.40}")
        if not _is_int(s["tokens"]) or s["tokens"] < 0:
            raise ValueError(f"{where}.tokens must be a non-negative integer, got {s['tokens']!r:.40}")
        if not isinstance(s["preview"], str):
            raise ValueError(f"{where}.preview must be a string, got {s['preview']!r:.40}")
        if s["top_score"] is not None and not _is_num(s["top_score"]):
            raise ValueError(f"{where}.top_score must be a finite number or null, got {s['top_score']!r:.40}")
    _check_keys(rec["subsets"], ALL_SUBSET_KEYS, "subsets")
    for key in ALL_SUBSET_KEYS:
        s = rec["subsets"][key]
        where = f"subsets[{key!r}]"
        _check_keys(s, SUBSET_FIELDS, where)
        if not _is_int(s["tokens"]) or s["tokens"] < 0:
            raise ValueError(f"{where}.tokens must be a non-negative integer, got {s['tokens']!r:.40}")
        _unit(s["evidence_recall"], f"{where}.evidence_recall")
        if s["f1"] is not None:
            _unit(s["f1"], f"{where}.f1")


def read_sweep(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """Every validated record of a sweep file; a bad line raises RecordError naming file:line, a repeated id too."""
    from routers.io import read_records, unique_ids

    return read_records(path, RECORD_FIELDS, unique_ids(validate_record), "MESA sweep record", limit=limit)
