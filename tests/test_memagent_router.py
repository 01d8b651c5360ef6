"""MemAgent router: prompts and parsers, completion-only SFT, export/reload, evaluation metrics (DESIGN §6)."""

from __future__ import annotations

import pytest

from routers.memagent import prompts as P
from routers.memagent.protocol import Preview, Task, Trajectory, TrajectoryStep


class FakeProvider:
    def __init__(self, name: str, gate: str = "all"):
        self.name, self.gate = name, gate

    def describe_storage(self) -> str:
        return f"{self.name} keeps trajectory summaries"

    def describe_retrieval(self) -> str:
        return f"{self.name} finds similar tasks"


NAMES = [("Voyager", "all"), ("ExpeL", "all"), ("Agent-KB", "success"), ("Mobile-E", "success"), ("AWM", "all")]
PROVIDERS = {n: FakeProvider(n, g) for n, g in NAMES}


def make_trajectory(n_steps: int = 4, success: bool = True, task_id: str = "t1") -> Trajectory:
    steps = [TrajectoryStep(i, f"You are in room {i}. There is a door.", f"go east {i}") for i in range(n_steps)]
    return Trajectory(Task(task_id, "Put the apple in the fridge."), steps, success, begin_provider="Voyager")


# -- prompts -----------------------------------------------------------------------------------------
def test_begin_prompt_carries_descriptions_previews_and_goal_last():
    pv = [Preview("Voyager", 0.8123, "take apple from table", 5), Preview("ExpeL", 0.0, "", 0)]
    msgs = P.begin_messages("Put the apple in the fridge.", pv, PROVIDERS)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert "Storage: Voyager keeps trajectory summaries" in user
    assert "Retrieval: AWM finds similar tasks" in user
    assert '1. Voyager preview: score 0.812, 5 items: "take apple from table"' in user
    assert "2. ExpeL\n" in user and user.count("(empty store)") == 1 and user.count("(no preview)") == 3
    assert "Options: None, Voyager, ExpeL, Agent-KB, Mobile-E, AWM" in user
    assert user.endswith("Task: Put the apple in the fridge.\n\n" + P.BEGIN_QUESTION)
    # static first: everything before the previews is the same for every task of the pool (cached across tasks)
    other = P.begin_messages("Wash the plate.", [Preview("AWM", 0.5, "open tap", 2)], PROVIDERS)[1]["content"]
    static = user[:user.index("Probe previews")]
    assert other.startswith(static) and "Preview" not in static and "Options:" in static
    with pytest.raises(ValueError, match="Unknown"):
        P.begin_messages("g", [Preview("Unknown", 0.1, "x", 1)], PROVIDERS)


def test_end_prompt_has_gate_and_caps_steps():
    traj = make_trajectory(n_steps=30, success=False)
    msgs = P.end_messages(traj, PROVIDERS)
    user = msgs[1]["content"]
    assert "Outcome: failure (30 steps)" in user
    assert "3. Agent-KB: Agent-KB keeps trajectory summaries [gate: stores successful trajectories only]" in user
    assert "1. Voyager: Voyager keeps trajectory summaries [gate: stores all outcomes]" in user
    assert user.count("\nStep ") == P.END_MAX_STEPS and "(18 steps omitted)" in user
    assert "Step 0: " in user and "Step 29: " in user and "Step 6: " not in user
    per = P.end_provider_messages(msgs, "ExpeL")
    assert per[1]["content"].endswith("Should ExpeL store this trajectory? Answer yes or no.")
    assert per[1]["content"][: -len("Should ExpeL store this trajectory? Answer yes or no.")] == \
        user[: -len(P.END_QUESTION)]
    assert msgs[1]["content"] == user  # not mutated
    with pytest.raises(ValueError, match="not an End prompt"):
        P.end_provider_messages(P.in_messages("g", 1, "x"), "ExpeL")


def test_in_prompt():
    user = P.in_messages("Find the key.", 3, "Collected Data:\n- key is in the drawer\n- door locked")[1]["content"]
    assert user == ("Task: Find the key.\n\nShort-term memory log (entries by the step that added them):\n"
                    "Step 3, Collected Data: key is in the drawer | door locked\n\n" + P.IN_QUESTION)
    assert "(nothing collected yet)" in P.in_messages("g", 0, "  ")[1]["content"]


@pytest.mark.parametrize("name", [None, "Voyager", "Agent-KB", "Mobile-E", "AWM"])
def test_begin_round_trip(name):
    assert P.parse_begin(P.begin_completion(name), PROVIDERS) == name


@pytest.mark.parametrize("query", [True, False])
def test_in_round_trip(query):
    assert P.parse_in(P.in_completion(query)) is query


@pytest.mark.parametrize("names", [[], ["ExpeL"], ["Voyager", "Agent-KB", "AWM"], ["Mobile-E", "Voyager"]])
def test_end_round_trip(names):
    assert P.parse_end(P.end_completion(names), PROVIDERS) == names


def test_parsers_are_robust_and_fail_clearly():
    assert P.parse_begin("Provider: agent kb.", PROVIDERS) == "Agent-KB"
    assert P.parse_begin("  `Mobile-E` because tips help", PROVIDERS) == "Mobile-E"
    assert P.parse_begin("No memory", PROVIDERS) is None
    assert P.parse_begin("none.", PROVIDERS) is None
    assert P.parse_in("noop.") is False and P.parse_in("Answer: QUERY") is True
    assert P.parse_end("expel and mobile-e; Voyager, expel", PROVIDERS) == ["ExpeL", "Mobile-E", "Voyager"]
    assert P.parse_end("none", PROVIDERS) == [] and P.parse_end("", PROVIDERS) == []
    assert P.end_completion(["AWM", "AWM"]) == "AWM"
    with pytest.raises(ValueError, match="cannot parse a Begin"):
        P.parse_begin("the kitchen", PROVIDERS)
    with pytest.raises(ValueError, match="cannot parse an In"):
        P.parse_in("maybe later")
    with pytest.raises(ValueError, match="unknown provider 'Zep'"):
        P.parse_end("Voyager, Zep", PROVIDERS)
    with pytest.raises(ValueError, match="gate"):
        P.end_messages(make_trajectory(), {"X": FakeProvider("X", gate="sometimes")})


# -- fake supervision records ------------------------------------------------------------------------
GOALS = ["Put the apple in the fridge.", "Find the key and open the chest.", "Cook the egg on the stove.",
         "Take the book to the bedroom."]


def write_jsonl(path, records) -> str:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def fake_phase_files(tmp_path, n_tasks: int = 4) -> dict[str, str]:
    """Begin/In/End records as the exploration helper writes them (TRL conversational prompt-completion)."""
    begin, inn, end = [], [], []
    names = list(PROVIDERS)
    for i in range(n_tasks):
        goal, tid = GOALS[i % len(GOALS)], f"task{i}"
        previews = [Preview(n, 0.1 * (j + 1), f"memory {j} about {goal}", j) for j, n in enumerate(names)]
        choice = [None, "Voyager", "AWM", "ExpeL"][i % 4]
        begin.append({"prompt": P.begin_messages(goal, previews, PROVIDERS),
                      "completion": [{"role": "assistant", "content": P.begin_completion(choice)}],
                      "phase": "begin", "task_id": tid, "reward": 1.0})
        for step in range(2):
            query = (i + step) % 2 == 0
            inn.append({"prompt": P.in_messages(goal, step, "Collected Data:\n- fact a\n- fact b" if query else ""),
                        "completion": [{"role": "assistant", "content": P.in_completion(query)}],
                        "phase": "in", "task_id": tid, "reward": 0.8})
        traj = make_trajectory(n_steps=3, success=i % 2 == 0, task_id=tid)
        end.append({"prompt": P.end_messages(traj, PROVIDERS),
                    "completion": [{"role": "assistant", "content": P.end_completion(names[: i % 3])}],
                    "phase": "end", "task_id": tid, "reward": 1.0})
    return {ph: write_jsonl(tmp_path / f"{ph}.jsonl", recs) for ph, recs in (("begin", begin), ("in", inn), ("end", end))}


# -- SFT data, completion-only mask, training ------------------------------------------------------------
def sft_args(model_dir, files, out, *extra) -> list[str]:
    return ["--model_name_or_path", model_dir, "--begin_file", files["begin"], "--in_file", files["in"],
            "--end_file", files["end"], "--output_dir", str(out), "--use_cpu", "true", "--seed", "0", *extra]


def test_phase_rows_canonicalize_and_expand_end(tmp_path):
    from train.memagent import phase_rows

    files = fake_phase_files(tmp_path)
    begin, stats = phase_rows(files["begin"], "begin")
    assert stats == {"records": 4}
    assert [r["completion"][0]["content"] for r in begin] == ["None", "Voyager", "AWM", "ExpeL"]
    end, _ = phase_rows(files["end"], "end")
    assert len(end) == 4 * len(PROVIDERS)
    # task1 chose ["Voyager"], task2 ["Voyager", "ExpeL"]: one yes/no row per provider, pool order
    answers = [r["completion"][0]["content"] for r in end]
    assert answers == ["no"] * 5 + ["yes", "no", "no", "no", "no"] + ["yes", "yes", "no", "no", "no"] + ["no"] * 5
    assert end[6]["prompt"][-1]["content"].endswith("Should ExpeL store this trajectory? Answer yes or no.")
    # a non-canonical completion is rewritten to the exact candidate the router scores
    import json

    rec = json.loads(open(files["begin"]).readline())
    rec["completion"][0]["content"] = "Provider: voyager."
    path = write_jsonl(tmp_path / "b2.jsonl", [rec])
    assert phase_rows(path, "begin")[0][0]["completion"][0]["content"] == "Voyager"
    rec = json.loads(open(files["end"]).readlines()[2])  # chose Voyager, ExpeL; reuse seen for 3 providers
    rec["reuse"] = {"Voyager": {"retrievals": 2, "success_rate": 1.0}, "ExpeL": {"retrievals": 1, "success_rate": 0.5},
                    "AWM": {"retrievals": 1, "success_rate": 0.0}}
    rows, stats = phase_rows(write_jsonl(tmp_path / "e2.jsonl", [rec]), "end")
    assert [(r["prompt"][-1]["content"].split("Should ")[1].split(" store")[0], r["completion"][0]["content"])
            for r in rows] == [("Voyager", "yes"), ("ExpeL", "yes"), ("AWM", "no")]
    assert stats == {"records": 1, "end_unobserved_skipped": 2}
    kept, stats = phase_rows(files["in"], "in", min_reward=0.9)
    assert kept == [] and stats == {"records": 8, "below_min_reward": 8}


def test_balance_decisions_oversamples_minorities_to_the_majority(tmp_path, smollm2_tokenizer):
    import random
    from collections import Counter

    from routers.config import parse_config
    from train.memagent import MemAgentSFTConfig, balance_decisions, build_rows, make_parser

    rows = [{"completion": [{"content": c}], "i": i} for i, c in enumerate("AAAAAAABBC")]
    out = balance_decisions(rows, random.Random(0))
    assert Counter(r["completion"][0]["content"] for r in out) == {"A": 7, "B": 7, "C": 7}
    assert {r["i"] for r in out} == set(range(10)) and sum(r["i"] == 9 for r in out) == 7  # C copied 7 times
    assert Counter(r["i"] for r in out if r["completion"][0]["content"] == "B") in ({7: 4, 8: 3}, {7: 3, 8: 4})
    assert balance_decisions([], random.Random(0)) == []
    files = fake_phase_files(tmp_path, n_tasks=6)  # Begin: None, Voyager, AWM, ExpeL, None, Voyager
    args = ["--begin_file", files["begin"], "--in_file", "none", "--end_file", "none", "--output_dir", str(tmp_path),
            "--use_cpu", "true"]
    (plain,) = parse_config(make_parser(), [MemAgentSFTConfig], args)
    (balanced,) = parse_config(make_parser(), [MemAgentSFTConfig], args + ["--balance_decisions", "true"])
    count = lambda rs: Counter(r["completion"][0]["content"] for r in rs)  # noqa: E731
    assert count(build_rows(plain, smollm2_tokenizer)[0]) == {"None": 2, "Voyager": 2, "AWM": 1, "ExpeL": 1}
    assert count(build_rows(balanced, smollm2_tokenizer)[0]) == {"None": 2, "Voyager": 2, "AWM": 2, "ExpeL": 2}
    assert count(build_rows(balanced, smollm2_tokenizer, caps=False)[0])["AWM"] == 1  # the dev split: as it is


def test_completion_only_mask_is_exact(tiny_llama_dir, smollm2_tokenizer, tmp_path, one_torch_thread):
    import torch

    from routers.memagent.router import chat_ids
    from routers.config import parse_config
    from train.memagent import MemAgentSFTConfig, build_trainer, make_parser

    files = fake_phase_files(tmp_path)
    (cfg,) = parse_config(make_parser(), [MemAgentSFTConfig],
                          sft_args(tiny_llama_dir, files, tmp_path / "out", "--shuffle_dataset", "false"))
    trainer, rows, per_phase = build_trainer(cfg)
    assert {k: v["samples"] for k, v in per_phase.items()} == {"begin": 4, "in": 8, "end": 20}
    ds = trainer.train_dataset
    picks = [next(i for i, r in enumerate(rows) if r["phase"] == ph) for ph in ("begin", "in", "end")]
    batch = trainer.data_collator([ds[i] for i in picks])
    width = batch["labels"].shape[1]
    expected = torch.full((3, width), -100, dtype=torch.long)
    for r, i in enumerate(picks):
        prompt = chat_ids(smollm2_tokenizer, rows[i]["prompt"], add_generation_prompt=True)
        full = chat_ids(smollm2_tokenizer, rows[i]["prompt"] + rows[i]["completion"])
        assert full[:len(prompt)] == prompt
        expected[r, len(prompt):len(full)] = torch.tensor(full[len(prompt):])
        assert torch.equal(batch["input_ids"][r, :len(full)], torch.tensor(full))
        tail = smollm2_tokenizer.decode(full[len(prompt):])
        assert tail == rows[i]["completion"][0]["content"] + "<|im_end|>\n"
    assert torch.equal(batch["labels"], expected)
    assert int((batch["labels"] != -100).sum()) == sum(
        len(chat_ids(smollm2_tokenizer, rows[i]["prompt"] + rows[i]["completion"]))
        - len(chat_ids(smollm2_tokenizer, rows[i]["prompt"], add_generation_prompt=True)) for i in picks)


@pytest.fixture(scope="module")
def trained(tiny_llama_dir, tmp_path_factory):
    """One short SFT run (LoRA, all three phases) with export; shared by the tests below."""
    from transformers import AutoModelForCausalLM

    from train.memagent import main

    root = tmp_path_factory.mktemp("memagent-sft")
    files = fake_phase_files(root / "data")
    out = root / "run"
    trainer, info = main(sft_args(tiny_llama_dir, files, out, "--max_steps", "6", "--learning_rate", "2e-2",
                                  "--logging_steps", "1", "--save_steps", "3", "--per_device_train_batch_size", "2",
                                  "--lora_target_modules", "all-linear", "--export_dir", str(out / "export")))
    return {"trainer": trainer, "info": info, "out": out, "files": files,
            "loss_before": dataset_loss(AutoModelForCausalLM.from_pretrained(tiny_llama_dir), trainer),
            "loss_after": dataset_loss(trainer.model, trainer)}


def dataset_loss(model, trainer) -> float:
    """Mean completion-token loss over the whole training set (one collated batch)."""
    import torch

    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    with torch.inference_mode():
        return float(model.eval()(**{k: v for k, v in batch.items()}).loss)


def test_sft_lowers_loss_and_changes_lora_weights(trained, tiny_llama_dir):
    import json

    from safetensors.torch import load_file

    info = trained["info"]
    assert info["steps"] == 6 and info["samples"] == 32
    assert info["phases"]["end"]["labels"] == {"yes": 3, "no": 17}
    assert info["provider_names"] == list(PROVIDERS)
    losses = [h["loss"] for h in trained["trainer"].state.log_history if "loss" in h]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert trained["loss_after"] < trained["loss_before"] - 0.3  # same 32 samples, completion tokens only
    lora = load_file(str(trained["out"] / "adapter_model.safetensors"))
    b = [v for k, v in lora.items() if "lora_B" in k]
    assert b and all(v.abs().sum() > 0 for v in b)  # B starts at zero: every adapter was trained
    summary = json.loads((trained["out"] / "train_summary.json").read_text())
    assert summary["phases"]["begin"]["labels"] == {"None": 1, "Voyager": 1, "AWM": 1, "ExpeL": 1}
    assert (trained["out"] / "checkpoint-6").is_dir() and (trained["out"] / "resolved_config.yaml").exists()


def test_sft_resumes_from_last_checkpoint(trained, tiny_llama_dir, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file

    from train.memagent import main

    args = ["--max_steps", "6", "--learning_rate", "2e-2", "--save_steps", "3", "--per_device_train_batch_size", "2",
            "--lora_target_modules", "all-linear", "--logging_steps", "1"]
    final = load_file(str(trained["out"] / "adapter_model.safetensors"))
    # interrupted after step 3: resuming trains steps 4-6 and lands on the same adapter as the full run
    run = tmp_path / "run"
    shutil.copytree(trained["out"], run, ignore=shutil.ignore_patterns("checkpoint-6", "export"))
    (run / "adapter_model.safetensors").unlink()
    trainer, info = main(sft_args(tiny_llama_dir, trained["files"], run, *args))
    assert info["steps"] == 6 and [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3, 4, 5, 6]
    resumed = load_file(str(run / "adapter_model.safetensors"))
    assert all(torch.allclose(resumed[k], final[k], atol=1e-6) for k in final)
    # a finished run is not trained again (transformers alone would add a step)
    trainer, info = main(sft_args(tiny_llama_dir, trained["files"], run, *args))
    assert info["steps"] == 6 and trainer.state.global_step == 6
    assert all(torch.equal(v, load_file(str(run / "adapter_model.safetensors"))[k]) for k, v in resumed.items())


# -- router ------------------------------------------------------------------------------------------
def test_cached_scores_match_full_forward(tiny_llama_dir, one_torch_thread):
    import torch

    from routers.memagent.router import MemAgentRouter, encode_candidates

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    router = MemAgentRouter.from_model(model, tok, max_batch_tokens=8)  # forces several packed forwards
    options, scores = router.score_begin(GOALS[0], [Preview("AWM", 0.5, "open fridge", 2)], PROVIDERS)
    assert options == [None, *PROVIDERS] and scores.shape == (6,)
    prompt = P.begin_messages(GOALS[0], [Preview("AWM", 0.5, "open fridge", 2)], PROVIDERS)
    with torch.inference_mode():
        for (ids, start), s in zip(encode_candidates(tok, prompt, [P.begin_completion(o) for o in options]), scores):
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
            ref = sum(float(logp[j - 1, ids[j]]) for j in range(start, len(ids)))
            assert abs(float(s) - ref) < 1e-4
    assert router.begin(GOALS[0], [], PROVIDERS) == options[int(torch.argmax(router.score_begin(GOALS[0], [], PROVIDERS)[1]))]
    assert [t["phase"] for t in router.timings] == ["begin", "begin", "begin"]
    assert router.timings[0]["candidates"] == 6 and router.timings[0]["seconds"] > 0


def test_decisions_thresholds_and_budget(tiny_llama_dir, one_torch_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.memagent.router import MemAgentRouter

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    router = MemAgentRouter.from_model(model, tok)
    traj = make_trajectory()
    p_end = router.score_end(traj, PROVIDERS)
    assert p_end.shape == (5,) and bool(((p_end > 0) & (p_end < 1)).all())
    router.config.end_threshold = float(p_end.min())
    assert router.end(traj, PROVIDERS) == list(PROVIDERS)
    router.config.end_threshold = float(p_end.max()) + 1e-6
    assert router.end(traj, PROVIDERS) == []
    p_in = float(router.score_inject(GOALS[1], 2, "Collected Data:\n- a\n- b"))
    router.config.in_threshold = p_in
    assert router.inject(GOALS[1], 2, "Collected Data:\n- a\n- b") is True
    router.config.in_threshold = p_in + 1e-6
    assert router.inject(GOALS[1], 2, "Collected Data:\n- a\n- b") is False
    assert router.decide(p_end, threshold=0.0, phase="end", options=list(PROVIDERS)) == list(PROVIDERS)
    router.config.max_input_tokens = 50  # every prompt is longer: safe fallbacks, flagged in timings
    assert router.begin(GOALS[0], [], PROVIDERS) is None
    assert router.inject(GOALS[0], 0, "x") is False and router.end(traj, PROVIDERS) == []
    assert [t["over_budget"] for t in router.timings[-3:]] == [True, True, True]


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_export_reload_reproduces_scores_exactly(tiny_llama_dir, tmp_path, mode, one_torch_thread):
    import json

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from routers.base import load_router
    from routers.memagent.router import MemAgentRouter

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    if mode == "merged":
        model = model.merge_and_unload()
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    router = MemAgentRouter.from_model(model, tok, base_model=tiny_llama_dir, provider_names=list(PROVIDERS),
                                       in_threshold=0.3, end_threshold=0.6)
    previews = [Preview("Voyager", 0.7, "fridge apple", 3)]
    before = (router.score_begin(GOALS[0], previews, PROVIDERS)[1], router.score_inject(GOALS[0], 1, "Collected Data: x"),
              router.score_end(make_trajectory(), PROVIDERS))
    path = router.save_pretrained(tmp_path / "router")
    files = {p.name for p in path.iterdir()}
    assert {"router_config.json", "calibration.json", "README.md", "tokenizer.json"} <= files
    assert ("adapter_model.safetensors" in files) == (mode == "adapter")
    assert ("model.safetensors" in files) == (mode == "merged")
    cfg = json.loads((path / "router_config.json").read_text())
    assert cfg["router_type"] == "memagent" and cfg["labels"]["begin"] == ["None", *PROVIDERS]
    assert cfg["end_mode"] == "per_provider" and cfg["in_threshold"] == 0.3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".router")]  # atomic: no temp dirs left
    again = load_router(path)
    assert isinstance(again, MemAgentRouter) and again.config.end_threshold == 0.6
    after = (again.score_begin(GOALS[0], previews, PROVIDERS)[1], again.score_inject(GOALS[0], 1, "Collected Data: x"),
             again.score_end(make_trajectory(), PROVIDERS))
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def test_training_export_matches_export_command(trained, tmp_path, one_torch_thread):
    import torch

    from routers.memagent.router import MemAgentRouter
    from train.export import memagent_main as export_main

    exported = MemAgentRouter.from_pretrained(trained["out"] / "export")
    assert exported.config.provider_names == list(PROVIDERS)
    export_main(["--checkpoint", str(trained["out"]), "--export_dir", str(tmp_path / "exp2")])
    reloaded = MemAgentRouter.from_pretrained(tmp_path / "exp2")
    assert reloaded.config.provider_names == list(PROVIDERS)
    # the same weights, written in the training dtype by both paths; reloaded the same way, the same scores
    mine, theirs = exported.model.state_dict(), reloaded.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert torch.equal(reloaded.score_begin(GOALS[2], [], PROVIDERS)[1], exported.score_begin(GOALS[2], [], PROVIDERS)[1])


# -- evaluation ----------------------------------------------------------------------------------------
def exploration_records() -> list[dict]:
    """4 held-out tasks x 3 options (None, Voyager, ExpeL), in_policy never; plus inject rows to be ignored.

    t1: None ok 5 steps, Voyager ok 3 (40 tok), ExpeL fail      -> 2 solve, oracle Voyager
    t2: nobody                                                    -> 0 solve (unsolvable)
    t3: all ok in 4 steps (Voyager 30 tok, ExpeL 20 tok)          -> 3 solve, oracle None (fewest tokens)
    t4: only ExpeL, 6 steps (50 tok)                              -> 1 solve, oracle ExpeL
    """
    rows = {"t1": [(True, 5, 0), (True, 3, 40), (False, 10, 60)],
            "t2": [(False, 10, 0), (False, 10, 40), (False, 10, 60)],
            "t3": [(True, 4, 0), (True, 4, 30), (True, 4, 20)],
            "t4": [(False, 10, 0), (False, 10, 40), (True, 6, 50)]}
    out = []
    for t, outcomes in rows.items():
        for option, (ok, steps, tok) in zip([None, "Voyager", "ExpeL"], outcomes):
            out.append({"task_id": t, "begin_provider": option, "in_policy": "never", "success": ok,
                        "steps": steps, "injected_tokens": tok})
            out.append({"task_id": t, "begin_provider": option, "in_policy": "inject", "success": True,
                        "steps": 1, "injected_tokens": 999})
    return out


def test_eval_metrics_hand_computed(tmp_path):
    from eval.memagent import begin_accuracy, evaluate, load_outcomes, overhead

    path = write_jsonl(tmp_path / "exploration.jsonl", exploration_records())
    table, pool = load_outcomes(path, "never")
    assert pool == ["Voyager", "ExpeL"] and sorted(table) == ["t1", "t2", "t3", "t4"]
    options = [None, *pool]
    runs = [{"task_id": "t1", "begin_provider": "ExpeL", "success": False, "steps": 10, "begin_tokens": 60,
             "in_tokens": 20, "injected_tokens": 80, "in_queries": 2, "probe_s": 0.1, "router_s": 0.2, "task_s": 3.0},
            {"task_id": "t2", "begin_provider": None, "success": False, "steps": 10, "begin_tokens": 0,
             "in_tokens": 0, "injected_tokens": 0, "in_queries": 0, "probe_s": 0.1, "router_s": 0.4, "task_s": 5.0},
            {"task_id": "t3", "begin_provider": "ExpeL", "success": True, "steps": 4, "begin_tokens": 20,
             "in_tokens": 0, "injected_tokens": 20, "in_queries": 0, "probe_s": 0.0, "router_s": 0.0, "task_s": 1.0},
            {"task_id": "t4", "begin_provider": "ExpeL", "success": True, "steps": 6, "begin_tokens": 50,
             "in_tokens": 10, "injected_tokens": 60, "in_queries": 1, "probe_s": 0.0, "router_s": 0.2, "task_s": 1.0}]
    m = evaluate(table, options, runs)
    b = m["baselines"]
    assert b["None"] == {"tasks": 4, "success_rate": 0.5, "avg_steps": 7.25, "injected_tokens_per_task": 0.0,
                         "errors": 0}
    assert b["Voyager"] == {"tasks": 4, "success_rate": 0.5, "avg_steps": 6.75, "injected_tokens_per_task": 37.5,
                            "errors": 0}
    assert b["ExpeL"]["success_rate"] == 0.5 and b["ExpeL"]["avg_steps"] == 7.5
    assert b["random"]["success_rate"] == pytest.approx((2 / 3 + 0 + 1 + 1 / 3) / 4)
    assert b["random"]["avg_steps"] == pytest.approx((18 / 3 + 10 + 4 + 26 / 3) / 4)
    assert b["oracle"]["success_rate"] == 0.75 and b["oracle"]["avg_steps"] == (3 + 10 + 4 + 6) / 4
    assert b["oracle"]["injected_tokens_per_task"] == (40 + 0 + 0 + 50) / 4
    cov = m["coverage"]
    assert cov["histogram"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert cov["buckets"] == {"0 (unsolvable)": {"tasks": 1, "share": 0.25},
                              "1-2 (routing-critical)": {"tasks": 2, "share": 0.5},
                              "3 (all correct)": {"tasks": 1, "share": 0.25}}
    assert cov["per_task"] == {"t1": 2, "t2": 0, "t3": 3, "t4": 1}
    r = m["routed"]
    assert r["success_rate"] == 0.5 and r["avg_steps"] == 7.5 and r["injected_tokens_per_task"] == 40.0
    assert r["begin_injected_tokens_per_task"] == 32.5 and r["in_queries_per_task"] == 0.75
    assert r["delta_vs_no_memory"] == 0.0 and m["best_single_provider"] == "Voyager"
    assert r["begin_choices"] == {"ExpeL": 3, "None": 1}
    assert r["overhead"]["share"] == pytest.approx((0.2 + 0.8) / 10.0)
    assert r["overhead"]["probe_s_per_task"] == pytest.approx(0.05)
    beg = m["begin"]
    assert beg["solvable_tasks"] == 3
    assert beg["accuracy_solving"] == pytest.approx(2 / 3) and beg["accuracy_exact"] == pytest.approx(1 / 3)
    assert beg["confusion"]["labels"] == ["None", "Voyager", "ExpeL"]
    assert beg["confusion"]["matrix"] == [[0, 0, 1], [0, 0, 1], [0, 0, 1]]
    assert overhead([]) ["share"] is None
    with pytest.raises(ValueError, match="not an option"):
        begin_accuracy({"t1": "AWM"}, table, options)


def test_coverage_buckets_for_fourteen_options():
    from eval.memagent import coverage_distribution

    options = [None, *[f"p{i}" for i in range(13)]]
    table = {f"t{k}": {o: {"success": i < k, "steps": 1} for i, o in enumerate(options)} for k in range(15)}
    cov = coverage_distribution(table, options, list(table))
    assert list(cov["buckets"]) == ["0 (unsolvable)", "1-2 (routing-critical)", "3-6", "7-13", "14 (all correct)"]
    assert [b["tasks"] for b in cov["buckets"].values()] == [1, 2, 4, 7, 1]


class FakeEnv:
    """Two commands; 'win' wins. Observations carry the command list."""

    def reset(self, task):
        from routers.memagent.protocol import Observation

        return Observation("You are in a kitchen.", ["go north", "win"])

    def step(self, command):
        from routers.memagent.protocol import Observation

        return Observation(f"You {command}.", ["go north", "win"], done=command == "win", won=command == "win")


class MemoryReadingAgent:
    """Wins only when the Begin memory says so; otherwise wanders."""

    def act(self, task, history, observation, memory):
        return "win" if "WIN" in memory else "go north"


class ProbeProvider(FakeProvider):
    def __init__(self, name, text):
        super().__init__(name)
        self.text = text

    def probe(self, goal):
        return Preview(self.name, 0.5, self.text, 1)

    def retrieve(self, goal):
        from routers.memagent.protocol import Retrieved

        return Retrieved(self.name, self.text, ["i1"])


class CountingSTM:
    def __init__(self):
        self.n = 0

    def summary(self):
        return f"Collected Data:\n- step {self.n}" if self.n else ""

    def update(self, step):
        self.n += 1


class ScriptedRouter:
    def __init__(self, choice):
        self.choice, self.in_calls = choice, []

    def begin(self, goal, previews, providers):
        assert [p.provider for p in previews] == list(providers)
        return self.choice

    def inject(self, goal, index, summary):
        self.in_calls.append(index)
        return index % 2 == 1


def test_routed_rollouts_with_fakes(tmp_path):
    from eval.memagent import RolloutContext, run_routed

    providers = {"Voyager": ProbeProvider("Voyager", "say WIN now"), "ExpeL": ProbeProvider("ExpeL", "wander")}
    tasks = [Task("a", "win the game", split="heldout"), Task("b", "win again", split="heldout")]
    router = ScriptedRouter("ExpeL")
    ctx = RolloutContext(env=FakeEnv(), tasks=tasks, agent=MemoryReadingAgent(), providers=providers,
                         short_term_factory=CountingSTM, max_steps=4)
    runs = run_routed(tasks, ctx, router, tmp_path / "routed.jsonl")
    assert [r["task_id"] for r in runs] == ["a", "b"]
    a = runs[0]
    assert a["begin_provider"] == "ExpeL" and a["success"] is False and a["steps"] == 4
    assert a["begin_tokens"] == 1 and a["in_queries"] == 2 and a["in_decisions"] == 3  # step 0: empty summary
    assert a["in_tokens"] == 2 * 5 and a["injected_tokens"] == 1 + 10  # "Collected Data:\n- step k": 5 words
    assert router.in_calls == [1, 2, 3, 1, 2, 3]
    assert a["task_s"] >= a["probe_s"] + a["router_s"] and a["error"] is None
    assert [s["injected"] != "" for s in a["trajectory"]["steps"]] == [False, True, False, True]
    router.choice = "Voyager"  # resumable: finished tasks are not rerun
    again = run_routed(tasks, ctx, router, tmp_path / "routed.jsonl")
    assert again == runs and len((tmp_path / "routed.jsonl").read_text().splitlines()) == 2
    won = run_routed(tasks[:1], ctx, router, tmp_path / "r2.jsonl")
    assert won[0]["success"] is True and won[0]["steps"] == 1 and won[0]["begin_tokens"] == 3
    # recorded Begin memories (what the baseline rollouts saw) take precedence over a live retrieve
    ctx.memories = {"a": {"ExpeL": "recorded WIN"}}
    router.choice = "ExpeL"
    rec = run_routed(tasks[:1], ctx, router, tmp_path / "r3.jsonl")[0]
    assert rec["success"] is True and rec["begin_tokens"] == 2
    # In fixed (only Begin routed): the router is never asked In, no summary is injected
    router.in_calls, ctx.memories = [], None
    fixed = run_routed(tasks[:1], ctx, router, tmp_path / "r4.jsonl", in_policy="never")[0]
    assert router.in_calls == [] and fixed["in_queries"] == 0 and fixed["begin_provider"] == "ExpeL"
    # In asked every 2nd step only (NoOp between, no router call): steps 0 and 2 of 4; step 0 has no summary
    router.in_calls = []
    sparse = run_routed(tasks[:1], ctx, router, tmp_path / "r5.jsonl", in_every=2)[0]
    assert router.in_calls == [2] and sparse["in_decisions"] == 3 and sparse["in_queries"] == 0
    with pytest.raises(ValueError, match="in_every"):
        run_routed(tasks[:1], ctx, router, tmp_path / "r6.jsonl", in_every=0)
    assert fixed["trajectory"]["meta"]["in_policy"] == "never"


def test_end_report_counts_store_sets_and_stores_after_success_and_failure():
    from eval.memagent_metrics import end_decisions, end_report

    runs = [{"success": True, "end_choice": ["memp"]}, {"success": True, "end_choice": ["memp", "voyager"]},
            {"success": True, "end_choice": []}, {"success": False, "end_choice": []},
            {"success": False, "end_choice": ["voyager"]}, {"success": False}]   # the last: End not asked
    assert end_report(runs) == {"end_choices": {"memp": 1, "memp+voyager": 1, "None": 2, "voyager": 1},
                                "end_store_rate": {"after_success": 2 / 3, "after_failure": 0.5}}
    assert end_report([{"success": True}]) == {}

    class Storer:  # stores successes only
        def end(self, trajectory, providers):
            return list(providers) if trajectory.success else []

    fresh = [{"success": s, "trajectory": {"task": {"task_id": f"t{i}", "goal": "g"}, "steps": [], "success": s}}
             for i, s in enumerate((True, False))]
    end_decisions(Storer(), fresh, {"memp": None})
    assert [r["end_choice"] for r in fresh] == [["memp"], []]


def test_eval_main_with_real_router_and_fake_environment(tmp_path, tiny_llama_dir, monkeypatch, one_torch_thread):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import eval.memagent as em
    from routers.memagent.router import MemAgentRouter

    MemAgentRouter.from_model(AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
                              AutoTokenizer.from_pretrained(tiny_llama_dir)).save_pretrained(tmp_path / "router")
    write_jsonl(tmp_path / "x" / "heldout" / "exploration.jsonl", exploration_records())
    providers = {"Voyager": ProbeProvider("Voyager", "say WIN now"), "ExpeL": ProbeProvider("ExpeL", "wander")}
    tasks = [Task(t, f"goal {t}", split="heldout") for t in ("t1", "t2", "t3", "t4")]
    seen = {}

    def fake_context(cfg, pool):
        seen["pool"] = pool
        return em.RolloutContext(env=FakeEnv(), tasks=tasks, agent=MemoryReadingAgent(), providers=providers,
                                 short_term_factory=CountingSTM, max_steps=3)

    monkeypatch.setattr(em, "build_rollout_context", fake_context)
    m = em.main(["--router", str(tmp_path / "router"), "--exploration_dir", str(tmp_path / "x"), "--output_dir",
                 str(tmp_path / "res")])
    assert seen["pool"] == ["Voyager", "ExpeL"]
    saved = json.loads((tmp_path / "res" / "metrics.json").read_text())
    assert saved["tasks"] == 4 and saved["routed"]["tasks"] == 4
    assert saved["baselines"]["oracle"]["success_rate"] == 0.75
    assert saved["baselines_by_in_policy"]["inject"]["None"]["success_rate"] == 1.0
    assert saved["oracle_any_in_policy"] == {"tasks": 4, "success_rate": 1.0, "in_policies": ["inject", "never"]}
    assert sum(saved["begin"]["confusion"]["matrix"][i][j] for i in range(3) for j in range(3)) == 3
    assert 0 < saved["routed"]["overhead"]["share"] < 1
    # End's storage choices for each routed trajectory (reported, stores frozen), overall and per task type
    assert sum(saved["routed"]["end_choices"].values()) == 4
    assert set(saved["routed"]["end_store_rate"]) == {"after_success", "after_failure"}
    assert saved["by_task_type"]["all"]["routed"]["end_choices"] == saved["routed"]["end_choices"]
    for png in ("coverage.png", "begin_confusion.png"):
        assert (tmp_path / "res" / png).read_bytes()[:4] == b"\x89PNG"
    assert m["routed"]["success_rate"] == sum(r["success"] for r in
                                              map(json.loads, open(tmp_path / "res" / "routed.jsonl"))) / 4
    base_only = em.main(["--router", "none", "--exploration_dir", str(tmp_path / "x"), "--output_dir",
                         str(tmp_path / "res2"), "--providers", "ExpeL", "--max_tasks", "2"])
    assert "routed" not in base_only and (tmp_path / "res2" / "coverage.png").exists()
    assert base_only["options"] == ["None", "ExpeL"] and base_only["tasks"] == 2
    assert not (tmp_path / "res2" / "begin_confusion.png").exists()


# -- malformed input -----------------------------------------------------------------------------------
def test_malformed_records_name_file_and_line(tmp_path):
    import json

    from routers.io import RecordError
    from eval.memagent import load_outcomes
    from train.memagent import phase_rows

    files = fake_phase_files(tmp_path)
    lines = open(files["in"]).read().splitlines()
    bad = json.loads(lines[2])
    bad["completion"][0]["content"] = "perhaps"
    p = write_jsonl(tmp_path / "in_bad.jsonl", [json.loads(lines[0]), json.loads(lines[1]), bad])
    with pytest.raises(RecordError, match=r"in_bad\.jsonl:3: cannot parse an In decision"):
        phase_rows(p, "in")
    (tmp_path / "trunc.jsonl").write_text(lines[0] + "\n{\"prompt\": [\n")
    with pytest.raises(RecordError, match=r"trunc\.jsonl:2: invalid JSON"):
        phase_rows(str(tmp_path / "trunc.jsonl"), "in")
    with pytest.raises(RecordError, match=r"begin\.jsonl:1: phase 'begin' in the in file"):
        phase_rows(files["begin"], "in")
    rec = json.loads(open(files["end"]).readline())
    rec["completion"][0]["content"] = "Voyager, Zep"
    with pytest.raises(RecordError, match=r"end_bad\.jsonl:1: .*unknown provider 'Zep'"):
        phase_rows(write_jsonl(tmp_path / "end_bad.jsonl", [rec]), "end")
    rec = json.loads(open(files["begin"]).readline())
    rec["prompt"] = [{"role": "user", "content": 3}]
    with pytest.raises(RecordError, match=r"b3\.jsonl:1: prompt: every message needs"):
        phase_rows(write_jsonl(tmp_path / "b3.jsonl", [rec]), "begin")
    recs = exploration_records()
    recs[3]["success"] = "yes"
    with pytest.raises(RecordError, match=r"x1\.jsonl:4: success must be true or false"):
        load_outcomes(write_jsonl(tmp_path / "x1.jsonl", recs), "never")
    recs = exploration_records()
    recs.append(dict(recs[0]))
    with pytest.raises(RecordError, match=rf"x2\.jsonl:{len(recs)}: duplicate record for task 't1', option None"):
        load_outcomes(write_jsonl(tmp_path / "x2.jsonl", recs), "never")
    del recs[-1]
    for r in recs:
        r.pop("steps")
    with pytest.raises(RecordError, match=r"x3\.jsonl:1: missing field\(s\) \['steps'\]"):
        load_outcomes(write_jsonl(tmp_path / "x3.jsonl", recs), "never")


def test_cli_registers_memagent_jobs():
    from routers.cli import JOBS

    assert JOBS["train"]["memagent"] == "train.memagent:main"
    assert JOBS["export"]["memagent"] == "train.export:memagent_main"
    assert JOBS["eval"]["memagent"] == "eval.memagent:main"


# -- real SmolLM2 (slow) -------------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_begin_scores_match_full_forward_on_thirteen_providers():
    import torch

    from routers.memagent.providers import PROVIDER_NAMES, build_providers
    from routers.memagent.router import MemAgentRouter, chat_ids, encode_candidates

    class UnusedEncoder:  # only descriptions are needed: nothing is encoded here
        def encode(self, texts):
            raise AssertionError("not used")

    providers = build_providers(encoder=UnusedEncoder())
    previews = [Preview(n, 0.3 + 0.02 * i, "Earlier: took the knife, sliced the potato, fried it, ate the meal.", 4 + i)
                for i, n in enumerate(PROVIDER_NAMES)]
    router = MemAgentRouter.from_base("smollm2", device="cpu")
    options, scores = router.score_begin(GOALS[2], previews, providers)
    assert len(options) == 14 and router.timings[-1]["prompt_tokens"] > 1000
    prompt = P.begin_messages(GOALS[2], previews, providers)
    cands = encode_candidates(router.tokenizer, prompt, [P.begin_completion(o) for o in options])
    ids_all = chat_ids(router.tokenizer, prompt, add_generation_prompt=True)
    with torch.inference_mode():
        for (ids, start), s in list(zip(cands, scores))[:3]:
            assert ids[:start] == ids_all
            logp = torch.log_softmax(router.model(torch.tensor([ids])).logits[0].float(), dim=-1)
            assert abs(float(s) - sum(float(logp[j - 1, ids[j]]) for j in range(start, len(ids)))) < 1e-3
    traj = make_trajectory(n_steps=20)
    p = router.score_end(traj, providers)
    assert p.shape == (13,) and bool(((p > 0) & (p < 1)).all())


def test_exploration_config_prefers_manifest_fingerprint(tmp_path):
    import json

    from eval.memagent import exploration_config

    (tmp_path / "resolved_config.yaml").write_text("max_steps: 10\nn_heldout: 3\ngames_dir: g\nnot_a_field: 1\n")
    (tmp_path / "manifest.json").write_text(json.dumps({"fingerprint": {"max_steps": 12, "providers": ["awm"]}}))
    cfg = exploration_config(tmp_path)
    assert (cfg.max_steps, cfg.n_heldout, cfg.games_dir, cfg.providers) == (12, 3, "g", ["awm"])


# -- end to end (slow: compiles TextWorld games) ------------------------------------------------------------
@pytest.mark.slow
def test_exploration_to_sft_to_eval_end_to_end(tmp_path, tiny_llama_dir, monkeypatch, one_torch_thread):
    """Forced exploration (walkthrough agent, real providers with fake encoder/LLM) -> supervision -> SFT ->
    export -> `memroute eval memagent` rebuilding the environment and frozen stores from the exploration dir."""
    import json

    import data_synthesis.memagent as xm
    from data_synthesis.memagent import ForcedExplorationConfig, ForcedExplorer, label
    from eval.memagent import main as eval_main
    from memagent_provider_fakes import HashEncoder, ScriptedLLM
    from routers.memagent.providers import build_providers
    from train.memagent import main as train_main

    names = ["voyager", "expel", "agent_kb"]

    def providers(cfg=None):
        return build_providers(list(cfg.providers) if cfg else names, encoder=HashEncoder(), llm=ScriptedLLM())

    xdir = tmp_path / "x"
    cfg = ForcedExplorationConfig(output_dir=str(xdir), games_dir=str(tmp_path / "games"), n_train=2, n_heldout=2,
                                  game_presets=["recipe=1,take=1,go=1"], max_steps=8, agent="walkthrough",
                                  judge="none", providers=names, splits=["train", "heldout"])
    ForcedExplorer(cfg, providers=providers(), progress=False).explore()
    label(cfg, providers=providers(), progress=False)
    from routers.config import save_resolved_config

    save_resolved_config(xdir, cfg)
    _, info = train_main(["--model_name_or_path", tiny_llama_dir, "--begin_file", str(xdir / "begin.jsonl"),
                          "--in_file", str(xdir / "in.jsonl"), "--end_file", str(xdir / "end.jsonl"),
                          "--output_dir", str(tmp_path / "sft"), "--export_dir", str(tmp_path / "sft" / "export"),
                          "--max_steps", "2", "--per_device_train_batch_size", "2", "--use_cpu", "true"])
    assert info["steps"] == 2 and info["phases"]["begin"]["samples"] >= 1
    monkeypatch.setattr(xm, "build_providers_from", providers)  # the fake encoder/LLM, not MiniLM/SmolLM2
    m = eval_main(["--router", str(tmp_path / "sft" / "export"), "--exploration_dir", str(xdir),
                   "--output_dir", str(tmp_path / "eval")])
    assert m["tasks"] == 2 and m["options"] == ["None", *names]
    assert m["baselines"]["None"]["success_rate"] == 1.0  # the walkthrough agent always wins
    assert m["routed"]["success_rate"] == 1.0 and m["routed"]["tasks"] == 2
    assert m["coverage"]["histogram"]["4"] == 2 and m["begin"]["solvable_tasks"] == 2
    off = m["begin_offline"]
    assert off["trained"]["tasks"] == 2 and off["trained"]["implied_success_rate"] == 1.0
    assert off["base"]["tasks"] == 2 and off["base_model"] == tiny_llama_dir
    n_labels = sum(1 for _ in open(xdir / "begin.jsonl"))
    fit = m["begin_train_fit"]  # the router's own training tasks, scored from their recorded previews
    assert fit["tasks"] == n_labels >= 1 and sum(fit["choices"].values()) == n_labels and fit["prob_spread"] >= 0
    assert "counterfactual_begin" not in m  # the probes edit persistent-world goals only
    routed = [json.loads(line) for line in open(tmp_path / "eval" / "routed.jsonl")]
    held = {r["task_id"]: r for r in map(json.loads, open(xdir / "heldout" / "tasks.jsonl"))}
    for r in routed:  # the Begin memory injected is the one the baseline rollout of that option saw
        choice = r["begin_provider"]
        expected = held[r["task_id"]]["retrieved"][choice]["text"] if choice else ""
        assert r["trajectory"]["begin_memory"] == expected


def test_broken_exports_fail_naming_the_file(tmp_path):
    import json

    from routers.base import RouterConfigError
    from routers.memagent.router import MemAgentRouter

    # the same reader and error type as the other routers (RouterConfigError, a ValueError naming the file)
    with pytest.raises(RouterConfigError, match=r"router_config\.json: missing"):
        MemAgentRouter.from_pretrained(tmp_path)
    (tmp_path / "router_config.json").write_text('{"router_type": "sufficiency"}')
    with pytest.raises(RouterConfigError, match=r"router_config\.json: router_type is 'sufficiency'"):
        MemAgentRouter.from_pretrained(tmp_path)
    (tmp_path / "router_config.json").write_text('{"router_type": "memagent"')
    with pytest.raises(RouterConfigError, match=r"router_config\.json: invalid JSON"):
        MemAgentRouter.from_pretrained(tmp_path)
    (tmp_path / "router_config.json").write_text('{"router_type": "memagent", "schema_version": 1}')
    (tmp_path / "calibration.json").write_text(json.dumps({"end_threshold": "high"}))
    with pytest.raises(RouterConfigError, match=r"calibration\.json: end_threshold must be a number"):
        MemAgentRouter.from_pretrained(tmp_path)


def test_offline_begin_from_recorded_previews(tmp_path):
    from eval.memagent import load_outcomes, offline_begin

    table, pool = load_outcomes(write_jsonl(tmp_path / "x.jsonl", exploration_records()), "never")
    picks = {"goal t1": "Voyager", "goal t2": "ExpeL", "goal t3": "ExpeL", "goal t4": None}

    class ByGoal:
        def begin(self, goal, previews, providers):
            assert [p["provider"] for p in previews] == ["Voyager"]  # previews of other pools are dropped
            return picks[goal]

    recs = {t: {"goal": f"goal {t}", "previews": [{"provider": "Voyager", "score": 0.1, "snippet": "", "n_items": 1},
                                                  {"provider": "AWM", "score": 0.1, "snippet": "", "n_items": 1}]}
            for t in table}
    out = offline_begin(ByGoal(), recs, {"Voyager": None, "ExpeL": None}, table, [None, *pool], list(table))
    # t1 Voyager ok (oracle), t2 unsolvable, t3 ExpeL ok (oracle None), t4 None fails (oracle ExpeL)
    assert out["implied_success_rate"] == 0.5 and out["choices"] == {"Voyager": 1, "ExpeL": 2, "None": 1}
    assert out["accuracy_solving"] == pytest.approx(2 / 3) and out["accuracy_exact"] == pytest.approx(1 / 3)


def test_begin_train_fit_tells_a_router_that_learned_the_label_marginal():
    """A router that gives every task the label shares (what SFT on a few skewed labels can learn) picks the
    majority everywhere: accuracy = majority share, probability spread 0; one that reads the goal fits."""
    import torch

    from eval.memagent_metrics import begin_train_fit

    labels = [{"task_id": "a", "decision": "memp"}, {"task_id": "b", "decision": "memp"},
              {"task_id": "c", "decision": None}, {"task_id": "gone", "decision": None}]
    recs = {t: {"goal": f"goal {t}", "previews": [{"provider": "memp", "score": 0.1, "snippet": "", "n_items": 1}]}
            for t in "abc"}
    providers = {"memp": None}

    class Marginal:
        def score_begin(self, goal, previews, providers):
            return [None, *providers], torch.log(torch.tensor([1 / 3, 2 / 3]))

    class ByGoal:
        def score_begin(self, goal, previews, providers):
            assert [p["provider"] for p in previews] == ["memp"]
            return [None, *providers], torch.tensor([0.0, -3.0] if goal == "goal c" else [-3.0, 0.0])

    prior = begin_train_fit(Marginal(), recs, labels, providers)
    assert prior["tasks"] == 3 and prior["choices"] == {"memp": 3} and prior["labels"] == {"memp": 2, "None": 1}
    assert prior["accuracy"] == pytest.approx(2 / 3) == prior["majority_share"] and prior["prob_spread"] == 0.0
    fit = begin_train_fit(ByGoal(), recs, labels, providers)
    spread = torch.softmax(torch.tensor([0.0, -3.0]), 0)[0] - torch.softmax(torch.tensor([-3.0, 0.0]), 0)[0]
    assert fit["accuracy"] == 1.0 and fit["prob_spread"] == pytest.approx(float(spread) * (2 ** 0.5) / 3, abs=1e-5)


def test_time_budget_stops_sft_with_a_checkpoint(tiny_llama_dir, tmp_path, one_torch_thread):
    from train.memagent import main

    files = fake_phase_files(tmp_path / "data")
    out = tmp_path / "run"
    trainer, info = main(sft_args(tiny_llama_dir, files, out, "--max_steps", "20", "--save_steps", "100",
                                  "--max_train_minutes", "0", "--per_device_train_batch_size", "2"))
    assert info["steps"] == 1 and (out / "checkpoint-1" / "trainer_state.json").is_file()
