"""Router-Mem sufficiency router: verbalizers, padding, scoring math, decisions, export (DESIGN §3, §5, §9)."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from pathlib import Path

import pytest
import torch

import routers.sufficiency as suff
from conftest import make_tiny_llama
from routers.base import load_router
from routers.sufficiency import (CONTINUE, NO_WORDS, TERMINATE, YES_WORDS, SufficiencyRouter, build_prompt,
                                 group_log_probs, left_pad, sufficiency_score, verbalizer_ids)

# The ids DESIGN §3 lists for SmolLM2 (used only to check the derived ids, never by the source).
DESIGN_YES = {"yes": 10407, " yes": 9805, "Yes": 10539, " Yes": 9230}
DESIGN_NO = {"no": 4607, " no": 787, "No": 5230, " No": 2838}

QUESTIONS = ["When did Caroline go to the LGBTQ support group?", "What is Melanie's hobby?",
             "Where did they travel?"]
CONTEXTS = ["[D1:3] (1:56 pm on 8 May, 2023) Caroline: I went to a LGBTQ support group yesterday.",
            "[D2:1] Melanie: I love painting sunsets.\n[D2:5] Melanie: Pottery is my new thing, and I run "
            "every morning before work.\n[D3:2] Caroline: That's great!",
            ""]


@pytest.fixture(scope="module")
def router(smollm2_tokenizer):
    return SufficiencyRouter.from_model(make_tiny_llama(smollm2_tokenizer), smollm2_tokenizer)


@pytest.fixture(scope="module")
def exported(router, tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "router"
    router.save_pretrained(path)
    return path


def _tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


# -- verbalizers -------------------------------------------------------------------------------------
def test_verbalizer_ids_match_design(smollm2_tokenizer):
    yes = verbalizer_ids(smollm2_tokenizer, YES_WORDS)
    no = verbalizer_ids(smollm2_tokenizer, NO_WORDS)
    assert set(DESIGN_YES.values()) <= set(yes)
    assert set(DESIGN_NO.values()) <= set(no)
    assert yes[:4] == [10407, 9805, 10539, 9230]  # word order, bare form before spaced form
    assert no[:4] == [4607, 787, 5230, 2838]
    assert set(yes).isdisjoint(no) and len(set(yes)) == len(yes) and len(set(no)) == len(no)
    for form, tid in {**DESIGN_YES, **DESIGN_NO}.items():
        assert smollm2_tokenizer.decode([tid]) == form
    for tid in yes:
        assert smollm2_tokenizer.decode([tid]).strip().lower() == "yes"
    for tid in no:
        assert smollm2_tokenizer.decode([tid]).strip().lower() == "no"


def test_verbalizer_ids_not_hard_coded():
    source = inspect.getsource(suff)
    for tid in [*DESIGN_YES.values(), *DESIGN_NO.values()]:
        assert str(tid) not in source


class _FakeTok:
    def __init__(self, table):
        self.table = table

    def encode(self, text, add_special_tokens=False):
        return self.table.get(text, [900, 901])  # unknown forms are multi-token


def test_verbalizer_ids_derived_from_any_tokenizer():
    tok = _FakeTok({"yes": [3], " yes": [3], "Yes": [7], " Yes": [1, 2], "YES": [11]})
    assert verbalizer_ids(tok, YES_WORDS) == [3, 7, 11]  # duplicates once, multi-token forms skipped
    with pytest.raises(ValueError, match="single token"):
        verbalizer_ids(_FakeTok({}), NO_WORDS)


# -- padding and scoring math ------------------------------------------------------------------------
def test_left_pad_exact():
    out = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert set(out) == {"input_ids", "attention_mask", "position_ids"}
    for v in out.values():
        assert v.dtype == torch.long
    assert torch.equal(out["input_ids"], torch.tensor([[5, 6, 7], [0, 0, 8]]))
    assert torch.equal(out["attention_mask"], torch.tensor([[1, 1, 1], [0, 0, 1]]))
    assert torch.equal(out["position_ids"], torch.tensor([[0, 1, 2], [0, 0, 0]]))
    out = left_pad([[4], [1, 2], [9, 9, 9, 9]], pad_id=2)
    assert torch.equal(out["input_ids"], torch.tensor([[2, 2, 2, 4], [2, 2, 1, 2], [9, 9, 9, 9]]))
    assert torch.equal(out["position_ids"], torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 2, 3]]))


def test_padding_safe_mask_exact():
    """causal & padding, plus the diagonal: the two left-pad queries of row 1 see only themselves."""
    mask = suff.padding_safe_mask(torch.tensor([[1, 1, 1], [0, 0, 1]]))
    assert mask.shape == (2, 1, 3, 3) and mask.dtype == torch.bool
    assert torch.equal(mask[0, 0].int(), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]))
    assert torch.equal(mask[1, 0].int(), torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1]]))
    assert bool(mask.any(-1).all())  # no empty attention row anywhere


def test_padding_safe_mask_keeps_real_token_outputs_and_gradients(router, smollm2_tokenizer):
    """Same last-token logits and hidden states as the plain 2D mask, and finite gradients."""
    seqs = [smollm2_tokenizer.encode(t) for t in ("a long question about the garden party", "hi", "one two")]
    batch = left_pad(seqs, smollm2_tokenizer.pad_token_id)
    model = router.model
    plain, out_plain = suff.last_token_logits(model, batch, output_hidden_states=True)
    safe, out_safe = suff.last_token_logits(model, {**batch, "attention_mask": suff.padding_safe_mask(batch["attention_mask"])},
                                            output_hidden_states=True)
    assert torch.allclose(plain, safe, atol=1e-5, rtol=0)
    for a, b in zip(out_plain.hidden_states, out_safe.hidden_states):
        assert torch.allclose(a[:, -1], b[:, -1], atol=1e-5, rtol=0)
    model.zero_grad()
    safe.logsumexp(-1).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.zero_grad()


def test_group_log_probs_and_score_by_hand():
    rows = [[0.0, 1.0, 2.0, 0.0, -1.0, 0.5], [3.0, -2.0, 0.0, 1.5, 0.0, 4.0]]
    logits = torch.tensor(rows)
    yes, no = [1, 3], [2, 5]
    lp_yes, lp_no = group_log_probs(logits, yes, no)
    exp_yes, exp_no, exp_s = [], [], []
    for r in rows:
        z = sum(math.exp(v) for v in r)
        p_yes = (math.exp(r[1]) + math.exp(r[3])) / z
        p_no = (math.exp(r[2]) + math.exp(r[5])) / z
        exp_yes.append(math.log(p_yes))
        exp_no.append(math.log(p_no))
        exp_s.append(p_yes / (p_yes + p_no))
    torch.testing.assert_close(lp_yes, torch.tensor(exp_yes))
    torch.testing.assert_close(lp_no, torch.tensor(exp_no))
    s = sufficiency_score(logits, yes, no)
    torch.testing.assert_close(s, torch.tensor(exp_s))
    torch.testing.assert_close(s[0], torch.tensor((math.e + 1) / (math.e + 1 + math.e ** 2 + math.exp(0.5))))
    # half precision input is scored in fp32; the score is invariant to a constant logit shift
    torch.testing.assert_close(sufficiency_score(logits.half(), yes, no), torch.tensor(exp_s), atol=2e-3, rtol=0)
    torch.testing.assert_close(sufficiency_score(logits + 100.0, yes, no), s)
    assert s.dtype == torch.float32


# -- scoring with the tiny model ---------------------------------------------------------------------
def test_build_prompt_uses_chat_template(smollm2_tokenizer):
    prompt = build_prompt(smollm2_tokenizer, "Q?", "CTX")
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "Question: Q?" in prompt and "CTX" in prompt and suff.SYSTEM_PROMPT in prompt
    assert "Evidence analysis: because" in build_prompt(smollm2_tokenizer, "Q?", "CTX", rationale="because")


def test_batched_scores_equal_single(router):
    lengths = [len(e) for e in router.encode(QUESTIONS, CONTEXTS)]
    assert len(set(lengths)) == 3  # different lengths, so the batch really is left-padded
    batched = router.score(QUESTIONS, CONTEXTS, batch_size=3)
    alone = torch.stack([router.score(q, c)[0] for q, c in zip(QUESTIONS, CONTEXTS)])
    assert batched.shape == (3,) and batched.dtype == torch.float32
    assert torch.isfinite(batched).all() and ((batched > 0) & (batched < 1)).all()
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    assert batched.unique().numel() == 3  # the inputs actually matter
    # results go back to their input positions whatever the length-sorted batch order
    rev = router.score(QUESTIONS[::-1], CONTEXTS[::-1], batch_size=2)
    torch.testing.assert_close(rev, batched.flip(0), atol=1e-5, rtol=0)


def test_score_matches_manual_forward(router):
    ids = router.encode(QUESTIONS[:1], CONTEXTS[:1])[0]
    with torch.no_grad():
        logits = router.model(torch.tensor([ids])).logits[:, -1, :]
    expected = sufficiency_score(logits, router.config.yes_token_ids, router.config.no_token_ids)
    torch.testing.assert_close(router.score(QUESTIONS[0], CONTEXTS[0]), expected, atol=1e-5, rtol=0)


def test_score_length_mismatch(router):
    with pytest.raises(ValueError, match="2 questions but 1 contexts"):
        router.score(QUESTIONS[:2], CONTEXTS[:1])


def test_decide(router):
    assert router.decide([0.2, 0.7, float("nan")], threshold=0.5) == [CONTINUE, TERMINATE, CONTINUE]
    assert router.decide(torch.tensor([0.2, 0.7, float("nan")]), 0.5) == ["continue", "terminate", "continue"]
    assert router.decide(0.5) == [TERMINATE]  # s >= tau terminates, default tau from the config
    assert router.decide([0.49999]) == [CONTINUE]
    assert router.decide([0.7], threshold=0.9) == [CONTINUE]


def test_input_budget_makes_long_contexts_continue(smollm2_tokenizer, router):
    short_len = len(router.encode(QUESTIONS[:1], CONTEXTS[:1])[0])
    budget = SufficiencyRouter(router.model, smollm2_tokenizer,
                               suff.SufficiencyConfig(router.config.yes_token_ids, router.config.no_token_ids,
                                                      threshold=0.0, max_input_tokens=short_len))
    long_ctx = CONTEXTS[0] + " more words" * 50
    s = budget.score([QUESTIONS[0], QUESTIONS[0]], [long_ctx, CONTEXTS[0]])
    assert math.isnan(s[0]) and not math.isnan(s[1])
    torch.testing.assert_close(s[1], router.score(QUESTIONS[0], CONTEXTS[0])[0], atol=1e-5, rtol=0)
    # tau = 0 would terminate on any real score; the over-budget one still continues
    assert budget.decide(s) == [CONTINUE, TERMINATE]
    assert torch.isnan(budget.score([QUESTIONS[0]], [long_ctx])).all()


# -- export ------------------------------------------------------------------------------------------
def test_export_files(router, exported):
    names = set(os.listdir(exported))
    assert {"router_config.json", "calibration.json", "README.md", "model.safetensors", "config.json",
            "tokenizer.json"} <= names
    cfg = json.loads((exported / "router_config.json").read_text())
    assert cfg["router_type"] == "sufficiency" and cfg["schema_version"] == 1
    assert cfg["yes_token_ids"] == router.config.yes_token_ids
    assert cfg["no_token_ids"] == router.config.no_token_ids
    assert cfg["threshold"] == 0.5 and cfg["max_input_tokens"] == 1024
    assert cfg["user_template"] == suff.USER_TEMPLATE and cfg["system_prompt"] == suff.SYSTEM_PROMPT
    assert set(cfg["labels"]) == {"0", "1"}
    versions = cfg["library_versions"]
    assert versions["torch"] == torch.__version__ and "transformers" in versions and "python" in versions
    assert "git_revision" in cfg
    assert json.loads((exported / "calibration.json").read_text()) == {"threshold": 0.5}
    card = (exported / "README.md").read_text()
    assert card.startswith("---\n") and "\nlibrary_name: transformers\n" in card.split("---")[1]
    assert str(router.config.yes_token_ids) in card
    assert not [n for n in os.listdir(exported.parent) if n != exported.name]  # no temp dirs left


def test_from_pretrained_reproduces_scores(router, exported):
    loaded = SufficiencyRouter.from_pretrained(exported, device="cpu")
    assert loaded.config == router.config
    assert loaded.encode(QUESTIONS, CONTEXTS) == router.encode(QUESTIONS, CONTEXTS)  # same tokenizer + template
    assert torch.equal(loaded.score(QUESTIONS, CONTEXTS), router.score(QUESTIONS, CONTEXTS))


def test_load_router_dispatches(router, exported, tmp_path):
    loaded = load_router(exported, device="cpu")
    assert type(loaded) is SufficiencyRouter and loaded.router_type == "sufficiency"
    assert torch.equal(loaded.score(QUESTIONS[:1], CONTEXTS[:1]), router.score(QUESTIONS[:1], CONTEXTS[:1]))
    other = tmp_path / "other"
    other.mkdir()
    (other / "router_config.json").write_text(json.dumps({"router_type": "no-such-router"}))
    with pytest.raises(ValueError, match="unknown router_type 'no-such-router'"):
        load_router(other)
    with pytest.raises(ValueError, match="expected 'sufficiency'"):
        SufficiencyRouter.from_pretrained(other)


def test_calibration_threshold_applies_on_load(router, tmp_path):
    path = router.save_pretrained(tmp_path / "calibrated", calibration={"threshold": 0.8, "ece": 0.1})
    loaded = SufficiencyRouter.from_pretrained(path, device="cpu")
    assert loaded.config.threshold == 0.8 and loaded.calibration == {"threshold": 0.8, "ece": 0.1}
    assert loaded.decide([0.79, 0.8]) == [CONTINUE, TERMINATE]
    assert router.config.threshold == 0.5  # the in-memory router is not changed by exporting


def test_atomic_export_on_failure(router, tmp_path, monkeypatch):
    target = tmp_path / "export"
    router.save_pretrained(target)
    before = _tree_digest(target)
    assert "model.safetensors" in before

    def explode(*args, **kwargs):
        raise RuntimeError("disk full while saving the tokenizer")

    monkeypatch.setattr(router.tokenizer, "save_pretrained", explode)
    with pytest.raises(RuntimeError, match="disk full"):
        router.save_pretrained(target, calibration={"threshold": 0.9})
    monkeypatch.undo()
    assert _tree_digest(target) == before
    assert os.listdir(tmp_path) == ["export"]  # no temp or .old dirs left behind
    # a failed first export leaves nothing at all
    monkeypatch.setattr(router.tokenizer, "save_pretrained", explode)
    with pytest.raises(RuntimeError):
        router.save_pretrained(tmp_path / "fresh")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["export"]
    # and a later successful export replaces the previous one completely
    router.save_pretrained(target, calibration={"threshold": 0.9})
    assert json.loads((target / "calibration.json").read_text()) == {"threshold": 0.9}
    assert os.listdir(tmp_path) == ["export"]
