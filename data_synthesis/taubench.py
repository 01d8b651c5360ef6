"""tau-bench trajectories as a memory corpus: ``load_corpus("taubench", path)``.

tau-bench (Yao et al., 2024; MIT, the licence beside the data file) records tool-calling customer-service
dialogues: a simulated user, an agent that calls airline tools (``get_user_details``,
``get_reservation_details``, ``search_direct_flight``, ...), and the tools' JSON results. One trajectory
(``task_id`` x ``trial``) becomes one :class:`~routers.memory.schema.Episode`; its steps are the turns, in order
(the system prompt, the same policy text in every trajectory, is left out):

* a user message (``speaker`` ``user``), an agent message (``agent``);
* an agent tool call (``agent``): ``call get_user_details({"user_id": "mia_li_3668"})``;
* a tool result (``tool``): ``get_user_details({"user_id": "mia_li_3668"}) returned: {...}`` (the call's arguments
  again, so a result is self-contained, then the tool's own JSON text, unchanged).

Questions come from the tool results only (:mod:`data_synthesis.taubench_qa`): templates over the parsed JSON,
with the exact evidence steps, and every question whose answer also shows up in a step that is not evidence is
dropped (``meta`` of the episode counts what was dropped and why), so "the evidence is present" is exactly
"the context answers the question".

Trials of one task replay the same user goal, so they must not cross train / held-out: every episode carries
``meta["split_group"] = "task<id>"`` and :func:`data_synthesis.corpora.split_episodes` splits by that group.
"""

from __future__ import annotations

import json
from pathlib import Path

from routers.logs import get_logger
from routers.memory.schema import Episode, LoadStats, Step

log = get_logger(__name__)

DEFAULT_TAUBENCH = "../shared/data/taubench/gpt-4o-airline.json"


def _compact(args) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return args
    return json.dumps(args, ensure_ascii=False)


def parse_json(text: str):
    """A tool result's JSON value, or None when the result is plain text (an error, a confirmation)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError, ValueError):
        return None


class CorpusError(ValueError):
    """A malformed tau-bench file (the message names the file and the trajectory / message)."""


def trajectory_steps(traj: list[dict], where: str) -> tuple[list[Step], list[dict]]:
    """Steps of one trajectory, and one record per tool result: ``{"step": i, "call_step": j, "name",
    "args" (dict), "result" (parsed JSON or None), "text"}`` (``i`` / ``j`` index ``steps``)."""
    steps: list[Step] = []
    tools: list[dict] = []
    pending: dict[str, tuple[int, str, dict]] = {}  # tool_call_id -> (call step, name, args); ids can repeat

    def add(text: str, speaker: str, kind: str) -> int:
        steps.append(Step(step_id=f"s{len(steps)}", index=len(steps), text=text, speaker=speaker,
                          meta={"kind": kind}))
        return len(steps) - 1

    for mi, msg in enumerate(traj):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise CorpusError(f"{where} message #{mi} must be an object with a 'role'")
        role, content = msg["role"], msg.get("content")
        if role == "system":
            continue
        if content is not None and not isinstance(content, str):
            raise CorpusError(f"{where} message #{mi} content must be a string or null")
        if role == "user":
            add(content or "", "user", "user")
        elif role == "assistant":
            if content and content.strip():
                add(content, "agent", "message")
            for call in msg.get("tool_calls") or []:
                fn = (call or {}).get("function") or {}
                name = fn.get("name")
                if not isinstance(name, str):
                    raise CorpusError(f"{where} message #{mi}: a tool call lacks function.name")
                raw = fn.get("arguments") or "{}"
                args = parse_json(raw) if isinstance(raw, str) else raw
                j = add(f"call {name}({_compact(raw)})", "agent", "tool_call")
                pending[call.get("id")] = (j, name, args if isinstance(args, dict) else {})
        elif role == "tool":
            name = msg.get("name") or "tool"
            j, _, args = pending.get(msg.get("tool_call_id"), (None, name, {}))
            # the call's arguments are repeated here, so a result step says by itself what was looked up
            shown = content if content and content.strip() else "(no output)"
            i = add(f"{name}({json.dumps(args, ensure_ascii=False)}) returned: {shown}", "tool", "tool_result")
            tools.append({"step": i, "call_step": j, "name": name, "args": args,
                          "result": parse_json(content or ""), "text": content or ""})
        else:
            raise CorpusError(f"{where} message #{mi}: unknown role {role!r}")
    return steps, tools


def load_taubench(path: str | Path | None = None, stats: LoadStats | None = None, seed: int = 0,
                  max_per_template: int = 3) -> list[Episode]:
    """One Episode per trajectory with evidence-exact questions from its tool results (see the module doc).
    ``seed`` / ``max_per_template``: at most that many questions of each template per episode, drawn seeded."""
    from data_synthesis.taubench_qa import episode_questions

    path = Path(path or DEFAULT_TAUBENCH)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (tau-bench trajectories, e.g. {DEFAULT_TAUBENCH})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise CorpusError(f"{path}: unreadable JSON ({type(err).__name__}: {str(err)[:120]})") from None
    if not isinstance(data, list):
        raise CorpusError(f"{path}: expected a list of tau-bench trajectories")
    stats = stats if stats is not None else LoadStats()
    episodes, seen = [], set()
    for ti, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("traj"), list) or "task_id" not in item:
            raise CorpusError(f"{path}: trajectory #{ti} must be an object with 'task_id' and 'traj' (a list)")
        task, trial = item["task_id"], item.get("trial", 0)
        eid = f"task{task}-trial{trial}"
        if eid in seen:
            raise CorpusError(f"{path}: trajectory #{ti}: duplicate task_id / trial {eid!r}")
        seen.add(eid)
        steps, tools = trajectory_steps(item["traj"], f"{path}: trajectory #{ti} ({eid})")
        if not steps:
            raise CorpusError(f"{path}: trajectory #{ti} ({eid}) has no turns")
        ep = Episode(episode_id=eid, steps=steps, source="taubench",
                     meta={"split_group": f"task{task}", "task_id": task, "trial": trial,
                           "reward": item.get("reward")})
        ep.qa, dropped = episode_questions(ep, tools, seed=seed, max_per_template=max_per_template)
        ep.meta["dropped_questions"] = dropped
        stats.qa_kept += len(ep.qa)
        stats.episodes += 1
        stats.steps += len(steps)
        episodes.append(ep)
    log.debug("taubench %s: %d episodes, %d questions", path, stats.episodes, stats.qa_kept)
    return episodes
