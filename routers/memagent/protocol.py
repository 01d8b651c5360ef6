"""The interfaces MemAgent's pieces agree on: tasks, trajectories, memory providers, environments, agents.

A finished task is a :class:`Trajectory`; it converts to the shared :class:`~routers.memory.schema.Episode`
(one step per action + observation) so the same runs feed MESA/AutoMem and the Router-Mem corpora.
Providers store trajectories (behind an outcome gate), answer a cheap embedding/keyword ``probe`` for the
Begin decision, and return injectable text from ``retrieve``. Environments and agents are protocols so a
user can plug a web agent and an LLM server in place of the built-in TextWorld suite.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

from routers.memory.schema import Episode, Step

Gate = Literal["success", "all"]
FAMILIES = ("similarity", "structural", "insight")


@dataclass
class Task:
    """One task instance: ``goal`` is what the agent is told; ``meta`` carries env specifics (game file, seed)."""

    task_id: str
    goal: str
    split: str = "train"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Observation:
    text: str
    admissible_commands: list[str] = field(default_factory=list)
    done: bool = False
    won: bool = False
    score: float = 0.0


@dataclass
class TrajectoryStep:
    """One agent step; ``injected`` is the short-term memory text shown before acting ('' = NoOp)."""

    index: int
    observation: str
    action: str
    injected: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    task: Task
    steps: list[TrajectoryStep]
    success: bool
    reward: float = 0.0
    begin_provider: str | None = None      # provider whose memory was injected at Begin (None = no memory)
    begin_memory: str = ""                 # the injected text
    error: str | None = None               # set when the rollout failed (agent/LLM error): counted, not raised
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Trajectory":
        d = dict(d)
        d["task"] = Task(**d["task"])
        d["steps"] = [TrajectoryStep(**s) for s in d["steps"]]
        return cls(**d)

    def render(self, max_steps: int | None = None) -> str:
        """Plain-text trajectory an LLM reads when writing memories."""
        lines = [f"Task: {self.task.goal}", f"Outcome: {'success' if self.success else 'failure'}"]
        for s in self.steps[:max_steps]:
            lines.append(f"Step {s.index}: > {s.action}\n{s.observation.strip()}")
        return "\n".join(lines)

    def to_episode(self) -> Episode:
        steps = [Step(step_id=f"S{s.index}", index=s.index, text=f"> {s.action}\n{s.observation.strip()}",
                      speaker="agent", meta={"action": s.action, "observation": s.observation})
                 for s in self.steps]
        return Episode(episode_id=self.task.task_id, steps=steps, source="memagent",
                       meta={"goal": self.task.goal, "success": self.success})


@dataclass
class MemoryItem:
    """One stored memory. ``key`` is what retrieval matches against (task text, insight, workflow name)."""

    provider: str
    item_id: str
    key: str
    text: str
    source_task_id: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Preview:
    """Begin-probe result: compact, computed without an LLM."""

    provider: str
    score: float
    snippet: str
    n_items: int


@dataclass
class Retrieved:
    provider: str
    text: str                                  # injected into the task prompt ('' when nothing matched)
    item_ids: list[str] = field(default_factory=list)


@runtime_checkable
class MemoryProvider(Protocol):
    name: str
    family: str              # one of FAMILIES
    gate: Gate               # which outcomes are stored
    k: int

    def describe_storage(self) -> str: ...
    def describe_retrieval(self) -> str: ...
    def store(self, trajectory: Trajectory) -> list[MemoryItem]: ...
    def probe(self, goal: str) -> Preview: ...
    def retrieve(self, goal: str) -> Retrieved: ...
    def save(self, path) -> None: ...
    def load(self, path) -> None: ...


@runtime_checkable
class TaskEnvironment(Protocol):
    """An environment the explorer and the routed agent run tasks in."""

    def tasks(self, split: str) -> list[Task]: ...
    def reset(self, task: Task) -> Observation: ...
    def step(self, command: str) -> Observation: ...


@runtime_checkable
class Agent(Protocol):
    """Chooses the next command; ``memory`` is Begin memory plus any In (short-term) injection."""

    def act(self, task: Task, history: Sequence[TrajectoryStep], observation: Observation, memory: str) -> str: ...
