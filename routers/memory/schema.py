"""The memory substrate every router shares.

An :class:`Episode` is an ordered list of :class:`Step` (a conversation turn, an agent action +
observation, a document sentence). Questions about an episode are :class:`QA` records whose
``evidence`` lists step ids. MemAgent tasks, MESA structures and AutoMem modules are built over the
same episodes, so a corpus loaded once serves every router.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class Step:
    """One unit of memory. ``step_id`` is unique within its episode; ``index`` is its temporal rank."""

    step_id: str
    index: int
    text: str
    speaker: str | None = None
    timestamp: str | None = None
    session: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def render(self) -> str:
        """The text a model reads for this step (speaker, time and id included)."""
        head = f"[{self.step_id}]"
        if self.timestamp:
            head += f" ({self.timestamp})"
        if self.speaker:
            return f"{head} {self.speaker}: {self.text}"
        return f"{head} {self.text}"


@dataclass
class QA:
    qa_id: str
    question: str
    answer: str
    evidence: list[str]
    category: str = "unknown"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    episode_id: str
    steps: list[Step]
    qa: list[QA] = field(default_factory=list)
    source: str = "unknown"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self._by_id = {s.step_id: s for s in self.steps}

    def step(self, step_id: str) -> Step:
        return self._by_id[step_id]

    def has_step(self, step_id: str) -> bool:
        return step_id in self._by_id

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "episode_id": self.episode_id, "source": self.source,
                "meta": self.meta, "steps": [asdict(s) for s in self.steps], "qa": [asdict(q) for q in self.qa]}

    @classmethod
    def from_dict(cls, d: dict) -> "Episode":
        """Inverse of :meth:`to_dict`; a malformed dict raises ValueError naming the step / question and field."""
        _check_episode_dict(d)
        return cls(episode_id=d["episode_id"], source=d.get("source", "unknown"), meta=d.get("meta", {}),
                   steps=[Step(**s) for s in d["steps"]], qa=[QA(**q) for q in d.get("qa", [])])


def _check_item(item, cls, where: str) -> None:
    import dataclasses

    from routers.validation import check_fields

    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object, got {type(item).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    unknown = sorted(set(item) - names, key=str)
    missing = [k for k in required if k not in item]
    if unknown or missing:
        raise ValueError(f"{where}: " + "; ".join(x for x in (f"missing field(s) {missing}" if missing else "",
                                                             f"unknown field(s) {unknown}" if unknown else "") if x))
    check_fields(item, cls, where, what="field")


def _check_episode_dict(d) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"an episode must be an object, got {type(d).__name__}")
    for key, kind in (("episode_id", str), ("steps", list), ("qa", list), ("source", str), ("meta", dict)):
        if (key in d or key in ("episode_id", "steps")) and not isinstance(d.get(key), kind):
            raise ValueError(f"episode field {key!r} must be a {kind.__name__}, got {d.get(key)!r:.60}")
    seen: set[str] = set()
    last_index = None
    for i, s in enumerate(d["steps"]):
        _check_item(s, Step, f"step #{i}")
        if s["step_id"] in seen:
            raise ValueError(f"step #{i}: duplicate step_id {s['step_id']!r}")
        seen.add(s["step_id"])
        # ``index`` is the temporal rank: contexts are ordered by it and windows are taken in list order, so
        # a repeated or decreasing index would silently reorder (or merge) memory
        if last_index is not None and s["index"] <= last_index:
            kind = "duplicate" if s["index"] == last_index else "decreasing"
            raise ValueError(f"step #{i} ({s['step_id']!r}): {kind} index {s['index']} (the previous step has "
                             f"{last_index}); steps must be listed in strictly increasing index order")
        last_index = s["index"]
    qa_ids: set[str] = set()
    for i, q in enumerate(d.get("qa", [])):
        _check_item(q, QA, f"qa #{i}")
        if q["qa_id"] in qa_ids:  # sample ids are built from qa ids: a repeat would silently lose a question
            raise ValueError(f"qa #{i}: duplicate qa_id {q['qa_id']!r}")
        qa_ids.add(q["qa_id"])


@dataclass
class LoadStats:
    """What a loader kept and dropped, so nothing disappears silently."""

    episodes: int = 0
    steps: int = 0
    qa_kept: int = 0
    skipped_no_evidence: int = 0
    skipped_category: int = 0
    skipped_unknown_evidence: int = 0
    normalized_evidence_ids: int = 0
    unknown_evidence_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)
