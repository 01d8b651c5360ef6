"""The supervision stage of forced exploration (``memroute synth forced-exploration --stage label``): reads the
training split's records, tasks and store log and writes ``begin.jsonl``, ``in.jsonl``, ``end.jsonl`` and
``stats.json`` through :mod:`data_synthesis.memagent_supervision`. Demonstration tasks (played by the expert)
feed the stores and End labels only."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Mapping

from routers.io import atomic_write_json, atomic_write_text, read_jsonl
from routers.memagent.rollout import EXPLORATION_FIELDS, validate_exploration

TASK_FIELDS = ("id", "task_id", "goal", "previews", "retrieved")
STORE_FIELDS = ("id", "task_id", "rollout_id", "provider", "item_ids")


def load_exploration(path: str | os.PathLike) -> list[dict]:
    """Exploration records; a malformed one raises RecordError naming file and line."""
    return list(read_jsonl(path, required=EXPLORATION_FIELDS, validate=validate_exploration))


def label(cfg, providers: Mapping | None = None, judge=None, progress: bool = True) -> dict:
    """Judge (cached) and write begin/in/end.jsonl + stats.json from the training split's records."""
    from data_synthesis import memagent_supervision as S
    from routers.backends import make_backend

    out = Path(cfg.output_dir)
    if providers is None:
        from routers.memagent.providers import PROVIDER_NAMES, build_providers

        providers = build_providers(list(cfg.providers) if cfg.providers is not None else list(PROVIDER_NAMES))
    if judge is None and cfg.judge and cfg.judge.lower() not in ("none", "null"):
        kw = {} if cfg.judge.startswith("openai:") else {"batch_size": cfg.judge_batch_size, "dtype": cfg.judge_dtype}
        judge = make_backend(cfg.judge, **kw)
    rollouts = load_exploration(out / "train" / "exploration.jsonl")
    tasks = list(read_jsonl(out / "train" / "tasks.jsonl", required=TASK_FIELDS))
    stores_path = out / "stores.jsonl"
    stores = list(read_jsonl(stores_path, required=STORE_FIELDS)) if stores_path.exists() else []
    unknown = sorted({r["begin_provider"] for r in rollouts if r["begin_provider"] is not None} - set(providers))
    if unknown:
        raise ValueError(f"exploration records name providers {unknown} that are not in the pool {list(providers)}")
    counts: Counter = Counter()
    demos = {t["task_id"] for t in tasks if ((t.get("task") or {}).get("meta") or {}).get("demonstration")}
    counts["demonstration_tasks"] = len(demos)  # played by the expert: they feed the stores and End labels only
    agent_tasks, agent_rollouts = ([x for x in xs if x["task_id"] not in demos] for xs in (tasks, rollouts))
    requests = S.judge_requests(agent_rollouts, cfg.judge_steps_per_rollout)
    judgments, jcounts = S.run_judge(requests, judge, out / "judgments.jsonl", cfg.judge_batch_size,
                                     progress=progress, constrained=cfg.judge_constrained)
    counts.update(jcounts)
    begin = S.begin_labels(agent_tasks, agent_rollouts, providers, judgments, cfg.begin_outcome_weight,
                           cfg.begin_min_reward, counts, cfg.begin_step_tolerance)
    inn = S.in_labels(agent_rollouts, judgments, cfg.judge_steps_per_rollout, cfg.in_outcome_weight, cfg.in_min_reward,
                      counts)
    end = S.end_labels(stores, rollouts, providers, [t["task_id"] for t in tasks], cfg.end_min_reuse,
                       cfg.end_min_retrievals, cfg.end_min_reward, counts)
    for name, recs in (("begin", begin), ("in", inn), ("end", end)):
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    stats = S.summarize(agent_rollouts, begin, inn, end, counts, list(providers), cfg)  # the agent's rollouts
    atomic_write_json(out / "stats.json", stats)
    return stats
