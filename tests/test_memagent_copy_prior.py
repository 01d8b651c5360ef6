"""The copy prior: remembered command segments, the route pointer, and the LM agent following a remembered route."""

from __future__ import annotations

import pytest

from routers.memagent.agent import LMCommandAgent, compose_memory
from routers.memagent.copy_prior import remembered_commands, route_prior, similarity
from routers.memagent.protocol import Observation, Task, TrajectoryStep

ROUTE = ("Task: In Harbor House, find the red key and put it on the table in the kitchen.\nOutcome: success\n"
         "> go north\n> go east\n> take red key from chest\n> go west\n> go south\n> put red key on table")
CMDS = ["go north", "go south", "go east", "go west", "take blue ball from chest", "take green coin from chest"]


def test_segments_from_every_provider_format():
    want = [["go", "north"], ["go", "east"], ["take", "red", "key", "from", "chest"]]
    formats = {
        "actions": ROUTE,
        "memp": "Procedure for: x\n1. Go to the room.\nConcrete actions: go north; go east; take red key from chest",
        "dilu": "Query: x\nOutcome: success\n1. go north -> You are in the hallway.\n2. go east -> attic\n"
                "3. take red key from chest -> taken",
        "render": "Task: T\nStep 0: > go north\nYou are in the hallway. Exits lead east and south.\n"
                  "Step 1: > go east\nStep 2: > take red key from chest",
    }
    for name, text in formats.items():
        segs = remembered_commands(text)
        got = [s for s in segs if s in want]
        assert got == want, name
        assert all(len(s) <= 8 for s in segs)  # observations and headers are not commands


def test_similarity_keeps_verbs_apart_and_lets_the_object_change():
    assert similarity("take red key from chest".split(), "take blue ball from chest".split()) == 0.6
    assert similarity("go north".split(), "go south".split()) == 0.5
    assert similarity("open chest".split(), "take chest".split()) == 0.0
    assert similarity([], ["go"]) == 0.0


def test_pointer_follows_history_and_skips_detours():
    assert route_prior(ROUTE, [], CMDS) == [1.0, 0, 0, 0, 0, 0]
    assert route_prior(ROUTE, ["go north"], CMDS) == [0, 0, 1.0, 0, 0, 0]
    # the remembered object is gone: both objects on offer at the site match the take at 0.6; the LM picks
    assert route_prior(ROUTE, ["go north", "go east"], CMDS) == [0, 0, 0, 0, 0.6, 0.6]
    assert route_prior(ROUTE, ["go north", "go east", "take blue ball from chest"], CMDS) == [0, 0, 0, 1.0, 0, 0]
    # a detour the memory does not contain leaves the pointer in place
    assert route_prior(ROUTE, ["go north", "examine shelf"], CMDS) == [0, 0, 1.0, 0, 0, 0]
    assert route_prior("", ["go north"], CMDS) == [0.0] * len(CMDS)
    assert route_prior(ROUTE, ["go north"], ["open door"]) == [0.0]


def test_prose_around_the_route_does_not_hide_it():
    """A provider's LLM-written script before the concrete actions (here: a degenerate one, as SmolLM2 writes
    them) is longer than the lookahead; only segments that start with a command verb make the route."""
    junk = "Procedure for: find the red key.\n" + "You've just restarted the game.\n\n" * 8
    memory = junk + "Concrete actions: go north; go east; take red key from chest"
    assert route_prior(memory, [], CMDS) == route_prior(ROUTE, [], CMDS) == [1.0, 0, 0, 0, 0, 0]
    assert route_prior(memory, ["go north"], CMDS) == [0, 0, 1.0, 0, 0, 0]


def test_lm_agent_follows_the_remembered_route_only_with_the_prior(tiny_llama_dir, one_torch_thread):
    task = Task("t", "In Harbor House, find the blue ball and put it on the table in the kitchen.")
    obs = Observation("-= Hallway =-\nExits: east, south.", ["go south", "go east", "look"])
    history = [TrajectoryStep(index=0, observation="-= Hallway =-", action="go north")]
    stm = "## Collected Data\n- go north was tried"
    routes = {nxt: ROUTE.replace("> go east", f"> {nxt}") for nxt in ("go east", "go south")}
    copier = LMCommandAgent.from_pretrained(tiny_llama_dir, memory_prior=50.0)
    plain = LMCommandAgent.from_pretrained(tiny_llama_dir)
    lm_choices = set()
    for nxt, route in routes.items():  # whichever the LM prefers, the copier takes the route's next command
        memory = compose_memory(route, stm)
        assert copier.act(task, history, obs, memory) == nxt and copier.last_info["prior"] == 1.0
        lm_choices.add(plain.act(task, history, obs, memory))
        assert plain.last_info["prior"] == 0.0
    assert lm_choices <= set(obs.admissible_commands)
    # the short-term block is never read as a route: with only short-term memory the copier is the plain LM
    only_stm = compose_memory("", "## Collected Data\n- go east\n- go south")
    assert copier.act(task, history, obs, only_stm) == plain.act(task, history, obs, only_stm)
    assert copier.last_info["prior"] == 0.0
