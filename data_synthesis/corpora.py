"""Loaders from real benchmark files into the shared memory schema.

* LoCoMo (Maharana et al., 2024; CC BY-NC 4.0): one episode per conversation, one step per turn.
  Evidence ids are normalized (``"D8:6; D9:17"`` -> two ids, ``"D:11:26"`` -> ``"D11:26"``,
  ``"D30:05"`` -> ``"D30:5"``); adversarial questions (category 5) are excluded by default.
* HotpotQA (Yang et al., 2018; CC BY-SA 4.0): one episode per question, one step per context
  sentence; supporting facts are the evidence.
* TextWorld (MIT, Microsoft): trajectories of generated cooking games with evidence-exact QA, written by
  ``memroute synth textworld`` (:mod:`data_synthesis.textworld_corpus`); one episode per game.
"""

from __future__ import annotations

import json
import random
import re
from importlib import resources
from pathlib import Path

from routers.memory.schema import QA, Episode, LoadStats, Step

LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


def bundled_locomo_path() -> Path:
    """The LoCoMo file shipped inside the package (with its license), so a clean clone runs."""
    return Path(str(resources.files("data_synthesis") / "data" / "locomo" / "locomo10.json"))


def _load_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None


def normalize_locomo_evidence(raw: list[str]) -> tuple[list[str], int]:
    """Split and canonicalize LoCoMo evidence ids; returns (ids, number of ids that needed fixing)."""
    out, fixed = [], 0
    for item in raw:
        found = _EVIDENCE_ID.findall(str(item))
        canon = [f"D{int(a)}:{int(b)}" for a, b in found]
        if canon != [str(item)]:
            fixed += 1
        out.extend(canon)
    seen: set[str] = set()
    return [x for x in out if not (x in seen or seen.add(x))], fixed


def load_locomo(path: str | Path | None = None, include_adversarial: bool = False,
                stats: LoadStats | None = None) -> list[Episode]:
    path = Path(path) if path else bundled_locomo_path()
    data = _load_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of conversations")
    stats = stats if stats is not None else LoadStats()
    episodes = []
    for ci, conv in enumerate(data):
        try:
            sample_id, c = conv["sample_id"], conv["conversation"]
        except (KeyError, TypeError):
            raise ValueError(f"{path}: conversation #{ci} lacks 'sample_id' or 'conversation'") from None
        sessions = sorted((int(k.split("_")[1]), k) for k, v in c.items()
                          if re.fullmatch(r"session_\d+", k) and isinstance(v, list))
        steps: list[Step] = []
        for num, key in sessions:
            when = c.get(f"{key}_date_time")
            for turn in c[key]:
                text = turn.get("text", "")
                if turn.get("blip_caption"):
                    text = f"{text} [shares a photo: {turn['blip_caption']}]".strip()
                steps.append(Step(step_id=turn["dia_id"], index=len(steps), text=text,
                                  speaker=turn.get("speaker"), timestamp=when, session=str(num)))
        ep = Episode(episode_id=str(sample_id), steps=steps, source="locomo",
                     meta={"speakers": [c.get("speaker_a"), c.get("speaker_b")]})
        for qi, q in enumerate(conv.get("qa", [])):
            cat = LOCOMO_CATEGORIES.get(q.get("category"), str(q.get("category")))
            if cat == "adversarial" and not include_adversarial:
                stats.skipped_category += 1
                continue
            evidence, fixed = normalize_locomo_evidence(q.get("evidence") or [])
            stats.normalized_evidence_ids += fixed
            unknown = [e for e in evidence if not ep.has_step(e)]
            if unknown:
                stats.unknown_evidence_ids.extend(f"{sample_id}/{e}" for e in unknown)
                evidence = [e for e in evidence if ep.has_step(e)]
                if not evidence:
                    stats.skipped_unknown_evidence += 1
                    continue
            if not evidence:
                stats.skipped_no_evidence += 1
                continue
            answer = q.get("answer", q.get("adversarial_answer", ""))
            ep.qa.append(QA(qa_id=f"{sample_id}/q{qi}", question=q["question"], answer=str(answer),
                            evidence=evidence, category=cat))
            stats.qa_kept += 1
        stats.episodes += 1
        stats.steps += len(steps)
        episodes.append(ep)
    return episodes


def load_hotpotqa(path: str | Path, stats: LoadStats | None = None) -> list[Episode]:
    data = _load_json(Path(path))
    stats = stats if stats is not None else LoadStats()
    episodes = []
    for qi, item in enumerate(data):
        steps, key_to_id = [], {}
        for title, sentences in item["context"]:
            for si, sent in enumerate(sentences):
                sid = f"{title}#{si}"
                key_to_id[(title, si)] = sid
                steps.append(Step(step_id=sid, index=len(steps), text=sent.strip(), speaker=title))
        ep = Episode(episode_id=str(item.get("_id", qi)), steps=steps, source="hotpotqa")
        evidence = [key_to_id[(t, i)] for t, i in item.get("supporting_facts", []) if (t, i) in key_to_id]
        missing = len(item.get("supporting_facts", [])) - len(evidence)
        if missing:
            stats.unknown_evidence_ids.extend(f"{ep.episode_id}/{t}#{i}" for t, i in item["supporting_facts"]
                                              if (t, i) not in key_to_id)
        if evidence:
            ep.qa.append(QA(qa_id=f"{ep.episode_id}/q0", question=item["question"], answer=str(item["answer"]),
                            evidence=evidence, category=item.get("type", "unknown")))
            stats.qa_kept += 1
        else:
            stats.skipped_no_evidence += 1
        stats.episodes += 1
        stats.steps += len(steps)
        episodes.append(ep)
    return episodes


def split_episodes(episodes: list[Episode], eval_fraction: float = 0.2, seed: int = 0,
                   eval_ids: list[str] | None = None) -> tuple[list[Episode], list[Episode]]:
    """Split by episode (conversation / trajectory), never by question, so no memory leaks across."""
    if eval_ids is not None:
        ids = set(eval_ids)
    else:
        order = sorted(e.episode_id for e in episodes)
        random.Random(seed).shuffle(order)
        n_eval = max(1, round(len(order) * eval_fraction)) if len(order) > 1 else 0
        ids = set(order[:n_eval])
    return [e for e in episodes if e.episode_id not in ids], [e for e in episodes if e.episode_id in ids]


def sample_qa(episode: Episode, cap: int | None, seed: int = 0) -> list[QA]:
    """Up to ``cap`` questions of an episode, drawn at random (seeded, per episode) and kept in file order.

    Taking the first ``cap`` would be biased: LoCoMo lists its questions grouped by category.
    """
    if not cap or cap >= len(episode.qa):
        return list(episode.qa)
    rng = random.Random(f"{seed}:{episode.episode_id}")
    keep = sorted(rng.sample(range(len(episode.qa)), cap))
    return [episode.qa[i] for i in keep]


def load_corpus(name: str, path: str | None = None, **kwargs) -> list[Episode]:
    if name == "locomo":
        return load_locomo(path, **kwargs)
    if name == "hotpotqa":
        if not path:
            raise ValueError("hotpotqa needs a path, e.g. ../shared/data/hotpotqa/hotpotqa_train100.json")
        return load_hotpotqa(path, **kwargs)
    if name == "textworld":
        from data_synthesis.textworld_corpus import load_textworld

        if not path:
            raise ValueError("textworld needs a path: the output_dir of `memroute synth textworld` "
                             "(e.g. outputs/textworld) or its episodes.jsonl")
        return load_textworld(path, **kwargs)
    raise ValueError(f"unknown corpus {name!r}; choose 'locomo', 'hotpotqa' or 'textworld'")
