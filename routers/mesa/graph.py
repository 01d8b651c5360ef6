"""Graph (G): triples anchored to steps; entity/lexical match, step proximity, 1-2 hop expansion.

Builder: :mod:`routers.mesa.openie` (heuristic OpenIE-lite by default, or the two-stage LLM prompts). Each edge
is (h, r, t, l) with l the anchoring step index. Access for a question q:

* score(e) = IDF-weighted share of q's content words found in "h r t" + 0.5 per endpoint entity linked to q
  (an entity whose words meet q's) + the proximity bonus 1.25 / (1 + |l - r|) for the closest step r the
  question references explicitly (:class:`routers.mesa.base.StepResolver`); edges within one step of r
  count as step-local seeds even without a lexical match;
* the k_G = 8 best-scoring seed edges are the focal relations; each gets up to 4 neighbours: the best-scoring
  edges sharing an entity with it (1 hop), topped up through the entities of those (2 hops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routers.memory.retrieval import tokenize
from routers.memory.schema import Episode
from routers.mesa.base import Access, StepResolver


def proximity_bonus(anchor: int, refs: list[int]) -> float:
    """1.25 / (1 + |l - r|) for the closest referenced step r (0 without references)."""
    return max((1.25 / (1 + abs(anchor - r)) for r in refs), default=0.0)


def _norm(x: str) -> str:
    return " ".join(tokenize(x)) or x.lower().strip()


@dataclass
class GraphMemory:
    extractor: str = "heuristic"  # or "llm"
    backend: object = None
    k: int = 8
    neighbours: int = 4
    entity_weight: float = 0.5
    name: str = "graph"

    def __post_init__(self):
        if self.extractor not in ("heuristic", "llm"):
            raise ValueError(f"graph extractor must be 'heuristic' or 'llm', got {self.extractor!r}")

    def fingerprint(self) -> dict:
        fp = {"extractor": self.extractor, "k": self.k, "neighbours": self.neighbours,
              "entity_weight": self.entity_weight}
        if self.extractor == "llm":
            fp["model"] = getattr(self.backend, "name", None)
        return fp

    def build(self, episode: Episode) -> dict:
        from routers.mesa.openie import heuristic_triples, llm_triples

        fallbacks = 0
        if self.extractor == "llm":
            if self.backend is None:
                raise ValueError("the llm graph extractor needs a backend (graph_model)")
            edges, fallbacks = llm_triples(episode, self.backend)
        else:
            edges = heuristic_triples(episode)
        if not edges:
            raise ValueError("no triple could be extracted from the episode")
        return {"edges": edges, "llm_fallback_passages": fallbacks}

    def access(self, state: dict, episode: Episode, question: str) -> Access:
        edges = state["edges"]
        refs = StepResolver(episode).parse(question).anchors
        qtok = set(tokenize(question))
        docs = [set(tokenize(f"{e['h']} {e['r']} {e['t']}")) for e in edges]
        n = len(docs)
        df: dict[str, int] = {}
        for d in docs:
            for t in d & qtok:
                df[t] = df.get(t, 0) + 1
        idf = {t: math.log((n + 1) / (df.get(t, 0) + 0.5)) for t in qtok}
        total = sum(idf.values()) or 1.0
        heads = [_norm(e["h"]) for e in edges]
        tails = [_norm(e["t"]) for e in edges]
        linked = {x for x in set(heads) | set(tails) if set(x.split()) & qtok}
        scores, seeds = [], []
        for i, e in enumerate(edges):
            lex = sum(idf[t] for t in docs[i] & qtok) / total
            ent = self.entity_weight * ((heads[i] in linked) + (tails[i] in linked))
            prox = proximity_bonus(e["step"], refs)
            scores.append(lex + ent + prox)
            if lex > 0 or ent > 0 or any(abs(e["step"] - r) <= 1 for r in refs):
                seeds.append(i)
        order = sorted(seeds or range(n), key=lambda i: (-scores[i], edges[i]["step"], i))
        focal = order[: self.k]
        by_entity: dict[str, list[int]] = {}
        for i in range(n):
            for x in {heads[i], tails[i]}:
                by_entity.setdefault(x, []).append(i)
        used = set(focal)
        lines, covered = [], set()
        for f in focal:
            hop1 = {j for x in (heads[f], tails[f]) for j in by_entity.get(x, []) if j not in used}
            pick = sorted(hop1, key=lambda j: (-scores[j], abs(edges[j]["step"] - edges[f]["step"]), j))
            pick = pick[: self.neighbours]
            if len(pick) < self.neighbours:
                ents = {x for j in pick for x in (heads[j], tails[j])} - {heads[f], tails[f]}
                hop2 = {j for x in ents for j in by_entity.get(x, []) if j not in used and j not in pick}
                pick += sorted(hop2, key=lambda j: (-scores[j], j))[: self.neighbours - len(pick)]
            used.update(pick)
            lines.append(self._line(edges[f]))
            lines.extend("    " + self._line(edges[j]) for j in pick)
            covered.update(edges[j]["step"] for j in [f, *pick])
        best = max((scores[i] for i in focal), default=None)
        return Access("\n".join(lines), sorted(covered), top_score=None if best is None else float(best))

    @staticmethod
    def _line(e: dict) -> str:
        return f"({e['step_id']}) {e['h']} | {e['r']} | {e['t']}"
