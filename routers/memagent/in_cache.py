"""Incremental In decisions: the router's KV cache follows the growing In prompt of a task (issue 18).

The In prompt (``prompts.InLog``) is laid out static-first: system, task goal, then the task's append-only
short-term memory log (each line tagged with the step that added it), and only then the question, with no
per-step text. Consecutive In prompts of a task therefore share everything up to the end of the previous log
(a step that adds nothing asks the same prompt again: one token re-run), and :class:`PrefixKVCache` runs only
what is new:

* it keeps the KV cache and token ids of the last prompt it scored, crops the cache back to the longest
  common token prefix with the next prompt (at least one prompt token is always re-run: its logits score
  the first completion token), and runs the rest of the prompt **and** the candidate completions in one
  forward: one packed row with a tree attention mask (prompt tokens causal; each candidate sees the
  prompt and itself) and only the logits rows the scores need;
* the candidates (and the question, at the next step that adds a log line) are cropped off again, so the cache holds the
  prompt only; a new task keeps just the common prefix (system prompt), the rest is recomputed;
* the very same call again (a step that added nothing to the log: about half the steps of a worlds rollout)
  returns the last scores without a forward: same token ids and same weights give the same scores.

It works on token ids, so it is exact for any prompt text: the scores are those of
``router.sequence_log_probs`` on the full prompt (same ids, float rounding apart); a change of the model's
weights in place (training, ``load_state_dict``) drops the cache. The Begin prompt is laid out the same way
(provider descriptions first, the same for every task of a pool), so ``MemAgentRouter.score_begin`` keeps a
second cache that carries the descriptions from task to task and runs only the previews and goal. :class:`InDecisions`
is what ``MemAgentRouter.score_inject`` calls: one :class:`~routers.memagent.prompts.InLog` per task
(keyed by goal, the ``max_tasks`` most recent kept) and the cache; ``incremental = False`` scores the same
prompt text the uncached way (``MemAgentRouter.score_candidates``), for benchmarks and checks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Sequence

import torch

from routers.memagent import prompts as P
from routers.memagent.chat_tokens import common_prefix_length, encode_candidates, shared_prefix_length
from routers.models import kv_cache_kwarg, output_kv_cache


def _crop_to(cache, length: int) -> None:
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # this transformers' crop takes minus the number of tokens to drop


class PrefixKVCache:
    """Scores candidate completions of a prompt, reusing the KV cache of the previous prompt's common prefix."""

    def __init__(self, model):
        self.model = model
        self.ids: list[int] = []      # the prompt tokens the cache holds
        self.cache = None
        self.last_reused = 0
        self.version = None           # the weights the cache was computed with
        self.last = None              # (sequences, starts, scores) of the last call: an identical call reruns nothing

    def reset(self) -> None:
        self.ids, self.cache, self.last_reused, self.last = [], None, 0, None

    def weights_version(self) -> tuple:
        """Device, dtype and the sum of the parameters' in-place version counters (an optimizer step or a
        weight load changes it): the cache is valid only for the weights it was computed with."""
        first = next(self.model.parameters())
        return str(first.device), first.dtype, sum(p._version for p in self.model.parameters())

    @torch.inference_mode()
    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> torch.Tensor:
        """sum_{j >= start} log p(x_j | x_<j) per sequence (float32), as ``router.sequence_log_probs``."""
        if not sequences:
            return torch.zeros(0)
        shared = shared_prefix_length(sequences, starts)
        if shared < 1:
            raise ValueError("candidates share no prompt prefix")
        prompt = list(sequences[0][:shared])
        version = self.weights_version()
        if version != self.version:
            self.reset()
            self.version = version
        key = (tuple(map(tuple, sequences)), tuple(starts))
        if self.last is not None and self.last[0] == key:  # same ids, same weights: the same scores, no forward
            self.last_reused = shared
            return self.last[1].clone()
        past = min(common_prefix_length(self.ids, prompt), shared - 1) if self.cache is not None else 0
        if past == 0:
            self.cache = None
        else:
            _crop_to(self.cache, past)
        new = prompt[past:]
        sufs = [list(s[shared:]) for s in sequences]
        lengths = [len(x) for x in sufs]
        param = next(self.model.parameters())
        device, dtype = param.device, param.dtype
        n, total = len(new), len(new) + sum(lengths)
        ids = torch.tensor([new + [t for x in sufs for t in x]], device=device)
        pos = torch.tensor([list(range(past, shared)) + [shared + j for m in lengths for j in range(m)]], device=device)
        mask = self._mask(past, n, lengths, dtype).to(device)
        keep = torch.tensor([n - 1, *range(n, total)], device=device)
        kwargs = {} if self.cache is None else {kv_cache_kwarg(self.model): self.cache}
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                         logits_to_keep=keep, **kwargs)
        self.cache = output_kv_cache(out)
        _crop_to(self.cache, shared)  # drop the candidates: the cache holds the prompt only
        self.ids, self.last_reused = prompt, past
        logp = torch.log_softmax(out.logits[0].float(), dim=-1).cpu()
        scores = torch.zeros(len(sequences))
        offset = 0
        for i, seq in enumerate(sequences):
            # row 0 predicts seq[shared]; row 1 + offset + k predicts the token after suffix token k
            rows = [0 if j == shared else 1 + offset + j - shared - 1 for j in range(starts[i], len(seq))]
            scores[i] = float(logp[rows, list(seq[starts[i]:])].sum())
            offset += lengths[i]
        self.last = (key, scores.clone())
        return scores

    @staticmethod
    def _mask(past: int, n: int, lengths: Sequence[int], dtype) -> torch.Tensor:
        """Additive 4D mask over [cache | new prompt tokens | candidates]: prompt tokens causal, each candidate
        sees the whole prompt and its own earlier tokens."""
        low = torch.finfo(dtype).min
        q = n + sum(lengths)
        mask = torch.full((1, 1, q, past + q), low, dtype=dtype)
        mask[..., :past] = 0
        mask[0, 0, :, past:past + n] = torch.triu(torch.full((q, n), low, dtype=dtype), diagonal=1)
        offset = past + n
        for m in lengths:
            rows = slice(offset - past, offset - past + m)
            mask[0, 0, rows, offset:offset + m] = torch.triu(torch.full((m, m), low, dtype=dtype), diagonal=1)
            offset += m
        return mask


class InDecisions:
    """A router's In decisions: the per-task logs (prompt text) and the incremental KV cache (scoring)."""

    def __init__(self, router, max_tasks: int = 16, incremental: bool = True):
        self.router = router
        self.max_tasks = max_tasks
        self.incremental = incremental
        self.logs: OrderedDict[str, P.InLog] = OrderedDict()
        self.kv = PrefixKVCache(router.model)

    def reset(self) -> None:
        """Forget every task's log and the cache (the next In prompt of a goal starts a new log)."""
        self.logs.clear()
        self.kv.reset()

    def messages(self, goal: str, step_index: int, state_summary: str) -> list[dict]:
        """Record this step in the goal's log and return its In prompt (``prompts.InLog.messages``)."""
        log = self.logs.pop(goal, None) or P.InLog()
        self.logs[goal] = log
        while len(self.logs) > self.max_tasks:
            self.logs.popitem(last=False)
        return log.messages(goal, step_index, state_summary)

    def score(self, goal: str, step_index: int, state_summary: str) -> torch.Tensor | None:
        """Log-probabilities of (Query, NoOp), or None over ``max_input_tokens``; appends to ``router.timings``."""
        prompt = self.messages(goal, step_index, state_summary)
        completions = [P.in_completion(True), P.in_completion(False)]
        if not self.incremental:
            return self.router.score_candidates([(prompt, completions)], "in")
        return score_cached(self.router, self.kv, prompt, completions, "in")


def score_cached(router, kv: PrefixKVCache, prompt: list[dict], completions: Sequence[str], phase: str):
    """``router.score_candidates`` for one prompt through ``kv`` (None over ``max_input_tokens``); the timing
    record (with the prompt tokens reused from the cache) goes to ``router.timings``."""
    t0 = time.perf_counter()
    pairs = encode_candidates(router.tokenizer, prompt, completions)
    seqs, starts = [p[0] for p in pairs], [p[1] for p in pairs]
    over = max(starts) > router.config.max_input_tokens
    scores = None if over else kv.score(seqs, starts)
    router.timings.append({"phase": phase, "seconds": time.perf_counter() - t0, "candidates": len(seqs),
                           "prompt_tokens": max(starts), "over_budget": over,
                           "reused_tokens": 0 if over else kv.last_reused})
    return scores
