"""Router-Mem evidence-sufficiency router: one forward pass, one decision token, yes/no.

The score is s = p_yes / (p_yes + p_no) where p_yes sums next-token probabilities over the "yes"
token group (``yes``, ``Yes``, `` yes``, ...) derived from the tokenizer, likewise p_no. The router
terminates retrieval when s >= tau; a prompt longer than the input budget always continues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from routers.base import PROBABILITY, ROUTER_CONFIG, ExportedRouter, RouterConfigError
from routers.models import left_pad, padding_safe_mask  # noqa: F401 (padding_safe_mask: re-exported for train/tests)

YES_WORDS = ("yes", "Yes", "YES")
NO_WORDS = ("no", "No", "NO")
SYSTEM_PROMPT = ("You decide whether retrieved memory is sufficient to answer a question. "
                 "Reply with one word: yes or no.")
# Memory first, question last: the question sits right before the decision token, which small
# models need (with the question first, SmolLM2-135M stayed at chance after 150 LoRA steps).
USER_TEMPLATE = ("Retrieved memory:\n{context}\n\nQuestion: {question}\n\n"
                 "Does the retrieved memory contain the information needed to answer this question? Answer yes or no.")
TEACHER_SUFFIX = "\n\nEvidence analysis: {rationale}"
TERMINATE, CONTINUE = "terminate", "continue"


def verbalizer_ids(tokenizer, words: Sequence[str]) -> list[int]:
    """Single-token ids for each word with and without a leading space (multi-token forms skipped)."""
    ids: list[int] = []
    for w in words:
        for form in (w, " " + w):
            enc = tokenizer.encode(form, add_special_tokens=False)
            if len(enc) == 1 and enc[0] not in ids:
                ids.append(enc[0])
    if not ids:
        raise ValueError(f"none of {list(words)} is a single token for this tokenizer")
    return ids


def build_prompt(tokenizer, question: str, context: str, rationale: str | None = None,
                 system_prompt: str = SYSTEM_PROMPT, user_template: str = USER_TEMPLATE) -> str:
    """Chat-formatted router input ending where the decision token goes (teacher adds a rationale)."""
    user = user_template.format(question=question, context=context)
    if rationale is not None:
        user += TEACHER_SUFFIX.format(rationale=rationale)
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system_prompt}\n\n{user}\nAnswer:"


def group_log_probs(last_logits: torch.Tensor, yes_ids: Sequence[int], no_ids: Sequence[int]):
    """log p_yes and log p_no: log-sum-exp of the full-vocabulary log-softmax over each group."""
    logp = torch.log_softmax(last_logits.float(), dim=-1)
    return (torch.logsumexp(logp[:, list(yes_ids)], dim=-1), torch.logsumexp(logp[:, list(no_ids)], dim=-1))


def sufficiency_score(last_logits: torch.Tensor, yes_ids, no_ids) -> torch.Tensor:
    """s = p_yes / (p_yes + p_no) = sigmoid(log p_yes - log p_no)."""
    lp_yes, lp_no = group_log_probs(last_logits, yes_ids, no_ids)
    return torch.sigmoid(lp_yes - lp_no)


def last_token_logits(model, batch: dict[str, torch.Tensor], output_hidden_states: bool = False):
    out = model(**batch, logits_to_keep=1, output_hidden_states=output_hidden_states, use_cache=False)
    return out.logits[:, -1, :], out


def _question_context_lists(questions, contexts) -> tuple[list[str], list[str]]:
    """Two strings -> one pair; two sequences of strings -> lists; any other mix is an error."""
    from routers.validation import RouterInputError, text_list

    if isinstance(questions, str) or isinstance(contexts, str):
        if not (isinstance(questions, str) and isinstance(contexts, str)):
            single, other, value = (("questions", "contexts", contexts) if isinstance(questions, str)
                                    else ("contexts", "questions", questions))
            raise RouterInputError(f"{single} is one string but {other} is {type(value).__name__}: give one "
                                   "question and one context as two strings, or two equally long lists")
        return [questions], [contexts]
    return text_list(questions, "questions"), text_list(contexts, "contexts")


@dataclass
class SufficiencyConfig:
    yes_token_ids: list[int]
    no_token_ids: list[int]
    threshold: float = 0.5
    max_input_tokens: int = 1024
    system_prompt: str = SYSTEM_PROMPT
    user_template: str = USER_TEMPLATE
    base_model: str | None = None

    TEMPLATE_FIELDS = ("question", "context")

    def __post_init__(self):
        self.check_values(self.__dict__)

    @classmethod
    def check_values(cls, values: dict) -> None:
        """ValueError for a value no router can work with (also run on every ``router_config.json`` read):
        thresholds in [0, 1], a positive input budget, non-empty verbalizers, and templates whose only
        placeholders are {question} and {context}."""
        from routers.validation import check_template, positive_int, probability

        if "threshold" in values:
            probability(values["threshold"], "threshold", error=ValueError)
        if "max_input_tokens" in values:
            positive_int(values["max_input_tokens"], "max_input_tokens", error=ValueError)
        for key in ("yes_token_ids", "no_token_ids"):
            if key in values and not values[key]:
                raise ValueError("yes_token_ids and no_token_ids must not be empty")
        for key in ("system_prompt", "user_template"):
            if isinstance(values.get(key), str):
                reason = check_template(values[key], cls.TEMPLATE_FIELDS, key)
                if reason:
                    raise ValueError(reason)


class SufficiencyRouter(ExportedRouter):
    """Load with :meth:`from_pretrained`; call :meth:`score` then :meth:`decide`."""

    router_type = "sufficiency"
    config_cls = SufficiencyConfig
    calibration_keys = {"threshold": PROBABILITY}

    def __init__(self, model, tokenizer, config: SufficiencyConfig, calibration: dict | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config
        self.calibration = calibration or {}

    @classmethod
    def from_model(cls, model, tokenizer, threshold: float = 0.5, max_input_tokens: int = 1024,
                   base_model: str | None = None) -> "SufficiencyRouter":
        cfg = SufficiencyConfig(verbalizer_ids(tokenizer, YES_WORDS), verbalizer_ids(tokenizer, NO_WORDS),
                                threshold=threshold, max_input_tokens=max_input_tokens, base_model=base_model)
        return cls(model, tokenizer, cfg)

    @classmethod
    def from_base(cls, name_or_path: str, device: str | None = None, dtype=None, **kwargs) -> "SufficiencyRouter":
        """An untrained router straight from a causal LM (the zero-shot baseline); ``dtype`` default float32."""
        from routers.models import default_device, load_causal_lm

        model, tok = load_causal_lm(name_or_path, dtype=dtype, device=device or default_device())
        return cls.from_model(model, tok, base_model=name_or_path, **kwargs)

    @classmethod
    def _load_weights(cls, path: Path, config: SufficiencyConfig, device: str | None = None, dtype=None) -> dict:
        """The merged causal LM (``dtype``, default float32) and tokenizer; verbalizer ids inside the vocabulary."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from routers.models import default_device
        from routers.validation import load_errors

        with load_errors(path, "model"):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        with load_errors(path, "tokenizer"):
            tok = AutoTokenizer.from_pretrained(path)
        vocab = model.get_output_embeddings().weight.shape[0]
        bad = [i for i in config.yes_token_ids + config.no_token_ids if not 0 <= i < vocab]
        if bad:
            raise RouterConfigError(f"{path / ROUTER_CONFIG}: verbalizer token id(s) {bad} outside the vocabulary (0..{vocab - 1})")
        return {"model": model.to(device or default_device()), "tokenizer": tok}

    # -- inference -----------------------------------------------------------------------------------
    def encode(self, questions: Sequence[str] | str, contexts: Sequence[str] | str) -> list[list[int]]:
        """Prompt token ids per (question, context); the inputs are checked as in :meth:`score`."""
        from routers.validation import RouterInputError

        questions, contexts = _question_context_lists(questions, contexts)
        if len(questions) != len(contexts):
            raise RouterInputError(f"{len(questions)} questions but {len(contexts)} contexts")
        prompts = [build_prompt(self.tokenizer, q, c, system_prompt=self.config.system_prompt,
                                user_template=self.config.user_template) for q, c in zip(questions, contexts)]
        return [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]

    @torch.inference_mode()
    def score(self, questions: Sequence[str] | str, contexts: Sequence[str] | str, batch_size: int = 8,
              progress: bool = False) -> torch.Tensor:
        """Normalized p_yes per (question, context); NaN where the prompt exceeds the input budget.

        Give one question and one context (two strings: a 1-element result), or two equally long sequences of
        strings. Anything else (None, numbers, bytes, dicts, a string with a list) is a RouterInputError (a
        TypeError and a ValueError) naming the argument and the index."""
        from routers.validation import positive_int

        batch_size = positive_int(batch_size, "batch_size")
        encoded = self.encode(questions, contexts)
        scores = torch.full((len(encoded),), float("nan"))
        keep = [i for i, e in enumerate(encoded) if len(e) <= self.config.max_input_tokens]
        # Sort by length so batches pad little; results are placed back by index.
        keep.sort(key=lambda i: len(encoded[i]))
        starts = range(0, len(keep), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="router score", unit="batch")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = next(self.model.parameters()).device
        for s in starts:
            idx = keep[s:s + batch_size]
            batch = {k: v.to(device) for k, v in left_pad([encoded[i] for i in idx], pad).items()}
            logits, _ = last_token_logits(self.model, batch)
            scores[idx] = sufficiency_score(logits, self.config.yes_token_ids, self.config.no_token_ids).cpu()
        return scores

    def decide(self, scores: torch.Tensor | Sequence[float] | float, threshold: float | None = None) -> list[str]:
        """"terminate" where s >= tau, else "continue" (over-budget NaN scores always continue).

        ``scores``: one score (python float, numpy scalar, 0-d tensor: a 1-element list comes back) or a 1-D
        sequence / tensor / array of scores in [0, 1] (NaN allowed). ``threshold`` (default: the config's
        tau) must be a finite number in [0, 1]."""
        from routers.validation import probability, score_list

        tau = probability(self.config.threshold if threshold is None else threshold, "threshold")
        vals = score_list(scores, "scores", 0.0, 1.0)
        return [TERMINATE if (not math.isnan(s) and s >= tau) else CONTINUE for s in vals]

    # -- export --------------------------------------------------------------------------------------
    def _description(self) -> dict:
        return {"labels": {"1": "sufficient (terminate)", "0": "insufficient (continue)"}}

    def _save_weights(self, directory: Path) -> None:
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def model_card(self, metrics: dict | None = None, training: dict | None = None) -> str:
        return default_model_card(self, metrics=metrics, training=training)


USAGE = """from routers.sufficiency import SufficiencyRouter
router = SufficiencyRouter.from_pretrained("path/to/this/dir")
s = router.score([question], [retrieved_context])
router.decide(s)  # ['terminate'] or ['continue']"""


def default_model_card(router: SufficiencyRouter, metrics: dict | None = None, training: dict | None = None) -> str:
    from routers.cards import build_card

    cfg = router.config
    return build_card(
        "sufficiency", title="Router-Mem evidence-sufficiency router",
        description=("Decides, after a cheap retrieval prefix, whether the retrieved memory already suffices to answer\n"
                     "the question (stop early) or the agent should expand memory (continue). One forward pass, one\n"
                     "decision token: s = p_yes / (p_yes + p_no) over the yes/no token groups."),
        usage=USAGE, base_model=cfg.base_model, training=training, metrics=metrics,
        details=[f"- yes tokens: {cfg.yes_token_ids}; no tokens: {cfg.no_token_ids}",
                 f"- threshold tau: {cfg.threshold}; input budget: {cfg.max_input_tokens} tokens (longer -> continue)",
                 f"- weights: merged full model, {str(router.model.dtype).removeprefix('torch.')}"],
        extra_tags=("router-mem", "memory-router"))
