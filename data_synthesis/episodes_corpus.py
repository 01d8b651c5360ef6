"""Your own data: a corpus of :class:`~routers.memory.schema.Episode` records (``--corpus episodes``).

``corpus_path`` is one of
* a JSONL file (``.jsonl``, ``.ndjson``, or ``.json`` that does not start with ``[``): one episode per line,
  exactly ``Episode.to_dict()``; problems are reported as ``FILE:LINE: ...``;
* a ``.json`` file holding a list of episodes (``FILE:item N: ...``);
* a ``.parquet`` file, or a folder of data files, read with ``datasets.load_dataset`` (``FILE:row N: ...``);
  a folder holding ``episodes.jsonl`` reads that file;
* a Hugging Face Hub dataset id (``owner/name`` or ``owner/name:split``, default split ``train``) when it is
  not a local path and the machine is online (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` unset).

Every record is checked (fields and types, strictly increasing step ``index`` -- it may be left out and then
is the list position --, evidence ids that are steps of the episode, episode and question ids unique in the
corpus), and *every* bad record is reported, not only the first (:func:`scan`; ``memroute validate`` prints
them all). Questions without evidence are valid records but are not used by the routers: the loader drops
and counts them (``LoadStats.skipped_no_evidence``), like the other loaders.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from data_synthesis.textworld_episodes import EPISODES_FILE, check_schema_version
from routers.io import RecordError, read_jsonl
from routers.logs import get_logger
from routers.memory.schema import Episode, LoadStats

logger = get_logger(__name__)

EPISODE_FIELDS = ("schema_version", "episode_id", "source", "meta", "steps", "qa")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
DATASET_SUFFIXES = (".parquet", ".arrow")
MAX_UNREADABLE = 1000  # lines that are not JSON objects before the scan concludes the file is not JSONL
SHOWN_IN_ERROR = 20  # bad records named in a loader error (memroute validate lists all of them)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")
_CHECK_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError)


class EpisodesCorpusError(ValueError):
    """A generic corpus that cannot be read or holds bad records; ``problems`` lists every bad record."""

    def __init__(self, message: str, problems: list["BadRecord"] | None = None):
        super().__init__(message)
        self.problems = problems or []


@dataclass(frozen=True)
class BadRecord:
    source: str  # the file (or Hub id)
    position: str  # "14" (JSONL line), "row 3" (datasets row), "item 3" (JSON list item)
    reason: str  # names the field: "qa #0 ('e1/q0'): field 'evidence': ..."

    def __str__(self) -> str:
        return f"{self.source}:{self.position}: {self.reason}"


@dataclass
class Scan:
    """The episodes of the valid records of a corpus (in order) and every bad record."""

    source: str
    episodes: list[Episode] = field(default_factory=list)
    problems: list[BadRecord] = field(default_factory=list)

    def counts(self) -> dict:
        qa = [q for e in self.episodes for q in e.qa]
        return {"episodes": len(self.episodes), "steps": sum(len(e.steps) for e in self.episodes),
                "questions": len(qa), "questions_with_evidence": sum(bool(q.evidence) for q in qa)}


# -- one record ----------------------------------------------------------------------------------------------
def check_record(rec: dict) -> Episode:
    """The episode of ``rec``; ValueError naming the field when it is not one (a step's missing ``index`` is its
    list position)."""
    if not isinstance(rec, dict):
        raise ValueError(f"expected an episode object, got {type(rec).__name__}")
    unknown = sorted(set(rec) - set(EPISODE_FIELDS), key=str)
    missing = [k for k in ("episode_id", "steps") if k not in rec]
    if unknown or missing:
        raise ValueError("; ".join(x for x in (f"missing field(s) {missing}" if missing else "",
                                               f"unknown field(s) {unknown} (an episode has {list(EPISODE_FIELDS)})"
                                               if unknown else "") if x))
    check_schema_version(rec)
    if not isinstance(rec["steps"], list) or not rec["steps"]:
        raise ValueError(f"field 'steps' must be a non-empty list, got {rec['steps']!r:.60}")
    for i, step in enumerate(rec["steps"]):
        if isinstance(step, dict) and "index" not in step:
            step["index"] = i  # the temporal rank defaults to the list position
    ep = Episode.from_dict(rec)  # names the step / question and field
    for i, q in enumerate(ep.qa):
        unknown_ids = [e for e in q.evidence if not ep.has_step(e)]
        if unknown_ids:
            raise ValueError(f"qa #{i} ({q.qa_id!r}): field 'evidence': {unknown_ids[:5]} "
                             f"{'is not a step id' if len(unknown_ids) == 1 else 'are not step ids'} of the episode")
    return ep


def _record_checker():
    """``check_record`` plus episode and question ids unique across the corpus (sample ids are built from them,
    so a repeat would silently lose data): returns (episode, None) or (None, reason)."""
    episodes: dict[str, str] = {}  # episode_id -> where it was first seen
    qa_owner: dict[str, str] = {}

    def check(rec, position: str) -> tuple[Episode | None, str | None]:
        try:
            ep = check_record(rec)
        except _CHECK_ERRORS as err:
            return None, str(err) or type(err).__name__
        if ep.episode_id in episodes:
            return None, f"duplicate episode_id {ep.episode_id!r} (also at {episodes[ep.episode_id]})"
        for i, q in enumerate(ep.qa):
            if q.qa_id in qa_owner:
                return None, f"qa #{i}: duplicate qa_id {q.qa_id!r} (already used by episode {qa_owner[q.qa_id]!r})"
        episodes[ep.episode_id] = f"line {position}" if position.isdigit() else position
        qa_owner.update((q.qa_id, ep.episode_id) for q in ep.qa)
        return ep, None

    return check


# -- sources -------------------------------------------------------------------------------------------------
def _record_lines(path: Path) -> tuple[list[int], list[int]]:
    """The numbers (1-based) of the lines ``read_jsonl`` reads rather than skips as blank, and where each ends."""
    numbers, ends, pos = [], [], 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            pos += len(raw)
            try:
                blank = not raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                blank = False
            if not blank:
                numbers.append(lineno)
                ends.append(pos)
    return numbers, ends


def _jsonl_rows(path: Path) -> Iterator[tuple[str, object, str | None]]:
    """(line, record, None) per JSON object and (line, None, reason) per unreadable line, through ``read_jsonl``.

    ``read_jsonl`` stops at the first line that is not a JSON object; the scan then goes on with a temporary
    copy whose lines up to that one are blanked (``read_jsonl`` skips blank lines and keeps the numbering)."""
    numbers, ends = _record_lines(path)
    src, tmp, blanked, unreadable, k = path, None, 0, 0, 0
    try:
        while True:
            try:
                for rec in read_jsonl(src):
                    yield str(numbers[k]), rec, None
                    k += 1
                return
            except RecordError as err:
                yield str(err.line), None, err.reason
                unreadable += 1
                if unreadable >= MAX_UNREADABLE:
                    yield str(err.line), None, (f"stopped after {MAX_UNREADABLE} lines that are not JSON objects: "
                                                "is this a JSONL file of episodes?")
                    return
                k = bisect.bisect_left(numbers, err.line) + 1
                if tmp is None:
                    fd, tmp = tempfile.mkstemp(prefix=".memroute-scan-", suffix=".jsonl")
                    os.close(fd)
                    shutil.copyfile(path, tmp)
                    src = tmp
                end = ends[k - 1]
                with open(tmp, "r+b") as fh:  # blank [blanked, end): same length, newlines kept
                    fh.seek(blanked)
                    chunk = fh.read(end - blanked)
                    fh.seek(blanked)
                    fh.write(re.sub(rb"[^\n]", b" ", chunk))
                blanked = end
    finally:
        if tmp is not None:
            os.unlink(tmp)


def _json_list_rows(path: Path, data: list) -> Iterator[tuple[str, object, str | None]]:
    for i, rec in enumerate(data):
        yield f"item {i}", rec, None


def _drop_nulls(rec):
    """Rows read through Arrow carry null for every absent optional field: drop those that have defaults."""
    if not isinstance(rec, dict):
        return rec
    out = {k: v for k, v in rec.items() if not (v is None and k in ("schema_version", "source", "meta", "qa"))}
    for key, optional in (("steps", ("index", "meta")), ("qa", ("category", "meta"))):
        if isinstance(out.get(key), list):
            out[key] = [{k: v for k, v in s.items() if not (v is None and k in optional)} if isinstance(s, dict) else s
                        for s in out[key]]
    return out


def _offline() -> bool:
    return any(os.environ.get(k, "").lower() not in ("", "0", "false", "no")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _dataset_rows(spec: str, local: bool) -> Iterator[tuple[str, object, str | None]]:
    import datasets

    try:
        if not local:
            name, _, split = spec.partition(":")
            ds = datasets.load_dataset(name, split=split or "train")
        elif Path(spec).is_dir():
            ds = datasets.load_dataset(spec, split="train")
        else:
            kind = Path(spec).suffix.lstrip(".")
            ds = datasets.load_dataset(kind, data_files=spec, split="train")
    except Exception as err:  # noqa: BLE001 - not found, no connection, corrupt file: one named error
        raise EpisodesCorpusError(f"{spec}: cannot be read with datasets.load_dataset ({type(err).__name__}: "
                                  f"{' '.join(str(err).split())[:300]})") from None
    for i, row in enumerate(ds):
        yield f"row {i}", _drop_nulls(row), None


def _rows(spec: str) -> tuple[str, Iterator[tuple[str, object, str | None]]]:
    """(source name, rows) for a path or Hub id; local paths are resolved first."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / EPISODES_FILE).is_file():
            return str(path / EPISODES_FILE), _jsonl_rows(path / EPISODES_FILE)
        return str(path), _dataset_rows(str(path), local=True)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in DATASET_SUFFIXES:
            return str(path), _dataset_rows(str(path), local=True)
        if suffix == ".json":
            with open(path, "rb") as fh:
                head = fh.read(4096).lstrip()
            if head.startswith(b"["):
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (ValueError, UnicodeDecodeError, RecursionError) as err:
                    raise EpisodesCorpusError(f"{path}: not a JSON list of episodes ({type(err).__name__}: "
                                              f"{str(err)[:160]})") from None
                return str(path), _json_list_rows(path, data)
        return str(path), _jsonl_rows(path)
    if path.suffix.lower() in (*JSONL_SUFFIXES, ".json", *DATASET_SUFFIXES) or not _HUB_ID.match(spec):
        raise FileNotFoundError(f"{spec}: corpus file not found")
    if _offline():
        raise EpisodesCorpusError(f"{spec}: no such local file or folder, and it cannot be fetched as a Hugging Face "
                                  "Hub dataset id while offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set); "
                                  "download it first, or give a local path")
    return f"hub:{spec}", _dataset_rows(spec, local=False)


# -- the corpus ----------------------------------------------------------------------------------------------
def scan(spec: str | os.PathLike) -> Scan:
    """Read and check every record of a corpus; never stops at a bad record."""
    if spec is None or not str(spec).strip():
        raise ValueError("corpus 'episodes' needs corpus_path: an Episode JSONL file, a .json list, a .parquet "
                         "file or a Hub dataset id")
    source, rows = _rows(str(spec))
    out = Scan(source)
    check = _record_checker()
    for position, rec, reason in rows:
        ep, reason = (None, reason) if reason else check(rec, position)
        if reason:
            out.problems.append(BadRecord(source, position, reason))
        else:
            out.episodes.append(ep)
    return out


def load_episodes(spec: str | os.PathLike, stats: LoadStats | None = None) -> list[Episode]:
    """The episodes of a generic corpus; any bad record raises :class:`EpisodesCorpusError` naming them."""
    result = scan(spec)
    if result.problems:
        n, shown = len(result.problems), result.problems[:SHOWN_IN_ERROR]
        more = f"\n  ... and {n - len(shown)} more" if n > len(shown) else ""
        raise EpisodesCorpusError(
            f"{result.source}: {n} bad record(s) (`memroute validate {spec}` lists every one):\n  "
            + "\n  ".join(map(str, shown)) + more, result.problems)
    stats = stats if stats is not None else LoadStats()
    episodes = []
    for ep in result.episodes:
        kept = [q for q in ep.qa if q.evidence]
        stats.skipped_no_evidence += len(ep.qa) - len(kept)
        ep.qa = kept
        stats.qa_kept += len(kept)
        stats.episodes += 1
        stats.steps += len(ep.steps)
        episodes.append(ep)
    logger.info("%s: %d episodes, %d steps, %d questions with evidence (%d without, not used)", result.source,
                stats.episodes, stats.steps, stats.qa_kept, stats.skipped_no_evidence)
    return episodes
