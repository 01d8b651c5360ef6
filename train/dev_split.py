"""Evaluation during training, shared by the three trainers: the dev split, its checks, and the Trainer options.

The dev split is drawn from the **training file's own episodes**, episode-level and seeded: every record of a dev
episode leaves training, so no question, context or step of a dev episode is trained on. It never includes a
record marked as held out (``split`` other than ``train``), and an explicit ``--eval_file`` whose episode (or
sample) ids overlap the training file's is refused. Without ``dev_fraction`` / ``dev_episodes`` / ``eval_file``
nothing changes: a recipe trains exactly what it trained before.
"""

from __future__ import annotations

import random

from routers.logs import get_logger
from routers.validation import int_option, number_option

log = get_logger(__name__)

TRAIN_SPLITS = (None, "", "train")  # a record's ``split`` field: anything else is held out and never a dev record


def has_dev_split(cfg) -> bool:
    return getattr(cfg, "dev_fraction", None) is not None or bool(getattr(cfg, "dev_episodes", None))


def has_eval(cfg) -> bool:
    return has_dev_split(cfg) or bool(getattr(cfg, "eval_file", None))


def _value(option):
    return getattr(option, "value", option)  # IntervalStrategy.STEPS -> "steps" (before and after __post_init__)


def eval_option_checks(cfg) -> list[tuple[bool, str]]:
    """Parse-time checks of the eval options (``routers.validation.option_problems`` format)."""
    evaluates = _value(cfg.eval_strategy) not in (None, "no")
    checks = [
        number_option(cfg.dev_fraction, "dev_fraction", low=0, high=1, low_open=True, high_open=True, allow_none=True),
        (cfg.dev_fraction is None or not cfg.dev_episodes, "give dev_fraction or dev_episodes, not both"),
        (not (getattr(cfg, "eval_file", None) and has_dev_split(cfg)),
         "give eval_file or a dev split (dev_fraction / dev_episodes), not both"),
        (isinstance(cfg.dev_seed, int) and not isinstance(cfg.dev_seed, bool), f"dev_seed must be an integer, got {cfg.dev_seed!r}"),
        int_option(cfg.early_stopping_patience, "early_stopping_patience", allow_none=True),
        number_option(cfg.early_stopping_threshold, "early_stopping_threshold", low=0),
        (not evaluates or has_eval(cfg),
         f"eval_strategy {_value(cfg.eval_strategy)} needs something to evaluate: eval_file, dev_fraction or dev_episodes"),
        (not cfg.load_best_model_at_end or has_eval(cfg),
         "load_best_model_at_end needs an eval set: eval_file, dev_fraction or dev_episodes"),
        (cfg.early_stopping_patience is None or (has_eval(cfg) and evaluates and cfg.load_best_model_at_end),
         "early_stopping_patience needs an eval set (eval_file / dev_fraction / dev_episodes), eval_strategy steps or "
         "epoch, and load_best_model_at_end true"),
    ]
    return checks


def _episode(rec: dict, key: str) -> str | None:
    value = rec.get(key)
    return None if value is None or value == "" else str(value)


def split_by_episode(records: list[dict], fraction: float | None = None, episodes: list[str] | None = None,
                     seed: int = 0, key: str = "episode_id", source: str = "train_file") -> tuple[list[dict], list[dict], list[str]]:
    """(train records, dev records, dev episode ids): every record of a dev episode goes to dev, in file order.

    ``fraction``: a seeded draw of ``round(fraction * n)`` episodes (at least 1, at most n - 1) among the episodes
    whose records are all training records; ``episodes``: exactly these ids (each must be such an episode)."""
    missing = sum(1 for r in records if _episode(r, key) is None)
    if missing:
        raise ValueError(f"{source}: {missing} of {len(records)} records have no {key}: a dev split is drawn by "
                         f"episode ({key}); give a separate eval_file instead")
    order: list[str] = []
    held_out: set[str] = set()
    for rec in records:
        ep = _episode(rec, key)
        if ep not in order:
            order.append(ep)
        if rec.get("split") not in TRAIN_SPLITS:
            held_out.add(ep)
    candidates = [ep for ep in order if ep not in held_out]
    if episodes:
        wanted = [str(e) for e in episodes]
        unknown = [e for e in wanted if e not in order]
        if unknown:
            raise ValueError(f"dev_episodes {unknown}: not episodes of {source} (the dev split is drawn from the "
                             f"training episodes only; {len(order)} there, e.g. {order[:5]})")
        marked = [e for e in wanted if e in held_out]
        if marked:
            raise ValueError(f"dev_episodes {marked}: their records in {source} are marked as held out (split != train)")
        dev = list(dict.fromkeys(wanted))
    else:
        if len(candidates) < 2:
            raise ValueError(f"dev_fraction: {source} has {len(candidates)} training episode(s) ({key}); a dev split "
                             "needs at least 2 (one to train on)")
        n = min(len(candidates) - 1, max(1, round(fraction * len(candidates))))
        dev = random.Random(seed).sample(sorted(candidates), n)
    dev_set = set(dev)
    train = [r for r in records if _episode(r, key) not in dev_set]
    dev_recs = [r for r in records if _episode(r, key) in dev_set]
    if not train:
        raise ValueError(f"the dev split takes every episode of {source}; nothing is left to train on")
    return train, dev_recs, sorted(dev)


def check_disjoint(train: list[dict], evals: list[dict], key: str = "episode_id", source: str = "eval_file") -> None:
    """Refuse an eval set that shares an episode (or, without episode ids, a sample id) with the training set."""
    train_eps = {_episode(r, key) for r in train} - {None}
    shared = sorted(train_eps & ({_episode(r, key) for r in evals} - {None}))
    if shared:
        raise ValueError(f"{source}: episodes {shared[:10]} are also in the training file; evaluate on episodes the "
                         "router never trains on (or use dev_fraction / dev_episodes)")
    ids = {r.get("id") for r in train} - {None}
    shared_ids = sorted(str(i) for i in ids & ({r.get("id") for r in evals} - {None}))
    if shared_ids:
        raise ValueError(f"{source}: sample ids {shared_ids[:10]} are also in the training file")
    if not train_eps:
        log.warning("%s: the training records carry no %s, so only sample ids were checked for overlap", source, key)


def dev_fingerprint(cfg) -> dict:
    """The dev options a resumed run must share (they decide which episodes train); empty without a dev split, so
    the fingerprints of runs without one are unchanged."""
    if not has_dev_split(cfg):
        return {}
    return {"dev_fraction": cfg.dev_fraction, "dev_episodes": list(cfg.dev_episodes or []) or None,
            "dev_seed": cfg.dev_seed}


def resolve_report_to(cfg) -> None:
    """Drop ``tensorboard`` from ``report_to`` (with a warning) when neither tensorboard nor tensorboardX is
    installed: it is an optional extra, and a recipe that asks for it must still run."""
    from transformers.integrations import is_tensorboard_available

    report_to = list(cfg.report_to or [])
    if "tensorboard" in report_to and not is_tensorboard_available():
        log.warning("report_to tensorboard: tensorboard is not installed (pip install tensorboard); "
                    "logging to the console and trainer_state.json only")
        cfg.report_to = [r for r in report_to if r != "tensorboard"]


def add_early_stopping(trainer, cfg) -> None:
    if cfg.early_stopping_patience is not None:
        from transformers import EarlyStoppingCallback

        trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=cfg.early_stopping_patience,
                                                   early_stopping_threshold=cfg.early_stopping_threshold))


def best_model_info(trainer) -> dict:
    """What the summary records about evaluation: the best checkpoint and metric, and the last eval metrics."""
    evals = [h for h in trainer.state.log_history if any(k.startswith("eval_") for k in h)]
    return {"best_model_checkpoint": trainer.state.best_model_checkpoint, "best_metric": trainer.state.best_metric,
            "metric_for_best_model": trainer.args.metric_for_best_model, "evaluations": len(evals),
            "last_eval": evals[-1] if evals else None}


def train_and_eval_records(cfg, records: list[dict], read, key: str = "episode_id", source: str = "train_file"):
    """(training records, eval records or None, what was held out or None) for a trainer's config: the dev split
    of ``records`` (dev_fraction / dev_episodes), or ``read(cfg.eval_file)`` checked disjoint from ``records``."""
    eval_file = getattr(cfg, "eval_file", None)
    if eval_file:
        evals = read(eval_file)
        check_disjoint(records, evals, key, source=f"eval_file {eval_file}")
        return records, evals, {"eval_file": eval_file, "eval_records": len(evals)}
    if has_dev_split(cfg):
        train, dev, episodes = split_by_episode(records, cfg.dev_fraction, cfg.dev_episodes, cfg.dev_seed, key, source)
        log.info("dev split: %d episode(s) %s, %d records held out of training (%d train)", len(episodes),
                 episodes, len(dev), len(train))
        return train, dev, {"dev_episodes": episodes, "dev_records": len(dev), "dev_seed": cfg.dev_seed,
                            "dev_fraction": cfg.dev_fraction}
    return records, None, None


def has_eval_strategy(cfg) -> bool:
    return _value(cfg.eval_strategy) not in (None, "no")
