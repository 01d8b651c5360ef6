"""Train the Router-Mem evidence retriever: multi-positive InfoNCE on sentence-transformers' trainer.

    accelerate launch -m train.retriever configs/retriever/train/minilm.yaml [--max_steps 300 ...]
    memroute train retriever configs/retriever/train/minilm.yaml
    memroute export retriever --checkpoint outputs/retriever_minilm/checkpoint-100 --export_dir outputs/r

Data: the JSONL of ``memroute synth retriever`` (one record per question with *variable* numbers of
positives and negatives). :class:`MultiPositiveCollator` turns a batch of records into two columns:

* ``query``: the B questions;
* ``candidates``: for every question, ``positives_per_query`` positives (at least one evidence
  *step* when the record has one) and ``negatives_per_query`` mined negatives, sampled without
  replacement (all of them when a record has fewer), then **deduplicated by text** across the batch,
  so a text is embedded once and is one column. The candidates are ordered by length and tokenized
  in chunks of ``candidate_chunk_size`` (columns ``candidates0``, ``candidates1``, ...), each padded
  only to its own longest text: short steps are not padded to the length of a window, which saves
  most of the encoder's compute on CPU. The loss concatenates the chunks back in order.

and a packed ``label`` tensor (B + 1, C): rows [:B] say, per question and candidate, 1 = sampled
positive, -1 = a positive of this question that was not sampled (never used as its negative), 0 =
negative (its own mined negatives and everything the other questions brought: in-batch negatives);
row B holds each candidate's 63-bit text key, used to mask false negatives after a cross-process
gather. :class:`train.retriever_losses.MultiPositiveInfoNCELoss` consumes exactly this.

The model is saved in ``output_dir`` (a sentence-transformers folder) and, with ``export_dir``,
exported atomically as a :class:`routers.retriever.RetrieverRouter` (router_config.json, calibration.json,
model card).
Training resumes from the last checkpoint in ``output_dir`` (``--resume never`` to start over).
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator

from routers.io import atomic_write_json
from routers.models import DEFAULT_ENCODER
from routers.config import check_resume_value
from routers.logs import get_logger, setup_cli_logging
from train.args import EvalFileArgs, RunArgs
from train.checkpoints import resolve_resume, time_budget_callback
from routers.models import check_local_model_path
from routers.validation import int_option, number_option, option_problems, raise_option_problems
from train.distributed import (check_start, check_world_size, cpu_ddp_defaults, run_fingerprint,
                               training_argument_checks, warn_if_fsdp_ignored)
from train.dev_split import (add_early_stopping, best_model_info, dev_fingerprint, eval_option_checks,
                             has_eval_strategy, resolve_report_to, train_and_eval_records)
from train.retriever_losses import IGNORE, POSITIVE, MultiPositiveInfoNCELoss, pack_labels

log = get_logger(__name__)



@dataclass
class RetrieverTrainingConfig(RunArgs, EvalFileArgs, SentenceTransformerTrainingArguments):
    """SentenceTransformerTrainingArguments plus the retriever, sampling, loss and dev-evaluation options."""

    model_name_or_path: str = field(default=DEFAULT_ENCODER, metadata={"help": "alias ('minilm'), HF id or local path"})
    train_file: str = "outputs/retriever_data/train.jsonl"
    max_train_samples: int | None = None
    positives_per_query: int = field(default=2, metadata={"help": "positives sampled per query per step (<=0: all)"})
    negatives_per_query: int = field(default=4, metadata={"help": "mined negatives sampled per query per step (<0: all)"})
    temperature: float = field(default=0.05, metadata={"help": "InfoNCE temperature T"})
    mini_batch_size: int | None = field(default=None, metadata={"help": "GradCache mini-batch (texts); None = no caching"})
    gather_across_devices: bool = field(default=False, metadata={"help": "all-gather candidates across processes"})
    candidate_chunk_size: int | None = field(default=32, metadata={
        "help": "candidates are length-sorted and tokenized in chunks of this many (less padding); None = one column"})
    other_positives_in_denominator: bool = False
    max_seq_length: int | None = field(default=128, metadata={"help": "token budget per text (None = model default)"})
    export_max_seq_length: int | None = field(default=None, metadata={
        "help": "the export's token budget per text at inference; None = the base model's own (MiniLM: 256). "
                "Training truncates to max_seq_length for speed; an export that kept it would cut long steps"})
    # Defaults for this trainer (override the TrainingArguments ones).
    output_dir: str = "outputs/retriever_minilm"
    remove_unused_columns: bool = False
    per_device_train_batch_size: int = 32
    learning_rate: float = 3e-5
    logging_steps: int = 10
    save_steps: int = 50
    save_total_limit: int | None = 2

    def __post_init__(self):
        # Impossible values fail at parse time, before the encoder or the data is loaded.
        check_resume_value(self.resume)
        raise_option_problems(option_problems([
            *training_argument_checks(self),
            int_option(self.max_train_samples, "max_train_samples", allow_none=True),
            (isinstance(self.positives_per_query, int), f"positives_per_query must be an integer (<= 0: all), "
                                                        f"got {self.positives_per_query!r}"),
            (isinstance(self.negatives_per_query, int), f"negatives_per_query must be an integer (< 0: all), "
                                                        f"got {self.negatives_per_query!r}"),
            number_option(self.temperature, "temperature", low=0, low_open=True),
            int_option(self.mini_batch_size, "mini_batch_size", allow_none=True),
            int_option(self.candidate_chunk_size, "candidate_chunk_size", allow_none=True, minimum=0),
            int_option(self.max_seq_length, "max_seq_length", allow_none=True),
            int_option(self.export_max_seq_length, "export_max_seq_length", allow_none=True),
            *eval_option_checks(self),
        ]))
        super().__post_init__()


# What a resumed run must share with the run that wrote its checkpoints (plus the TrainingArguments
# optimisation options and the train file's path and sha256). GradCache (mini_batch_size) and the
# candidate chunking change memory and padding only, not what is learnt.
FINGERPRINT_KEYS = ("model_name_or_path", "max_train_samples", "positives_per_query", "negatives_per_query",
                    "temperature", "gather_across_devices", "other_positives_in_denominator", "max_seq_length")


def text_key(text: str) -> int:
    """Stable signed 63-bit key of a text (same on every process and run)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") >> 1


@dataclass
class MultiPositiveCollator(SentenceTransformerDataCollator):
    """Variable positives/negatives per record -> [query, candidates] features + packed labels.

    See the module docstring for the layout. Sampling uses this collator's own RNG (seeded), so a
    run is reproducible for a fixed batch order.
    """

    positives_per_query: int = 2
    negatives_per_query: int = 4
    candidate_chunk_size: int | None = 32
    seed: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def _sample_positives(self, rec: dict) -> list[str]:
        pos = list(rec["positives"])
        k = self.positives_per_query
        if k <= 0 or len(pos) <= k:
            return pos
        kinds = rec.get("positive_kinds") or []
        steps = [i for i, kind in enumerate(kinds) if kind == "step"]
        first = [self._rng.choice(steps)] if steps else []
        rest = [i for i in range(len(pos)) if i not in first]
        return [pos[i] for i in sorted(first + self._rng.sample(rest, k - len(first)))]

    def _sample_negatives(self, rec: dict) -> list[str]:
        neg = list(rec.get("negatives") or [])
        k = self.negatives_per_query
        if k < 0 or len(neg) <= k:
            return neg
        return [neg[i] for i in sorted(self._rng.sample(range(len(neg)), k))]

    def build(self, features: list[dict[str, Any]]) -> tuple[list[str], list[str], torch.Tensor]:
        """(queries, candidate texts, packed labels) without tokenizing -- for tests and inspection."""
        column: dict[str, int] = {}
        texts: list[str] = []
        sampled_pos: list[list[int]] = []
        for rec in features:
            cols = []
            for t in self._sample_positives(rec):
                if t not in column:
                    column[t] = len(texts)
                    texts.append(t)
                cols.append(column[t])
            sampled_pos.append(cols)
            for t in self._sample_negatives(rec):
                if t not in column:
                    column[t] = len(texts)
                    texts.append(t)
        if self.candidate_chunk_size:  # length order (stable), so each tokenized chunk pads little
            order = sorted(range(len(texts)), key=lambda j: len(texts[j]))
            new_col = {old: new for new, old in enumerate(order)}
            texts = [texts[j] for j in order]
            column = {t: new_col[j] for t, j in column.items()}
            sampled_pos = [[new_col[j] for j in cols] for cols in sampled_pos]
        relation = torch.zeros((len(features), len(texts)), dtype=torch.long)
        for i, rec in enumerate(features):
            for t in rec["positives"]:  # every known positive of i is never a negative of i ...
                if t in column:
                    relation[i, column[t]] = IGNORE
            relation[i, sampled_pos[i]] = POSITIVE  # ... and the sampled ones are its positives
        keys = torch.tensor([text_key(t) for t in texts], dtype=torch.long)
        return [rec["query"] for rec in features], texts, pack_labels(relation, keys)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if not features:
            return {}
        queries, texts, labels = self.build(features)
        size = self.candidate_chunk_size or len(texts)
        columns = [("query", queries)]
        if self.candidate_chunk_size:
            columns += [(f"candidates{i}", texts[s:s + size]) for i, s in enumerate(range(0, len(texts), size))]
        else:
            columns.append(("candidates", texts))
        batch: dict[str, Any] = {}
        for name, inputs in columns:
            for key, value in self.preprocess_fn(inputs).items():
                batch[f"{name}_{key}"] = value
        batch["label"] = labels
        return batch


def features_from_batch(batch: dict[str, Any]) -> tuple[list[dict[str, Any]], torch.Tensor | None]:
    """Split a collated batch into per-column feature dicts + labels, as SentenceTransformerTrainer does
    (``collect_features``): a column is every key sharing the prefix of a ``*_input_ids`` key."""
    features, seen = [], set()
    for key in batch:
        if key.endswith("_input_ids"):
            prefix = key[: -len("input_ids")]
            if prefix not in seen:
                seen.add(prefix)
                features.append({k[len(prefix):]: v for k, v in batch.items() if k.startswith(prefix)})
    return features, batch.get("label")


class RetrieverTrainer(SentenceTransformerTrainer):
    """SentenceTransformerTrainer whose default collator is :class:`MultiPositiveCollator`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The InfoNCE loss is a per-batch mean: the Trainer must divide it by the accumulation steps on every
        # transformers version (as TRL does), not only where it reads loss_is_scaled_for_ga.
        self.model_accepts_loss_kwargs = False
        self.loss_is_scaled_for_ga = False

    def get_data_collator(self, model, args, processing_class=None):
        return MultiPositiveCollator(preprocess_fn=model.preprocess,
                                     positives_per_query=getattr(args, "positives_per_query", 2),
                                     negatives_per_query=getattr(args, "negatives_per_query", 4),
                                     candidate_chunk_size=getattr(args, "candidate_chunk_size", 32),
                                     seed=args.seed + args.process_index)  # ranks sample independently


def load_model(name_or_path: str, max_seq_length: int | None = None, device: str | None = None):
    from routers.models import load_encoder

    model = load_encoder(name_or_path, device=device)
    model.memroute_base_max_seq_length = model.max_seq_length  # the export restores it (export_max_seq_length)
    if max_seq_length:
        model.max_seq_length = max_seq_length
    return model


def build_dataset(cfg_or_records):
    """A ``datasets.Dataset`` of the training records (a config's ``train_file``, or records already read)."""
    from datasets import Dataset

    recs = read_records(cfg_or_records) if hasattr(cfg_or_records, "train_file") else cfg_or_records
    return Dataset.from_list([{"query": r["query"], "positives": r["positives"], "negatives": r["negatives"],
                               "positive_kinds": r.get("positive_kinds") or ["step"] * len(r["positives"])}
                              for r in recs])


def read_records(cfg: RetrieverTrainingConfig, path: str | None = None, option: str = "train_file") -> list[dict]:
    """The training records (or ``path``'s, e.g. the eval file: then uncapped), read and validated (before any
    model is loaded)."""
    from data_synthesis.retriever_records import read_retriever_records

    cap = cfg.max_train_samples if path is None else None
    path = cfg.train_file if path is None else path
    if not os.path.exists(path):
        raise FileNotFoundError(f"{option} {path}: file not found")
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a directory, not a JSONL file")
    recs = read_retriever_records(path, cap)
    for n, r in enumerate(recs, start=1):
        kinds = r.get("positive_kinds")
        if kinds is not None and (not isinstance(kinds, list) or len(kinds) != len(r["positives"])):
            raise ValueError(f"{path}: record #{n} (id {r.get('id')!r:.60}): positive_kinds must be a list with one "
                             f"kind per positive ({len(r['positives'])}), got {kinds!r:.80}")
    return recs


def make_loss(model, cfg: RetrieverTrainingConfig) -> MultiPositiveInfoNCELoss:
    return MultiPositiveInfoNCELoss(model, temperature=cfg.temperature, mini_batch_size=cfg.mini_batch_size,
                                    gather_across_devices=cfg.gather_across_devices,
                                    other_positives_in_denominator=cfg.other_positives_in_denominator)


def export_retriever(model, cfg_or_base, export_dir: str, training_info: dict | None = None,
                     temperature: float | None = None, max_seq_length: int | None = None):
    """Write a RetrieverRouter directory (sentence-transformers folder + router_config + calibration + card),
    atomically, with ``max_seq_length`` (if given) as the inference token budget."""
    from routers.retriever import RetrieverConfig, RetrieverRouter

    if max_seq_length:
        model.max_seq_length = max_seq_length
    base = getattr(cfg_or_base, "model_name_or_path", cfg_or_base)
    temp = temperature if temperature is not None else getattr(cfg_or_base, "temperature", 0.05)
    router = RetrieverRouter(model, RetrieverConfig(base_model=base, temperature=temp,
                                                    max_seq_length=getattr(model, "max_seq_length", None)))
    router.save_pretrained(export_dir, model_card=router.model_card(training=training_info))
    return router


def make_parser():
    from routers.config import make_arg_parser

    return make_arg_parser([RetrieverTrainingConfig], prog="memroute train retriever",
                           description="Train the evidence retriever (multi-positive InfoNCE).")


def main(argv=None):
    from transformers import set_seed

    from routers.config import parse_config, save_resolved_config

    parser = make_parser()
    cpu_ddp_defaults(parser)
    (cfg,) = parse_config(parser, [RetrieverTrainingConfig], argv)
    setup_cli_logging()  # a CLI entry point (memroute train ..., python -m, accelerate launch -m)
    resolve_report_to(cfg)
    set_seed(cfg.seed)
    # Data, paths, export target and resume fingerprint first: they fail in seconds, the encoder load does not.
    check_local_model_path(cfg.model_name_or_path, "model_name_or_path")
    recs, dev_recs, held_out = train_and_eval_records(cfg, read_records(cfg),
                                                      lambda path: read_records(cfg, path, "eval_file"))
    resume = resolve_resume(cfg)
    fingerprint = {**run_fingerprint(cfg, FINGERPRINT_KEYS, {"train_file": cfg.train_file}), **dev_fingerprint(cfg)}
    check_start(cfg, "retriever", resume, fingerprint, protect=(resume,))
    dataset = build_dataset(recs)
    evaluator = None
    if dev_recs is not None:
        from train.retriever_eval import ir_evaluator, select_best_by_primary_metric

        evaluator = ir_evaluator(dev_recs, batch_size=cfg.per_device_eval_batch_size)
        held_out["dev_queries"], held_out["dev_corpus"] = len(evaluator.queries), len(evaluator.corpus)
        select_best_by_primary_metric(cfg)
    model = load_model(cfg.model_name_or_path, cfg.max_seq_length)
    inference_budget = cfg.export_max_seq_length or model.memroute_base_max_seq_length
    trainer = RetrieverTrainer(model=model, args=cfg, train_dataset=dataset, loss=make_loss(model, cfg),
                               evaluator=evaluator)
    check_world_size(trainer.args)
    warn_if_fsdp_ignored(trainer)
    if trainer.is_world_process_zero():
        save_resolved_config(cfg.output_dir, cfg)
        log.info("%d training queries from %s; batch %d x (<= %d pos + %d neg); %s; resume from %s", len(dataset),
                 cfg.train_file, cfg.per_device_train_batch_size, cfg.positives_per_query, cfg.negatives_per_query,
                 f"{held_out['dev_queries']} dev queries" if held_out else "no dev set", resume)
    add_early_stopping(trainer, cfg)
    if cfg.max_train_minutes is not None:
        trainer.add_callback(time_budget_callback(cfg.max_train_minutes))
    result = trainer.train(resume_from_checkpoint=resume)  # load_best_model_at_end: trainer.model is the best one
    if evaluator is not None and not has_eval_strategy(cfg):
        trainer.evaluate()  # a dev set without eval_strategy: evaluate the final model once
    trainer.save_model(cfg.output_dir)
    info = {"model": cfg.model_name_or_path, "train_file": cfg.train_file, "queries": len(dataset),
            "steps": result.global_step, "train_runtime_s": result.metrics.get("train_runtime"),
            "final_loss": result.training_loss, "temperature": cfg.temperature,
            "batch_size": cfg.per_device_train_batch_size, "positives_per_query": cfg.positives_per_query,
            "negatives_per_query": cfg.negatives_per_query, "learning_rate": cfg.learning_rate,
            "max_seq_length": cfg.max_seq_length, "mini_batch_size": cfg.mini_batch_size,
            "candidate_chunk_size": cfg.candidate_chunk_size,
            "resumed_from": resume, "world_size": trainer.args.world_size,
            "eval": {**held_out, **best_model_info(trainer)} if held_out else None}
    if trainer.is_world_process_zero():
        atomic_write_json(Path(cfg.output_dir) / "train_summary.json", {**info, "log_history": trainer.state.log_history})
        if cfg.export_dir:
            export_retriever(trainer.accelerator.unwrap_model(trainer.model), cfg, cfg.export_dir, info,
                             max_seq_length=inference_budget)
            log.info("exported retriever to %s", cfg.export_dir)
    return trainer, info


if __name__ == "__main__":
    main()
