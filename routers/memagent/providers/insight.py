"""Insight-accumulation providers (MemAgent Table 15): the indexable unit is an atomic, composable insight
fragment. ExpeL, Agent-KB, InsightGraph, Mobile-E, EvolveR, LightWeight."""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from routers.memagent.protocol import MemoryItem
from routers.memagent.providers.base import BaseProvider
from routers.memagent.providers.text_limits import parse_bullets, parse_sections
from routers.memory.index import top_k


def _ranked(scores: np.ndarray, rows: Sequence[int], n: int) -> list[int]:
    """The ``n`` best of ``rows`` by score (ties: earlier row)."""
    rows = list(rows)
    if not rows:
        return []
    return [rows[j] for j in top_k(scores[np.asarray(rows)], n)[0]]


class ExpeL(BaseProvider):
    """ExpeL (Zhao et al., 2024) as MemAgent runs it (Tables 6, 7, 11): dual path -- insights (tips or
    warnings) extracted from every outcome, plus refined trajectories from successes; hybrid retrieval
    0.3 TF-IDF + 0.7 dense over both, k = 3.

    Insights evolve with ExpeL's own operations: the LLM sees the existing insights most similar to the
    task (ExpeL shows the whole list; a cap of ``shown_insights`` keeps prompts bounded) and answers
    ``ADD``/``EDIT n``/``UPVOTE n``/``DOWNVOTE n``; new insights start with 2 votes, an insight at 0 votes is
    removed. Limits (not in the paper's text): 40 words per insight, 150 per refined trajectory."""

    name, family, gate, k = "expel", "insight", "all", 3
    retrieval = "hybrid"
    dense_weight = 0.7
    keyword_kind = "tfidf"
    word_limit = 40
    trajectory_words = 150
    output_word_limit = 260
    shown_insights = 10
    max_new_insights = 3
    max_new_tokens = 200
    reference = "Zhao et al., 2024 (ExpeL)"
    storage_description = ("Extracts insights (tips or warnings) from all outcomes; stores refined trajectories "
                           "from successes.")
    retrieval_description = "Hybrid (TF-IDF 0.3 + semantic 0.7) retrieval of insights and successful trajectories."

    _OP = re.compile(r"^(ADD|EDIT|UPVOTE|DOWNVOTE|AGREE|REMOVE)\b\s*(?:#|insight\s*)?(\d+)?\s*[:.\-]?\s*(.*)$",
                     re.IGNORECASE)

    def _write(self, trajectory, items):
        items = list(items)
        insights = [i for i, it in enumerate(items) if it.meta.get("kind") == "insight"]
        shown: list[int] = insights
        if len(insights) > self.shown_insights:
            st = self._state
            q = self._embed([trajectory.task.goal])[0]
            sims = np.asarray(st.embeddings[np.asarray(insights)] @ q, np.float64)
            shown = [insights[j] for j in top_k(sims, self.shown_insights)[0]]
        listing = "\n".join(f"{n + 1}. {items[i].text}" for n, i in enumerate(shown)) or "(none yet)"
        out = self._ask(
            "You maintain a list of general insights (tips or warnings) that help an agent solve future tasks. "
            "Compare the trajectory with the existing insights and answer with operations, one per line:\n"
            "ADD: <new insight>\nEDIT <n>: <improved insight n>\nUPVOTE <n>\nDOWNVOTE <n>\n"
            "Each insight at most 40 words and general (no task-specific names).",
            f"Existing insights:\n{listing}\n\n{self._traj_prompt(trajectory)}")
        added = 0
        removed: set[int] = set()
        for line in parse_bullets(out):
            m = self._OP.match(line)
            op, num, body = (m.group(1).upper(), m.group(2), m.group(3).strip()) if m else ("ADD", None, line)
            target = shown[int(num) - 1] if num and 0 < int(num) <= len(shown) else None
            if op == "ADD":
                body = self._limit(body)
                if len(body.split()) >= 3 and added < self.max_new_insights \
                        and all(items[i].text.lower() != body.lower() for i in insights):
                    items.append(self._new_item(trajectory, body, body, kind="insight", votes=2))
                    added += 1
            elif target is not None and target not in removed:
                it = items[target]
                votes = int(it.meta.get("votes", 2))
                if op == "EDIT" and len(body.split()) >= 3:
                    body = self._limit(body)
                    items[target] = dataclasses.replace(it, key=body, text=body, meta={**it.meta, "votes": votes + 1})
                elif op in ("UPVOTE", "AGREE"):
                    items[target] = dataclasses.replace(it, meta={**it.meta, "votes": votes + 1})
                elif op in ("DOWNVOTE", "REMOVE"):
                    items[target] = dataclasses.replace(it, meta={**it.meta, "votes": votes - 1})
                    if votes - 1 <= 0:
                        removed.add(target)
        if trajectory.success:
            refined = self._ask(
                "Rewrite this successful trajectory as a concise worked example for similar tasks: alternating "
                "'Thought:' and 'Action:' lines, only the steps that mattered, at most 150 words.",
                self._traj_prompt(trajectory))
            refined = self._limit(refined, self.trajectory_words)
            if refined:
                items.append(self._new_item(trajectory, trajectory.task.goal,
                                            f"Task: {trajectory.task.goal}\n{refined}", kind="trajectory"))
        self._pending["insights_removed"] += len(removed)
        return [it for i, it in enumerate(items) if i not in removed]

    def _render(self, goal, items):
        ins = [it.text for it in items if it.meta.get("kind") == "insight"]
        traj = [it.text for it in items if it.meta.get("kind") == "trajectory"]
        parts = []
        if ins:
            parts.append("Insights:\n" + "\n".join(f"- {t}" for t in ins))
        if traj:
            parts.append("Similar successful trajectory:\n" + "\n\n".join(traj))
        return "\n\n".join(parts)


class AgentKB(BaseProvider):
    """Agent KB (Tang et al., 2025) as MemAgent describes it (Table 11): successful trajectories are
    summarized into structured fields -- Agent Planning, Search Agent Planning, Agent Experience -- and
    retrieval gives Student Guidance (reference plans) and Teacher Guidance (lessons learned). k and the
    retrieval mix are not in the text we have; they follow Agent KB's hybrid retrieval (lexical + semantic,
    here BM25 0.5 + dense 0.5 on the task query), k = 2, and a 200-word limit per entry and on the output."""

    name, family, gate, k = "agent_kb", "insight", "success", 2
    retrieval = "hybrid"
    dense_weight = 0.5
    keyword_kind = "bm25"
    word_limit = 200
    output_word_limit = 200
    max_new_tokens = 300
    SECTIONS = ("Agent Planning", "Search Agent Planning", "Agent Experience")
    reference = "Tang et al., 2025 (Agent KB)"
    storage_description = ("Summarizes successful trajectories into structured fields: Agent Planning, Search Agent "
                           "Planning, Agent Experience.")
    retrieval_description = "Student Guidance (reference plans) and Teacher Guidance (lessons learned)."

    def _write(self, trajectory, items):
        out = self._ask(
            "Summarize this successful trajectory into a knowledge-base entry with exactly these sections:\n"
            "Agent Planning: <the overall plan that worked>\nSearch Agent Planning: <how information was "
            "searched for or explored>\nAgent Experience: <lessons learned for similar tasks>\nAt most 200 words.",
            self._traj_prompt(trajectory))
        sec = parse_sections(out, self.SECTIONS)
        if not any(sec.values()):
            sec["Agent Experience"] = out.strip()
        if not any(sec.values()):
            return list(items)
        text = self._limit("\n".join(f"{n}: {v}" for n, v in sec.items() if v))
        sec = parse_sections(text, self.SECTIONS)
        return [*items, self._new_item(trajectory, trajectory.task.goal, text, fields=sec)]

    def _render(self, goal, items):
        plans, lessons = [], []
        for it in items:
            f = it.meta.get("fields", {})
            plan = " ".join(v for v in (f.get("Agent Planning"), f.get("Search Agent Planning")) if v)
            if plan:
                plans.append(f"- ({it.meta.get('goal', '')}) {plan}")
            if f.get("Agent Experience"):
                lessons.append(f"- {f['Agent Experience']}")
        parts = []
        if plans:
            parts.append("Student guidance (reference plans):\n" + "\n".join(plans))
        if lessons:
            parts.append("Teacher guidance (lessons learned):\n" + "\n".join(lessons))
        return "\n\n".join(parts)


class InsightGraph(BaseProvider):
    """InsightGraph. MemAgent's text gives only its family and that it injects the fewest tokens (57 per task,
    Table 14); the design here is ours: insights are graph nodes tagged with concepts, linked through shared
    concepts. Storing extracts up to 2 '(concepts) | insight' pairs from every outcome (<= 30 words each);
    a near-duplicate insight (cosine >= ``merge_threshold``) reinforces the existing node (support + 1,
    concepts merged) instead of adding one. Retrieval seeds with the most similar node (dense) and expands
    along shared concepts, k = 2 nodes, <= 60 words."""

    name, family, gate, k = "insightgraph", "insight", "all", 2
    word_limit = 30
    output_word_limit = 60
    merge_threshold = 0.92
    max_new_tokens = 120
    reference = "InsightGraph (cited in MemAgent; design not specified there)"
    storage_description = ("Extracts concept-tagged insights from every trajectory into a graph; similar insights "
                           "reinforce existing nodes.")
    retrieval_description = "Finds the most relevant insight node and its concept neighbours (very compact)."

    def _write(self, trajectory, items):
        out = self._ask(
            "Extract at most 2 general insights from this trajectory. One per line, in the form "
            "'concept1, concept2 | insight' with at most 30 words per insight.", self._traj_prompt(trajectory))
        items = list(items)
        new_pairs = []
        for line in parse_bullets(out, 2):
            concepts, sep, insight = line.partition("|")
            if not sep:
                concepts, insight = "", line
            tags = sorted({c.strip().lower() for c in concepts.split(",") if c.strip()})[:4]
            insight = self._limit(insight.strip())
            if len(insight.split()) >= 3:
                new_pairs.append((tags, insight))
        if not new_pairs:
            return items
        keys = [f"{', '.join(t)}: {s}" if t else s for t, s in new_pairs]
        new_emb = self._embed(keys)
        old_emb = self._state.embeddings
        for (tags, insight), key, vec in zip(new_pairs, keys, new_emb):
            j = -1
            if old_emb is not None and len(old_emb):
                sims = np.asarray(old_emb @ vec, np.float64)
                j = int(np.argmax(sims)) if float(sims.max()) >= self.merge_threshold else -1
            if j >= 0:
                it = items[j]
                merged = sorted(set(it.meta.get("concepts", [])) | set(tags))
                items[j] = dataclasses.replace(it, meta={**it.meta, "concepts": merged,
                                                         "support": int(it.meta.get("support", 1)) + 1})
                self._pending["merged"] += 1
            else:
                items.append(self._new_item(trajectory, key, insight, concepts=tags, support=1))
        return items

    def _select(self, goal, scores, items):
        seed = int(top_k(scores, 1)[0][0])
        tags = set(items[seed].meta.get("concepts", []))
        linked = [i for i, it in enumerate(items) if i != seed and tags & set(it.meta.get("concepts", []))]
        chosen = [seed] + _ranked(scores, linked, self.k - 1)
        if len(chosen) < self.k:
            rest = [i for i in range(len(items)) if i not in chosen]
            chosen += _ranked(scores, rest, self.k - len(chosen))
        return chosen

    def _render(self, goal, items):
        return "\n".join(f"- {it.text}" for it in items)


class MobileE(BaseProvider):
    """Mobile-Agent-E (Wang et al., 2025b) as MemAgent runs it (Tables 6, 7): keyword-indexed Tips (text)
    and Shortcuts (structured action sequences); keyword retrieval (the paper tokenizes with Jieba; here
    ``keyword_tokens``, Jieba for CJK when installed) returning 2 tips + 2 shortcuts. Mobile-Agent-E's
    experience reflectors update after every task, so the gate is 'all'; shortcuts are only written from
    successful trajectories (a shortcut must be a sequence that worked). Limits (ours): tip <= 40 words,
    shortcut <= 60 words. A shortcut with an existing name replaces it; duplicate tips are skipped."""

    name, family, gate, k = "mobile_e", "insight", "all", 4
    retrieval = "keyword"
    keyword_kind = "bm25"
    n_tips, n_shortcuts = 2, 2
    word_limit = 40
    shortcut_words = 60
    output_word_limit = 2 * 40 + 2 * 60 + 10
    max_new_tokens = 220
    reference = "Wang et al., 2025b (Mobile-Agent-E)"
    storage_description = "Tips (general guidance, all outcomes) and Shortcuts (reusable action sequences from successes)."
    retrieval_description = "Keyword-based retrieval of 2 tips and 2 shortcuts."

    def _write(self, trajectory, items):
        ask_shortcuts = ("\nSHORTCUTS:\n- <name> | <precondition> | <action 1>; <action 2>; ..." if trajectory.success
                         else "")
        out = self._ask(
            "Reflect on this trajectory. Write up to 2 tips (general guidance, at most 40 words each)"
            + (" and up to 2 shortcuts (reusable action sequences that worked)" if trajectory.success else "")
            + ". Format:\nTIPS:\n- <tip>" + ask_shortcuts, self._traj_prompt(trajectory))
        sec = parse_sections(out, ("TIPS", "SHORTCUTS"))
        if not sec["TIPS"] and not sec["SHORTCUTS"]:
            sec["TIPS"] = out
        items = list(items)
        have_tips = {it.text.lower() for it in items if it.meta.get("kind") == "tip"}
        for tip in parse_bullets(sec["TIPS"], 2):
            tip = self._limit(tip)
            if len(tip.split()) >= 3 and tip.lower() not in have_tips:
                items.append(self._new_item(trajectory, tip, tip, kind="tip"))
                have_tips.add(tip.lower())
        if trajectory.success:
            for line in parse_bullets(sec["SHORTCUTS"], 2):
                parts = [p.strip() for p in line.split("|")]
                if len(parts) < 2 or not parts[0]:
                    continue
                name = parts[0]
                pre = parts[1] if len(parts) > 2 else ""
                actions = parts[-1]
                text = self._limit(f"Shortcut {name} (when: {pre or 'any'}): {actions}", self.shortcut_words)
                items = [it for it in items if not (it.meta.get("kind") == "shortcut" and it.meta.get("name") == name)]
                items.append(self._new_item(trajectory, f"{name} {pre} {actions}", text, kind="shortcut",
                                            name=name))
        return items

    def _select(self, goal, scores, items):
        tips = [i for i, it in enumerate(items) if it.meta.get("kind") == "tip"]
        shortcuts = [i for i, it in enumerate(items) if it.meta.get("kind") == "shortcut"]
        return _ranked(scores, tips, self.n_tips) + _ranked(scores, shortcuts, self.n_shortcuts)

    def _render(self, goal, items):
        tips = [it.text for it in items if it.meta.get("kind") == "tip"]
        cuts = [it.text for it in items if it.meta.get("kind") == "shortcut"]
        parts = []
        if tips:
            parts.append("Tips:\n" + "\n".join(f"- {t}" for t in tips))
        if cuts:
            parts.append("Shortcuts:\n" + "\n".join(f"- {t}" for t in cuts))
        return "\n\n".join(parts)


class EvolveR(BaseProvider):
    """EvolveR (Wu et al., 2025). MemAgent's text gives only its family, so the design follows EvolveR's
    experience lifecycle: every trajectory is self-distilled into up to 2 strategic principles (guiding
    ones from successes, cautionary ones from failures, <= 40 words); a principle that repeats an existing
    one (cosine >= ``merge_threshold``) updates that principle instead of being added; each principle keeps
    usage statistics -- when a later trajectory was given this provider's memory at Begin, the principles
    it was shown are credited with its outcome -- and its score (successes + 1) / (uses + 2); principles
    used >= ``prune_min_uses`` times with a score below ``prune_below`` are pruned. Retrieval: dense, k = 3."""

    name, family, gate, k = "evolver", "insight", "all", 3
    word_limit = 40
    merge_threshold = 0.85
    prune_min_uses, prune_below = 5, 0.2
    max_new_tokens = 140
    reference = "Wu et al., 2025 (EvolveR)"
    storage_description = ("Distills guiding (success) and cautionary (failure) strategic principles from every "
                           "trajectory; merges repeats and tracks each principle's success score.")
    retrieval_description = "Semantic search over principles; returns the 3 most relevant with their scores."

    def _write(self, trajectory, items):
        items = list(items)
        if trajectory.begin_provider == self.name and trajectory.begin_memory:
            for j, it in enumerate(items):
                if it.text in trajectory.begin_memory:
                    items[j] = dataclasses.replace(it, meta={**it.meta, "uses": int(it.meta.get("uses", 0)) + 1,
                                                             "successes": int(it.meta.get("successes", 0))
                                                             + int(bool(trajectory.success))})
        kind = "guiding" if trajectory.success else "cautionary"
        out = self._ask(
            f"Distill at most 2 {kind} strategic principles from this {'successful' if trajectory.success else 'failed'} "
            "trajectory: general rules an agent should follow (or avoid) on similar tasks. One per line, at most "
            "40 words each.", self._traj_prompt(trajectory))
        principles = [self._limit(p) for p in parse_bullets(out, 2)]
        principles = [p for p in principles if len(p.split()) >= 3]
        if principles:
            vecs = self._embed(principles)
            old = self._state.embeddings
            for p, vec in zip(principles, vecs):
                j = -1
                if old is not None and len(old):
                    sims = np.asarray(old @ vec, np.float64)
                    j = int(np.argmax(sims)) if float(sims.max()) >= self.merge_threshold else -1
                if j >= 0 and items[j].item_id == self._state.items[j].item_id:
                    it = items[j]
                    items[j] = dataclasses.replace(it, meta={**it.meta, "merged": int(it.meta.get("merged", 0)) + 1})
                    self._pending["merged"] += 1
                else:
                    items.append(self._new_item(trajectory, p, p, kind=kind, uses=0, successes=0, merged=0))
        keep = [it for it in items if not (int(it.meta.get("uses", 0)) >= self.prune_min_uses
                                           and principle_score(it) < self.prune_below)]
        self._pending["pruned"] += len(items) - len(keep)
        return keep

    def _render(self, goal, items):
        return "Principles:\n" + "\n".join(
            f"- [{it.meta.get('kind', 'guiding')}, score {principle_score(it):.2f}] {it.text}" for it in items)


def principle_score(item: MemoryItem) -> float:
    return (int(item.meta.get("successes", 0)) + 1) / (int(item.meta.get("uses", 0)) + 2)


class LightWeight(BaseProvider):
    """LightWeight (Zhang et al., 2026a) as MemAgent describes it (Table 11): after a successful task, extract
    a strategic memory (planning and decisions) and an operational memory (tools and techniques); retrieval
    provides long-term strategic/operational experience. k and the limit are not in the text we have: k = 2
    (the best strategic and the best operational memory), <= 60 words each (Table 14 measures ~154 injected
    tokens). Keys are the task plus the memory text."""

    name, family, gate, k = "lightweight", "insight", "success", 2
    word_limit = 60
    max_new_tokens = 200
    reference = "Zhang et al., 2026a (LightWeight)"
    storage_description = ("Extracts strategic (planning/decisions) and operational (tools/techniques) memories "
                           "after task success.")
    retrieval_description = "Provides long-term strategic/operational experience."

    def _write(self, trajectory, items):
        out = self._ask(
            "Extract two memories from this successful trajectory, at most 60 words each:\n"
            "STRATEGIC: <planning and decisions that led to success>\nOPERATIONAL: <tools, commands and "
            "techniques that worked>", self._traj_prompt(trajectory))
        sec = parse_sections(out, ("STRATEGIC", "OPERATIONAL"))
        new = []
        for kind in ("strategic", "operational"):
            text = self._limit(sec[kind.upper()])
            if text:
                new.append(self._new_item(trajectory, f"{trajectory.task.goal}\n{text}", text, kind=kind))
        return [*items, *new]

    def _select(self, goal, scores, items):
        by_kind = [_ranked(scores, [i for i, it in enumerate(items) if it.meta.get("kind") == kd], 1)
                   for kd in ("strategic", "operational")]
        chosen = [i for sel in by_kind for i in sel]
        if len(chosen) < self.k:
            chosen += _ranked(scores, [i for i in range(len(items)) if i not in chosen], self.k - len(chosen))
        return chosen[: self.k]

    def _render(self, goal, items):
        return "\n".join(f"{it.meta.get('kind', 'memory').capitalize()} experience: {it.text}" for it in items)
