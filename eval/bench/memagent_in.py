"""``memagent_in`` (``memroute bench --which memagent_in``): the routing overhead of MemAgent per task (issue 18).

Per agent step, the In decision three ways: the pre-issue-18 full prompt, the append-only log prompt uncached,
and with the incremental KV cache (``routers.memagent.in_cache``); per task, the Begin decision over 13
providers and over the 3 of the measured eval runs, uncached and with the pool's provider descriptions cached
across tasks; next to one ``LMCommandAgent.act`` per step (its candidates packed into one row, and as a padded
batch as before packing), all on the same model. Overhead = (Begin + In x asked steps) / (agent x steps), target
<= 10 %. The episodes are synthetic TextWorld-like walks (the short-term
memory grows every step); provider previews carry realistic snippets (``eval.bench.memagent``).
"""

from __future__ import annotations

import time

import numpy as np

from eval.bench.common import figure, sync, with_target
from eval.bench.memagent import _ADJS, _OBJS, _PLACES, DIM, _RandomEncoder, _summary, synthetic_items
from routers.logs import get_logger
from routers.memagent import prompts as P
from routers.memagent.protocol import Observation, Preview, Task, TrajectoryStep
from routers.memagent.providers import build_providers

log = get_logger("eval.bench.memagent_in")

IN_STEPS = 15
IN_EPISODES = 2
OVERHEAD_TARGET = 0.10
EVAL_POOL = ("voyager", "expel", "awm")      # the pool of the measured eval runs (configs/memagent/README.md)
_LEGACY_IN = ("You are the memory agent of a task agent. At each step you decide whether to inject the "
              "short-term memory summary into the task agent's context (Query) or to skip it (NoOp). "
              "Reply with Query or NoOp only.",
              "Inject the short-term memory summary at this step? Reply Query or NoOp.")  # (system, question)
_DIRS = ["north", "east", "south", "west"]
_CONTAINERS = ["wooden chest", "metal cabinet", "old crate", "tall wardrobe", "small box", "rusty locker"]


def _thing(rng) -> str:
    return f"{_ADJS[rng.integers(len(_ADJS))]} {_OBJS[rng.integers(len(_OBJS))]}"


def legacy_in_messages(goal: str, step_index: int, state_summary: str) -> list[dict]:
    """The In prompt before issue 18 (summary first, no reuse between steps): today's path, for comparison."""
    summary = state_summary.strip()[:3000] or "(empty)"
    user = f"Short-term memory summary:\n{summary}\n\nTask: {goal.strip()}\nStep: {int(step_index)}\n\n{_LEGACY_IN[1]}"
    return [{"role": "system", "content": _LEGACY_IN[0]}, {"role": "user", "content": user}]


def synthetic_episode(rng, n_steps: int = IN_STEPS) -> tuple[Task, list[tuple[Observation, TrajectoryStep]]]:
    """A TextWorld-like walk: (observation the agent acts on, the step it leads to) per step. Rooms with a
    container and objects; the walk examines, opens, takes and moves on, so the short-term memory grows."""
    rooms, target = [_PLACES[i] for i in rng.permutation(len(_PLACES))[:6]], _thing(rng)
    task = Task(f"synthetic-{rng.integers(1 << 30)}", f"Find the {target} and put it on the table in the {rooms[0]}.")
    plan, held, boxes = [], [], [_CONTAINERS[rng.integers(len(_CONTAINERS))] for _ in rooms]
    for k, box in enumerate(boxes):
        things, way, nxt = [_thing(rng), _thing(rng)], _DIRS[(k + rng.integers(3)) % 4], (k + 1) % len(rooms)
        plan += [(f"examine {box}", f"The {box} is closed. It has a keyhole and {len(things)} things inside."),
                 (f"open {box}", f"You open the {box}, revealing a {things[0]} and a {things[1]}."),
                 (f"take {things[0]} from {box}", f"You take the {things[0]} from the {box}. It is heavy."),
                 (f"go {way}", f"-= {rooms[nxt].title()} =-\nYou've entered a {rooms[nxt]}. You can see a closed "
                  f"{boxes[nxt]} here. There is an exit to the {_DIRS[(k + 2) % 4]} and a door to the {way}.")]
    text = (f"-= {rooms[0].title()} =-\nYou are in the {rooms[0]}. There is a table here. A closed {boxes[0]} "
            "stands in the corner. There is an exit to the east.")
    out = []
    for i, (action, result) in enumerate(plan[:n_steps]):
        verb_obj = action.split(" from ")[0]
        held += [verb_obj[5:]] if verb_obj.startswith("take ") else []
        cmds = ["look", "inventory", *[f"go {d}" for d in _DIRS[:3]], action, "examine table",
                *[f"drop {h}" for h in held[-3:]], *[f"put {h} on table" for h in held[-3:]],
                *[f"examine {_OBJS[rng.integers(len(_OBJS))]}" for _ in range(4)]]
        out.append((Observation(text, list(dict.fromkeys(cmds))), TrajectoryStep(i, result, action)))
        text = result
    return task, out


def _in_model(cfg, device: str):
    """(model, tokenizer, name, fallback): ``cfg.model_name_or_path`` (default SmolLM2), else a tiny random Llama."""
    import torch

    from routers.models import DEFAULT_CAUSAL_LM, load_causal_lm, smollm2_gguf_path

    name = getattr(cfg, "model_name_or_path", None) or DEFAULT_CAUSAL_LM
    dtype = getattr(torch, getattr(cfg, "inference_dtype", "float32"))
    try:
        model, tok = load_causal_lm(name, dtype=dtype, device=device)
        return model.eval(), tok, name, False
    except Exception as err:  # noqa: BLE001 - the bench still runs, and says so
        log.warning("memagent_in: %s unavailable (%s); a tiny random Llama instead", name, err)
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf, _ = smollm2_gguf_path(), torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    return model.to(device=device, dtype=dtype).eval(), tok, "tiny random Llama (fallback)", True


def pruned_router(model, tok, keep: int):
    """A router over a copy of ``model`` with its first ``keep`` decoder layers (at most all of them)."""
    import copy

    from routers.memagent.router import MemAgentRouter
    from routers.models import keep_decoder_layers

    copy_ = copy.deepcopy(model)
    keep = min(int(keep), len(model.model.layers))
    keep_decoder_layers(copy_, keep)
    return MemAgentRouter.from_model(copy_.eval(), tok), keep


def _timed(fn, device: str):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def bench_memagent_in(cfg=None, records=None, device: str = "cpu", n_steps: int | None = None,
                      n_episodes: int | None = None) -> dict:
    """Per agent step: the In decision (today's full prompt, the new prompt uncached, the new prompt with the
    incremental cache), one ``LMCommandAgent.act`` and, per task, the Begin decision (13 providers and the 3 of
    the eval runs), all with the same model (``cfg.model_name_or_path``); overhead = (Begin + In x asked steps)
    / (agent x steps). ``records`` is unused (synthetic TextWorld-like episodes)."""
    from routers.memagent.agent import LMCommandAgent, compose_memory
    from routers.memagent.in_cache import InDecisions, PrefixKVCache
    from routers.memagent.providers.short_term import ShortTermMemory
    from routers.memagent.router import MemAgentRouter

    n_steps = n_steps or getattr(cfg, "memagent_in_steps", IN_STEPS)
    n_episodes = n_episodes or getattr(cfg, "memagent_in_episodes", IN_EPISODES)
    rng = np.random.default_rng(getattr(cfg, "seed", 0))
    model, tok, model_name, fallback = _in_model(cfg, device)
    router, agent = MemAgentRouter.from_model(model, tok), LMCommandAgent(model, tok)
    batched = LMCommandAgent(model, tok, batch_size=16, pack_candidates=False)  # the agent before packing
    pruned, keep = pruned_router(model, tok, getattr(cfg, "memagent_in_keep_layers", 10))
    pools = {"all": build_providers(encoder=_RandomEncoder(DIM, 0))}
    pools["eval"] = {n: pools["all"][n] for n in EVAL_POOL}
    full, inc, inc_pruned = InDecisions(router, incremental=False), InDecisions(router), InDecisions(pruned)
    legacy = lambda g, i, s: router.score_candidates([(legacy_in_messages(g, i, s), [P.QUERY, P.NOOP])], "in")
    times = {k: [] for k in ("agent", "agent_batched", "in_legacy", "in_full", "in_incremental", "in_pruned",
                             "begin_all", "begin_eval", "begin_all_uncached", "begin_eval_uncached", "begin_all_pruned", "begin_eval_pruned")}
    begin_kv = {pool: PrefixKVCache(model) for pool in pools}  # one pool per router in use: a cache each
    pruned_kv = {pool: PrefixKVCache(pruned.model) for pool in pools}
    tokens, max_diff, asked, same_action = [], 0.0, 0, []
    episodes = [synthetic_episode(rng, 3)] + [synthetic_episode(rng, n_steps) for _ in range(n_episodes)]  # warm-up
    for e, (task, walk) in enumerate(episodes):
        timed = {}
        for pool in ("all", "eval"):  # probe previews: score, count, a realistic snippet
            previews = [Preview(n, float(rng.uniform(0.2, 0.9)), synthetic_items(p, 1, rng)[0].text,
                                int(rng.integers(5, 500))) for n, p in pools[pool].items()]
            router.begin_kv = begin_kv[pool]
            timed[f"begin_{pool}"] = [_timed(lambda: router.score_begin(task.goal, previews, pools[pool]), device)[0]]
            pruned.begin_kv = pruned_kv[pool]
            timed[f"begin_{pool}_pruned"] = [_timed(lambda: pruned.score_begin(task.goal, previews, pools[pool]),
                                                    device)[0]]
            prompt, outs = P.begin_messages(task.goal, previews, pools[pool]), [None, *pools[pool]]
            timed[f"begin_{pool}_uncached"] = [_timed(lambda: router.score_candidates(
                [(prompt, [P.begin_completion(o) for o in outs])], "begin"), device)[0]]
        stm, history = ShortTermMemory(), []
        timed |= {k: [] for k in ("agent", "agent_batched", "in_legacy", "in_full", "in_incremental", "in_pruned")}
        for obs, step in walk:
            summary = stm.summary()
            if summary.strip():
                asked += e > 0
                timed["in_legacy"].append(_timed(lambda: legacy(task.goal, step.index, summary), device)[0])
                t, a = _timed(lambda: full.score(task.goal, step.index, summary), device)
                timed["in_full"].append(t)
                t, b = _timed(lambda: inc.score(task.goal, step.index, summary), device)
                timed["in_incremental"].append(t)
                max_diff = max(max_diff, float((a - b).abs().max()))
                timed["in_pruned"].append(_timed(lambda: inc_pruned.score(task.goal, step.index, summary), device)[0])
                tm = router.timings[-3:]  # legacy, full, incremental: prompt tokens run
                tokens += [[t["prompt_tokens"] - t.get("reused_tokens", 0) for t in tm]] if e else []
            memory = compose_memory("", summary)
            t, action = _timed(lambda: agent.act(task, history, obs, memory), device)
            timed["agent"].append(t)
            t, before = _timed(lambda: batched.act(task, history, obs, memory), device)
            timed["agent_batched"].append(t)
            same_action += [action == before] if e else []
            history.append(step)
            stm.update(step)
        for k, v in timed.items():
            times[k] += v if e > 0 else []
    stats = {k: _summary(v) for k, v in times.items()}
    mean = {k: (s["mean_s"] or 0.0) for k, s in stats.items()}
    per_task = {"agent_s": mean["agent"] * n_steps, "in_asked_steps": asked / n_episodes, "steps": n_steps}

    def router_s(pool: str, mode: str) -> float:  # before: legacy In prompt and uncached Begin
        begin = mean[f"begin_{pool}" + {"legacy": "_uncached", "full": "_uncached", "pruned": "_pruned"}.get(mode, "")]
        return begin + per_task["in_asked_steps"] * mean[f"in_{mode}"]

    overhead = {f"{pool}_{mode}": router_s(pool, mode) / per_task["agent_s"]
                for pool in ("all", "eval") for mode in ("legacy", "full", "incremental", "pruned")}
    p50 = {k: s["p50_s"] for k, s in stats.items()}
    return with_target({
        "benchmark": "memagent_in",
        "description": f"In decision per agent step over {n_episodes} synthetic TextWorld-like episodes x {n_steps} "
                       "steps (ShortTermMemory summaries): the pre-issue-18 full prompt, the append-only log prompt "
                       "uncached and with the incremental KV cache; LMCommandAgent.act per step (candidates packed, "
                       "and batched as before) and Begin per task (13 providers / the eval's 3; uncached and with the "
                       "descriptions cached) on the same model",
        "model": {"name": model_name, "tiny_fallback": fallback, "dtype": str(model.dtype).removeprefix("torch."),
                  "layers": len(model.model.layers), "pruned_router_layers": keep},
        "timings": stats, "per_task": per_task, "overhead": overhead,
        "agent_same_action_packed_vs_batched": float(np.mean(same_action)) if same_action else None,
        "prompt_tokens_run_mean": dict(zip(("legacy", "full", "incremental"), np.mean(tokens, axis=0).tolist()))
        if tokens else None, "max_score_diff_incremental_vs_full": max_diff,
        "overhead_definition": "(Begin once + In x steps with a non-empty summary) / (LMCommandAgent.act x steps); "
                               "environment and short-term memory time are not in the denominator (conservative)",
        "figures": [
            figure("agent_step_p50_packed_vs_batched", "s", p50["agent"], p50["agent_batched"], "baseline/value", None,
                   "median LMCommandAgent.act: candidates packed into one row (tree mask) vs the padded batch with "
                   "the prompt cache copied per candidate (speedup; the routing overheads below divide by the "
                   "packed agent)"),
            figure("in_step_p50_vs_legacy", "s", p50["in_incremental"], p50["in_legacy"], "baseline/value", None,
                   "median In decision: incremental cache vs the pre-issue-18 full prompt (speedup)"),
            figure("in_step_p50_vs_full", "s", p50["in_incremental"], p50["in_full"], "baseline/value", None,
                   "median In decision: incremental cache vs the same prompt text uncached (speedup)"),
            figure("begin_13_cached_vs_uncached", "s", mean["begin_all"], mean["begin_all_uncached"], "baseline/value",
                   None, "Begin over 13 providers: descriptions cached across tasks vs the whole prompt (speedup)"),
            figure("routing_overhead_13", "s", router_s("all", "incremental"), per_task["agent_s"], "value/baseline",
                   ("<=", OVERHEAD_TARGET), "router s per task (Begin over 13 providers + In) / agent s per task"),
            figure("routing_overhead_13_legacy", "s", router_s("all", "legacy"), per_task["agent_s"], "value/baseline",
                   None, "the same with the pre-issue-18 In prompt and an uncached Begin (before)"),
            figure("routing_overhead_3", "s", router_s("eval", "incremental"), per_task["agent_s"], "value/baseline",
                   None, "router s per task (Begin over voyager/expel/awm + In) / agent s per task"),
            figure("routing_overhead_13_pruned", "s", router_s("all", "pruned"), per_task["agent_s"], "value/baseline",
                   ("<=", OVERHEAD_TARGET), f"the same as routing_overhead_13 with a router of the first {keep} layers "
                   "(keep_layers; the agent keeps all)"),
            figure("in_step_p50_pruned_vs_full_depth", "s", p50["in_pruned"], p50["in_incremental"], "baseline/value",
                   None, f"median incremental In decision: {keep}-layer router vs the full-depth one (speedup)"),
        ]})


