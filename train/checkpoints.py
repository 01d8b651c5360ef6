"""Checkpoints of the three trainers: which one to resume from, and what a finished run recorded.

``Trainer._save_checkpoint`` writes weights, optimizer, scheduler and RNG states first and
``trainer_state.json`` last, and none of it atomically. A run killed while saving leaves a
``checkpoint-N`` directory without (or with a truncated) ``trainer_state.json``; resuming from it
crashes deep inside ``Trainer.train``. :func:`last_complete_checkpoint` skips such directories, and
:func:`resolve_resume` (used by every trainer) resumes from the newest complete one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from routers.config import check_resume_value
from routers.logs import get_logger

log = get_logger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def checkpoint_is_complete(path: str | os.PathLike) -> bool:
    """True when ``trainer_state.json`` (written last) parses and names this checkpoint's step."""
    path = Path(path)
    m = _CHECKPOINT.match(path.name)
    try:
        state = json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and (m is None or state.get("global_step") == int(m.group(1)))


def last_complete_checkpoint(output_dir: str | os.PathLike, warn: bool = True) -> str | None:
    """The highest-step complete ``checkpoint-N`` under ``output_dir`` (None when there is none)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in root.iterdir()
                    if p.is_dir() and (m := _CHECKPOINT.match(p.name))), reverse=True)
    for _, path in found:
        if checkpoint_is_complete(path):
            return str(path)
        if warn:
            log.warning("skipping incomplete checkpoint %s (no valid %s: the run was killed while saving it)",
                        path, TRAINER_STATE)
    return None


def time_budget_callback(minutes: float):
    """A ``TrainerCallback`` that stops a run gracefully once ``minutes`` of training have passed: it
    saves a checkpoint and lets the script export as usual. For time-boxed jobs (preemptible nodes, a
    shared GPU lease): the run ends with a usable router and a resumable checkpoint, not killed mid-step."""
    import time

    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def __init__(self):
            self.budget_s, self.start, self.stopped_at_step = minutes * 60.0, None, None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if self.start is not None and time.monotonic() - self.start >= self.budget_s and self.stopped_at_step is None:
                control.should_training_stop = True
                control.should_save = True
                self.stopped_at_step = state.global_step
                log.warning("time budget of %g min reached at step %d/%d: saving and stopping", minutes,
                            state.global_step, state.max_steps)
            return control

    return TimeBudget()


def resolve_resume(cfg) -> str | None:
    """The checkpoint a trainer resumes from: ``cfg.resume_from_checkpoint`` when given (it must exist), else
    with ``resume: auto`` the newest *complete* checkpoint in ``cfg.output_dir`` (one killed while saving is
    skipped rather than crashing the resume), else None (``resume: never``, or nothing saved yet)."""
    check_resume_value(cfg.resume)
    if cfg.resume_from_checkpoint:
        if not os.path.isdir(cfg.resume_from_checkpoint):
            raise FileNotFoundError(f"resume_from_checkpoint {cfg.resume_from_checkpoint}: directory does not exist")
        return cfg.resume_from_checkpoint
    if cfg.resume == "auto" and os.path.isdir(cfg.output_dir):
        return last_complete_checkpoint(cfg.output_dir)
    return None


TRAIN_SUMMARY = "train_summary.json"


def training_summary(checkpoint: str | os.PathLike) -> dict | None:
    """``train_summary.json`` of a training output_dir / checkpoint without its ``log_history`` (what an export's
    model card records); None when absent, a ValueError naming the file when it is unreadable."""
    summary = Path(checkpoint) / TRAIN_SUMMARY
    if not summary.exists():
        return None
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{summary}: unreadable ({getattr(err, 'msg', None) or err}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{summary}: expected a JSON object, got {type(data).__name__}")
    return {k: v for k, v in data.items() if k != "log_history"}
