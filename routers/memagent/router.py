"""The MemAgent router: Begin (which provider), In (inject short-term memory?), End (who stores).

Decisions score the candidate completions with the causal LM instead of generating text, so even a
small model always returns a valid option:

* the candidates' token sequences are exactly what SFT trained on (TRL prompt-completion: chat template
  with the generation prompt, then the assistant turn; the completion is everything after the common
  prefix), and a candidate's score is the summed log-probability of its completion tokens;
* the shared prompt prefix runs once (KV cache), then all candidate suffixes run in one forward,
  packed into one row with a tree attention mask (each candidate sees the prefix and itself), so the
  prefix cache is never replicated per candidate.

Begin: argmax over ``None`` + every provider. In: p(Query) = softmax over {Query, NoOp} >= ``in_threshold``.
End: **per-provider yes/no** (one question per provider, the same End body, all in the same batched
forward), store where p(yes) >= ``end_threshold``. Scoring all 2^13 subsets is infeasible and a greedy
list decode needs 14 sequential passes; the per-provider form is one pass and matches how the SFT data
expands each End record (``train.memagent`` turns a chosen subset into one yes/no sample per provider).
"""

from __future__ import annotations

import numbers
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from routers.base import PROBABILITY, ROUTER_CONFIG, ExportedRouter, RouterConfigError
from routers.memagent import prompts as P
from routers.memagent.chat_tokens import (chat_ids, common_prefix_length, encode_candidates,  # noqa: F401
                                          shared_prefix_length)
from routers.memagent.in_cache import InDecisions, PrefixKVCache, score_cached
from routers.models import kv_cache_kwarg, output_kv_cache, tree_attention_mask

ADAPTER_CONFIG = "adapter_config.json"


@torch.inference_mode()
def sequence_log_probs(model, sequences: Sequence[Sequence[int]], starts: Sequence[int],
                       max_batch_tokens: int = 4096) -> torch.Tensor:
    """sum_{j >= start} log p(x_j | x_<j) per sequence (float32).

    The common prefix runs once into a KV cache (batch 1); all candidate suffixes then run in one
    forward as a single packed row with a tree-shaped attention mask and their own position ids, so the
    prefix's cache is shared, never copied per candidate. Candidates are split into several forwards only
    when their suffixes exceed ``max_batch_tokens`` together (the cache is cropped back in between).
    """
    if not sequences:
        return torch.zeros(0)
    shared = shared_prefix_length(sequences, starts)
    if shared < 1:
        raise ValueError("candidates share no prompt prefix")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    out = model(input_ids=torch.tensor([list(sequences[0][:shared])], device=device), use_cache=True,
                logits_to_keep=1)
    first = torch.log_softmax(out.logits[0, -1].float(), dim=-1).cpu()
    cache = output_kv_cache(out)
    cache_kw = kv_cache_kwarg(model)
    scores = torch.zeros(len(sequences))
    chunks, current, size = [], [], 0
    for i, seq in enumerate(sequences):
        n = len(seq) - shared
        if current and size + n > max_batch_tokens:
            chunks.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    chunks.append(current)
    for idx in chunks:
        sufs = [list(sequences[i][shared:]) for i in idx]
        lengths = [len(x) for x in sufs]
        ids = torch.tensor([[t for x in sufs for t in x]], device=device)
        pos = torch.tensor([[shared + j for n in lengths for j in range(n)]], device=device)
        mask = tree_attention_mask(lengths, shared, dtype).to(device)
        logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                       **{cache_kw: cache}).logits
        extra = cache.get_seq_length() - shared
        if extra > 0:
            cache.crop(-extra)  # drop this chunk's tokens: the next chunk sees only the prefix
        logp = torch.log_softmax(logits[0].float(), dim=-1).cpu()
        offset = 0
        for i, n in zip(idx, lengths):
            seq, total = sequences[i], 0.0
            for j in range(starts[i], len(seq)):
                row = first if j == shared else logp[offset + j - shared - 1]
                total += float(row[seq[j]])
            scores[i] = total
            offset += n
    return scores


PHASES = ("begin", "in", "end")


def portable_adapter_config(file: Path, base_model: str | None) -> None:
    """Name the base model by its Hub id in ``adapter_config.json`` (peft writes the local path it was loaded
    from, e.g. the converted SmolLM2 cache folder), so ``AutoPeftModelForCausalLM`` loads the adapter anywhere.
    A base with no known Hub id keeps its path (logged)."""
    import json

    from routers.cards import hub_model_id
    from routers.io import atomic_write_json
    from routers.logs import get_logger

    data = json.loads(file.read_text(encoding="utf-8"))
    hub_id = hub_model_id(base_model) or hub_model_id(data.get("base_model_name_or_path"))
    if hub_id:
        data["base_model_name_or_path"] = hub_id
        atomic_write_json(file, data)
    else:
        get_logger(__name__).warning("%s: base model %s has no known Hugging Face Hub id; adapter_config.json keeps "
                                     "the local path (the adapter loads only where that path exists)", file,
                                     data.get("base_model_name_or_path"))


def _text(value, name: str) -> str:
    from routers.validation import RouterInputError

    if not isinstance(value, str):
        raise RouterInputError(f"{name} must be a string, got {type(value).__name__} {value!r:.80}")
    return value


def _pool(providers, name: str = "providers") -> Mapping[str, Any]:
    """The provider pool: a mapping provider name (str) -> provider."""
    from routers.validation import RouterInputError

    if not isinstance(providers, Mapping):
        raise RouterInputError(f"{name} must be a mapping of provider name -> provider, got "
                               f"{type(providers).__name__} {providers!r:.80}")
    for key in providers:
        if not isinstance(key, str) or not key.strip():
            raise RouterInputError(f"{name}: provider names must be non-empty strings, got {key!r:.80}")
    return providers


@dataclass
class MemAgentConfig:
    in_threshold: float = 0.5
    end_threshold: float = 0.5
    max_input_tokens: int = 4096          # longer prompts fall back: Begin None, In NoOp, End store nothing
    max_batch_tokens: int = 4096          # candidate suffix tokens per packed forward
    end_mode: str = "per_provider"
    provider_names: list[str] = field(default_factory=list)   # the pool the router was trained on (informative)
    base_model: str | None = None
    prompts: dict[str, str] = field(default_factory=lambda: {
        "begin_system": P.BEGIN_SYSTEM, "begin_question": P.BEGIN_QUESTION, "in_system": P.IN_SYSTEM,
        "in_question": P.IN_QUESTION, "end_system": P.END_SYSTEM, "end_provider_question": P.END_PROVIDER_QUESTION})
    completions: dict[str, Any] = field(default_factory=lambda: {
        "begin_none": P.NONE, "in": [P.QUERY, P.NOOP], "end": [P.YES, P.NO]})

    END_MODES = ("per_provider",)

    def __post_init__(self):
        self.check_values(self.__dict__)

    @classmethod
    def check_values(cls, values: dict) -> None:
        """ValueError for a value the router cannot work with (also run on every ``router_config.json`` read):
        thresholds in [0, 1], positive token budgets, a supported ``end_mode``."""
        from routers.validation import positive_int, probability

        for key in ("in_threshold", "end_threshold"):
            if key in values:
                probability(values[key], key, error=ValueError)
        for key in ("max_input_tokens", "max_batch_tokens"):
            if key in values:
                positive_int(values[key], key, error=ValueError)
        if "end_mode" in values and values["end_mode"] not in cls.END_MODES:
            raise ValueError(f"end_mode must be one of {list(cls.END_MODES)}, got {values['end_mode']!r:.80}")


class MemAgentRouter(ExportedRouter):
    """``begin`` / ``inject`` / ``end`` return decisions; ``score_*`` return the tensors behind them.

    Every decision appends ``{"phase", "seconds", "candidates", "prompt_tokens"}`` to ``timings``.
    """

    router_type = "memagent"
    config_cls = MemAgentConfig
    calibration_keys = {"in_threshold": PROBABILITY, "end_threshold": PROBABILITY}

    def __init__(self, model, tokenizer, config: MemAgentConfig | None = None, calibration: dict | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config or MemAgentConfig()
        self.calibration = calibration or {}
        self.timings: list[dict] = []
        self.in_decisions = InDecisions(self)  # per-task In logs + the incremental KV cache
        self.begin_kv = PrefixKVCache(self.model)  # Begin: the pool's provider descriptions, reused across tasks

    @classmethod
    def from_model(cls, model, tokenizer, **kwargs) -> "MemAgentRouter":
        return cls(model, tokenizer, MemAgentConfig(**kwargs))

    @classmethod
    def from_base(cls, name_or_path: str, device: str | None = None, **kwargs) -> "MemAgentRouter":
        """An untrained router straight from a causal LM (the zero-shot baseline)."""
        from routers.models import default_device, load_causal_lm

        model, tok = load_causal_lm(name_or_path, device=device or default_device())
        return cls.from_model(model, tok, base_model=name_or_path, **kwargs)

    @classmethod
    def _load_weights(cls, path: Path, config: MemAgentConfig, device: str | None = None, dtype=None) -> dict:
        """A merged model, or a LoRA adapter over ``config.base_model`` (``dtype``, default float32), and the
        tokenizer (pad token: eos when it has none)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from routers.models import default_device, resolve_causal_lm
        from routers.validation import load_errors

        dtype = dtype or torch.float32
        if (path / ADAPTER_CONFIG).exists():
            from peft import PeftModel

            if not config.base_model:
                raise RouterConfigError(f"{path / ROUTER_CONFIG}: an adapter export needs base_model")
            with load_errors(path, f"base model {config.base_model!r} (router_config.json base_model)"):
                base = AutoModelForCausalLM.from_pretrained(resolve_causal_lm(config.base_model), dtype=dtype)
            with load_errors(path, "LoRA adapter"):
                model = PeftModel.from_pretrained(base, str(path))
        else:
            with load_errors(path, "model"):
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        with load_errors(path, "tokenizer"):
            tok = AutoTokenizer.from_pretrained(path)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return {"model": model.to(device or default_device()), "tokenizer": tok}

    # -- scoring -------------------------------------------------------------------------------------
    def score_candidates(self, items: Sequence[tuple[Sequence[dict], Sequence[str]]], phase: str) -> torch.Tensor | None:
        """Completion log-probabilities for every (prompt, completions) pair, flattened in order.

        Returns None when a prompt exceeds ``max_input_tokens`` (the caller falls back).
        """
        t0 = time.perf_counter()
        seqs, starts = [], []
        for prompt, completions in items:
            for ids, start in encode_candidates(self.tokenizer, prompt, completions):
                seqs.append(ids)
                starts.append(start)
        longest = max(starts) if starts else 0
        if longest > self.config.max_input_tokens:
            scores = None
        else:
            scores = sequence_log_probs(self.model, seqs, starts, self.config.max_batch_tokens)
        self.timings.append({"phase": phase, "seconds": time.perf_counter() - t0, "candidates": len(seqs),
                             "prompt_tokens": longest, "over_budget": scores is None})
        return scores

    def score_begin(self, goal: str, previews, providers: Mapping[str, Any]) -> tuple[list[str | None], torch.Tensor | None]:
        """Options (None first, then the pool order) and their completion log-probabilities."""
        goal, providers = _text(goal, "goal"), _pool(providers)
        options: list[str | None] = [None, *providers]
        prompt = P.begin_messages(goal, previews, providers)
        return options, score_cached(self, self.begin_kv, prompt, [P.begin_completion(o) for o in options], "begin")

    def begin(self, goal: str, previews, providers: Mapping[str, Any]) -> str | None:
        options, scores = self.score_begin(goal, previews, providers)
        return None if scores is None else options[int(torch.argmax(scores))]

    def score_inject(self, goal: str, step_index: int, state_summary: str) -> torch.Tensor | None:
        """p(Query) over {Query, NoOp} (a 0-d tensor), or None over budget. Ask a task's steps in order."""
        from routers.validation import RouterInputError

        goal, state_summary = _text(goal, "goal"), _text(state_summary, "state_summary")
        if isinstance(step_index, bool) or not isinstance(step_index, numbers.Integral) or step_index < 0:
            raise RouterInputError(f"step_index must be a non-negative integer, got {step_index!r:.80}")
        step_index = int(step_index)
        scores = self.in_decisions.score(goal, step_index, state_summary)  # the task's log, KV cache reused
        return None if scores is None else torch.softmax(scores, dim=0)[0]

    def inject(self, goal: str, step_index: int, state_summary: str) -> bool:
        from routers.validation import probability

        tau = probability(self.config.in_threshold, "in_threshold")
        p = self.score_inject(goal, step_index, state_summary)
        return bool(p is not None and float(p) >= tau)

    def score_end(self, trajectory, providers: Mapping[str, Any]) -> torch.Tensor | None:
        """p(yes) per provider (pool order), all providers' yes/no candidates in one batched forward."""
        providers = _pool(providers)
        body = P.end_messages(trajectory, providers)
        items = [(P.end_provider_messages(body, name), [P.YES, P.NO]) for name in providers]
        scores = self.score_candidates(items, "end")
        if scores is None:
            return None
        return torch.softmax(scores.view(len(items), 2), dim=-1)[:, 0]

    def end(self, trajectory, providers: Mapping[str, Any]) -> list[str]:
        from routers.validation import probability

        tau = probability(self.config.end_threshold, "end_threshold")
        p = self.score_end(trajectory, providers)
        if p is None:
            return []
        return [name for name, s in zip(providers, p.tolist()) if s >= tau]

    # Router protocol (routers.base): score one phase's inputs, decide with a threshold.
    def score(self, phase: str, **inputs):
        if phase == "begin":
            return self.score_begin(**inputs)[1]
        if phase == "in":
            return self.score_inject(**inputs)
        if phase == "end":
            return self.score_end(**inputs)
        raise ValueError(f"unknown phase {phase!r}; expected begin, in or end")

    def decide(self, scores, threshold: float | None = None, phase: str = "in", options: Sequence | None = None):
        """Begin: the argmax option; In: bool; End: per-provider bools (``options`` names them).

        ``scores`` as the matching ``score_*`` returns it (None = over budget: the safe fallback). Begin takes
        the log-probabilities (1-D, ``options`` as long, when given); In one p(Query) in [0, 1] (float, 0-d
        tensor, numpy scalar); End the p(yes) per provider in [0, 1] (``options`` as long, when given).
        ``threshold`` (In / End; default from the config) must be a finite number in [0, 1]."""
        from routers.validation import RouterInputError, probability, score_list

        if phase not in PHASES:
            raise RouterInputError(f"unknown phase {phase!r:.80}; expected begin, in or end")
        if options is not None:
            options = list(options)
        if phase != "begin":
            default = self.config.in_threshold if phase == "in" else self.config.end_threshold
            tau = probability(default if threshold is None else threshold, "threshold")
        if scores is None:
            return None if phase == "begin" else (False if phase == "in" else [])
        if phase == "begin":
            vals = score_list(scores, "scores")
            if not vals or any(v != v for v in vals):
                raise RouterInputError(f"begin scores must be a non-empty list of numbers without NaN, "
                                       f"got {vals!r:.80}")
            if options and len(options) != len(vals):
                raise RouterInputError(f"{len(vals)} scores but {len(options)} options")
            best = max(range(len(vals)), key=lambda i: (vals[i], -i))  # ties: the earlier option, like argmax
            return options[best] if options else best
        vals = score_list(scores, "scores", 0.0, 1.0)
        if phase == "in":
            if len(vals) != 1:
                raise RouterInputError(f"the In decision takes one score (p(Query)), got {len(vals)}")
            return bool(vals[0] >= tau)
        if options and len(options) != len(vals):
            raise RouterInputError(f"{len(vals)} scores but {len(options)} options")
        keep = [v >= tau for v in vals]  # NaN is never >= tau: not stored
        return [o for o, k in zip(options, keep) if k] if options else keep

    # -- export --------------------------------------------------------------------------------------
    def _description(self) -> dict:
        return {"labels": {"begin": [P.NONE, *self.config.provider_names], "in": [P.QUERY, P.NOOP],
                           "end": [P.YES, P.NO]},
                "decision": {"begin": "argmax summed completion log-prob", "in": "softmax(Query, NoOp) >= in_threshold",
                             "end": "per provider softmax(yes, no) >= end_threshold"}}

    def save_pretrained(self, path: str | os.PathLike, model_card: str | None = None,
                        calibration: dict | None = None) -> Path:
        """Weights (merged model, or a LoRA adapter over ``base_model``), tokenizer, config, calibration, card."""
        if hasattr(self.model, "peft_config") and not self.config.base_model:
            raise ValueError("saving a LoRA adapter needs config.base_model")
        return super().save_pretrained(path, model_card=model_card, calibration=calibration)

    def _save_weights(self, directory: Path) -> None:
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        if (directory / ADAPTER_CONFIG).is_file():
            portable_adapter_config(directory / ADAPTER_CONFIG, self.config.base_model)

    def model_card(self, metrics: dict | None = None, training: dict | None = None) -> str:
        return default_model_card(self, metrics=metrics, training=training)


USAGE = """from routers.memagent.router import MemAgentRouter
router = MemAgentRouter.from_pretrained("path/to/this/dir")
name = router.begin(goal, previews, providers)        # provider name or None
query = router.inject(goal, step_index, state_summary)  # True = inject
stores = router.end(trajectory, providers)             # list of provider names"""


def default_model_card(router: MemAgentRouter, metrics: dict | None = None, training: dict | None = None) -> str:
    from routers.cards import build_card, hub_model_id

    cfg = router.config
    adapter = hasattr(router.model, "peft_config")
    base = hub_model_id(cfg.base_model) or cfg.base_model
    usage = USAGE
    if adapter:
        usage += ("\n# or, with peft only (the base model is named by its Hub id in adapter_config.json):\n"
                  "# AutoPeftModelForCausalLM.from_pretrained(\"path/to/this/dir\")")
    return build_card(
        "memagent", title="MemAgent memory router",
        description=("Routes an agent's memory across heterogeneous providers (MemAgent): **Begin** picks the provider to\n"
                     "retrieve from (or none), **In** decides each step whether to inject the short-term summary, **End**\n"
                     "picks the providers that store the finished trajectory. Decisions score the candidate completions'\n"
                     "log-probabilities (no free generation). End is scored per provider (yes/no)."),
        usage=usage, base_model=cfg.base_model, training=training, metrics=metrics, adapter=adapter,
        details=[f"- weights: {'LoRA adapter over ' + str(base) if adapter else 'merged full model'}, "
                 f"{str(router.model.dtype).removeprefix('torch.')}",
                 f"- thresholds: in {cfg.in_threshold}, end {cfg.end_threshold}; input budget {cfg.max_input_tokens} tokens",
                 f"- provider pool at training: {', '.join(cfg.provider_names) or '(not recorded)'}",
                 f"- decoder layers: {router.model.config.num_hidden_layers}"
                 + (f" (the first {training['layers_kept']} of the base's, pruned)" if (training or {}).get("layers_kept")
                    else "")],
        extra_tags=("memagent", "memory-router"))
