"""JSONL records: versioned, validated on read (errors name file and line), resumable on write."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


class RecordError(ValueError):
    """A malformed record; the message names the file and the 1-based line."""

    def __init__(self, path: str | os.PathLike, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


def read_jsonl(path: str | os.PathLike, required: Iterable[str] = (),
               validate: Callable[[dict], None] | None = None) -> Iterator[dict]:
    """Yield records; a bad line raises :class:`RecordError` naming file and line.

    A truncated last line (a writer killed mid-record) is also an error here: use
    :func:`repair_truncated_tail` before resuming a writer.
    """
    required = tuple(required)
    with open(path, "rb") as fh:
        for lineno, raw_bytes in enumerate(fh, start=1):
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as err:
                raise RecordError(path, lineno, f"not UTF-8 text (byte {err.start})") from None
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError) as err:  # JSONDecodeError, huge ints, deep nesting
                msg, col = getattr(err, "msg", str(err) or type(err).__name__), getattr(err, "colno", "?")
                raise RecordError(path, lineno, f"invalid JSON ({msg} at column {col})") from None
            if not isinstance(rec, dict):
                raise RecordError(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
            missing = [k for k in required if k not in rec]
            if missing:
                raise RecordError(path, lineno, f"missing field(s) {missing}")
            if validate is not None:
                try:
                    validate(rec)
                except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
                    raise RecordError(path, lineno, str(err) or type(err).__name__) from None
            yield rec


def repair_truncated_tail(path: str | os.PathLike) -> int:
    """Drop a partial last line left by a killed writer. Returns the number of bytes removed."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    cut = data.rfind(b"\n") + 1
    try:  # a complete record that only lacks its newline is kept
        if isinstance(json.loads(data[cut:]), dict):
            with open(path, "ab") as fh:
                fh.write(b"\n")
            return 0
    except (ValueError, RecursionError):
        pass
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    return len(data) - cut


class ResumableJsonlWriter:
    """Append-only writer keyed by a record id: rerunning skips ids already on disk.

    Each record is flushed and fsynced, so a kill loses at most the record being written, which
    :func:`repair_truncated_tail` removes on the next open.
    """

    def __init__(self, path: str | os.PathLike, key: str = "id", on_duplicate: str = "raise"):
        if on_duplicate not in ("raise", "skip"):
            raise ValueError(f"on_duplicate must be 'raise' or 'skip', got {on_duplicate!r}")
        self.path = Path(path)
        self.key = key
        self.on_duplicate = on_duplicate  # "skip" for caches, where the same key may legitimately recur
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired_bytes = repair_truncated_tail(self.path)
        self.done: set[str] = set()
        self._written: set[str] = set()
        if self.path.exists():
            def scalar_key(rec: dict) -> None:
                if isinstance(rec[key], bool) or not isinstance(rec[key], (str, int, float)):
                    raise ValueError(f"{key} must be a string or a number, got {rec[key]!r:.60}")

            for rec in read_jsonl(self.path, required=(key,), validate=scalar_key):
                self.done.add(rec[key])
        self._fh = open(self.path, "a", encoding="utf-8")

    def __contains__(self, key: str) -> bool:
        return key in self.done

    def write(self, record: dict) -> bool:
        """Append ``record``; False when its id was already on disk (a resumed run skips it). An id written
        twice within this run is a caller bug (e.g. a corpus with a duplicate qa_id) and raises."""
        k = record[self.key]
        if k in self._written and self.on_duplicate == "raise":
            raise ValueError(f"{self.path}: {self.key} {k!r} written twice in one run (duplicate input id?)")
        if k in self.done:
            return False
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done.add(k)
        self._written.add(k)
        return True

    def close(self):
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a file so readers see either the old or the new content, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes owner-only files; give what open() would
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class OutputLockedError(RuntimeError):
    """Another process holds the output directory's lock."""


LOCK_FILE = ".memroute.lock"


class OutputLock:
    """An exclusive, non-blocking ``flock`` on ``output_dir/.memroute.lock`` for the life of a run.

    Two runs appending to the same resumable files would each skip only their own ids and write every
    record twice; the second run fails at once instead. The kernel drops the lock when the process dies,
    so a crashed run never leaves a stale lock behind.
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.dir = Path(output_dir)
        self._fh = None

    def acquire(self) -> "OutputLock":
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / LOCK_FILE, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise OutputLockedError(f"{self.dir}: another memroute run (pid {holder}) is writing here; wait for it "
                                    "to finish or choose another output directory") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the descriptor releases the flock
            self._fh = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def unique_ids(validate: Callable[[dict], None] | None = None, key: str = "id") -> Callable[[dict], None]:
    """``validate`` plus: a ``key`` seen earlier in the same file is an error (it would count twice)."""
    seen: set = set()

    def check(rec: dict) -> None:
        if validate is not None:
            validate(rec)
        if rec[key] in seen:
            raise ValueError(f"duplicate {key} {rec[key]!r:.80}")
        seen.add(rec[key])

    return check


def read_records(path: str | os.PathLike, required: Iterable[str], validate: Callable[[dict], None] | None,
                 what: str, limit: int | None = None) -> list[dict]:
    """Every validated record of one JSONL file (the first ``limit``), with a named error for a missing file,
    a directory or a file without records. Call it before loading any model: bad data fails in seconds."""
    out = []
    try:
        for rec in read_jsonl(path, required=required, validate=validate):
            out.append(rec)
            if limit is not None and len(out) >= limit:
                break
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {what} file not found") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a JSONL {what} file") from None
    if not out:
        raise ValueError(f"{path}: no {what}s (empty file)")
    return out
