"""Per-sample result caches that make an evaluation resumable after a kill.

Each evaluation appends one JSON line per scored sample (or per ranked question) to
``<output_dir>/<name>.jsonl`` through :class:`~routers.io.ResumableJsonlWriter` (flushed and
fsynced per record; a torn last line from a kill is dropped on reopen). A rerun reads the cache back
and only computes what is missing. The key of a record is

    <model identity> | <sample id> | <hash of the sample's inputs>

so a different model (other weights, even the same path retrained), or a sample whose text changed
under the same id, is computed afresh instead of silently reusing a stale result.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from routers.io import RecordError, ResumableJsonlWriter, read_jsonl

# Files of a model directory that do not change its outputs (eval writes calibration.json itself).
_IGNORED = {"calibration.json", "README.md"}


def content_hash(*parts: Any) -> str:
    """Short stable hash of JSON-serializable parts."""
    data = json.dumps(parts, ensure_ascii=False, sort_keys=True, default=str).encode("utf-8")
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def model_identity(source: str | os.PathLike | None, **settings: Any) -> str | None:
    """Identity of a model plus the settings that change its outputs.

    A local directory (or file) is identified by its resolved path and the name, size and mtime of
    every file in it (weights rewritten in place -> new identity); a string that is not on disk (an HF
    id) by itself. None stays None (no caching).
    """
    if source is None:
        return None
    path = Path(source)
    if path.exists():
        path = path.resolve()
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                     if p.is_file() and p.name not in _IGNORED
                                                     and not any(part.startswith(".") for part in p.relative_to(path).parts))
        stats = [(str(p.relative_to(path)) if p != path else p.name, p.stat().st_size, p.stat().st_mtime_ns)
                 for p in files]
        ident = f"{path}@{content_hash(stats)}"
    else:
        ident = str(source)
    return f"{ident}#{content_hash(settings)}" if settings else ident


def _check_key(validate):
    def check(rec: dict) -> None:
        if not isinstance(rec["key"], str):
            raise ValueError(f"key must be a string, got {rec['key']!r:.60}")
        if validate is not None:
            validate(rec)
    return check


def score_field(rec: dict) -> None:
    """``score``: a number or null (over the input budget)."""
    v = rec["score"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ValueError(f"score must be a number or null, got {v!r:.60}")


def ranking_field(rec: dict) -> None:
    """``top10``: a list of step ids (strings)."""
    v = rec["top10"]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"top10 must be a list of step ids, got {v!r:.60}")


class ResultCache:
    """Append-only, crash-safe cache of per-sample results (records carry their ``key``)."""

    def __init__(self, path: str | os.PathLike, fresh: bool = False, required: tuple[str, ...] = (),
                 validate: Callable[[dict], None] | None = None):
        self.path = Path(path)
        if fresh and self.path.exists():
            self.path.unlink()
        try:
            self._writer = ResumableJsonlWriter(self.path, key="key", on_duplicate="skip")
            self._records = {rec["key"]: rec for rec in read_jsonl(self.path, required=("key", *required),
                                                                   validate=_check_key(validate))}
        except RecordError as err:
            raise RecordError(err.path, err.line, f"{err.reason} (a corrupt result cache: delete {self.path} "
                                                  "or rerun with --resume false)") from None
        self.hits = 0
        self.writes = 0

    @staticmethod
    def key(model: str, sample_id: str, *inputs: Any) -> str:
        return f"{model}|{sample_id}|{content_hash(*inputs)}"

    def get(self, key: str) -> dict | None:
        rec = self._records.get(key)
        if rec is not None:
            self.hits += 1
        return rec

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def put(self, record: dict) -> None:
        if self._writer.write(record):
            self.writes += 1
        self._records[record["key"]] = record

    def close(self) -> None:
        self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
