"""The exported MESA structure selector: :class:`MesaSelector` (router_type ``mesa_selector``).

    from routers.base import load_router
    sel = load_router("outputs/mesa/locomo/selector")
    sel.select("When did Caroline go to the support group?", previews)   # -> ("temporal", "vector")

``previews`` maps structure name -> ``{"ok", "tokens", "preview", "top_score"}`` (absent structures count as
unavailable; other keys are ignored). The export directory holds ``policy.json`` (the :class:`Policy`),
``router_config.json`` and a model card ``README.md``; there are no weights.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from routers.base import ExportedRouter, RouterConfigError, _read_object, model_card_json_sections
from routers.mesa.policies import Policy
from routers.mesa.selector_view import STRUCTURES, QueryView, mask_of
from routers.mesa.sweep_format import subset_key

POLICY_FILE = "policy.json"


@dataclass
class MesaSelectorConfig:
    policy_file: str = POLICY_FILE
    direction: str = ""
    default_subset: str = ""
    score: str = "evidence_recall"
    lam: float = 0.1
    t_ref: float = 1.0
    seed: int | None = None
    validation: dict = field(default_factory=dict)

    @staticmethod
    def check_values(values: dict) -> None:
        if values.get("policy_file") != POLICY_FILE:
            raise ValueError(f"policy_file must be {POLICY_FILE!r}, got {values.get('policy_file')!r:.80}")


class MesaSelector(ExportedRouter):
    router_type = "mesa_selector"
    config_cls = MesaSelectorConfig

    def __init__(self, policy: Policy, config: MesaSelectorConfig | None = None, calibration: dict | None = None):
        self.policy = policy
        self.config = config or MesaSelectorConfig(direction=policy.direction, default_subset=policy.default)
        self.config.direction, self.config.default_subset = policy.direction, policy.default
        self.calibration = calibration or {}

    @classmethod
    def _load_weights(cls, path: Path, config, device=None, dtype=None) -> dict:
        file = Path(path) / POLICY_FILE
        raw = _read_object(file, "the selector policy")
        try:
            return {"policy": Policy.from_dict(raw)}
        except (ValueError, TypeError, KeyError) as err:
            raise RouterConfigError(f"{file}: not a valid MESA policy ({err})") from None

    def _save_weights(self, directory: Path) -> None:
        (Path(directory) / POLICY_FILE).write_text(json.dumps(self.policy.to_dict(), indent=2) + "\n", encoding="utf-8")

    def _description(self) -> dict:
        return {"labels": list(STRUCTURES), "action_space": "the 31 non-empty subsets of the five structures"}

    # -- selecting ---------------------------------------------------------------------------------------------
    def select(self, question: str, previews: Mapping | None = None, corpus: str = "") -> tuple[str, ...]:
        """The structures to read for ``question`` (canonical order; never empty)."""
        return self.policy.select(QueryView.from_previews(question, previews, corpus))

    def select_key(self, question: str, previews: Mapping | None = None, corpus: str = "") -> str:
        return subset_key(self.select(question, previews, corpus))

    def score(self, questions: Sequence[str], previews: Sequence[Mapping], corpus: str = ""):
        """(n, 5) 0/1 tensor: structure k selected for question i (columns in STRUCTURES order)."""
        import torch

        rows = []
        for q, p in zip(questions, previews, strict=True):
            m = mask_of(self.select(q, p, corpus))
            rows.append([float(m >> k & 1) for k in range(len(STRUCTURES))])
        return torch.tensor(rows).reshape(-1, len(STRUCTURES))

    def decide(self, scores, threshold: float | None = None) -> list[str]:
        """Subset keys from :meth:`score` rows (``threshold`` unused: selections are already 0/1)."""
        return [subset_key([n for n, v in zip(STRUCTURES, row) if float(v) > 0.5] or self.policy.default.split("+"))
                for row in scores.tolist()]

    def model_card(self, metrics: dict | None = None, training: dict | None = None) -> str:
        c = self.config
        lines = ["---", "library_name: memroute", "tags: [memroute, mesa, memory-structure-selection]", "---", "",
                 "# MESA structure selector", "",
                 "Chooses, per question, which of the five memory structures (summary, temporal, graph, vector, raw) "
                 "an agent reads. Learned by MESA's UCB-guided policy search over twenty prior directions on a "
                 "structure sweep; a policy is an inspectable JSON object (`policy.json`).", "",
                 f"- direction: `{self.policy.direction}`; hyper-parameters `{json.dumps(self.policy.hyper)}`",
                 f"- repair rules: {len(self.policy.rules)}; default subset `{self.policy.default}`",
                 f"- objective: {c.score} - {c.lam} x evidence tokens / {c.t_ref:.0f} (mean all-five tokens, train)",
                 f"- validation: `{json.dumps(c.validation)}`", "",
                 "```python", "from routers.base import load_router", "sel = load_router(path)",
                 "sel.select(question, previews)  # previews: name -> {ok, tokens, preview, top_score}", "```"]
        return "\n".join(lines + model_card_json_sections(training, metrics)) + "\n"

    def router_config(self) -> dict:
        out = super().router_config()
        out.update(dataclasses.asdict(self.config))
        return out
