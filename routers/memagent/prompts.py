"""Begin / In / End prompts of the MemAgent router (paper Tables 10-11) and robust parsers for its replies.

Each phase is a chat (list of ``{"role", "content"}`` messages) plus a short completion, the TRL
conversational prompt-completion format the SFT data and the router's log-probability scoring share:

* Begin: the goal, and for every long-term provider its storage + retrieval description and the
  embedding/keyword probe preview (Table 11: "Begin prompts incorporate both storage and retrieval
  descriptions"). Completion: one provider name, or ``None`` for no memory.
* In: the goal, then the task's short-term memory *log* (the summary entries, Table 10 sections, under the
  step they first appeared: append-only, so the router keeps its KV cache across steps, ``in_cache``), then
  the step index and a short question (the only text re-run every step). Completion: ``Query`` (inject the
  summary) or ``NoOp``. :class:`InLog` builds the log; the SFT records (``data_synthesis.memagent_supervision``) and
  the router feed it the same per-step summaries in step order, so both see the same text.
* End: the trajectory (compact, step-capped) and every provider's storage description with its outcome
  gate (Table 11). Completion: comma-separated provider names, or ``None``. The router scores End per
  provider (``end_provider_messages``: the same body, a yes/no question about one provider).

The question sits last in every user message: small models need it right before the decision tokens.
Providers are a mapping ``name -> object`` with ``describe_storage()``, ``describe_retrieval()`` and
``gate`` ("success" | "all"), duck typed.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

NONE = "None"
QUERY, NOOP = "Query", "NoOp"
YES, NO = "yes", "no"
SNIPPET_CHARS = 200          # probe preview snippet shown per provider
END_MAX_STEPS = 12           # trajectory steps rendered in the End prompt (first half + last half)
END_OBS_CHARS = 240          # observation characters per rendered step
IN_LOG_CHARS = 3000          # In prompt log cap: past it, the oldest steps are dropped down to 2/3 of it
IN_ENTRY_CHARS = 200         # characters per logged short-term memory entry

BEGIN_SYSTEM = ("You are the memory agent of a task agent. Before a task starts you choose which long-term "
                "memory provider to retrieve from; its memory is injected into the task agent's prompt. "
                "Choose None when no provider's memory would help. Reply with one option name only.")
BEGIN_QUESTION = "Which memory provider should the task agent retrieve from? Reply with one option name."
IN_SYSTEM = ("You are the memory agent of a task agent. At each step you decide whether to inject the "
             "short-term memory summary (the latest entries of the log below) into the task agent's context "
             "(Query) or to skip it (NoOp). Reply with Query or NoOp only.")
IN_QUESTION = "Inject the summary now? Query or NoOp."  # short: the In prompt's tail is re-run every step
END_SYSTEM = ("You are the memory agent of a task agent. After a task ends you choose which long-term "
              "memory providers should store its trajectory for reuse by future tasks. "
              "Reply with the provider names separated by commas, or None.")
END_QUESTION = "Which providers should store this trajectory? Reply with names separated by commas, or None."
END_PROVIDER_QUESTION = "Should {name} store this trajectory? Answer yes or no."
GATE_TEXT = {"success": "stores successful trajectories only", "all": "stores all outcomes"}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def _get(obj: Any, key: str, default=None):
    return obj.get(key, default) if isinstance(obj, Mapping) else getattr(obj, key, default)


def _previews_by_name(previews) -> dict[str, Any]:
    """Accept a mapping name -> Preview, or a sequence of Preview objects / dicts with a ``provider`` key."""
    if isinstance(previews, Mapping):
        return dict(previews)
    out = {}
    for p in previews or ():
        name = _get(p, "provider")
        if name is None:
            raise ValueError(f"preview without a provider name: {p!r}")
        out[name] = p
    return out


def _gate_text(gate: str) -> str:
    if gate not in GATE_TEXT:
        raise ValueError(f"unknown storage gate {gate!r}; expected one of {sorted(GATE_TEXT)}")
    return GATE_TEXT[gate]


def begin_messages(goal: str, previews, providers: Mapping[str, Any]) -> list[dict]:
    """Begin prompt, static first: every provider's storage/retrieval description and the options (the same
    for every task of a pool: the router's KV cache of them is reused across tasks), then this task's probe
    previews, the goal last."""
    by_name = _previews_by_name(previews)
    unknown = sorted(set(by_name) - set(providers))
    if unknown:
        raise ValueError(f"previews for providers not in the pool: {unknown}")
    blocks, lines = [], []
    for i, (name, prov) in enumerate(providers.items(), 1):
        blocks.append(f"{i}. {name}\n   Storage: {prov.describe_storage()}\n   Retrieval: {prov.describe_retrieval()}")
        p = by_name.get(name)
        if p is None or not int(_get(p, "n_items", 0) or 0):
            preview = "(empty store)" if p is not None else "(no preview)"
        else:
            preview = (f"score {float(_get(p, 'score', 0.0)):.3f}, {int(_get(p, 'n_items', 0))} items: "
                       f"\"{_clip(_get(p, 'snippet', ''), SNIPPET_CHARS)}\"")
        lines.append(f"{i}. {name} preview: {preview}")
    options = ", ".join([NONE, *providers])
    user = ("Memory providers (storage, retrieval):\n" + "\n".join(blocks) + f"\n\nOptions: {options}\n\n"
            + "Probe previews for this task:\n" + "\n".join(lines)
            + f"\n\nTask: {goal.strip()}\n\n{BEGIN_QUESTION}")
    return [{"role": "system", "content": BEGIN_SYSTEM}, {"role": "user", "content": user}]


_SECTION_HEAD = re.compile(r"^(?:#+\s*(.+?)\s*:?|([A-Z][A-Za-z ]{0,40}):)$")


def summary_entries(state_summary: str) -> list[tuple[str, str]]:
    """(section, entry) pairs of a short-term summary (``## Section`` / ``Section:`` headers, ``- entry`` bullets;
    other lines are entries of the current section, '' before any header), in order, without repeats."""
    out: list[tuple[str, str]] = []
    section = ""
    for line in (state_summary or "").splitlines():
        line = " ".join(line.split())
        head = _SECTION_HEAD.match(line)
        if head:
            section = head.group(1) or head.group(2)
        elif line.strip("-*• "):
            entry = (section, _clip(line.lstrip("-*• "), IN_ENTRY_CHARS))
            if entry not in out:
                out.append(entry)
    return out


class InLog:
    """One task's append-only short-term memory log for the In prompt.

    ``messages(goal, step_index, summary)`` records the summary's entries not seen before in this task under
    ``step_index`` and returns the In prompt. A new goal or a step index before the last one starts a new log
    (a new task or episode); the same step index again replaces that step's record (asking twice is
    idempotent). Steps that add nothing add no text, so a caller that skips empty summaries (``run_episode``
    asks In only when the summary has content) sees the same log as one that feeds every step. Past
    ``IN_LOG_CHARS`` the oldest steps are dropped (down to 2/3 of it) and an omission line opens the log.
    """

    def __init__(self):
        self.goal: str | None = None
        self.step: int | None = None
        self.blocks: list[tuple[int, list[str]]] = []
        self.seen: set[tuple[str, str]] = set()
        self.omitted = False
        self._before = None

    def update(self, goal: str, step_index: int, state_summary: str) -> None:
        step_index = int(step_index)
        if goal != self.goal or (self.step is not None and step_index < self.step):
            self.__init__()
            self.goal = goal
        elif step_index == self.step and self._before is not None:
            self.blocks, self.seen, self.omitted = self._before
        self._before = (list(self.blocks), set(self.seen), self.omitted)
        self.step = step_index
        new = [e for e in summary_entries(state_summary) if e not in self.seen]
        if new:  # one line per section: "Step 4, Collected Data: fact | fact" (few tokens per entry)
            self.seen.update(new)
            sections = list(dict.fromkeys(sec for sec, _ in new))
            self.blocks.append((step_index, [f"Step {step_index}{', ' + sec if sec else ''}: "
                                             + " | ".join(t for s, t in new if s == sec) for sec in sections]))
        if len(self.text()) > IN_LOG_CHARS:
            while len(self.blocks) > 1 and len(self.text()) > IN_LOG_CHARS * 2 // 3:
                self.blocks.pop(0)
                self.omitted = True

    def text(self) -> str:
        if not self.blocks:
            return "(nothing collected yet)"
        lines = ["(earlier steps omitted)"] if self.omitted else []
        return "\n".join(lines + [line for _, block in self.blocks for line in block])

    def messages(self, goal: str, step_index: int, state_summary: str) -> list[dict]:
        self.update(goal, step_index, state_summary)
        # no per-step text after the log: a step that adds nothing asks the very same prompt again, which the
        # router's KV cache answers by re-running one token (about half the steps of a worlds rollout)
        user = (f"Task: {goal.strip()}\n\nShort-term memory log (entries by the step that added them):\n"
                f"{self.text()}\n\n{IN_QUESTION}")
        return [{"role": "system", "content": IN_SYSTEM}, {"role": "user", "content": user}]


def in_messages(goal: str, step_index: int, state_summary: str) -> list[dict]:
    """In prompt of a task's first In step (a fresh :class:`InLog`); later steps need the task's log."""
    return InLog().messages(goal, step_index, state_summary)


def in_step_prompts(goal: str, steps: Iterable[tuple[int, str]]) -> dict[int, list[dict]]:
    """The In prompt of every (step index, summary) of one episode, its log fed in step order as the router
    feeds it (``routers.memagent.in_cache``): what the SFT records of that episode must contain."""
    log = InLog()
    return {i: log.messages(goal, i, summary or "") for i, summary in sorted(steps, key=lambda x: x[0])}


def render_trajectory(trajectory, max_steps: int = END_MAX_STEPS, obs_chars: int = END_OBS_CHARS) -> str:
    """Compact trajectory: goal, outcome, memory used, and at most ``max_steps`` steps (head and tail)."""
    steps = list(trajectory.steps)
    lines = [f"Task: {trajectory.task.goal.strip()}",
             f"Outcome: {'success' if trajectory.success else 'failure'} ({len(steps)} steps)",
             f"Begin memory: {trajectory.begin_provider or NONE}"]
    if len(steps) > max_steps:
        head, tail = steps[: (max_steps + 1) // 2], steps[len(steps) - max_steps // 2:]
        shown = [*head, None, *tail]
    else:
        shown = steps
    for s in shown:
        if s is None:
            lines.append(f"... ({len(steps) - max_steps} steps omitted) ...")
        else:
            lines.append(f"Step {s.index}: > {_clip(s.action, 120)} | {_clip(s.observation, obs_chars)}")
    return "\n".join(lines)


def _end_body(trajectory, providers: Mapping[str, Any]) -> str:
    blocks = [f"{i}. {name}: {prov.describe_storage()} [gate: {_gate_text(prov.gate)}]"
              for i, (name, prov) in enumerate(providers.items(), 1)]
    return (f"Trajectory:\n{render_trajectory(trajectory)}\n\nProviders (storage, outcome gate):\n"
            + "\n".join(blocks))


def end_messages(trajectory, providers: Mapping[str, Any]) -> list[dict]:
    """End prompt: the compact trajectory, every provider's storage description + gate, the subset question."""
    user = f"{_end_body(trajectory, providers)}\n\n{END_QUESTION}"
    return [{"role": "system", "content": END_SYSTEM}, {"role": "user", "content": user}]


def end_provider_messages(end_prompt: Sequence[dict], name: str) -> list[dict]:
    """Per-provider End question: the End prompt with its subset question replaced by a yes/no about ``name``.

    Built from the messages (not the trajectory) so ``end.jsonl`` records convert without the run.
    """
    msgs = [dict(m) for m in end_prompt]
    last = msgs[-1] if msgs else {}
    content = last.get("content", "")
    if last.get("role") != "user" or not content.endswith(END_QUESTION):
        raise ValueError("not an End prompt: the last message must be the user turn ending with the End question")
    last["content"] = content[: -len(END_QUESTION)] + END_PROVIDER_QUESTION.format(name=name)
    return msgs


def _user_text(messages: Sequence[dict]) -> str:
    users = [m.get("content", "") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError("prompt has no user message")
    return users[-1]


def begin_prompt_options(messages: Sequence[dict]) -> list[str]:
    """Provider names offered by a rendered Begin prompt (its ``Options:`` line, without None)."""
    for line in _user_text(messages).splitlines():
        if line.startswith("Options: "):
            return [n.strip() for n in line[len("Options: "):].split(",") if n.strip() and n.strip() != NONE]
    raise ValueError("not a Begin prompt: no 'Options:' line")


_END_PROVIDER_LINE = re.compile(r"^(\d+)\. (.+?): .* \[gate: [^\]]+\]$")


def end_prompt_provider_names(messages: Sequence[dict]) -> list[str]:
    """Provider names listed by a rendered End prompt (its "Providers" block), in order."""
    text = _user_text(messages)
    head = "Providers (storage, outcome gate):\n"
    if head not in text:
        raise ValueError("not an End prompt: no providers block")
    names = []
    for line in text.rsplit(head, 1)[1].splitlines():
        m = _END_PROVIDER_LINE.match(line)
        if not m:
            break
        names.append(m.group(2))
    if not names:
        raise ValueError("End prompt lists no providers")
    return names


def begin_completion(name: str | None) -> str:
    return NONE if name is None else str(name)


def in_completion(query: bool) -> str:
    return QUERY if query else NOOP


def end_completion(names: Iterable[str]) -> str:
    out: list[str] = []
    for n in names:
        if n not in out:
            out.append(n)
    return ", ".join(out) if out else NONE


def yes_no_completion(value: bool) -> str:
    return YES if value else NO


_LABEL = re.compile(r"^\s*(?:answer|provider|option|choice|decision|store|storage|providers)\s*[:=-]\s*", re.I)
_NONE_FORMS = {"none", "nomemory", "nothing", "null", "no", "noprovider", "nostorage", "empty"}


def _strip_label(text: str) -> str:
    text = str(text).strip().strip("`").strip()
    return _LABEL.sub("", text, count=1).strip()


def _match_name(piece: str, names: Sequence[str]) -> str | None:
    key = _norm(piece)
    if not key:
        return None
    by_norm = {_norm(n): n for n in names}
    if key in by_norm:
        return by_norm[key]
    hits = [(key.find(k), -len(k), n) for k, n in by_norm.items() if k and k in key]
    return min(hits)[2] if hits else None


def parse_begin(text: str, names: Iterable[str]) -> str | None:
    """Provider name (canonical spelling) or None. Tolerates labels, quotes, case, punctuation, extra words."""
    names = list(names)
    body = _strip_label(text)
    first = body.splitlines()[0] if body else ""
    if _norm(first) in _NONE_FORMS:
        return None
    for candidate in (first, body):
        hit = _match_name(candidate, names)
        if hit is not None:
            return hit
    if re.search(r"\bnone\b|\bno memory\b", body, re.I):
        return None
    raise ValueError(f"cannot parse a Begin decision from {text!r}; options: {[NONE, *names]}")


def parse_in(text: str) -> bool:
    """True for Query, False for NoOp; tolerant of case, punctuation and trailing words."""
    body = _strip_label(text)
    key = _norm(body.split()[0]) if body.split() else ""
    if key in {"query", "inject", "yes"}:
        return True
    if key in {"noop", "skip", "no", "none"}:
        return False
    low = _norm(body)
    positions = [(low.find(k), v) for k, v in (("noop", False), ("query", True)) if k in low]
    if positions:
        return min(positions)[1]
    raise ValueError(f"cannot parse an In decision from {text!r}; expected {QUERY} or {NOOP}")


def parse_end(text: str, names: Iterable[str]) -> list[str]:
    """Provider names (canonical, first-seen order, no duplicates); [] for None. Unknown names are an error."""
    names = list(names)
    body = _strip_label(text)
    if _norm(body) in _NONE_FORMS or not body:
        return []
    out: list[str] = []
    for piece in re.split(r"[,;\n]|\band\b|&", body):
        piece = piece.strip().strip("-*•").strip()
        if not _norm(piece):
            continue
        hit = _match_name(piece, names)
        if hit is None:
            if _norm(piece) in _NONE_FORMS:
                continue
            raise ValueError(f"cannot parse an End decision from {text!r}: unknown provider {piece!r}; "
                             f"known: {names}")
        if hit not in out:
            out.append(hit)
    return out
