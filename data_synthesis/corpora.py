"""Loaders from real benchmark files into the shared memory schema.

* LoCoMo (Maharana et al., 2024; CC BY-NC 4.0): one episode per conversation, one step per turn.
  Evidence ids are normalized (``"D8:6; D9:17"`` -> two ids, ``"D:11:26"`` -> ``"D11:26"``,
  ``"D30:05"`` -> ``"D30:5"``); adversarial questions (category 5) are excluded by default.
* HotpotQA (Yang et al., 2018; CC BY-SA 4.0): one episode per question, one step per context
  sentence; supporting facts are the evidence.
* TextWorld (MIT, Microsoft): trajectories of generated cooking games with evidence-exact QA, written by
  ``memroute synth textworld`` (:mod:`data_synthesis.textworld_corpus`); one episode per game.
* tau-bench (MIT, Sierra): tool-calling airline trajectories with evidence-exact questions from their tool
  results (:mod:`data_synthesis.taubench`); one episode per trajectory, split by task.
* Your own data (``episodes``): Episode records as JSONL, a JSON list, parquet or a Hub dataset id, every bad
  record reported (:mod:`data_synthesis.episodes_corpus`; ``memroute validate FILE`` checks a file).
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


class CorpusError(ValueError):
    """A malformed corpus file; the message names the file and the item (conversation, turn, question)."""


def _load_json(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # bad bytes, huge ints, deep nesting
        raise CorpusError(f"{path}: unreadable JSON ({type(err).__name__}: {str(err)[:120]})") from None


def _text(value, where: str, path, optional: bool = False) -> str | None:
    """A string field (numbers are accepted as their text); None only when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise CorpusError(f"{path}: {where} must be a string, got {type(value).__name__}")


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


def _locomo_steps(c: dict, where: str, path) -> list[Step]:
    sessions = sorted((int(k.split("_")[1]), k) for k, v in c.items()
                      if isinstance(k, str) and re.fullmatch(r"session_\d+", k) and isinstance(v, list))
    steps: list[Step] = []
    seen: set[str] = set()
    for num, key in sessions:
        when = _text(c.get(f"{key}_date_time"), f"{where} {key}_date_time", path, optional=True)
        for ti, turn in enumerate(c[key]):
            at = f"{where} {key} turn #{ti}"
            if not isinstance(turn, dict):
                raise CorpusError(f"{path}: {at} must be an object, got {type(turn).__name__}")
            if "dia_id" not in turn:
                raise CorpusError(f"{path}: {at} lacks 'dia_id'")
            dia_id = _text(turn["dia_id"], f"{at} dia_id", path)
            if dia_id in seen:
                raise CorpusError(f"{path}: {at}: duplicate dia_id {dia_id!r}")
            seen.add(dia_id)
            text = _text(turn.get("text", ""), f"{at} text", path, optional=True) or ""
            caption = _text(turn.get("blip_caption"), f"{at} blip_caption", path, optional=True)
            if caption:
                text = f"{text} [shares a photo: {caption}]".strip()
            steps.append(Step(step_id=dia_id, index=len(steps), text=text,
                              speaker=_text(turn.get("speaker"), f"{at} speaker", path, optional=True),
                              timestamp=when, session=str(num)))
    return steps


def load_locomo(path: str | Path | None = None, include_adversarial: bool = False,
                stats: LoadStats | None = None) -> list[Episode]:
    path = Path(path) if path else bundled_locomo_path()
    data = _load_json(path)
    if not isinstance(data, list):
        raise CorpusError(f"{path}: expected a list of conversations")
    stats = stats if stats is not None else LoadStats()
    episodes = []
    seen_ids: dict[str, int] = {}
    for ci, conv in enumerate(data):
        if not isinstance(conv, dict) or "sample_id" not in conv or not isinstance(conv.get("conversation"), dict):
            raise CorpusError(f"{path}: conversation #{ci} lacks 'sample_id' or 'conversation' (an object)")
        sample_id = _text(conv["sample_id"], f"conversation #{ci} sample_id", path)
        where = f"conversation #{ci} ({sample_id})"
        if sample_id in seen_ids:  # qa ids are "<sample_id>/q<i>": a repeat would silently lose questions
            raise CorpusError(f"{path}: {where}: duplicate sample_id {sample_id!r} (also conversation "
                              f"#{seen_ids[sample_id]})")
        seen_ids[sample_id] = ci
        c = conv["conversation"]
        steps = _locomo_steps(c, where, path)
        speakers = [_text(c.get(k), f"{where} {k}", path, optional=True) for k in ("speaker_a", "speaker_b")]
        ep = Episode(episode_id=sample_id, steps=steps, source="locomo", meta={"speakers": speakers})
        qas = conv.get("qa", [])
        if not isinstance(qas, list):
            raise CorpusError(f"{path}: {where} qa must be a list, got {type(qas).__name__}")
        for qi, q in enumerate(qas):
            at = f"{where} qa #{qi}"
            if not isinstance(q, dict) or "question" not in q:
                raise CorpusError(f"{path}: {at} must be an object with a 'question'")
            question = _text(q["question"], f"{at} question", path)
            raw_cat = q.get("category")
            cat = LOCOMO_CATEGORIES.get(raw_cat, str(raw_cat)) if isinstance(raw_cat, (int, str, type(None))) else str(raw_cat)
            if cat == "adversarial" and not include_adversarial:
                stats.skipped_category += 1
                continue
            raw_ev = q.get("evidence") or []
            if not isinstance(raw_ev, list):
                raise CorpusError(f"{path}: {at} evidence must be a list of ids, got {type(raw_ev).__name__}")
            evidence, fixed = normalize_locomo_evidence(raw_ev)
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
            ep.qa.append(QA(qa_id=f"{sample_id}/q{qi}", question=question, answer=str(answer),
                            evidence=evidence, category=cat))
            stats.qa_kept += 1
        stats.episodes += 1
        stats.steps += len(steps)
        episodes.append(ep)
    return episodes


def _hotpot_context(item: dict, where: str, path) -> list[tuple[str, list]]:
    ctx = item.get("context")
    ok = isinstance(ctx, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], list)
                                       for p in ctx)
    if not ok:
        raise CorpusError(f"{path}: {where} context must be a list of [title, [sentences...]] pairs")
    return [(_text(t, f"{where} context title", path), sents) for t, sents in ctx]


def load_hotpotqa(path: str | Path, stats: LoadStats | None = None) -> list[Episode]:
    data = _load_json(Path(path))
    if not isinstance(data, list):
        raise CorpusError(f"{path}: expected a list of HotpotQA items")
    stats = stats if stats is not None else LoadStats()
    episodes = []
    seen_ids: dict[str, int] = {}
    for qi, item in enumerate(data):
        where = f"item #{qi}"
        if not isinstance(item, dict) or "question" not in item or "answer" not in item:
            raise CorpusError(f"{path}: {where} must be an object with 'question', 'answer' and 'context'")
        steps, key_to_id = [], {}
        for title, sentences in _hotpot_context(item, where, path):
            for si, sent in enumerate(sentences):
                sid = f"{title}#{si}"
                if (title, si) in key_to_id:
                    raise CorpusError(f"{path}: {where}: duplicate context title {title!r}")
                key_to_id[(title, si)] = sid
                steps.append(Step(step_id=sid, index=len(steps), text=_text(sent, f"{where} {sid}", path).strip(),
                                  speaker=title))
        episode_id = _text(item.get("_id", qi), f"{where} _id", path)
        if episode_id in seen_ids:  # the qa id is "<_id>/q0": a repeat would silently lose a question
            raise CorpusError(f"{path}: {where}: duplicate _id {episode_id!r} (also item #{seen_ids[episode_id]})")
        seen_ids[episode_id] = qi
        ep = Episode(episode_id=episode_id, steps=steps, source="hotpotqa")
        facts = item.get("supporting_facts", [])
        if not isinstance(facts, list) or not all(
                isinstance(f, (list, tuple)) and len(f) == 2 and isinstance(f[0], str) and isinstance(f[1], int)
                and not isinstance(f[1], bool) for f in facts):
            raise CorpusError(f"{path}: {where} supporting_facts must be a list of [title, sentence index] pairs")
        facts = [(t, i) for t, i in facts]
        evidence = [key_to_id[(t, i)] for t, i in facts if (t, i) in key_to_id]
        missing = [f"{ep.episode_id}/{t}#{i}" for t, i in facts if (t, i) not in key_to_id]
        if missing:
            stats.unknown_evidence_ids.extend(missing)
        if evidence:
            category = item.get("type", "unknown")
            ep.qa.append(QA(qa_id=f"{ep.episode_id}/q0", question=_text(item["question"], f"{where} question", path),
                            answer=str(item["answer"]), evidence=evidence,
                            category=category if isinstance(category, str) else str(category)))
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
    else:  # episodes sharing meta["split_group"] (tau-bench trials of one task) stay on one side
        group = {e.episode_id: str(e.meta.get("split_group", e.episode_id)) for e in episodes}
        order = sorted(set(group.values()))
        random.Random(seed).shuffle(order)
        n_eval = max(1, round(len(order) * eval_fraction)) if len(order) > 1 else 0
        held = set(order[:n_eval])
        ids = {e for e, g in group.items() if g in held}
    return [e for e in episodes if e.episode_id not in ids], [e for e in episodes if e.episode_id in ids]


DEFAULT_EVAL_FRACTION = 0.2


def held_out_split(episodes: list[Episode], eval_episodes: list[str] | None = None,
                   eval_fraction: float | None = None, seed: int = 0,
                   name: str = "the corpus") -> tuple[list[Episode], list[Episode]]:
    """(train, held-out) episodes: the held-out ones named (``eval_episodes``) or a seeded share of whole episodes
    (``eval_fraction``, default 0.2 when neither is given). Both given, unknown ids or an empty side are errors."""
    if eval_episodes is not None and eval_fraction is not None:
        raise ValueError("give eval_episodes or eval_fraction, not both")
    if eval_episodes is not None:
        known = {e.episode_id for e in episodes}
        unknown = sorted(set(eval_episodes) - known)
        if not eval_episodes or unknown:
            raise ValueError(f"eval_episodes {unknown or '[]'} are not episodes of {name} (it has "
                             f"{sorted(known)[:8]}{' ...' if len(known) > 8 else ''})")
        train, held = split_episodes(episodes, eval_ids=list(eval_episodes))
        how = f"eval_episodes {list(eval_episodes)[:5]}"
    else:
        fraction = DEFAULT_EVAL_FRACTION if eval_fraction is None else eval_fraction
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {fraction}")
        train, held = split_episodes(episodes, fraction, seed)
        how = f"eval_fraction {fraction} of {len(episodes)} episode(s) (an episode is never split)"
    for split, eps in (("train", train), ("held-out", held)):
        if not eps:
            raise ValueError(f"{name}: the {split} split would have no episodes with {how}")
    return train, held


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
        from data_synthesis.textworld_episodes import load_textworld

        if not path:
            raise ValueError("textworld needs a path: the output_dir of `memroute synth textworld` "
                             "(e.g. outputs/textworld) or its episodes.jsonl")
        return load_textworld(path, **kwargs)
    if name == "episodes":
        from data_synthesis.episodes_corpus import load_episodes

        return load_episodes(path, **kwargs)
    if name == "taubench":
        from data_synthesis.taubench import load_taubench

        return load_taubench(path, **kwargs)
    raise ValueError(f"unknown corpus {name!r}; choose 'locomo', 'hotpotqa', 'textworld', 'taubench' or 'episodes'")
