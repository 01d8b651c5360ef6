"""Task agents for command-based environments, and :func:`run_episode`, the loop every rollout goes through.

* :class:`LMCommandAgent` picks among the admissible commands by scoring each one with a local causal LM:
  ``log p(command + end-of-turn | prompt)``, length-normalised by default. The prompt's KV cache is computed
  once per step and shared by all candidates, which run packed into one row with a tree attention mask (not a
  batch that copies the cache per candidate). Memory (Begin + In) goes into the prompt.
* :class:`HTTPCommandAgent` is for an LLM server (``make_backend("openai:MODEL@URL")``): it cannot score,
  so it shows a numbered command list and asks for a number with ``generate``.
* :class:`WalkthroughAgent` / :class:`RandomCommandAgent`: scripted oracle and random baselines.

:func:`run_episode` runs one task with a fixed Begin memory and an In policy (``"inject"`` = Query every
step the short-term memory has content, ``"never"`` = NoOp, or a callable a router supplies) and turns
any agent/LLM/environment error into ``Trajectory.error`` instead of raising, so one broken rollout never
stops an exploration run.
"""

from __future__ import annotations

import random
import re
import time
import traceback
from itertools import accumulate
from typing import Callable, Sequence

from routers.memagent.copy_prior import route_prior
from routers.memagent.protocol import Observation, Task, Trajectory, TrajectoryStep
from routers.models import kv_cache_kwarg, output_kv_cache, tree_attention_mask

SYSTEM_PROMPT = ("You are playing a text adventure game. Reach the goal by choosing one of the valid commands "
                 "each turn. Use the memory notes when they are relevant. Reply with the command only.")
HTTP_SYSTEM_PROMPT = ("You are playing a text adventure game. Reach the goal by choosing one of the numbered "
                      "valid commands each turn. Use the memory notes when they are relevant. "
                      "Reply with the number of the command only.")
IN_POLICIES = ("inject", "never")
LTM_HEADER = "Memory from past tasks:"
STM_HEADER = "Short-term memory (this task so far):"


class AgentError(RuntimeError):
    """The agent could not produce a command (empty command list, broken model reply)."""


def _clip(text: str, n: int) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def compose_memory(begin_memory: str, injected: str) -> str:
    """The memory block the task agent sees: Begin (long-term) memory, then the In (short-term) injection."""
    parts = []
    if begin_memory and begin_memory.strip():
        parts.append(f"{LTM_HEADER}\n{begin_memory.strip()}")
    if injected and injected.strip():
        parts.append(f"{STM_HEADER}\n{injected.strip()}")
    return "\n\n".join(parts)


def split_memory(memory: str) -> tuple[str, str]:
    """Inverse of :func:`compose_memory`: (long-term block, short-term block), headers included."""
    memory = memory or ""
    i = memory.find(STM_HEADER)
    if i < 0:
        return memory.strip(), ""
    return memory[:i].strip(), memory[i:].strip()


class _PromptMixin:
    history_steps: int = 3
    max_observation_chars: int = 600
    max_memory_chars: int = 1500

    def _static(self, task: Task, long_term: str) -> str:
        """The part of the prompt fixed for a whole rollout (goal + Begin memory): cached across steps."""
        text = f"Goal: {task.goal.strip()}\n\n"
        if long_term:
            text += f"{_clip(long_term, self.max_memory_chars)}\n\n"
        return text

    def _dynamic(self, history: Sequence[TrajectoryStep], observation: Observation, short_term: str) -> str:
        lines = []
        if short_term:
            lines.append(f"{_clip(short_term, self.max_memory_chars)}\n")
        recent = list(history)[-self.history_steps:] if self.history_steps > 0 else []
        if recent:
            lines.append("Recent steps:")
            lines += [f"> {s.action}\n{_clip(s.observation, self.max_observation_chars // 2)}" for s in recent]
            lines.append("")
        lines.append(f"Current observation:\n{_clip(observation.text, self.max_observation_chars)}")
        return "\n".join(lines)


class LMCommandAgent(_PromptMixin):
    """Scores every admissible command with a causal LM and takes the best.

    Two KV-cache levels: the rollout-static prompt head (system, goal, Begin memory) is computed once per
    rollout, the step-dependent tail once per step, and the candidates run packed into one row on top of both
    (``pack_candidates``; False: a padded batch with the cache copied per candidate, the slower path before).
    """

    def __init__(self, model, tokenizer, history_steps: int = 3, max_observation_chars: int = 600,
                 max_memory_chars: int = 1500, length_norm: str = "mean", repeat_penalty: float = 1.0,
                 repeat_window: int = 6, batch_size: int = 64, system_prompt: str = SYSTEM_PROMPT,
                 memory_prior: float = 0.0, pack_candidates: bool = True):
        if length_norm not in ("mean", "sum"):
            raise ValueError(f"length_norm must be 'mean' or 'sum', got {length_norm!r}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.history_steps, self.max_observation_chars = history_steps, max_observation_chars
        self.max_memory_chars = max_memory_chars
        self.length_norm, self.repeat_penalty, self.repeat_window = length_norm, repeat_penalty, repeat_window
        self.batch_size, self.system_prompt = batch_size, system_prompt  # batch_size: candidates per forward
        self.pack_candidates = pack_candidates
        self.memory_prior = float(memory_prior)  # weight of routers.memagent.copy_prior (0 = off)
        self.name = f"lm:{getattr(model.config, '_name_or_path', '') or type(model).__name__}"
        self._terminator = None
        self._cache_kw = kv_cache_kwarg(model)
        self._static_key: tuple | None = None
        self._static_layers = None
        self.last_info: dict = {}

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32", device: str | None = None, **kwargs):
        from routers.models import load_causal_lm, torch_dtype

        model, tok = load_causal_lm(name_or_path, dtype=torch_dtype(dtype), device=device)
        return cls(model, tok, **kwargs)

    # ------------------------------------------------------------------ prompt
    def prompt_parts(self, task: Task, history, observation: Observation, memory: str) -> tuple[list[dict], str]:
        """(chat messages, the rollout-static head of the user message)."""
        long_term, short_term = split_memory(memory)
        static = self._static(task, long_term)
        cmds = "\n".join(f"- {c}" for c in observation.admissible_commands)
        user = (static + self._dynamic(history, observation, short_term)
                + f"\n\nValid commands:\n{cmds}\n\nNext command:")
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}], static

    def messages(self, task: Task, history, observation: Observation, memory: str) -> list[dict]:
        return self.prompt_parts(task, history, observation, memory)[0]

    def terminator(self) -> str:
        """Text the chat template puts after an assistant reply (``<|im_end|>`` for SmolLM2), found by rendering."""
        if self._terminator is None:
            tok, probe = self.tokenizer, [{"role": "user", "content": "hi"}]
            marker = "\u2063MARK\u2063"
            try:
                prefix = tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
                full = tok.apply_chat_template(probe + [{"role": "assistant", "content": marker}], tokenize=False)
                tail = full[len(prefix):] if full.startswith(prefix) else ""
                self._terminator = tail.split(marker, 1)[1].rstrip() if marker in tail else (tok.eos_token or "")
            except (ValueError, AttributeError, TypeError):  # no chat template
                self._terminator = tok.eos_token or ""
        return self._terminator

    def encode(self, messages: list[dict], commands: Sequence[str], static: str = "") -> tuple[list[int], list[int], list[list[int]]]:
        """Token ids: (rollout-static head, step tail, candidates). Head + tail is the whole prompt."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            prompt = "\n\n".join(m["content"] for m in messages) + "\n"
        cut = prompt.find(static) + len(static) if static and static in prompt else 0
        head = tok(prompt[:cut], add_special_tokens=False)["input_ids"] if cut else []
        tail = tok(prompt[cut:], add_special_tokens=False)["input_ids"]
        term = self.terminator()
        cands = [tok(c + term, add_special_tokens=False)["input_ids"] for c in commands]
        if not tail or any(not c for c in cands):
            raise AgentError("empty prompt or command after tokenization")
        return head, tail, cands

    # ------------------------------------------------------------------ scoring
    def _aggregate(self, token_logps: list[list[float]]) -> list[float]:
        return [sum(t) / len(t) if self.length_norm == "mean" else sum(t) for t in token_logps]

    def _forward(self, ids, cache=None, **kwargs):
        if cache is not None:
            kwargs[self._cache_kw] = cache
        return self.model(input_ids=ids, use_cache=True, **kwargs)

    def _cache_from(self, layers, batch: int = 1):
        from transformers import DynamicCache

        data = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in layers]
        return DynamicCache(ddp_cache_data=data, config=self.model.config)

    def token_logprobs(self, head: list[int], tail: list[int], cand_ids: list[list[int]]) -> list[list[float]]:
        """Per-token log-probs of each candidate continuation of ``head + tail``, using the KV caches."""
        import torch

        dev = self.model.device
        with torch.inference_mode():
            cache = None
            if head:
                key = tuple(head)
                if key != self._static_key:  # a new rollout (or new Begin memory): recompute the head
                    res = self._forward(torch.tensor([head], device=dev), logits_to_keep=1)
                    self._static_layers = [(lay.keys, lay.values) for lay in output_kv_cache(res).layers]
                    self._static_key = key
                cache = self._cache_from(self._static_layers)
            pre = self._forward(torch.tensor([tail], device=dev), cache, logits_to_keep=1)
            first = torch.log_softmax(pre.logits[0, -1].float(), dim=-1)
            score = self._score_packed if self.pack_candidates else self._score_batched
            return score(pre, first, len(head) + len(tail), cand_ids)

    def _score_packed(self, pre, first, plen: int, cand_ids: list[list[int]]) -> list[list[float]]:
        """``batch_size`` candidates per forward, packed into one row after the prompt's cache with a tree attention
        mask (``routers.models.tree_attention_mask``): the cache is shared, not copied per candidate."""
        import torch

        dev, dtype = self.model.device, next(self.model.parameters()).dtype
        cache, out = output_kv_cache(pre), []
        for start in range(0, len(cand_ids), self.batch_size):
            chunk = cand_ids[start:start + self.batch_size]
            lengths = [len(c) for c in chunk]
            ids = torch.tensor([[t for c in chunk for t in c]], device=dev)
            pos = torch.tensor([[plen + j for n in lengths for j in range(n)]], device=dev)
            res = self._forward(ids, cache, position_ids=pos,
                                attention_mask=tree_attention_mask(lengths, plen, dtype).to(dev))
            extra = cache.get_seq_length() - plen
            if extra > 0:
                cache.crop(-extra)  # drop this chunk: the next one sees the prompt only
            logp = torch.log_softmax(res.logits[0].float(), dim=-1)
            # row k of a candidate predicts its token k + 1; its first token comes from the prompt's last row
            rows = [at + j for at, n in zip(accumulate(lengths, initial=0), lengths) for j in range(n - 1)]
            nexts = [t for c in chunk for t in c[1:]]
            vals = logp[torch.tensor(rows, dtype=torch.long, device=dev),
                        torch.tensor(nexts, dtype=torch.long, device=dev)].tolist()
            at = 0
            for c in chunk:
                out.append([first[c[0]].item(), *vals[at:at + len(c) - 1]])
                at += len(c) - 1
        return out

    def _score_batched(self, pre, first, plen: int, cand_ids: list[list[int]]) -> list[list[float]]:
        """The path before packing (``pack_candidates=False``): candidates padded into a batch, the prompt's cache
        expanded to it. Kept as the benchmark baseline (``memroute bench --which memagent_in``)."""
        import torch

        dev, out = self.model.device, []
        layers = [(lay.keys, lay.values) for lay in output_kv_cache(pre).layers]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for start in range(0, len(cand_ids), self.batch_size):
            chunk = cand_ids[start:start + self.batch_size]
            b, width = len(chunk), max(len(c) for c in chunk)
            ids = torch.full((b, width), pad, dtype=torch.long, device=dev)
            mask = torch.zeros((b, plen + width), dtype=torch.long, device=dev)
            mask[:, :plen] = 1
            for i, c in enumerate(chunk):
                ids[i, :len(c)] = torch.tensor(c, device=dev)
                mask[i, plen:plen + len(c)] = 1
            res = self._forward(ids, self._cache_from(layers, b), attention_mask=mask)
            logp = torch.log_softmax(res.logits.float(), dim=-1)
            for i, c in enumerate(chunk):
                vals = [first[c[0]].item()]
                if len(c) > 1:
                    idx = torch.tensor(c[1:], device=dev)
                    vals += logp[i, torch.arange(len(c) - 1, device=dev), idx].tolist()
                out.append(vals)
        return out

    def token_logprobs_uncached(self, head: list[int], tail: list[int], cand_ids: list[list[int]]) -> list[list[float]]:
        """Reference: one full forward per candidate, no cache (checks the cached path)."""
        import torch

        prefix = head + tail
        out = []
        with torch.inference_mode():
            for c in cand_ids:
                ids = torch.tensor([prefix + c], device=self.model.device)
                logp = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), dim=-1)
                p = len(prefix)
                out.append([logp[p - 1 + j, t].item() for j, t in enumerate(c)])
        return out

    def score_commands(self, messages: list[dict], commands: Sequence[str], static: str = "",
                       cached: bool = True) -> list[float]:
        head, tail, cands = self.encode(messages, commands, static)
        fn = self.token_logprobs if cached else self.token_logprobs_uncached
        self.last_info = {"prompt_tokens": len(head) + len(tail)}
        return self._aggregate(fn(head, tail, cands))

    def act(self, task: Task, history: Sequence[TrajectoryStep], observation: Observation, memory: str) -> str:
        commands = list(observation.admissible_commands)
        if not commands:
            raise AgentError("no admissible commands")
        messages, static = self.prompt_parts(task, history, observation, memory)
        scores = self.score_commands(messages, commands, static)
        recent = [s.action for s in list(history)[-self.repeat_window:]] if self.repeat_window > 0 else []
        adjusted = [s - self.repeat_penalty * recent.count(c) for s, c in zip(scores, commands)]
        prior = [0.0] * len(commands)
        if self.memory_prior:
            prior = route_prior(split_memory(memory)[0], [s.action for s in history], commands)
            adjusted = [a + self.memory_prior * p for a, p in zip(adjusted, prior)]
        best = max(range(len(commands)), key=lambda i: (adjusted[i], -i))
        self.last_info.update(score=round(scores[best], 4), n_commands=len(commands), prior=round(prior[best], 3))
        return commands[best]


class HTTPCommandAgent(_PromptMixin):
    """Asks an LLM backend (e.g. a vLLM server) for the number of the next command."""

    def __init__(self, backend, history_steps: int = 3, max_observation_chars: int = 600,
                 max_memory_chars: int = 1500, max_new_tokens: int = 8, system_prompt: str = HTTP_SYSTEM_PROMPT):
        self.backend = backend
        self.history_steps, self.max_observation_chars = history_steps, max_observation_chars
        self.max_memory_chars, self.max_new_tokens, self.system_prompt = max_memory_chars, max_new_tokens, system_prompt
        self.name = f"http:{getattr(backend, 'name', type(backend).__name__)}"
        self.last_info: dict = {}

    def messages(self, task: Task, history, observation: Observation, memory: str) -> list[dict]:
        cmds = "\n".join(f"{i}. {c}" for i, c in enumerate(observation.admissible_commands, 1))
        long_term, short_term = split_memory(memory)
        body = self._static(task, long_term) + self._dynamic(history, observation, short_term)
        user = (f"{body}\n\nValid commands:\n{cmds}\n\n"
                f"Reply with the number of the next command (1-{len(observation.admissible_commands)}).")
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}]

    @staticmethod
    def parse(reply: str, commands: Sequence[str]) -> tuple[str, str]:
        """(command, how): a number in range, else a command quoted verbatim, else best word overlap."""
        for m in re.finditer(r"\d+", reply or ""):
            n = int(m.group())
            if 1 <= n <= len(commands):
                return commands[n - 1], "number"
        low = (reply or "").lower()
        quoted = [c for c in commands if c.lower() in low]
        if quoted:
            return max(quoted, key=len), "text"
        words = set(re.findall(r"[a-z]+", low))
        overlap = [len(words & set(c.split())) for c in commands]
        return commands[max(range(len(commands)), key=lambda i: (overlap[i], -i))], "fallback"

    def act(self, task: Task, history: Sequence[TrajectoryStep], observation: Observation, memory: str) -> str:
        commands = list(observation.admissible_commands)
        if not commands:
            raise AgentError("no admissible commands")
        (reply,) = self.backend.generate([self.messages(task, history, observation, memory)], self.max_new_tokens)
        command, how = self.parse(reply, commands)
        self.last_info = {"reply": _clip(reply, 80), "parse": how, "n_commands": len(commands)}
        return command


class WalkthroughAgent:
    """Oracle baseline: replays the game's winning walkthrough (``task.meta['walkthrough']``), skipping the
    commands a pruned action space does not offer (``inventory``, ``drop knife``/``take knife`` no-op pairs)."""

    name = "walkthrough"

    def __init__(self):
        self.last_info: dict = {}
        self._pos = 0

    def act(self, task: Task, history, observation: Observation, memory: str) -> str:
        if not history:
            self._pos = 0
        plan = list(task.meta.get("walkthrough", []))
        allowed = set(observation.admissible_commands)
        while self._pos < len(plan):
            cmd = plan[self._pos]
            self._pos += 1
            if cmd in allowed:
                return cmd
        if not observation.admissible_commands:
            raise AgentError("walkthrough exhausted and no admissible commands")
        return observation.admissible_commands[0]


class RandomCommandAgent:
    """Uniform random admissible command, seeded per task (a reproducible floor)."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.last_info: dict = {}

    def act(self, task: Task, history, observation: Observation, memory: str) -> str:
        if not observation.admissible_commands:
            raise AgentError("no admissible commands")
        rng = random.Random(f"{self.seed}:{task.task_id}:{len(history)}")
        return rng.choice(list(observation.admissible_commands))


def _in_decider(in_policy) -> Callable[[Task, int, str], bool]:
    if callable(in_policy):
        return in_policy
    if in_policy == "inject":
        return lambda task, index, summary: True
    if in_policy == "never":
        return lambda task, index, summary: False
    raise ValueError(f"in_policy must be one of {IN_POLICIES} or a callable, got {in_policy!r}")


def run_episode(env, agent, task: Task, begin_provider: str | None = None, begin_memory: str = "",
                in_policy="never", short_term=None, max_steps: int = 30) -> Trajectory:
    """Play one task; errors (agent, LLM, environment, short-term memory) end the rollout into ``error``.

    Each step's ``meta`` keeps the short-term summary that was available (``stm``) whether or not it was
    injected, so a judge can score NoOp decisions later, plus ``query``, timing and agent details.
    """
    decide = _in_decider(in_policy)
    steps: list[TrajectoryStep] = []
    obs: Observation | None = None
    error = None
    t0 = time.perf_counter()
    meta: dict = {"in_policy": in_policy if isinstance(in_policy, str) else getattr(in_policy, "__name__", "callable"),
                  "max_steps": max_steps}
    try:
        obs = env.reset(task)
        meta["initial_observation"] = obs.text
        for index in range(max_steps):
            if obs.done:
                break
            summary = short_term.summary() if short_term is not None else ""
            query = bool(summary and summary.strip()) and bool(decide(task, index, summary))
            injected = summary if query else ""
            t = time.perf_counter()
            action = agent.act(task, steps, obs, compose_memory(begin_memory, injected))
            act_s = time.perf_counter() - t
            obs = env.step(action)
            info = dict(getattr(agent, "last_info", {}) or {})
            step = TrajectoryStep(index=index, observation=obs.text, action=action, injected=injected,
                                  meta={"stm": summary, "query": query, "act_s": round(act_s, 4),
                                        "score": obs.score, **info})
            steps.append(step)
            if short_term is not None:
                short_term.update(step)
    except Exception as err:  # noqa: BLE001 - a failed rollout is data, not a crash
        error = f"{type(err).__name__}: {err}"
        meta["traceback"] = traceback.format_exc(limit=4)
    meta["elapsed_s"] = round(time.perf_counter() - t0, 4)
    success = bool(obs is not None and obs.won and error is None)
    return Trajectory(task=task, steps=steps, success=success, reward=float(obs.score) if obs is not None else 0.0,
                      begin_provider=begin_provider, begin_memory=begin_memory, error=error, meta=meta)
