"""Incremental In decisions (issue 18): the append-only In log, the prefix KV cache (exact against the uncached
full-prompt scores), the SFT records' prompt text, and the ``memagent_in`` benchmark on the tiny model."""

from __future__ import annotations

import pytest
import torch

from routers.memagent import prompts as P

GOAL_A = "Find the silver key and put it on the table in the kitchen."
GOAL_B = "Cook the egg."
# Short-term summaries of one task, step by step (ShortTermMemory.summary() format): entries appear, move,
# get evicted; step 0 and 3 have nothing new (the router is not asked on an empty summary).
SUMMARIES = ["",
             "## Collected Data\n- The chest is closed.\n- It has a keyhole.",
             "## Collected Data\n- The chest is closed.\n- It has a keyhole.\n- You open the chest, revealing a key.",
             "## Collected Data\n- The chest is closed.\n- It has a keyhole.\n- You open the chest, revealing a key.",
             "## Collected Data\n- It has a keyhole.\n- You open the chest, revealing a key.\n- You take the key.\n"
             "## Pages Visited\n- Kitchen\n- Hall\n- Attic",
             "## Collected Data\n- You take the key.\n- The table is wooden.\n## Pages Visited\n- Kitchen\n- Hall\n- Attic"]


def _router(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.memagent.router import MemAgentRouter

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    return MemAgentRouter.from_model(model, AutoTokenizer.from_pretrained(tiny_llama_dir))


def _reference(router, prompt) -> torch.Tensor:
    """Today's uncached path on the same prompt text: the full prompt once, candidates tree-packed."""
    from routers.memagent.router import encode_candidates, sequence_log_probs

    pairs = encode_candidates(router.tokenizer, prompt, [P.QUERY, P.NOOP])
    return sequence_log_probs(router.model, [p[0] for p in pairs], [p[1] for p in pairs])


def test_in_log_is_append_only_and_static_first():
    log = P.InLog()
    prompts = [log.messages(GOAL_A, i, s) for i, s in enumerate(SUMMARIES)]
    users = [p[1]["content"] for p in prompts]
    assert users[0].startswith(f"Task: {GOAL_A}\n\n") and "(nothing collected yet)" in users[0]
    for a, b in zip(users[1:], users[2:]):  # each prompt extends the previous log: only the question follows it
        head = a[: a.rindex("\n\n" + P.IN_QUESTION)]
        assert b.startswith(head)
    assert users[3] == users[2]  # nothing new at step 3: the same prompt (the cache re-runs one token)
    last = users[-1]
    assert last.endswith(f"Attic\nStep 5, Collected Data: The table is wooden.\n\n{P.IN_QUESTION}")
    assert last.count("You take the key.") == 1 and "Step 3," not in last  # nothing new at step 3: no line
    assert "\nStep 4, Collected Data: You take the key.\nStep 4, Pages Visited: Kitchen | Hall | Attic\n" in last
    assert "\nStep 5, Collected Data: The table is wooden.\n" in last
    # asking the same step twice is idempotent; an earlier step or a new goal starts a new log
    assert log.messages(GOAL_A, 5, SUMMARIES[5]) == prompts[5]
    assert log.messages(GOAL_A, 1, SUMMARIES[1]) == P.in_messages(GOAL_A, 1, SUMMARIES[1])
    assert P.InLog().messages(GOAL_B, 2, SUMMARIES[2]) == P.in_messages(GOAL_B, 2, SUMMARIES[2])
    # the SFT records' helper feeds the same log (in step order, whatever the input order)
    steps = list(enumerate(SUMMARIES))
    assert P.in_step_prompts(GOAL_A, steps[::-1]) == dict(enumerate(prompts))


def test_in_log_caps_its_length():
    log = P.InLog()
    for i in range(200):
        msgs = log.messages(GOAL_A, i, f"## Collected Data\n- fact number {i} is about the {i}th drawer.\n- x{i}")
    text = log.text()
    assert len(text) <= P.IN_LOG_CHARS and text.startswith("(earlier steps omitted)")
    assert "fact number 199" in msgs[1]["content"] and "fact number 0 " not in msgs[1]["content"]


def test_incremental_scores_equal_uncached(tiny_llama_dir, one_torch_thread):
    router = _router(tiny_llama_dir)
    ref_logs = {GOAL_A: P.InLog(), GOAL_B: P.InLog()}
    seen = []
    # task A, then task B (a new goal: only the common prefix of the cache is kept), then A again from step 1
    # (a new episode), with a repeated step and a summary-free step skipped as run_episode does
    plan = [(GOAL_A, i) for i in range(len(SUMMARIES))] + [(GOAL_A, 5), (GOAL_B, 1), (GOAL_B, 2), (GOAL_B, 4),
                                                           (GOAL_A, 1), (GOAL_A, 2)]
    for goal, i in plan:
        if not SUMMARIES[i].strip():
            continue
        prompt_tokens_before = len(router.in_decisions.kv.ids)
        p = router.score_inject(goal, i, SUMMARIES[i])
        ref = _reference(router, ref_logs[goal].messages(goal, i, SUMMARIES[i]))
        assert torch.allclose(p, torch.softmax(ref, dim=0)[0], atol=1e-4)
        t = router.timings[-1]
        assert t["phase"] == "in" and t["candidates"] == 2 and not t["over_budget"]
        seen.append((goal, i, t["reused_tokens"], t["prompt_tokens"], prompt_tokens_before))
    # later steps of a task reuse all but the per-step tail; a new task or episode reuses only the shared prefix
    reuse = {(g, i): r for g, i, r, _, _ in seen}
    assert seen[0][2] == 0
    assert all(r > 0.6 * n for g, i, r, n, _ in seen[1:4])
    b1 = next(s for s in seen if s[0] == GOAL_B)
    assert 0 < b1[2] < 0.6 * b1[4]
    assert reuse[(GOAL_A, 1)] > 0  # the last (GOAL_A, 1): the system prompt is still shared


def test_prefix_cache_matches_sequence_log_probs_on_any_prompts(tiny_llama_dir, one_torch_thread):
    from routers.memagent.in_cache import PrefixKVCache
    from routers.memagent.router import sequence_log_probs

    router = _router(tiny_llama_dir)
    cache = PrefixKVCache(router.model)
    base = list(range(100, 160))
    cases = [
        ([base + [5, 6, 7], base + [8, 9]], [60, 60]),               # fresh cache
        ([base + [11] + [5, 6], base + [11] + [8]], [61, 61]),        # the prompt grew by one token
        ([base + [11] + [5, 6], base + [11] + [8]], [61, 61]),        # identical prompt: one token re-run
        ([base[:30] + [5, 6, 7, 8], base[:30] + [5, 9]], [31, 31]),   # shorter prompt, candidates share a token
        ([base + [1, 2, 3, 4], base + [1, 2, 5]], [62, 62]),         # completions start after the shared prefix
        ([list(range(300, 340)) + [5], list(range(300, 340)) + [6]], [40, 40]),  # nothing in common
    ]
    for seqs, starts in cases:
        got = cache.score(seqs, starts)
        ref = sequence_log_probs(router.model, seqs, starts)
        assert torch.allclose(got, ref, atol=1e-4 * max(1.0, float(ref.abs().max()))), (seqs, got, ref)  # sums
        assert cache.cache.get_seq_length() == len(cache.ids)  # candidates cropped off
    with pytest.raises(ValueError, match="share no prompt prefix"):
        cache.score([[1, 2], [3, 4]], [0, 0])


def test_begin_reuses_the_pools_descriptions_across_tasks_and_matches_uncached(tiny_llama_dir, one_torch_thread):
    from routers.memagent.protocol import Preview
    from routers.memagent.providers import build_providers
    from memagent_provider_fakes import HashEncoder

    router = _router(tiny_llama_dir)
    pool = {k: v for k, v in build_providers(encoder=HashEncoder()).items() if k in ("voyager", "memp", "awm")}
    tasks = [(GOAL_A, [Preview("memp", 0.7, "go north; take silver key from chest", 3)]),
             (GOAL_B, [Preview("voyager", 0.2, "crack the egg, then fry it", 9), Preview("awm", 0.0, "", 0)]),
             (GOAL_A, [])]
    for i, (goal, previews) in enumerate(tasks):
        options, got = router.score_begin(goal, previews, pool)
        prompt = P.begin_messages(goal, previews, pool)
        ref = router.score_candidates([(prompt, [P.begin_completion(o) for o in options])], "begin")
        assert torch.allclose(got, ref, atol=1e-4 * max(1.0, float(ref.abs().max())))
        cached = [t for t in router.timings if t["phase"] == "begin" and "reused_tokens" in t][-1]
        static = len(router.tokenizer.apply_chat_template(  # the descriptions and options, up to the previews
            [prompt[0], {"role": "user", "content": prompt[1]["content"].split("Probe previews")[0]}], tokenize=True))
        assert (cached["reused_tokens"] >= static - 8) if i else cached["reused_tokens"] == 0


def test_prefix_cache_is_dropped_when_the_weights_change(tiny_llama_dir, one_torch_thread):
    from routers.memagent.in_cache import PrefixKVCache
    from routers.memagent.router import sequence_log_probs

    router = _router(tiny_llama_dir)
    cache = PrefixKVCache(router.model)
    seqs, starts = [list(range(100, 150)) + [5], list(range(100, 150)) + [6]], [50, 50]
    cache.score(seqs, starts)
    with torch.no_grad():  # a training step / weight load changes the weights in place
        next(router.model.parameters()).mul_(1.5)
    got = cache.score([s[:40] + [7] for s in seqs], [40, 40])
    ref = sequence_log_probs(router.model, [s[:40] + [7] for s in seqs], [40, 40])
    assert cache.last_reused == 0 and torch.allclose(got, ref, atol=1e-4 * max(1.0, float(ref.abs().max())))


def test_an_identical_call_reruns_nothing_until_the_weights_change(tiny_llama_dir, one_torch_thread):
    from routers.memagent.in_cache import PrefixKVCache
    from routers.memagent.router import sequence_log_probs

    router = _router(tiny_llama_dir)
    cache = PrefixKVCache(router.model)
    calls = []
    router.model.register_forward_pre_hook(lambda *_: calls.append(1))
    seqs, starts = [list(range(100, 150)) + [5], list(range(100, 150)) + [6]], [50, 50]
    first = cache.score(seqs, starts)
    again = cache.score([list(s) for s in seqs], list(starts))  # a step that added nothing: the same ids
    assert len(calls) == 1 and torch.equal(first, again) and cache.last_reused == 50
    assert again.data_ptr() != first.data_ptr()  # a copy, not the memo itself
    cache.score(seqs, [49, 50])  # other scored positions: computed
    assert len(calls) == 2
    with torch.no_grad():
        next(router.model.parameters()).mul_(1.5)
    got = cache.score(seqs, starts)
    assert len(calls) == 3 and torch.allclose(got, sequence_log_probs(router.model, seqs, starts), atol=1e-4 * 50)


def test_sft_in_records_match_router_prompts(tiny_llama_dir):
    from data_synthesis.memagent_supervision import in_labels

    router = _router(tiny_llama_dir)
    steps = [{"index": i, "observation": "o", "action": "a", "meta": {"stm": s}} for i, s in enumerate(SUMMARIES)]
    rollout = {"id": "r1", "task_id": "t1", "in_policy": "inject", "success": True, "error": None,
               "trajectory": {"task": {"task_id": "t1", "goal": GOAL_A}, "steps": steps}}
    records = in_labels([rollout], {}, judge_steps=3)
    assert len(records) == 3
    asked = {}
    for i, s in enumerate(SUMMARIES):  # what the router sees in run_episode: only steps with a summary
        if s.strip():
            asked[i] = router.in_decisions.messages(GOAL_A, i, s)
    for rec in records:
        assert rec["prompt"] == asked[rec["step"]]


def test_bench_memagent_in_tiny(tiny_llama_dir, one_torch_thread):
    from eval.bench.common import BenchConfig
    from eval.bench.memagent_in import bench_memagent_in

    res = bench_memagent_in(BenchConfig(model_name_or_path=tiny_llama_dir), [], "cpu", n_steps=6, n_episodes=1)
    assert res["benchmark"] == "memagent_in" and not res["model"]["tiny_fallback"]
    assert res["max_score_diff_incremental_vs_full"] < 1e-3  # summed log-probs of up to ~40 nats, float32
    tokens = res["prompt_tokens_run_mean"]
    assert tokens["incremental"] < tokens["full"] and tokens["incremental"] < tokens["legacy"]
    assert res["timings"]["agent_batched"]["n"] == 6 and res["agent_same_action_packed_vs_batched"] == 1.0
    assert res["timings"]["agent"]["n"] == 6 and res["timings"]["in_incremental"]["n"] == res["per_task"]["in_asked_steps"]
    assert {f["name"] for f in res["figures"]} >= {"in_step_p50_vs_legacy", "routing_overhead_13",
                                                   "agent_step_p50_packed_vs_batched",
                                                   "routing_overhead_13_pruned"}
    assert res["model"]["pruned_router_layers"] == 2 == res["model"]["layers"]  # capped at the tiny model's depth
    assert res["timings"]["in_pruned"]["n"] == res["timings"]["in_incremental"]["n"]
    assert isinstance(res["meets_target"], bool) and res["target"]
