"""The memory library M_i = {B_k(tau_i)}: build the five structures of an episode (timed, cached on disk,
failures isolated) and access them for a question.

Cache: ``<cache_dir>/<episode_id>/<structure>.json`` (the state, its build time and a fingerprint of the
builder settings + the episode's content) and ``<structure>.<key>.npy`` for array fields (the vector
embeddings). A fingerprint mismatch rebuilds; a failed build is cached too (``ok: false`` + the error), so a
resumed sweep neither retries nor forgets it. A structure that fails to build, or whose access raises, is
logged and left out for that episode / question only.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from routers.io import atomic_write_json
from routers.logs import get_logger
from routers.memory.schema import Episode
from routers.mesa.base import Access
from routers.mesa.sweep_format import STRUCTURES

logger = get_logger(__name__)


def episode_hash(episode: Episode) -> str:
    payload = json.dumps([[s.step_id, s.index, s.text, s.speaker, s.timestamp, s.session] for s in episode.steps],
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


@dataclass
class EpisodeMemory:
    episode: Episode
    states: dict[str, dict] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    build_s: dict[str, float] = field(default_factory=dict)
    cached: dict[str, bool] = field(default_factory=dict)

    def ok(self, name: str) -> bool:
        return name in self.states


def default_structures(encoder="sentence-transformers/all-MiniLM-L6-v2", summary_builder: str = "extractive",
                       graph_extractor: str = "heuristic", backend=None) -> dict:
    from routers.mesa.graph import GraphMemory
    from routers.mesa.raw import RawWindows
    from routers.mesa.summary import SummaryMemory
    from routers.mesa.temporal import TemporalStore
    from routers.mesa.vector import VectorStore

    return {"summary": SummaryMemory(builder=summary_builder, backend=backend), "temporal": TemporalStore(),
            "graph": GraphMemory(extractor=graph_extractor, backend=backend), "vector": VectorStore(encoder=encoder),
            "raw": RawWindows()}


class MemoryLibrary:
    """The five structures (``name -> structure``, canonical names) with an optional on-disk cache."""

    def __init__(self, structures: dict, cache_dir: str | Path | None = None):
        unknown = sorted(set(structures) - set(STRUCTURES))
        if unknown:
            raise ValueError(f"unknown structure name(s) {unknown}; expected {list(STRUCTURES)}")
        self.structures = structures
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.build_calls: Counter = Counter()

    def _paths(self, episode_id: str, name: str) -> tuple[Path, Path]:
        base = self.cache_dir / _safe(episode_id)
        return base / f"{name}.json", base

    def _load(self, episode: Episode, name: str, fp: dict):
        if self.cache_dir is None:
            return None
        path, base = self._paths(episode.episode_id, name)
        if not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            if entry.get("fingerprint") != fp:
                logger.info("%s/%s: builder settings or episode changed; rebuilding", episode.episode_id, name)
                return None
            for key in entry.get("arrays", []):
                entry["state"][key] = np.load(base / f"{name}.{key}.npy")
            return entry
        except (OSError, ValueError, KeyError, TypeError) as err:
            logger.warning("%s: unreadable cache entry (%s); rebuilding", path, err)
            return None

    def _save(self, episode: Episode, name: str, entry: dict) -> None:
        if self.cache_dir is None:
            return
        path, base = self._paths(episode.episode_id, name)
        base.mkdir(parents=True, exist_ok=True)
        state = dict(entry.get("state") or {})
        arrays = [k for k, v in state.items() if isinstance(v, np.ndarray)]
        for key in arrays:
            np.save(base / f"{name}.{key}.npy", state.pop(key))
        atomic_write_json(path, {**entry, "state": state, "arrays": arrays})  # the json last: it marks completion

    def build(self, episode: Episode) -> EpisodeMemory:
        mem = EpisodeMemory(episode)
        ehash = episode_hash(episode)
        for name in STRUCTURES:
            if name not in self.structures:
                mem.failures[name] = "not configured"
                continue
            struct = self.structures[name]
            fp = {"structure": name, "episode": ehash, **struct.fingerprint()}
            entry = self._load(episode, name, fp)
            if entry is None:
                self.build_calls[name] += 1
                t0 = time.perf_counter()
                try:
                    state = struct.build(episode)
                    entry = {"fingerprint": fp, "ok": True, "error": None, "state": state}
                except Exception as err:  # noqa: BLE001 - one structure's failure must not stop the others
                    logger.warning("%s: the %s structure failed to build (%s: %s); it is left out for this "
                                   "episode", episode.episode_id, name, type(err).__name__, err)
                    entry = {"fingerprint": fp, "ok": False, "error": f"{type(err).__name__}: {err}", "state": None}
                entry["build_s"] = round(time.perf_counter() - t0, 4)
                self._save(episode, name, entry)
                mem.cached[name] = False
            else:
                mem.cached[name] = True
            mem.build_s[name] = float(entry.get("build_s", 0.0))
            if entry["ok"]:
                mem.states[name] = entry["state"]
            else:
                mem.failures[name] = entry["error"]
        return mem

    def access(self, mem: EpisodeMemory, question: str) -> dict[str, Access | None]:
        """Each working structure's access for ``question``; None for failed ones (and for an access that
        raises, logged)."""
        out: dict[str, Access | None] = {}
        for name in STRUCTURES:
            if not mem.ok(name):
                out[name] = None
                continue
            try:
                out[name] = self.structures[name].access(mem.states[name], mem.episode, question)
            except Exception as err:  # noqa: BLE001
                logger.warning("%s: the %s access failed for %r (%s: %s)", mem.episode.episode_id, name,
                               question[:60], type(err).__name__, err)
                out[name] = None
        return out
