"""MemAgent forced exploration: TextWorld suite, command agents, explorer (combos, resume, errors, parallel),
supervision (Table 8 weights by hand, judge parsing/fallback, End reuse) and malformed records.

Fast: two tiny cooking games (generated once per session, ~3 s each), scripted agents or the tiny random
Llama, fake providers / fake judge. The real SmolLM2 run is in the slow test at the bottom.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from data_synthesis import memagent_supervision as S
from routers.io import RecordError, read_jsonl
from data_synthesis.memagent import (ForcedExplorationConfig, ForcedExplorer, choose_to_store, combos, label,
                                     load_exploration, rollout_id)
from routers.memagent.agent import (HTTPCommandAgent, LMCommandAgent, RandomCommandAgent, WalkthroughAgent,
                                    compose_memory, run_episode, split_memory)
from routers.memagent.protocol import MemoryItem, Observation, Preview, Retrieved, Task, Trajectory
from routers.memagent.textworld_env import TextWorldSuite, clean_feedback, parse_preset, prune

PRESETS = ["recipe=1,take=1,go=1"]
TIMING = ("elapsed_s", "s_per_step")


# -- fixtures -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def games_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tw-games")
    TextWorldSuite(d, n_train=2, n_heldout=1, presets=PRESETS).tasks("train")
    return str(d)


def suite(games_dir, **kw) -> TextWorldSuite:
    return TextWorldSuite(games_dir, **{"n_train": 2, "n_heldout": 1, "presets": PRESETS, **kw})


class FakeProvider:
    """Protocol provider: stores the action sequence of each accepted trajectory; retrieves the newest item."""

    family = "similarity"
    k = 1

    def __init__(self, name: str, gate: str = "all"):
        self.name, self.gate = name, gate
        self.items: list[MemoryItem] = []

    def describe_storage(self) -> str:
        return f"{self.name} stores action sequences"

    def describe_retrieval(self) -> str:
        return f"{self.name} returns the newest sequence"

    def store(self, trajectory: Trajectory) -> list[MemoryItem]:
        text = f"[{self.name}] " + ", ".join(s.action for s in trajectory.steps)
        item = MemoryItem(self.name, f"{self.name}-{len(self.items):04d}", trajectory.task.goal, text,
                          trajectory.task.task_id)
        self.items.append(item)
        return [item]

    def probe(self, goal: str) -> Preview:
        return Preview(self.name, float(len(self.items)), self.items[-1].text[:40] if self.items else "", len(self.items))

    def retrieve(self, goal: str) -> Retrieved:
        if not self.items:
            return Retrieved(self.name, "", [])
        return Retrieved(self.name, self.items[-1].text, [self.items[-1].item_id])

    def save(self, path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "items.json").write_text(json.dumps([asdict(i) for i in self.items]))

    def load(self, path) -> None:
        self.items = [MemoryItem(**d) for d in json.loads((Path(path) / "items.json").read_text())]


class FakeSTM:
    """Short-term memory that shows the actions so far once there are two."""

    def __init__(self):
        self.actions: list[str] = []

    def update(self, step):
        self.actions.append(step.action)

    def summary(self) -> str:
        return "## Collected Data\n" + "\n".join(f"- did {a}" for a in self.actions) if len(self.actions) >= 2 else ""


def fake_providers():
    return {"alpha": FakeProvider("alpha"), "beta": FakeProvider("beta", gate="success")}


def explorer(tmp_path, games_dir, agent, providers=None, **kw):
    cfg = ForcedExplorationConfig(output_dir=str(tmp_path), games_dir=games_dir, n_train=2, n_heldout=1,
                                  game_presets=PRESETS, max_steps=kw.pop("max_steps", 8), judge="none",
                                  splits=kw.pop("splits", ["train"]), agent="walkthrough", **kw)
    return ForcedExplorer(cfg, env=suite(games_dir), agent=agent,
                          providers=providers if providers is not None else fake_providers(),
                          short_term_factory=FakeSTM, progress=False)


def records(path) -> list[dict]:
    out = []
    for r in read_jsonl(path):
        r = {k: v for k, v in r.items() if k not in TIMING}
        r["trajectory"]["meta"].pop("elapsed_s", None)
        for s in r["trajectory"]["steps"]:
            s["meta"].pop("act_s", None)
        out.append(r)
    return sorted(out, key=lambda r: r["id"])


# -- environment -----------------------------------------------------------------------------------------------
def test_presets_and_pruning():
    assert parse_preset("recipe=2,take=1,go=6,cut") == {"recipe": 2, "take": 1, "go": 6, "open": False,
                                                        "cook": False, "cut": True, "drop": False}
    with pytest.raises(ValueError, match="unknown setting 'colour'"):
        parse_preset("colour=3")
    with pytest.raises(ValueError, match="go must be"):
        parse_preset("go=5")
    cmds = ["examine counter", "look", "take knife from counter", "cook apple with stove", "slice apple with knife",
            "drop apple", "eat apple", "eat meal", "take cookbook from table", "examine cookbook", "go east"]
    assert prune(cmds) == ["take knife from counter", "cook apple with stove", "slice apple with knife",
                           "drop apple", "eat meal", "examine cookbook", "go east"]
    assert prune(cmds, parse_preset("recipe=1,cut")) == ["take knife from counter", "slice apple with knife",
                                                         "eat meal", "examine cookbook", "go east"]
    assert clean_feedback("  $$$$ \n |  $$ |\n-= Kitchen =-\nYou see a fridge.\n\n\n\n>  ") == \
        "-= Kitchen =-\nYou see a fridge."


def test_suite_tasks_walkthrough_wins_and_cache(games_dir):
    env = suite(games_dir)
    train, held = env.tasks("train"), env.tasks("heldout")
    assert len(train) == 2 and len(held) == 1
    assert {t.meta["seed"] for t in train}.isdisjoint({t.meta["seed"] for t in held})
    assert len({t.task_id for t in train + held}) == 3
    for t in train + held:
        assert "The recipe needs:" in t.goal and "Directions:" in t.goal and Path(t.meta["game_file"]).exists()
        traj = run_episode(env, WalkthroughAgent(), t, max_steps=20)
        assert traj.success and traj.error is None and traj.steps[-1].action == "eat meal"
    # a second suite reuses the cached games (same ids, no regeneration)
    files = sorted(p.name for p in Path(games_dir).iterdir())
    assert [t.task_id for t in suite(games_dir).tasks("train")] == [t.task_id for t in train]
    assert sorted(p.name for p in Path(games_dir).iterdir()) == files
    obs = env.reset(train[0])
    assert obs.admissible_commands and not any(c.startswith(("examine counter", "look", "drop ")) for c in obs.admissible_commands)


# -- agents ----------------------------------------------------------------------------------------------------
def test_kv_cached_scoring_matches_uncached(tiny_llama_dir, one_torch_thread):
    agent = LMCommandAgent.from_pretrained(tiny_llama_dir, batch_size=3)
    task = Task("t", "Cook the meal. The recipe needs: red apple.")
    obs = Observation("-= Kitchen =-\nYou see a fridge and a counter.",
                      ["go east", "take red apple from counter", "open fridge", "examine cookbook", "prepare meal"])
    memory = compose_memory("Take the apple first, then prepare meal.", "## Collected Data\n- a fact\n- another")
    assert split_memory(memory)[1].startswith("Short-term memory")
    messages, static = agent.prompt_parts(task, [], obs, memory)
    assert static and static in messages[1]["content"] and "Short-term" not in static
    head, tail, cands = agent.encode(messages, obs.admissible_commands, static)
    ref = agent.token_logprobs_uncached(head, tail, cands)
    got = agent.token_logprobs(head, tail, cands)
    again = agent.token_logprobs(head, tail, cands)  # the rollout-static head now comes from the cache
    for a, b, c in zip(ref, got, again):
        assert len(a) == len(b)
        assert a == pytest.approx(b, abs=1e-4) and b == pytest.approx(c, abs=1e-5)
    # packed candidates (3 per forward here: the cache is cropped between chunks) = the padded batch of before
    batched = LMCommandAgent(agent.model, agent.tokenizer, batch_size=2, pack_candidates=False)
    for a, b in zip(batched.token_logprobs(head, tail, cands), got):
        assert a == pytest.approx(b, abs=1e-4)  # as against the uncached reference: any CPU's summation order
    # the terminator is scored: every candidate ends with <|im_end|>
    end_id = agent.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(c[-1] == end_id for c in cands)
    # act() picks the argmax of the (mean) cached scores
    scores = agent.score_commands(messages, obs.admissible_commands, static)
    assert scores == pytest.approx([sum(t) / len(t) for t in ref], abs=1e-4)
    assert agent.act(task, [], obs, memory) == obs.admissible_commands[max(range(5), key=lambda i: (scores[i], -i))]


def test_http_agent_parses_replies():
    cmds = ["go east", "take red apple from counter", "prepare meal"]
    assert HTTPCommandAgent.parse("2", cmds) == ("take red apple from counter", "number")
    assert HTTPCommandAgent.parse("Command 3.", cmds) == ("prepare meal", "number")
    assert HTTPCommandAgent.parse("I'd say: prepare meal", cmds) == ("prepare meal", "text")
    assert HTTPCommandAgent.parse("eastward!", cmds) == ("go east", "fallback")

    class Backend:
        name = "fake"

        def generate(self, convs, max_new_tokens=8):
            assert "1. go east" in convs[0][-1]["content"]
            return ["3"]

    agent = HTTPCommandAgent(Backend())
    assert agent.act(Task("t", "g"), [], Observation("room", cmds), "") == "prepare meal"
    assert agent.last_info["parse"] == "number"


def test_run_episode_records_error_and_in_policy(games_dir):
    env = suite(games_dir)
    task = env.tasks("train")[0]

    class Boom(WalkthroughAgent):
        def act(self, task, history, observation, memory):
            if len(history) == 2:
                raise RuntimeError("LLM server down")
            return super().act(task, history, observation, memory)

    traj = run_episode(env, Boom(), task, in_policy="inject", short_term=FakeSTM(), max_steps=10)
    assert not traj.success and traj.error == "RuntimeError: LLM server down" and len(traj.steps) == 2
    ok = run_episode(env, WalkthroughAgent(), task, in_policy="inject", short_term=FakeSTM(), max_steps=10)
    assert ok.success
    # the summary appears once two actions are known; inject shows it, never only records it
    assert [bool(s.injected) for s in ok.steps] == [False, False] + [True] * (len(ok.steps) - 2)
    never = run_episode(env, WalkthroughAgent(), task, in_policy="never", short_term=FakeSTM(), max_steps=10)
    assert not any(s.injected for s in never.steps) and never.steps[2].meta["stm"]
    with pytest.raises(ValueError, match="in_policy"):
        run_episode(env, WalkthroughAgent(), task, in_policy="sometimes")


# -- explorer --------------------------------------------------------------------------------------------------
def test_combos_enumerated_exactly(tmp_path, games_dir):
    assert combos(["a", "b"], True, ["inject", "never"]) == [
        (None, "inject"), (None, "never"), ("a", "inject"), ("a", "never"), ("b", "inject"), ("b", "never")]
    assert combos(["a"], False, ["never"]) == [("a", "never")]
    ex = explorer(tmp_path, games_dir, WalkthroughAgent())
    ex.explore()
    recs = records(tmp_path / "train" / "exploration.jsonl")
    tasks = suite(games_dir).tasks("train")
    assert [r["id"] for r in recs] == sorted(rollout_id(t.task_id, o, p) for t in tasks
                                             for o, p in combos(["alpha", "beta"], True, ["inject", "never"]))
    assert all(r["success"] and r["error"] is None for r in recs)
    # task 1's combos saw task 0's stored memory (one item per provider), task 0's saw empty stores
    t0, t1 = (t.task_id for t in tasks)
    for r in recs:
        mem = r["trajectory"]["begin_memory"]
        if r["task_id"] == t0 or r["begin_provider"] is None:
            assert mem == "" and r["begin_tokens"] == 0
        else:
            assert mem.startswith(f"[{r['begin_provider']}] ") and r["retrieved_item_ids"] == [f"{r['begin_provider']}-0000"]
            assert r["begin_tokens"] == len(mem.split())
        assert r["injected_tokens"] == r["begin_tokens"] + r["in_tokens"]
        assert (r["in_queries"] > 0) == (r["in_policy"] == "inject")
    stores = list(read_jsonl(tmp_path / "stores.jsonl"))
    assert [(s["task_id"], s["provider"], s["item_ids"]) for s in stores] == [
        (t0, "alpha", ["alpha-0000"]), (t0, "beta", ["beta-0000"]), (t1, "alpha", ["alpha-0001"]),
        (t1, "beta", ["beta-0001"])]
    progress = json.loads((tmp_path / "stores" / "progress.json").read_text())
    assert progress["tasks_done"] == [t0, t1]


class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so run_episode does not catch it."""


def test_heldout_plays_its_own_in_policies_and_may_change_on_resume(tmp_path, games_dir):
    explorer(tmp_path, games_dir, WalkthroughAgent(), splits=["train"]).explore()
    explorer(tmp_path, games_dir, WalkthroughAgent(), splits=["train", "heldout"],
             heldout_in_policies=["never"]).explore()  # same manifest: held-out records name their policy
    train = records(tmp_path / "train" / "exploration.jsonl")
    heldout = records(tmp_path / "heldout" / "exploration.jsonl")
    assert sorted({(r["begin_provider"] or "", r["in_policy"]) for r in train}) == [
        ("", "inject"), ("", "never"), ("alpha", "inject"), ("alpha", "never"), ("beta", "inject"), ("beta", "never")]
    (task,) = suite(games_dir).tasks("heldout")
    assert [r["id"] for r in heldout] == sorted(rollout_id(task.task_id, o, "never") for o in (None, "alpha", "beta"))
    with pytest.raises(ValueError, match="heldout_in_policies"):
        explorer(tmp_path, games_dir, WalkthroughAgent(), heldout_in_policies=["sometimes"])
    with pytest.raises(ValueError, match="heldout_in_policies"):
        explorer(tmp_path, games_dir, WalkthroughAgent(), heldout_in_policies=[])


def test_resume_after_partial_run_same_records_no_duplicates(tmp_path, games_dir):
    full = tmp_path / "full"
    explorer(full, games_dir, RandomCommandAgent(1)).explore()

    class DiesOnce(RandomCommandAgent):
        calls = 0

        def act(self, task, history, observation, memory):
            DiesOnce.calls += 1
            if DiesOnce.calls == 40:  # in the middle of the second task
                raise Killed()
            return super().act(task, history, observation, memory)

    part = tmp_path / "part"
    with pytest.raises(Killed):
        explorer(part, games_dir, DiesOnce(1)).explore()
    n_partial = len(list(read_jsonl(part / "train" / "exploration.jsonl")))
    assert 0 < n_partial < 12
    explorer(part, games_dir, RandomCommandAgent(1)).explore()
    explorer(part, games_dir, RandomCommandAgent(1)).explore()  # a finished run is a no-op
    got, want = records(part / "train" / "exploration.jsonl"), records(full / "train" / "exploration.jsonl")
    assert len({r["id"] for r in got}) == len(got) == 12
    assert got == want
    def store_log(path):
        return [{k: v for k, v in r.items() if k != "store_s"} for r in read_jsonl(path)]

    assert store_log(part / "stores.jsonl") == store_log(full / "stores.jsonl")
    for name in ("alpha", "beta"):
        assert (part / "stores" / name / "items.json").read_text() == (full / "stores" / name / "items.json").read_text()
    # a different setup in the same directory is refused
    with pytest.raises(ValueError, match="different setup"):
        explorer(part, games_dir, RandomCommandAgent(1), max_steps=5).explore()


def test_rollout_error_recorded_and_run_goes_on(tmp_path, games_dir):
    class FailsWithBeta(WalkthroughAgent):
        def act(self, task, history, observation, memory):
            if "[beta]" in memory:
                raise ConnectionError("agent LLM unreachable")
            return super().act(task, history, observation, memory)

    class BadRetrieve(FakeProvider):
        def retrieve(self, goal):
            raise TimeoutError("vector store timeout")

    providers = {"alpha": FakeProvider("alpha"), "beta": FakeProvider("beta"), "gamma": BadRetrieve("gamma")}
    explorer(tmp_path, games_dir, FailsWithBeta(), providers=providers).explore()
    recs = {r["id"]: r for r in records(tmp_path / "train" / "exploration.jsonl")}
    assert len(recs) == 2 * 8
    failed = {i: r["error"] for i, r in recs.items() if r["error"]}
    t1 = suite(games_dir).tasks("train")[1].task_id
    assert {i for i in failed if "|beta|" in i} == {rollout_id(t1, "beta", p) for p in ("inject", "never")}
    assert all(e == "ConnectionError: agent LLM unreachable" for i, e in failed.items() if "|beta|" in i)
    assert {i for i in failed if "|gamma|" in i} == {i for i in recs if "|gamma|" in i}
    assert all(e == "retrieve: TimeoutError: vector store timeout" for i, e in failed.items() if "|gamma|" in i)
    assert all(not r["success"] for i, r in recs.items() if i in failed)
    assert all(r["success"] for i, r in recs.items() if i not in failed)
    assert not any(s["rollout_id"] in failed for s in read_jsonl(tmp_path / "stores.jsonl"))


def test_choose_to_store():
    def rec(option, policy, success, steps, error=None):
        return {"id": f"t|{option}|{policy}", "begin_provider": option, "in_policy": policy, "success": success,
                "steps": steps, "error": error}

    rs = [rec(None, "inject", False, 9), rec(None, "never", False, 9), rec("a", "inject", True, 6),
          rec("a", "never", True, 5), rec("b", "never", True, 5)]
    assert [r["id"] for r in choose_to_store(rs, "representative")] == ["t|a|never"]
    fails = [rec(None, "inject", False, 9, "Boom: x"), rec(None, "never", False, 7), rec("a", "never", False, 3)]
    assert [r["id"] for r in choose_to_store(fails, "representative")] == ["t|None|never"]
    assert [r["id"] for r in choose_to_store(fails, "all")] == ["t|None|never", "t|a|never"]


def test_real_providers_parallel_pool_and_supervision_files(tmp_path, games_dir):
    """Real providers (fake encoder/LLM), a 2-process pool (walkthrough agent built in the workers),
    then labels with a fake judge: the files load in the SFT trainer's reader."""
    from memagent_provider_fakes import HashEncoder, ScriptedLLM
    from routers.memagent.providers import build_providers
    from train.memagent import phase_rows

    def providers():
        return build_providers(["voyager", "expel", "agent_kb"], encoder=HashEncoder(), llm=ScriptedLLM())

    seq = tmp_path / "seq"
    cfg = ForcedExplorationConfig(output_dir=str(seq), games_dir=games_dir, n_train=2, n_heldout=1,
                                  game_presets=PRESETS, max_steps=8, agent="walkthrough", judge="none",
                                  providers=["voyager", "expel", "agent_kb"], splits=["train", "heldout"])
    ForcedExplorer(cfg, providers=providers(), progress=False).explore()
    par = tmp_path / "par"
    ForcedExplorer(replace(cfg, output_dir=str(par), num_workers=2), providers=providers(), progress=False).explore()
    for split in ("train", "heldout"):
        assert records(seq / split / "exploration.jsonl") == records(par / split / "exploration.jsonl")
    held = records(seq / "heldout" / "exploration.jsonl")
    assert len(held) == 8 and all(r["split"] == "heldout" for r in held)
    assert {s["task_id"] for s in read_jsonl(seq / "stores.jsonl")} == {t.task_id for t in suite(games_dir).tasks("train")}

    class Judge:
        name = "fake-judge"

        def generate(self, convs, max_new_tokens=32):
            out = []
            for c in convs:
                u = c[-1]["content"]
                if "Utilization: <0-5>" in u:
                    out.append("Utilization: 4\nRelevance: 5")
                elif "Helpfulness: <0-5>" in u:
                    out.append("Helpfulness: 5, Progress: 4, Noise: 0")
                else:
                    out.append("no idea")  # NoOp replies never parse -> outcome-only fallback
            return out

    stats = label(cfg, providers=providers(), judge=Judge(), progress=False)
    assert stats["counts"]["judge_unparsable"] > 0 and stats["counts"]["judged"] > 0
    for phase in ("begin", "in", "end"):
        path = seq / f"{phase}.jsonl"
        recs = list(read_jsonl(path))
        for r in recs:
            assert r["phase"] == phase and r["completion"][0]["role"] == "assistant" and "task_id" in r
        rows, _ = phase_rows(str(path), phase)
        assert len(rows) >= len(recs)
    begin = list(read_jsonl(seq / "begin.jsonl"))
    # task 0: every option solves it, all stores were empty (no memory to judge) -> None wins the tie
    assert begin[0]["decision"] is None and begin[0]["reward"] == 1.0
    # task 1: a provider with judged memory: 0.5 * 1 + 0.5 * (0.6 * 4/5 + 0.4 * 5/5) = 0.94 < None's 1.0
    assert begin[1]["options"]["voyager"]["reward"] == pytest.approx(0.94)
    inn = list(read_jsonl(seq / "in.jsonl"))
    q = [r for r in inn if r["decision"] == "Query"]
    assert q and all(r["reward"] == pytest.approx(0.4 + 0.4 * 0.8 + 0.2) for r in q)
    assert all(r["label_source"] == "outcome" for r in inn if r["decision"] == "NoOp")
    end = list(read_jsonl(seq / "end.jsonl"))
    assert [r["task_id"] for r in end] == [suite(games_dir).tasks("train")[0].task_id]


def test_demonstrations_are_played_by_the_expert_stored_and_never_labelled(tmp_path):
    """A worlds suite with demonstrations: the first visit is one expert rollout (stored: the repeat visit's
    memory is its route); the repeat visit gets every combination, played by the task agent; Begin labels and
    stats come from the agent's tasks only."""
    pytest.importorskip("textworld")
    from routers.memagent.worlds import WorldConfig
    from routers.memagent.worlds_env import WorldSuite

    opts = dict(worlds_seen=1, worlds_unseen=0, world_rooms=5, world_sites=1, world_site_objects=2,
                world_train_repeats=1, world_moved=0, world_demonstrations=True)
    cfg = ForcedExplorationConfig(output_dir=str(tmp_path / "x"), env="textworld_worlds", games_dir=str(tmp_path),
                                  max_steps=20, agent="random", judge="none", splits=["train"], in_policies=["never"],
                                  **opts)
    env = WorldSuite(tmp_path / "games", WorldConfig(n_seen=1, n_unseen=0, n_rooms=5, n_sites=1, site_objects=2,
                                                     train_repeats=1, n_moved=0, demonstrations=True))
    demo, repeat = env.tasks("train")
    assert demo.meta["demonstration"] and not repeat.meta["demonstration"]
    ex = ForcedExplorer(cfg, env=env, agent=RandomCommandAgent(0), providers=fake_providers(), progress=False)
    ex.explore()
    recs = records(tmp_path / "x" / "train" / "exploration.jsonl")
    assert [(r["task_id"], r["begin_provider"], r["agent"]) for r in recs if r["task_id"] == demo.task_id] == [
        (demo.task_id, None, "walkthrough")]
    assert recs[[r["task_id"] for r in recs].index(demo.task_id)]["success"]
    mine = sorted((r["begin_provider"] or "", r["agent"]) for r in recs if r["task_id"] == repeat.task_id)
    assert mine == [("", "random"), ("alpha", "random"), ("beta", "random")]
    route = ", ".join(demo.meta["walkthrough"])
    assert all(r["trajectory"]["begin_memory"] == f"[{r['begin_provider']}] {route}" for r in recs
               if r["task_id"] == repeat.task_id and r["begin_provider"])
    stats = label(cfg, providers=fake_providers(), progress=False)
    assert stats["counts"]["demonstration_tasks"] == 1 and stats["rollouts"] == 3
    assert demo.task_id not in {r["task_id"] for r in read_jsonl(tmp_path / "x" / "begin.jsonl")}
    again = ForcedExplorer(cfg, env=env, agent=RandomCommandAgent(0), providers=fake_providers(), progress=False)
    assert again.explore().get("rollouts", 0) == 0  # resumed: nothing replayed


# -- supervision by hand -----------------------------------------------------------------------------------------
def test_table8_weights_by_hand():
    assert S.aggregate("begin", {"utilization": 4, "relevance": 2}) == pytest.approx(0.6 * 0.8 + 0.4 * 0.4)  # 0.64
    assert S.aggregate("query", {"helpfulness": 3, "progress": 5, "noise": 1}) == pytest.approx(
        0.4 * 0.6 + 0.4 * 1.0 + 0.2 * (1 - 0.2))  # 0.80
    assert S.aggregate("noop", {"appropriateness": 4, "missed_opportunity": 2}) == pytest.approx(
        0.5 * 0.8 + 0.5 * (1 - 0.4))  # 0.70
    assert S.aggregate("query", {"helpfulness": 0, "progress": 0, "noise": 5}) == 0.0
    assert S.aggregate("query", {"helpfulness": 5, "progress": 5, "noise": 0}) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="outside"):
        S.aggregate("begin", {"utilization": 6, "relevance": 0})


@pytest.mark.parametrize("reply,kind,want", [
    ("Utilization: 4\nRelevance: 2", "begin", {"utilization": 4, "relevance": 2}),
    ("**Relevance** - 2/5, utilization=4", "begin", {"utilization": 4, "relevance": 2}),
    ("4 2", "begin", {"utilization": 4, "relevance": 2}),
    ("Helpfulness: 3 Progress: 5 Noise: 1", "query", {"helpfulness": 3, "progress": 5, "noise": 1}),
    ("Appropriateness: 4\nMissed Opportunity: 2", "noop", {"appropriateness": 4, "missed_opportunity": 2}),
    ("appropriateness 4, missed_opportunity 2", "noop", {"appropriateness": 4, "missed_opportunity": 2}),
    ("Utilization: 7\nRelevance: 2", "begin", None),
    ("Utilization: 4/10\nRelevance: 2/10", "begin", None),
    ("The memory was quite useful.", "begin", None),
    ("Helpfulness: 3", "query", None),
])
def test_parse_judge_scores(reply, kind, want):
    assert S.parse_scores(reply, kind) == want


def _rollout(task, option, policy, success, steps=3, stm=True, tokens=0, retrieved=()):
    steps_ = [{"index": i, "observation": f"obs {i}", "action": f"act {i}", "injected": "",
               "meta": {"stm": "## Collected Data\n- x" if stm and i >= 1 else ""}} for i in range(steps)]
    traj = {"task": {"task_id": task, "goal": f"goal of {task}", "split": "train", "meta": {}}, "steps": steps_,
            "success": success, "reward": 0.0, "begin_provider": option, "begin_memory": "mem" if option else "",
            "error": None, "meta": {}}
    return {"id": rollout_id(task, option, policy), "task_id": task, "begin_provider": option, "in_policy": policy,
            "success": success, "steps": steps, "injected_tokens": tokens, "error": None,
            "retrieved_item_ids": list(retrieved), "trajectory": traj}


def test_begin_labels_by_hand():
    providers = fake_providers()
    rs = [_rollout("t1", None, "never", False), _rollout("t1", None, "inject", False),
          _rollout("t1", "alpha", "never", True), _rollout("t1", "alpha", "inject", False),
          _rollout("t1", "beta", "never", True), _rollout("t1", "beta", "inject", True)]
    judgments = {"begin|t1|alpha|never": {"score": 1.0}, "begin|t1|beta|never": {"score": 0.64}}
    tasks = [{"task_id": "t1", "goal": "goal of t1", "previews": [asdict(Preview("alpha", 0.3, "x", 1))]}]
    out = S.begin_labels(tasks, rs, providers, judgments, outcome_weight=0.5, min_reward=0.5)
    # alpha: 0.5 * 0.5 + 0.5 * 1.0 = 0.75; beta: 0.5 * 1.0 + 0.5 * 0.64 = 0.82 -> beta
    assert out[0]["options"]["alpha"]["reward"] == pytest.approx(0.75)
    assert out[0]["decision"] == "beta" and out[0]["reward"] == pytest.approx(0.82)
    assert out[0]["completion"] == [{"role": "assistant", "content": "beta"}]
    assert "Options: None, alpha, beta" in out[0]["prompt"][-1]["content"]
    # without a judge both fall back to outcomes: beta (1.0) beats alpha (0.5)
    assert S.begin_labels(tasks, rs, providers, {}, 0.5, 0.5)[0]["label_source"] == "outcome"
    # the threshold filters: nothing reaches 0.9
    from collections import Counter
    c = Counter()
    assert S.begin_labels(tasks, rs, providers, judgments, 0.5, 0.9, c) == [] and c["begin_below_min_reward"] == 1


def test_begin_step_tolerance_ties_near_step_counts_and_prefers_fewer_tokens():
    providers = fake_providers()
    rs = [_rollout("t1", None, "never", True, steps=5), _rollout("t1", "alpha", "never", True, steps=4, tokens=30),
          _rollout("t1", "beta", "never", True, steps=4, tokens=10)]
    tasks = [{"task_id": "t1", "goal": "goal of t1", "previews": [asdict(Preview("alpha", 0.3, "x", 1))]}]
    # exact steps: alpha and beta tie at 4, beta injects fewer tokens
    assert S.begin_labels(tasks, rs, providers, {}, 0.5, 0.5)[0]["decision"] == "beta"
    # one step of tolerance: no memory (5 steps, no tokens) ties with them and wins
    assert S.begin_labels(tasks, rs, providers, {}, 0.5, 0.5, step_tolerance=1)[0]["decision"] is None
    # a failing option never enters the tie, however few its steps
    rs[0] = _rollout("t1", None, "never", False, steps=2)
    assert S.begin_labels(tasks, rs, providers, {}, 0.5, 0.5, step_tolerance=3)[0]["decision"] == "beta"


def test_in_and_end_labels_by_hand():
    rs = [_rollout("t1", None, "inject", True, steps=5), _rollout("t1", None, "never", False, steps=5)]
    judgments = {"query|t1|none|inject|1": {"score": 0.9}, "query|t1|none|inject|4": {"score": 0.2},
                 "noop|t1|none|never|1": {"score": 0.7}}
    assert [s["index"] for s in S.pick_steps(rs[0]["trajectory"]["steps"], 2)] == [1, 4]
    out = S.in_labels(rs, judgments, judge_steps=2, outcome_weight=0.0, min_reward=0.5)
    # inject step 1 (0.9) kept as Query; step 4 (0.2) dropped; never step 1 (0.7) kept as NoOp; never
    # step 4 has no judgment -> outcome-only 0.0 -> dropped
    assert [(r["id"], r["decision"], r["reward"]) for r in out] == [
        ("t1|none|inject|1", "Query", 0.9), ("t1|none|never|1", "NoOp", 0.7)]
    assert out[0]["prompt"][-1]["content"].startswith("Task: goal of t1\n\nShort-term memory log")
    assert "Step 1, Collected Data: x" in out[0]["prompt"][-1]["content"]

    providers = fake_providers()
    stores = [{"task_id": "t1", "rollout_id": "t1|none|inject", "provider": "alpha", "item_ids": ["a1"]},
              {"task_id": "t1", "rollout_id": "t1|none|inject", "provider": "beta", "item_ids": ["b1"]}]
    later = [_rollout("t2", "alpha", "never", True, retrieved=["a1"]), _rollout("t2", "alpha", "inject", True, retrieved=["a1"]),
             _rollout("t2", "beta", "never", False, retrieved=["b1"]), _rollout("t3", "beta", "never", True, retrieved=["b1"]),
             _rollout("t3", "beta", "inject", False, retrieved=["b1"])]
    end = S.end_labels(stores, rs + later, providers, ["t1", "t2", "t3"], min_reuse=0.5, min_reward=0.5)
    # alpha reuse 2/2 -> store; beta reuse 1/3 -> not; reward = mean(1.0, 1 - 1/3) = 5/6
    assert end[0]["decision"] == ["alpha"] and end[0]["reward"] == pytest.approx(5 / 6)
    assert end[0]["completion"][0]["content"] == "alpha"
    assert end[0]["reuse"]["beta"] == {"retrievals": 3, "success_rate": pytest.approx(1 / 3)}


def test_malformed_exploration_record_names_file_and_line(tmp_path):
    good = _rollout("t1", None, "never", True)
    path = tmp_path / "exploration.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "steps": "three"}) + "\n")
    with pytest.raises(RecordError, match=r"exploration\.jsonl:2: steps must be a non-negative integer"):
        load_exploration(path)
    path.write_text(json.dumps(good) + "\n\n" + "{not json\n")
    with pytest.raises(RecordError, match=r"exploration\.jsonl:3: invalid JSON"):
        load_exploration(path)
    path.write_text(json.dumps({**good, "in_policy": "sometimes"}) + "\n")
    with pytest.raises(RecordError, match=r"exploration\.jsonl:1: in_policy"):
        load_exploration(path)


def test_cli_registered():
    from routers.cli import JOBS

    assert JOBS["synth"]["forced-exploration"] == "data_synthesis.memagent:main"
    cfg = ForcedExplorationConfig()
    assert cfg.splits == ["train", "heldout"] and cfg.in_policies == ["inject", "never"]
    with pytest.raises(ValueError, match="in_policies"):
        ForcedExplorationConfig(in_policies=["always"])


# -- slow: the real SmolLM2 agent ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_agent_plays_a_game(games_dir, one_torch_thread):
    env = suite(games_dir)
    agent = LMCommandAgent.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
    traj = run_episode(env, agent, env.tasks("train")[0], max_steps=12)
    assert traj.error is None and 1 <= len(traj.steps) <= 12
    assert all(s.meta["prompt_tokens"] > 50 for s in traj.steps)


def test_constrained_judge_fills_forms_per_kind(tmp_path):
    """With a backend that can fill forms, every judgment parses (no free-text parsing failures), and
    a chunk mixing Begin / Query / NoOp requests gets each kind's own dimensions."""
    seen = []

    class FormJudge:
        name = "form-judge"

        def generate(self, convs, max_new_tokens=32):
            raise AssertionError("constrained mode must not generate free text")

        def fill_form(self, convs, fields, choices):
            seen.append((tuple(fields), len(convs)))
            assert choices == ["0", "1", "2", "3", "4", "5"]
            return [{f: str(i % 6) for i, f in enumerate(fields)} for _ in convs]

    reqs = [S.JudgeRequest("b1", "begin", "r1", None, [{"role": "user", "content": "x"}]),
            S.JudgeRequest("q1", "query", "r1", 1, [{"role": "user", "content": "y"}]),
            S.JudgeRequest("n1", "noop", "r2", 1, [{"role": "user", "content": "z"}]),
            S.JudgeRequest("b2", "begin", "r2", None, [{"role": "user", "content": "w"}])]
    out, counts = S.run_judge(reqs, FormJudge(), tmp_path / "j.jsonl", batch_size=4, progress=False)
    assert counts["judged"] == 4 and counts["judge_unparsable"] == 0
    assert seen == [(("Utilization", "Relevance"), 2), (("Helpfulness", "Progress", "Noise"), 1),
                    (("Appropriateness", "Missed Opportunity"), 1)]
    assert out["b1"]["scores"] == {"utilization": 0, "relevance": 1}
    assert out["q1"]["scores"] == {"helpfulness": 0, "progress": 1, "noise": 2}
    assert out["n1"]["reply"] == "Appropriateness: 0\nMissed Opportunity: 1"
    assert out["n1"]["score"] == pytest.approx(0.5 * 0.0 + 0.5 * (1 - 1 / 5))
    # free mode is still used when asked for (this judge's generate raises -> counted, not cached)
    _, free = S.run_judge(reqs[:1], FormJudge(), tmp_path / "free.jsonl", progress=False, constrained=False)
    assert free["judge_errors"] == 1 and free["judged"] == 0


def test_local_judge_is_built_in_judge_dtype(tmp_path, games_dir, monkeypatch):
    import routers.backends

    built = {}

    def fake_backend(spec, **kw):
        built.update(spec=spec, **kw)
        return None  # outcome-only labels: nothing to load

    monkeypatch.setattr(routers.backends, "make_backend", fake_backend)
    ex = explorer(tmp_path, games_dir, WalkthroughAgent(), judge_dtype="bfloat16")
    ex.explore()
    label(replace(ex.cfg, judge="some/judge"), providers=ex.providers, progress=False)
    assert built == {"spec": "some/judge", "batch_size": 8, "dtype": "bfloat16"}
    with pytest.raises(ValueError, match="judge_dtype"):
        explorer(tmp_path, games_dir, WalkthroughAgent(), judge_dtype="int8")
