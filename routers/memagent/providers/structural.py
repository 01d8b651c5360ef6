"""Structural-abstraction providers (MemAgent Table 15): the indexable unit is an abstraction of how a task
was solved -- a workflow template (AWM), an executable function (SkillWeaver), a procedural script (Memp).
All three learn from successful trajectories only."""

from __future__ import annotations

import ast
import re

from routers.memagent.protocol import MemoryItem
from routers.memagent.providers.base import BaseProvider
from routers.memagent.providers.text_limits import action_sequence, count_words


class AWM(BaseProvider):
    """Agent Workflow Memory (Wang et al., 2025c) as MemAgent runs it (Tables 6, 7): LLM-induced abstract
    workflow templates (SOPs) with entity generalization, under 200 words; pure embedding search over the
    templates, k = 1. AWM induces workflows from trajectories judged successful, so the gate is 'success'
    (the paper's Table 11 row is not in the text we have). The template's text is its key."""

    name, family, gate, k = "awm", "structural", "success", 1
    word_limit = 200
    max_new_tokens = 300
    reference = "Wang et al., 2025c (Agent Workflow Memory)"
    storage_description = ("Induces abstract, reusable workflow templates (SOPs) from successful trajectories, "
                           "with task-specific entities replaced by placeholders.")
    retrieval_description = "Vector search over workflow templates; returns the best matching workflow."

    def _write(self, trajectory, items):
        out = self._ask(
            "Induce a reusable workflow from this successful trajectory. Replace task-specific names and values "
            "with {placeholders}. Format:\nWorkflow: <short goal description>\n1. <abstract step>\n2. ...\n"
            "At most 200 words.", self._traj_prompt(trajectory))
        if not out:
            return list(items)
        m = re.search(r"^\s*(?:#+\s*)?\**workflow\**\s*:\s*(.+)$", out, re.IGNORECASE | re.MULTILINE)
        if m is None:  # no header: first line is the title
            first, _, rest = out.partition("\n")
            out = f"Workflow: {first.strip()}\n{rest.strip()}".strip()
        text = self._limit(out)
        return [*items, self._new_item(trajectory, text, text)]


class SkillWeaver(BaseProvider):
    """SkillWeaver (Zheng et al., 2025) as MemAgent describes it (Table 11): successful trajectories are
    analysed for their core procedure and turned into generalized Python functions; retrieval matches
    relevant skills and exposes them as tools. k and the size limit are not in the text we have: k = 3
    skills (SkillWeaver hands an agent a small API of relevant skills) and at most 150 words of code.
    SkillWeaver only keeps skills that pass verification; here a skill must parse (``ast``), define a
    function with a docstring and fit the limit -- code cannot be truncated, so an over-long or broken
    skill is rejected and counted (``stats['rejected_skills']``). A new skill with an existing function
    name replaces the old one (skills are refined, not duplicated). The key is the name + docstring."""

    name, family, gate, k = "skillweaver", "structural", "success", 3
    word_limit = 150
    output_word_limit = 3 * 150 + 20
    max_new_tokens = 320
    reference = "Zheng et al., 2025 (SkillWeaver)"
    storage_description = ("Analyzes successful trajectories to identify core procedures and generates "
                           "generalized Python functions (skills).")
    retrieval_description = "Matches relevant skills and exposes them as callable tools."

    def _write(self, trajectory, items):
        out = self._ask(
            "Turn the core procedure of this successful trajectory into ONE reusable, generalized Python "
            "function. Use parameters instead of task-specific values, start the body with a one-line "
            "docstring, and issue each environment command with act(\"<command>\"). Reply with only the code.",
            self._traj_prompt(trajectory))
        skill = extract_skill(out)
        if skill is None:
            self._pending["rejected_skills"] += 1
            return list(items)
        fn_name, doc, code = skill
        if count_words(code) > self.word_limit:
            self._pending["rejected_skills"] += 1
            self._pending["rejected_over_limit"] += 1
            return list(items)
        key = f"{fn_name.replace('_', ' ')}: {doc}"
        new = self._new_item(trajectory, key, code, function=fn_name, docstring=doc)
        kept = [it for it in items if it.meta.get("function") != fn_name]
        if len(kept) != len(items):
            self._pending["replaced_skills"] += 1
        return [*kept, new]

    def snippet(self, item: MemoryItem) -> str:
        return f"{item.meta.get('function', '')}(): {item.meta.get('docstring', '')}"[: 8 * self.snippet_words]

    def _render(self, goal, items):
        return "Reusable skills (callable tools):\n```python\n" + "\n\n".join(it.text for it in items) + "\n```"


def extract_skill(text: str) -> tuple[str, str, str] | None:
    """(function name, docstring, source) of the first documented function in an LLM answer, or None."""
    block = re.search(r"```(?:python|py)?\s*\n(.*?)```", text or "", re.DOTALL)
    code = block.group(1) if block else (text or "")
    start = re.search(r"^(?:async\s+)?def\s", code, re.MULTILINE)
    if start is None:
        return None
    code = code[start.start():]
    # drop trailing prose after the function (lines that are not indented and not another def)
    lines = code.splitlines()
    end = len(lines)
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() and not line.startswith((" ", "\t")) and not line.startswith(("def ", "@", "#")):
            end = i
            break
    code = "\n".join(lines[:end]).rstrip()
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                return node.name, " ".join(doc.split()), ast.get_source_segment(code, node) or code
    return None


class Memp(BaseProvider):
    """Memp (Fang et al., 2025) procedural memory. MemAgent's text gives no parameters beyond its family
    (procedural scripts), so they follow Memp's best build strategy, *proceduralization*: the memory keeps
    both an LLM-written abstract script and the concrete action sequence of the trajectory, indexed by the
    task query (Memp's query-vector key) and retrieved by dense similarity, k = 1. Memp's 'validation'
    update keeps successful trajectories only, so the gate is 'success'. At most 150 words (script <= 100,
    concrete actions fill the rest)."""

    name, family, gate, k = "memp", "structural", "success", 1
    word_limit = 150
    script_words = 100
    max_new_tokens = 180
    reference = "Fang et al., 2025 (Memp)"
    storage_description = ("Distills successful trajectories into procedural memory: an abstract step-by-step "
                           "script plus the concrete action sequence, keyed by the task query.")
    retrieval_description = "Dense search on task similarity; returns the procedure of the most similar task."

    def _write(self, trajectory, items):
        script = self._ask(
            "Write a procedural script for solving tasks like this one: numbered, abstract steps that would "
            "transfer to similar tasks. At most 100 words.", self._traj_prompt(trajectory))
        script = self._limit(script, self.script_words)
        if not script:
            return list(items)
        head = f"Procedure for: {trajectory.task.goal}\n{script}\nConcrete actions: "
        text = self._limit(head + action_sequence(trajectory))
        return [*items, self._new_item(trajectory, trajectory.task.goal, text)]


__all__ = ["AWM", "SkillWeaver", "Memp", "extract_skill"]
