"""MemAgent supervision from forced-exploration records (paper Figure 4, Tables 8-9; DESIGN §6).

Three signals, one per decision phase, then reward filtering into TRL prompt-completion files:

* **Begin**: task correctness per Begin option (success rate over the In policies, errored rollouts left
  out) plus LLM-judge attribution of the injected memory: ``utilization`` 0.6, ``relevance`` 0.4 (Table 8).
  ``reward = w * outcome + (1 - w) * judge`` for a provider (``w = begin_outcome_weight``); ``None`` (no
  memory) has nothing to attribute, so its reward is its outcome. Per task the best *solving* option (reward, then
  fewer steps up to ``begin_step_tolerance``, fewer injected tokens, None first) is the label if >= ``begin_min_reward``.
* **In**: the judge scores Query steps (rollouts with In policy ``inject``): ``helpfulness`` 0.4,
  ``progress`` 0.4, ``noise`` 0.2 inverted; and NoOp steps (``never``): ``appropriateness`` 0.5,
  ``missed_opportunity`` 0.5 inverted (Table 8 lists appropriateness 0.5; DESIGN §6 names missed
  opportunity as the inverted second dimension). Only steps where the short-term memory had content are
  decisions. ``reward = w * outcome + (1 - w) * judge`` (``w = in_outcome_weight``, default 0: judge only).
* **End**: downstream reuse. Storing task t's trajectory into provider p was good when later training
  rollouts that retrieved p's items written from t succeeded (``reuse >= end_min_reuse``). Providers whose
  t-items were never retrieved carry no evidence: they are labelled "do not store" (no benefit) and a task
  with no retrieved item at all yields no End record. ``reward`` = mean agreement of the label with the
  evidence over the providers that were retrieved.

Scores are 0-5 integers; inverted dimensions become ``1 - s/5`` before the weighted sum (Table 8). A judge
reply that does not parse (or a judge error) is counted, and that decision falls back to its outcome-only
reward. Judgments are cached in ``judgments.jsonl`` (resumable; errors are not cached, so a rerun retries).
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from routers.memagent import prompts as P
from routers.memagent.protocol import Preview, Trajectory
from routers.memagent.rollout import FORMAT, SCHEMA_VERSION
from routers.backends import form_reply
from routers.logs import get_logger

log = get_logger(__name__)
S_MAX = 5
# phase -> dimension -> (weight, inverted)   (paper Table 8)
WEIGHTS: dict[str, dict[str, tuple[float, bool]]] = {
    "begin": {"utilization": (0.6, False), "relevance": (0.4, False)},
    "query": {"helpfulness": (0.4, False), "progress": (0.4, False), "noise": (0.2, True)},
    "noop": {"appropriateness": (0.5, False), "missed_opportunity": (0.5, True)},
}
# Table 8 questions and Table 9 anchors (0 / 2-3 / 5); progress has no anchor row in Table 9.
RUBRIC: dict[str, dict[str, tuple[str, str, str, str]]] = {
    "begin": {
        "utilization": ("Did the task agent reference or use information from the retrieved memory in its "
                        "subsequent actions?", "memory completely ignored", "some overlap, likely coincidental",
                        "agent directly built upon specific memory content"),
        "relevance": ("How relevant was the retrieved memory to the specific task?", "completely irrelevant domain",
                      "somewhat related, not specifically useful", "perfectly targeted, critical information"),
    },
    "query": {
        "helpfulness": ("Did the agent use information from the injected short-term memory?",
                        "no reference to injected content", "minor overlap, uncertain attribution",
                        "agent directly leveraged specific injected details"),
        "progress": ("Did the injection help advance the task?", "no progress after the injection",
                     "some progress, unclear whether due to the injection", "the injection directly enabled progress"),
        "noise": ("Did the injection distract or confuse the agent?", "no distraction",
                  "some off-topic exploration triggered", "agent clearly confused, pursued wrong direction"),
    },
    "noop": {
        "appropriateness": ("Was skipping retrieval a reasonable choice given the current state?",
                            "short-term memory had highly relevant content that should have been retrieved",
                            "borderline; short-term memory has marginal content",
                            "short-term memory empty or clearly irrelevant; skipping was optimal"),
        "missed_opportunity": ("Did skipping miss valuable information?", "nothing valuable missed",
                               "missed non-critical information",
                               "missed critical information; retrieval would have been a breakthrough"),
    },
}
LABELS = {"utilization": "Utilization", "relevance": "Relevance", "helpfulness": "Helpfulness",
          "progress": "Progress", "noise": "Noise", "appropriateness": "Appropriateness",
          "missed_opportunity": "Missed Opportunity"}
_ALIASES = {"missed_opportunity": ("missed opportunity", "missed opp", "missed_opportunity", "missed")}
JUDGE_SYSTEM = ("You are a strict evaluator of how an agent used memory. Score each dimension with an integer "
                "from 0 to 5 following the rubric. Reply only with the scores in the requested format.")


# -- scores ----------------------------------------------------------------------------------------------
def aggregate(kind: str, scores: Mapping[str, int]) -> float:
    """Weighted 0-1 score of one judgment: ``sum w * s/5`` (inverted dimensions: ``1 - s/5``)."""
    dims = WEIGHTS[kind]
    missing = [d for d in dims if d not in scores]
    if missing:
        raise ValueError(f"{kind} judgment lacks {missing}")
    total = 0.0
    for dim, (w, inverted) in dims.items():
        s = int(scores[dim])
        if not 0 <= s <= S_MAX:
            raise ValueError(f"{dim} score {s} outside 0..{S_MAX}")
        total += w * ((1.0 - s / S_MAX) if inverted else s / S_MAX)
    return total


def parse_scores(text: str, kind: str) -> dict[str, int] | None:
    """0-5 integers per dimension from a judge reply, or None when it cannot be read unambiguously.

    Accepts ``Utilization: 4``, ``**Relevance** - 3/5``, ``utilization=4`` in any order and case; failing
    that, a reply with exactly one standalone 0-5 integer per dimension (in rubric order). Out-of-range
    numbers (``7``, ``4/10``) make the reply unparsable rather than clipped.
    """
    text = text or ""
    out: dict[str, int] = {}
    for dim in WEIGHTS[kind]:
        names = _ALIASES.get(dim, (LABELS[dim].lower(),))
        for name in names:
            pat = re.escape(name).replace(r"\ ", r"[\s_-]*")
            m = re.search(rf"{pat}\W{{0,6}}?(\d+)(\s*/\s*(\d+))?", text, re.IGNORECASE)
            if m:
                value, denom = int(m.group(1)), m.group(3)
                if value > S_MAX or (denom is not None and int(denom) != S_MAX):
                    return None
                out[dim] = value
                break
    if len(out) == len(WEIGHTS[kind]):
        return out
    nums = re.findall(r"(?<![\d.])(\d+)(?![\d.])", text)
    if len(nums) == len(WEIGHTS[kind]) and all(int(n) <= S_MAX for n in nums):
        return dict(zip(WEIGHTS[kind], (int(n) for n in nums)))
    return None


# -- judge prompts -----------------------------------------------------------------------------------------
def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def _rubric(kind: str) -> str:
    lines = []
    for dim, (question, low, mid, high) in RUBRIC[kind].items():
        lines.append(f"- {LABELS[dim]}: {question} 0 = {low}; 2-3 = {mid}; 5 = {high}.")
    fmt = "\n".join(f"{LABELS[d]}: <0-5>" for d in WEIGHTS[kind])
    return "Rubric:\n" + "\n".join(lines) + f"\n\nReply exactly in this format:\n{fmt}"


def _steps_text(steps: Sequence[dict], obs_chars: int = 160) -> str:
    return "\n".join(f"Step {s['index']}: > {s['action']} | {_clip(s['observation'], obs_chars)}" for s in steps) \
        or "(no steps)"


def begin_judge_messages(goal: str, memory: str, trajectory: Mapping[str, Any], max_steps: int = 12) -> list[dict]:
    steps = trajectory["steps"]
    shown = steps if len(steps) <= max_steps else steps[: max_steps // 2] + steps[-(max_steps - max_steps // 2):]
    user = (f"Task: {goal}\n\nMemory retrieved at the start and injected into the agent's prompt:\n"
            f"{_clip(memory, 1500)}\n\nWhat the agent did:\n{_steps_text(shown)}\n"
            f"Outcome: {'success' if trajectory['success'] else 'failure'}\n\n{_rubric('begin')}")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def in_judge_messages(goal: str, step: Mapping[str, Any], following: Sequence[dict], query: bool,
                      success: bool) -> list[dict]:
    stm = _clip(step["meta"].get("stm", ""), 1200)
    if query:
        head = f"At step {step['index']} this short-term memory summary was injected into the agent's context:\n{stm}"
    else:
        head = (f"At step {step['index']} the short-term memory summary was NOT injected (NoOp). "
                f"It held:\n{stm}")
    user = (f"Task: {goal}\n\n{head}\n\nThe agent's next actions:\n{_steps_text(following)}\n"
            f"Final outcome: {'success' if success else 'failure'}\n\n{_rubric('query' if query else 'noop')}")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


# -- judging -------------------------------------------------------------------------------------------------
@dataclass
class JudgeRequest:
    id: str
    kind: str            # begin | query | noop
    rollout_id: str
    step: int | None
    messages: list[dict]


def pick_steps(steps: Sequence[dict], k: int) -> list[dict]:
    """Up to ``k`` In decisions of a rollout, evenly spaced over the steps whose short-term memory had content."""
    cand = [s for s in steps if (s.get("meta") or {}).get("stm", "").strip()]
    if k <= 0 or not cand:
        return []
    if len(cand) <= k:
        return cand
    if k == 1:
        return [cand[len(cand) // 2]]
    return [cand[round(i * (len(cand) - 1) / (k - 1))] for i in range(k)]


def judge_requests(rollouts: Sequence[dict], judge_steps: int = 2, window: int = 3) -> list[JudgeRequest]:
    """Everything to judge: one Begin judgment per (task, provider) and a few In decisions per rollout."""
    reqs: list[JudgeRequest] = []
    begin_done: set[tuple[str, str]] = set()
    ordered = sorted(rollouts, key=lambda r: (r["task_id"], r["in_policy"] != "never", r["id"]))
    for r in ordered:
        if r.get("error"):
            continue
        traj = r["trajectory"]
        goal = traj["task"]["goal"]
        p = r["begin_provider"]
        if p is not None and traj.get("begin_memory", "").strip() and (r["task_id"], p) not in begin_done:
            begin_done.add((r["task_id"], p))  # the NoOp rollout first: it isolates the Begin memory's effect
            reqs.append(JudgeRequest(f"begin|{r['id']}", "begin", r["id"], None,
                                     begin_judge_messages(goal, traj["begin_memory"], traj)))
        query = r["in_policy"] == "inject"
        steps = traj["steps"]
        for s in pick_steps(steps, judge_steps):
            pos = steps.index(s)
            following = steps[pos: pos + window]
            kind = "query" if query else "noop"
            reqs.append(JudgeRequest(f"{kind}|{r['id']}|{s['index']}", kind, r["id"], s["index"],
                                     in_judge_messages(goal, s, following, query, bool(r["success"]))))
    return reqs


def _judge_replies(judge, chunk: Sequence[JudgeRequest], max_new_tokens: int, constrained: bool) -> list[str]:
    """Free generation, or (``constrained`` and the backend has ``fill_form``) a forced ``Label: 0-5`` form.

    Requests of one chunk may mix kinds (different dimensions), so forms are filled per kind.
    """
    if not (constrained and hasattr(judge, "fill_form")):
        return judge.generate([r.messages for r in chunk], max_new_tokens)
    replies: list[str | None] = [None] * len(chunk)
    for kind in dict.fromkeys(r.kind for r in chunk):
        idx = [i for i, r in enumerate(chunk) if r.kind == kind]
        fields = [LABELS[d] for d in WEIGHTS[kind]]
        forms = judge.fill_form([chunk[i].messages for i in idx], fields, [str(v) for v in range(S_MAX + 1)])
        if len(forms) != len(idx):
            raise RuntimeError(f"judge filled {len(forms)} forms for {len(idx)} prompts")
        for i, form in zip(idx, forms):
            replies[i] = form_reply(fields, form)
    return replies


def run_judge(requests: Sequence[JudgeRequest], judge, path: str | Path, batch_size: int = 8,
              max_new_tokens: int = 32, progress: bool = True,
              constrained: bool = True) -> tuple[dict[str, dict], Counter]:
    """Judge what ``path`` does not hold yet; returns ({request id: judgment record}, counts).

    ``constrained`` forces the reply format when the backend supports it (``fill_form``: local models
    by restricted arg-max, HTTP servers by a JSON-schema response format), so every reply parses.
    A backend exception for a batch is counted (``judge_errors``) and not cached, so a rerun retries it.
    """
    from tqdm.auto import tqdm

    from routers.io import ResumableJsonlWriter, read_jsonl

    counts: Counter = Counter()
    with ResumableJsonlWriter(path) as writer:
        todo = [r for r in requests if r.id not in writer] if judge is not None else []
        bar = tqdm(total=len(todo), desc="judge", unit="call", disable=not progress or not todo, file=sys.stderr)
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            try:
                replies = _judge_replies(judge, chunk, max_new_tokens, constrained)
                if len(replies) != len(chunk):
                    raise RuntimeError(f"judge returned {len(replies)} replies for {len(chunk)} prompts")
            except Exception as err:  # noqa: BLE001 - counted, falls back to outcome-only labels
                counts["judge_errors"] += len(chunk)
                log.warning("judge error (%s: %s); outcome-only labels for %d decisions", type(err).__name__, err,
                            len(chunk))
                bar.update(len(chunk))
                continue
            for req, reply in zip(chunk, replies):
                scores = parse_scores(reply, req.kind)
                writer.write({"id": req.id, "kind": req.kind, "rollout_id": req.rollout_id, "step": req.step,
                              "judge": getattr(judge, "name", type(judge).__name__), "reply": reply,
                              "scores": scores, "score": aggregate(req.kind, scores) if scores else None})
            bar.update(len(chunk))
        bar.close()
    wanted = {r.id for r in requests}
    cache = {rec["id"]: rec for rec in read_jsonl(path, required=("id", "kind", "scores"))} if Path(path).exists() else {}
    out = {k: v for k, v in cache.items() if k in wanted}
    counts["judged"] = sum(1 for v in out.values() if v["scores"] is not None)
    counts["judge_unparsable"] = sum(1 for v in out.values() if v["scores"] is None)
    counts["judge_missing"] = len(wanted) - len(out)
    return out, counts


# -- labels --------------------------------------------------------------------------------------------------
def _turn(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _mix(outcome: float, judge: float | None, w: float) -> tuple[float, str]:
    if judge is None:
        return outcome, "outcome"
    return w * outcome + (1.0 - w) * judge, "outcome+judge"


def group_by_task(rollouts: Iterable[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rollouts:
        out[r["task_id"]].append(r)
    return out


def begin_labels(tasks: Sequence[dict], rollouts: Sequence[dict], providers: Mapping[str, Any],
                 judgments: Mapping[str, dict], outcome_weight: float = 0.5, min_reward: float = 0.5,
                 counts: Counter | None = None, step_tolerance: float = 0.0) -> list[dict]:
    """One Begin record per task (module docstring). ``step_tolerance``: when a dozen providers solve a task, a
    one-step difference is noise that would scatter the labels over arbitrary providers."""
    counts = counts if counts is not None else Counter()
    by_task = group_by_task(rollouts)
    options: list[str | None] = [None, *providers]
    out = []
    for t in tasks:
        rs = [r for r in by_task.get(t["task_id"], []) if not r.get("error")]
        scored = []
        for order, opt in enumerate(options):
            mine = [r for r in rs if r["begin_provider"] == opt]
            if not mine:
                continue
            outcome = sum(bool(r["success"]) for r in mine) / len(mine)
            j = None
            if opt is not None:
                for r in sorted(mine, key=lambda r: r["in_policy"] != "never"):
                    rec = judgments.get(f"begin|{r['id']}")
                    if rec is not None:
                        j = rec.get("score")
                        break
            reward, source = _mix(outcome, j, outcome_weight) if opt is not None else (outcome, "outcome")
            steps = sum(r["steps"] for r in mine) / len(mine)
            tokens = sum(r.get("injected_tokens", 0) for r in mine) / len(mine)
            scored.append((reward, -steps, -tokens, -order, opt, outcome, j, source))
        solving = [s for s in scored if s[5] > 0]
        if not solving:
            counts["begin_unsolved_tasks"] += 1
            continue
        top = max(s[0] for s in solving)
        fewest = min(-s[1] for s in solving if s[0] == top)
        near = [s for s in solving if s[0] == top and -s[1] <= fewest + step_tolerance]
        reward, _, _, _, opt, outcome, j, source = max(near, key=lambda s: (s[2], s[3]))
        if reward < min_reward:
            counts["begin_below_min_reward"] += 1
            continue
        previews = [Preview(**p) for p in t["previews"]]
        out.append({"id": t["task_id"], "phase": "begin", "task_id": t["task_id"], "reward": round(reward, 6),
                    "prompt": P.begin_messages(t["goal"], previews, providers),
                    "completion": _turn(P.begin_completion(opt)), "decision": opt, "outcome": outcome,
                    "judge_score": j, "label_source": source,
                    "options": {("None" if s[4] is None else s[4]): {"reward": round(s[0], 6), "outcome": s[5],
                                                                       "judge_score": s[6]} for s in scored}})
    return out


def in_labels(rollouts: Sequence[dict], judgments: Mapping[str, dict], judge_steps: int = 2,
              outcome_weight: float = 0.0, min_reward: float = 0.5, counts: Counter | None = None) -> list[dict]:
    """In records: judged Query / NoOp decisions whose reward reaches ``min_reward``."""
    counts = counts if counts is not None else Counter()
    out = []
    for r in sorted(rollouts, key=lambda r: r["id"]):
        if r.get("error"):
            continue
        traj = r["trajectory"]
        query = r["in_policy"] == "inject"
        kind = "query" if query else "noop"
        prompts = P.in_step_prompts(traj["task"]["goal"], [(x["index"], x["meta"].get("stm")) for x in traj["steps"]])
        for s in pick_steps(traj["steps"], judge_steps):
            rec = judgments.get(f"{kind}|{r['id']}|{s['index']}")
            j = rec.get("score") if rec is not None else None
            reward, source = _mix(float(bool(r["success"])), j, outcome_weight)
            if reward < min_reward:
                counts[f"in_{kind}_below_min_reward"] += 1
                continue
            out.append({"id": f"{r['id']}|{s['index']}", "phase": "in", "task_id": r["task_id"],
                        "reward": round(reward, 6),
                        "prompt": prompts[s["index"]],
                        "completion": _turn(P.in_completion(query)), "decision": P.in_completion(query),
                        "rollout_id": r["id"], "step": s["index"], "outcome": bool(r["success"]),
                        "judge_score": j, "label_source": source})
    return out


def end_labels(stores: Sequence[dict], rollouts: Sequence[dict], providers: Mapping[str, Any],
               task_order: Sequence[str], min_reuse: float = 0.5, min_retrievals: int = 1,
               min_reward: float = 0.5, counts: Counter | None = None) -> list[dict]:
    """End records from downstream reuse of the stored trajectories' items by later training rollouts."""
    counts = counts if counts is not None else Counter()
    pos = {t: i for i, t in enumerate(task_order)}
    by_id = {r["id"]: r for r in rollouts}
    # item id -> tasks whose store wrote or changed it
    writers: dict[str, set[str]] = defaultdict(set)
    for s in stores:
        for item in s.get("item_ids", []):
            writers[item].add(s["task_id"])
    # (source task, provider) -> outcomes of later rollouts that retrieved one of its items
    reuse: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in rollouts:
        p = r["begin_provider"]
        if p is None or r.get("error") or r["task_id"] not in pos:
            continue
        sources = {t for item in r.get("retrieved_item_ids", []) for t in writers.get(item, ())}
        for t in sources:
            if t in pos and pos[t] < pos[r["task_id"]]:
                reuse[(t, p)].append(bool(r["success"]))
    out = []
    stored_rollouts = sorted({(s["task_id"], s["rollout_id"]) for s in stores}, key=lambda x: (pos.get(x[0], 1e9), x[1]))
    for task_id, rollout_id in stored_rollouts:
        observed = {p: reuse[(task_id, p)] for p in providers if len(reuse.get((task_id, p), [])) >= min_retrievals}
        if not observed:
            counts["end_unobserved"] += 1
            continue
        rate = {p: sum(v) / len(v) for p, v in observed.items()}
        chosen = [p for p in providers if p in rate and rate[p] >= min_reuse]
        reward = sum(rate[p] if p in chosen else 1.0 - rate[p] for p in rate) / len(rate)
        if reward < min_reward:
            counts["end_below_min_reward"] += 1
            continue
        rollout = by_id.get(rollout_id)
        if rollout is None:
            counts["end_missing_rollout"] += 1
            continue
        traj = Trajectory.from_dict(rollout["trajectory"])
        out.append({"id": f"{task_id}|{rollout_id}", "phase": "end", "task_id": task_id, "reward": round(reward, 6),
                    "prompt": P.end_messages(traj, providers), "completion": _turn(P.end_completion(chosen)),
                    "decision": chosen, "rollout_id": rollout_id,
                    "reuse": {p: {"retrievals": len(observed[p]), "success_rate": rate[p]} for p in rate}})
    return out


# -- statistics -------------------------------------------------------------------------------------------
def summarize(rollouts, begin, inn, end, counts: Counter, names: Sequence[str], cfg) -> dict:
    """Success rates per option and policy, coverage (Table 13 style), timings, label counts."""
    options = ([None] if cfg.include_no_memory else []) + list(names)
    by_opt: dict[str, dict] = {}
    for o in options:
        for pol in cfg.in_policies:
            rs = [r for r in rollouts if r["begin_provider"] == o and r["in_policy"] == pol]
            if rs:
                by_opt[f"{o or 'None'}|{pol}"] = {"rollouts": len(rs), "success_rate": sum(r["success"] for r in rs) / len(rs),
                                                  "avg_steps": sum(r["steps"] for r in rs) / len(rs),
                                                  "injected_tokens": sum(r["injected_tokens"] for r in rs) / len(rs)}
    tasks = sorted({r["task_id"] for r in rollouts})
    solved_by = {t: len({r["begin_provider"] for r in rollouts if r["task_id"] == t and r["success"]}) for t in tasks}
    steps = sum(r["steps"] for r in rollouts)
    secs = sum(r.get("elapsed_s") or 0 for r in rollouts)
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "tasks": len(tasks), "rollouts": len(rollouts),
            "errors": sum(bool(r["error"]) for r in rollouts),
            "success_rate": sum(r["success"] for r in rollouts) / len(rollouts) if rollouts else None,
            "by_option": by_opt, "coverage": {"options": len(options), "histogram": dict(Counter(solved_by.values()))},
            "timing": {"s_per_step": secs / steps if steps else None,
                       "s_per_rollout": secs / len(rollouts) if rollouts else None, "steps": steps},
            "labels": {"begin": len(begin), "in": len(inn), "end": len(end),
                       "begin_decisions": dict(Counter(str(r["decision"]) for r in begin)),
                       "in_decisions": dict(Counter(r["decision"] for r in inn)),
                       "end_sizes": dict(Counter(len(r["decision"]) for r in end))},
            "counts": dict(counts)}
