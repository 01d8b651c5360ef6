"""Reading a TextWorld corpus: ``episodes.jsonl`` as written by ``memroute synth textworld``.

Each line is one ``Episode.to_dict()``; :func:`load_textworld` validates every line (``RecordError`` names
file and line), refuses repeated episode or question ids, and drops evidence ids that are not steps.
"""

from __future__ import annotations

import os
from pathlib import Path

from routers.io import read_jsonl
from routers.memory.schema import SCHEMA_VERSION, Episode, LoadStats

EPISODES_FILE = "episodes.jsonl"


def check_schema_version(rec: dict, newest: int = SCHEMA_VERSION) -> None:
    """``schema_version`` must be an integer no newer than this reader (a string like "1" is an error)."""
    v = rec.get("schema_version", newest)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"schema_version must be an integer, got {v!r:.40}")
    if v > newest:
        raise ValueError(f"schema_version {v} is newer than this reader ({newest})")


def _validate(rec: dict) -> None:
    check_schema_version(rec)
    if not isinstance(rec["steps"], list) or not rec["steps"]:
        raise ValueError("steps must be a non-empty list")
    if not isinstance(rec.get("qa", []), list):
        raise ValueError("qa must be a list")
    Episode.from_dict(rec)  # raises ValueError naming the step / question and field


def _episode_validator():
    """``_validate`` plus ids unique across the file: a repeated episode_id, or a qa_id that another episode
    already used (sample ids are built from qa ids, so a repeat would silently lose a question). Run inside
    ``read_jsonl``, so the error names the real line."""
    episodes: set[str] = set()
    qa_owner: dict[str, str] = {}

    def validate(rec: dict) -> None:
        _validate(rec)
        eid = rec["episode_id"]
        if eid in episodes:
            raise ValueError(f"duplicate episode_id {eid!r}")
        for i, q in enumerate(rec.get("qa", [])):
            if q["qa_id"] in qa_owner:
                raise ValueError(f"qa #{i}: duplicate qa_id {q['qa_id']!r} (already used by episode "
                                 f"{qa_owner[q['qa_id']]!r})")
        episodes.add(eid)
        qa_owner.update((q["qa_id"], eid) for q in rec.get("qa", []))

    return validate


def load_textworld(path: str | os.PathLike, stats: LoadStats | None = None) -> list[Episode]:
    """Episodes from ``DIR/episodes.jsonl`` or a JSONL file; a bad line raises ``RecordError`` (file:line)."""
    path = Path(path)
    if path.is_dir():
        path = path / EPISODES_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (generate it with `memroute synth textworld`)")
    stats = stats if stats is not None else LoadStats()
    episodes = []
    for rec in read_jsonl(path, required=("schema_version", "episode_id", "steps"), validate=_episode_validator()):
        ep = Episode.from_dict(rec)
        kept = []
        for q in ep.qa:
            unknown = [e for e in q.evidence if not ep.has_step(e)]
            if unknown:
                stats.unknown_evidence_ids.extend(f"{ep.episode_id}/{e}" for e in unknown)
                q.evidence = [e for e in q.evidence if ep.has_step(e)]
            if not q.evidence:
                stats.skipped_no_evidence += 1
                continue
            kept.append(q)
        ep.qa = kept
        stats.qa_kept += len(kept)
        stats.episodes += 1
        stats.steps += len(ep.steps)
        episodes.append(ep)
    return episodes
