"""Deterministic stand-ins for the MemAgent provider tests: a hashed bag-of-words encoder and an LLM that
answers each provider's writing prompt in that provider's format (mentioning the task, so retrieval by goal
is checkable)."""

from __future__ import annotations

import re
import zlib

import numpy as np

from routers.memagent.protocol import Task, Trajectory, TrajectoryStep


class HashEncoder:
    """Hashed word counts (``dim`` buckets); unnormalized on purpose (the provider normalizes)."""

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), self.dim), np.float32)
        for r, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", t.lower()):
                out[r, zlib.crc32(w.encode()) % self.dim] += 1.0
            out[r, 0] += 0.05
        return out


def goal_of(prompt: str) -> str:
    m = re.search(r"^Task: (.*)$", prompt, re.M)
    return m.group(1).strip() if m else "unknown"


class ScriptedLLM:
    """Answers by recognising each provider's instruction; ``verbose`` pads answers to ~300 extra words;
    ``fail_on`` raises for prompts containing that text."""

    name = "scripted"

    def __init__(self, verbose: bool = False, fail_on: str | None = None):
        self.verbose = verbose
        self.fail_on = fail_on
        self.prompts: list[str] = []

    def generate(self, conversations, max_new_tokens=64):
        out = []
        for conv in conversations:
            system, user = conv[0]["content"], conv[-1]["content"]
            self.prompts.append(system)
            if self.fail_on and self.fail_on in system:
                raise RuntimeError("scripted LLM failure")
            out.append(self.respond(system, user))
        return out

    def respond(self, s: str, u: str) -> str:
        g = goal_of(u)
        slug = re.sub(r"[^a-z0-9]+", "_", g.lower()).strip("_")[:30]
        pad = (" filler" * 300) if self.verbose else ""
        if "rate the importance" in s:  # Generative rerank: word overlap with the new task
            task = set(re.search(r"New task: (.*)", u).group(1).lower().split())
            mems = re.findall(r"\[(\d+)\] (.*?)(?=\n\n\[\d+\]|\n\nRate|\Z)", u, re.S)
            return "\n".join(f"{j}: {len(task & set(m.lower().split()))}" for j, m in mems)
        if "Summarize this part" in s:
            return f"Part note about {g}."
        if "distill an agent's trajectory" in s:
            return (f"The agent worked on {g}. It explored. It acted. It checked. It finished. It reported. "
                    f"It rested. It slept.{pad}")
        if "numbered lines" in s:
            return f"1. go to {g} -> ok\n2. take -> done{pad}"
        if "Summarize this agent trajectory" in s:
            return f"Summary of {g}.{pad}"
        if "cheatsheet" in s:
            return f"Strategy for {g}: check everything first.{pad}"
        if "Induce a reusable workflow" in s:
            return f"Workflow: solve {g}\n1. locate {{item}}\n2. use it{pad}"
        if "Python function" in s:
            body = "".join(f'\n    act("step {i}")' for i in range(200)) if self.verbose else '\n    act("look")'
            return f'```python\ndef solve_{slug}(target):\n    """Solve tasks like {g}."""{body}\n```'
        if "procedural script" in s:
            return f"1. Look around\n2. Do {g}{pad}"
        if "general insights (tips or warnings)" in s:
            return f"ADD: When asked to {g}, inspect first.{pad}\nUPVOTE 1"
        if "worked example" in s:
            return f"Thought: plan\nAction: do it{pad}"
        if "knowledge-base entry" in s:
            return (f"Agent Planning: plan {g}\nSearch Agent Planning: explore rooms\n"
                    f"Agent Experience: lesson about {g}{pad}")
        if "'concept1, concept2 | insight'" in s:
            w = g.split()
            return f"{w[0]}, {w[-1]} | Always check {g} carefully before acting{pad}"
        if "Write up to 2 tips" in s:
            return (f"TIPS:\n- Tip for {g} tasks: look first{pad}\n"
                    f"SHORTCUTS:\n- grab_{slug} | item visible | take item; go north{pad}")
        if "strategic principles" in s:
            return f"Principle: for {g} always verify.{pad}"
        if "STRATEGIC:" in s:
            return f"STRATEGIC: plan {g} early{pad}\nOPERATIONAL: use the examine command for {g}{pad}"
        raise AssertionError("unexpected prompt: " + s[:80])


GOALS = ["cook the red apple in the oven", "unlock the wooden chest with a key",
         "water the plants in the garden", "read the ancient book in the library"]


def trajectory(i: int, goal: str, success: bool = True, n_steps: int = 2, **kw) -> Trajectory:
    steps = [TrajectoryStep(0, "-= Kitchen =- You see a red apple on the table.", "take apple"),
             TrajectoryStep(1, "You open the chest. It contains a small key.", "open chest")]
    steps += [TrajectoryStep(j, f"You walk around room {j}.", f"go east {j}") for j in range(2, n_steps)]
    return Trajectory(Task(f"t{i}", goal), steps[:n_steps], success, **kw)


def acted(goal: str, actions, ok: bool = True) -> Trajectory:
    """A trajectory that ran exactly ``actions`` for ``goal`` (one step each), as the guards' tests need."""
    steps = [TrajectoryStep(i, f"You did {a}.", a) for i, a in enumerate(actions)]
    return Trajectory(task=Task(f"t-{goal}", goal), steps=steps, success=ok)
