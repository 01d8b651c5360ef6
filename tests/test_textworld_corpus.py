"""TextWorld trajectory QA corpus: real games generated offline, played, questioned (DESIGN §4).

Two small tw-cooking games (6 rooms, short trajectories) are generated once per module; every check of a
state or an answer compares against the engine's own facts or against the step metadata recorded at play
time, not against the code that chose the evidence.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from data_synthesis.corpora import load_corpus, split_episodes
from routers.io import RecordError
from data_synthesis.textworld_corpus import TextWorldCorpusConfig, game_settings, run
from data_synthesis.textworld_episodes import EPISODES_FILE, load_textworld
from data_synthesis.textworld_player import clean_observation, play
from data_synthesis.textworld_qa import CATEGORIES, parse_recipe, support_problems
from data_synthesis.textworld_state import PlayedGame, find_mentions
from routers.memory.schema import SCHEMA_VERSION, LoadStats

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(n_games=2, go=[6], recipe=[2], take=[1, 2], min_steps=30, max_steps=60, questions_per_type=6,
             state_probes=10)


def _cfg(out, **kw) -> TextWorldCorpusConfig:
    return TextWorldCorpusConfig(output_dir=str(out), **{**SMALL, **kw})


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("tw") / "corpus"
    stats = run(_cfg(out), progress=False)
    return out, stats, load_textworld(out)


# -- generation and play ---------------------------------------------------------------------------------
def test_files_and_stats(corpus):
    out, stats, episodes = corpus
    assert [e.episode_id for e in episodes] == ["tw-s0-g000", "tw-s0-g001"]
    for e in episodes:
        for ext in (".z8", ".json"):
            assert (out / "games" / f"{e.episode_id}{ext}").stat().st_size > 1000
        assert e.meta["game_file"] == f"games/{e.episode_id}.z8"
        assert e.meta["settings"]["go"] == 6 and e.meta["settings"]["recipe"] == 2
        assert e.meta["uuid"].startswith("tw-cooking-recipe2+")
    assert not list((out / "games").glob(".tmp-*"))
    disk = json.loads((out / "stats.json").read_text())
    assert disk["games"] == stats["games"] == 2
    assert disk["steps"]["total"] == sum(len(e.steps) - 1 for e in episodes)
    assert disk["qa"]["total"] == sum(len(e.qa) for e in episodes)
    assert disk["qa"]["by_category"] == dict(Counter(q.category for e in episodes for q in e.qa))
    assert disk["this_run"]["generated"] == 2
    assert json.loads((out / "manifest.json").read_text())["episodes"] == ["tw-s0-g000", "tw-s0-g001"]


def test_trajectories_are_long_noisy_and_won(corpus):
    _, _, episodes = corpus
    for e in episodes:
        n = len(e.steps) - 1
        assert 30 <= n <= 60 + 20, n  # min_steps .. max_steps plus the walkthrough's tail
        assert [s.step_id for s in e.steps] == [f"T{i}" for i in range(n + 1)]
        assert [s.index for s in e.steps] == list(range(n + 1))
        kinds = Counter(s.meta["kind"] for s in e.steps)
        assert kinds["start"] == 1 and kinds["policy"] >= 5 and kinds["random"] + kinds["info"] + kinds["fail"] >= 15
        assert e.steps[1].meta["action"] == "inventory"
        assert e.meta["won"] and not e.meta["lost"] and e.meta["final_score"] == e.meta["max_score"]
        assert e.meta["failed_steps"] == sum(s.meta["failed"] for s in e.steps) >= 3
        for s in e.steps:
            assert s.speaker == "agent"
            assert s.text == f"> {s.meta['action']}\n{s.meta['observation']}"
            assert not re.search(r"=-\d+/\d+|\n>", s.meta["observation"])  # prompt and status line stripped


def test_recorded_states_match_a_fresh_replay_in_the_engine(corpus):
    """Replaying the recorded actions in the real game gives, step by step, the facts the episode stores."""
    import textworld

    out, _, episodes = corpus
    for e in episodes:
        traj = PlayedGame(e)
        env = textworld.start(str(out / e.meta["game_file"]), request_infos=textworld.EnvInfos(facts=True, score=True))
        try:
            state = env.reset()
            facts = lambda st: {(f.name, *(v.name for v in f.arguments)) for f in st["facts"]}  # noqa: E731
            assert facts(state) == set(traj.worlds[0].facts)
            for i, s in enumerate(e.steps[1:], start=1):
                state, score, _ = env.step(s.meta["action"])
                assert facts(state) == set(traj.worlds[i].facts), (e.episode_id, s.step_id)
                assert clean_observation(state["feedback"]) == s.meta["observation"]
                assert int(score) == s.meta["score"]
                assert traj.worlds[i].player_room() == s.meta["location"]
                assert traj.worlds[i].inventory() == s.meta["inventory"]
        finally:
            env.close()


def test_failures_really_failed_for_their_reason(corpus):
    _, _, episodes = corpus
    reasons = Counter()
    for e in episodes:
        traj = PlayedGame(e)
        for k, s in enumerate(e.steps):
            fail = s.meta.get("failure")
            if not fail:
                continue
            reasons[fail["reason"]] += 1
            assert s.meta["added"] == [] and s.meta["removed"] == [] and s.meta["score"] == e.steps[k - 1].meta["score"]
            before = traj.worlds[k - 1]
            room = before.player_room()
            if fail["reason"] == "no_exit":
                assert s.meta["action"] == f"go {fail['direction']}" and fail["direction"] not in before.exits(room)
                assert s.meta["observation"] == "You can't go that way."
            elif fail["reason"] == "closed_door":
                assert before.exits(room)[fail["direction"]][1] == fail["door"] and before.is_open(fail["door"]) is False
                assert s.meta["observation"] == f"You have to open the {fail['door']} first."
            elif fail["reason"] == "not_here":
                assert before.room_of(fail["entity"]) != room
            elif fail["reason"] == "already_carried":
                assert fail["entity"] in before.inventory() and s.meta["observation"] == "You already have that."
            elif fail["reason"] == "already_open":
                assert before.is_open(fail["container"]) and s.meta["observation"] == "That's already open."
            elif fail["reason"] == "closed_container":
                assert before.holder(fail["entity"]) == ("in", fail["container"])
                assert before.is_open(fail["container"]) is False
    assert sum(reasons.values()) >= 6 and len(reasons) >= 2


# -- QA ----------------------------------------------------------------------------------------------------
def test_every_question_type_present_and_supported(corpus):
    _, _, episodes = corpus
    for e in episodes:
        cats = Counter(q.category for q in e.qa)
        assert set(cats) == set(CATEGORIES), cats
        assert all(n <= 6 for n in cats.values())
        assert len({q.qa_id for q in e.qa}) == len(e.qa) and len({q.question for q in e.qa}) == len(e.qa)
        for q in e.qa:
            assert q.evidence and all(e.has_step(x) for x in q.evidence), q
            assert [e.step(x).index for x in q.evidence] == sorted({e.step(x).index for x in q.evidence})
            assert support_problems(e, q) == [], (q.question, q.answer, q.evidence)
            assert q.answer and len(q.answer.split()) <= 16, q.answer


def _prev_changes(e, key, k, since=1):
    """Steps in [since, k] whose recorded ``meta[key]`` differs from the step before."""
    return [e.steps[j].step_id for j in range(since, k + 1) if e.steps[j].meta[key] != e.steps[j - 1].meta[key]]


def test_state_answers_and_evidence_from_recorded_meta(corpus):
    _, _, episodes = corpus
    checked = Counter()
    for e in episodes:
        traj = PlayedGame(e)
        for q in (q for q in e.qa if q.category == "state_after_step"):
            k = q.meta["step"]
            sk = e.steps[k]
            assert f"step {sk.step_id}?" in q.question
            tpl = q.meta["template"]
            if tpl == "player_location":
                assert q.answer == sk.meta["location"]
                moves = _prev_changes(e, "location", k)
                assert q.evidence == (moves[-1:] or ["T0"])
            elif tpl == "inventory":
                assert q.answer.split(", ") == sk.meta["inventory"]
                last = max(j for j in range(1, k + 1) if e.steps[j].meta["action"] == "inventory")
                assert q.evidence == [f"T{last}"] + _prev_changes(e, "inventory", k, since=last + 1)
            elif tpl == "score":
                assert q.answer == str(sk.meta["score"])
                assert q.evidence == _prev_changes(e, "score", k)
            elif tpl == "object_location":
                x = q.question.split("Where was the ", 1)[1].split(" right after")[0]
                rel, where = traj.worlds[k].holder(x)
                expect = ("in the player's inventory" if where == "I" else
                          f"on the floor of the {where}" if rel == "at" else f"{rel} the {where}")
                assert q.answer == expect
                assert x in e.step(q.evidence[0]).meta["observation"] or x in e.step(q.evidence[0]).meta["action"]
                # nothing moved x between the evidence and step k
                first = e.step(q.evidence[0]).index
                assert all(traj.worlds[j].holder(x) == (rel, where) for j in range(first, k + 1))
            elif tpl == "open_state":
                c = q.question.split("Was the ", 1)[1].split(" open or closed")[0]
                assert q.answer == ("open" if traj.worlds[k].is_open(c) else "closed")
            checked[tpl] += 1
    assert checked["player_location"] >= 1 and sum(checked.values()) >= 8, checked


def test_causal_answers_name_the_cause(corpus):
    _, _, episodes = corpus
    n = 0
    for e in episodes:
        traj = PlayedGame(e)
        for q in (q for q in e.qa if q.category == "causal_failure"):
            fail_step = e.step(q.evidence[-1])
            k = fail_step.index
            fail = fail_step.meta["failure"]
            assert q.meta["reason"] == fail["reason"] and f"'{fail_step.meta['action']}'" in q.question
            assert f"step {fail_step.step_id}?" in q.question
            assert len(q.evidence) >= 2, "the failing step plus the step that established the cause"
            before = traj.worlds[k - 1]
            if fail["reason"] == "not_here":
                assert q.answer == f"the {fail['entity']} was in the {before.room_of(fail['entity'])}"
            elif fail["reason"] == "closed_door":
                assert q.answer == f"the {fail['door']} was closed"
            elif fail["reason"] == "no_exit":
                assert q.answer == f"the {before.player_room()} has no exit to the {fail['direction']}"
                desc = e.step(q.evidence[0]).meta["observation"]
                assert f"-= {before.player_room()} =-" in desc.lower() and fail["direction"] not in desc
            elif fail["reason"] == "already_carried":
                assert q.answer == f"the player was already carrying the {fail['entity']}"
                assert fail["entity"] in e.step(q.evidence[0]).meta["observation"]
            n += 1
    assert n >= 4


def test_update_and_recall_answers(corpus):
    _, _, episodes = corpus
    seen = Counter()
    for e in episodes:
        traj = PlayedGame(e)
        for q in e.qa:
            tpl = q.meta["template"]
            steps = [e.step(x) for x in q.evidence]
            if tpl == "enter_count":
                room = q.question.split("enter the ", 1)[1].rstrip("?")
                entries = [s.step_id for s in e.steps[1:] if s.meta["location"] == room
                           and e.steps[s.index - 1].meta["location"] != room]
                assert q.evidence == entries and q.answer == str(len(entries))
            elif tpl == "first_take":
                x = q.question.split("pick up the ", 1)[1].rstrip("?")
                first = next(s for s in e.steps[1:] if s.meta["action"].startswith("take ")
                             and x in s.meta["inventory"] and x not in e.steps[s.index - 1].meta["inventory"])
                assert q.answer == first.step_id == q.evidence[0]
            elif tpl == "first_score":
                first = next(s for s in e.steps[1:] if s.meta["score"] > e.steps[s.index - 1].meta["score"])
                assert q.answer == first.meta["action"] and q.evidence == [first.step_id]
            elif tpl == "recipe_ingredients":
                assert q.answer.split(", ") == [i[0] for i in e.meta["ingredients"]]  # the game's own recipe
                assert steps[0].meta["action"] == "examine cookbook"
            elif tpl == "recipe_directions":
                ing = q.question.split("should the ", 1)[1].split(" be prepared")[0]
                recipe = {i[0]: i[1:] for i in e.meta["ingredients"]}[ing]
                verbs = {"diced": "dice", "sliced": "slice", "chopped": "chop", "fried": "fry", "roasted": "roast",
                         "grilled": "grill"}
                assert set(q.answer.split(" and ")) == {verbs[p] for p in recipe if p in verbs}
            elif tpl == "take_source":
                x = q.question.split("take the ", 1)[1].split(" from at")[0]
                k = steps[0].index
                assert steps[0].meta["action"].startswith(f"take {x}")
                assert q.answer == f"the {traj.worlds[k - 1].holder(x)[1]}"
            elif tpl == "open_reveal":
                assert steps[0].meta["action"].startswith("open ")
                c = steps[0].meta["action"][5:]
                assert q.answer.split(", ") == traj.worlds[steps[0].index].contents(c) or \
                    set(q.answer.split(", ")) == set(traj.worlds[steps[0].index].contents(c))
            else:
                continue
            seen[tpl] += 1
    assert seen["recipe_ingredients"] == 2 and seen["enter_count"] + seen["first_take"] + seen["first_score"] >= 2


def test_support_check_catches_wrong_evidence(corpus):
    _, _, episodes = corpus
    e = episodes[0]
    q = next(q for q in e.qa if q.meta["template"] == "player_location")
    other = next(s.step_id for s in e.steps if s.meta["location"] != q.answer and q.answer not in s.text.lower())
    bad = {"answer": q.answer, "evidence": [other], "meta": q.meta}
    assert any("not in evidence text" in p for p in support_problems(e, bad))
    cnt = next(q for ep in episodes for q in ep.qa if q.meta["derivation"] == "count")
    ep = next(ep for ep in episodes if cnt in ep.qa)
    assert support_problems(ep, {"answer": str(len(cnt.evidence) + 1), "evidence": cnt.evidence, "meta": cnt.meta})
    assert support_problems(e, {"answer": "x", "evidence": ["T9999"], "meta": {}}) == ["unknown evidence ids ['T9999']"]


def test_text_helpers():
    assert find_mentions("You see a red hot pepper and a knife.", ["red hot pepper", "hot pepper", "knife", "fork"]) \
        == {"red hot pepper", "knife"}
    assert clean_observation("\nYou take it.\n\n\n\n>  " + " " * 20 + "-= Kitchen =-1/3") == "You take it."
    ings, dirs = parse_recipe("Ingredients:\nred apple\n  salt\n\nDirections:\nslice the red apple\n  prepare meal\n")
    assert ings == ["red apple", "salt"] and dirs == ["slice red apple"]


# -- determinism and resume --------------------------------------------------------------------------------
def test_resume_after_kill_regenerates_identically_without_duplicates(corpus, tmp_path):
    out, _, _ = corpus
    full = _lines(out / EPISODES_FILE)
    part = tmp_path / "part"
    part.mkdir()
    # game 0 finished, game 1 killed mid-write: half a line
    (part / EPISODES_FILE).write_text(full[0] + "\n" + full[1][: len(full[1]) // 2], encoding="utf-8")
    # resumed in a fresh process with another hash seed: set-order differences must not change a game
    argv = ["--output_dir", str(part)]
    for k, v in SMALL.items():
        argv += [f"--{k}", *map(str, v if isinstance(v, list) else [v])]
    proc = subprocess.run([sys.executable, "-m", "data_synthesis.textworld_corpus", *argv], cwd=REPO, text=True,
                          capture_output=True, env={**os.environ, "PYTHONHASHSEED": "12345"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads((part / "stats.json").read_text())
    assert stats["this_run"]["resumed_skip"] == 1 and stats["this_run"]["generated"] == 1
    assert _lines(part / EPISODES_FILE) == full  # same seed -> byte-identical episodes, no duplicate
    again = run(_cfg(part), progress=False)
    assert again["this_run"].get("generated", 0) == 0 and _lines(part / EPISODES_FILE) == full


def test_seed_changes_the_games_and_the_play(corpus):
    out, _, episodes = corpus
    assert game_settings(_cfg(out, seed=1), 0) != game_settings(_cfg(out, seed=0), 0)
    assert game_settings(_cfg(out, seed=0), 0) == (episodes[0].meta["settings"], episodes[0].meta["game_seed"])
    ep = episodes[0]
    game = out / ep.meta["game_file"]
    same, _ = play(game, _cfg(out), random.Random("0:0:play"))
    assert [s.text for s in same] == [s.text for s in ep.steps]
    other, outcome = play(game, _cfg(out), random.Random("1:0:play"))
    assert [s.text for s in other] != [s.text for s in ep.steps] and outcome["won"]


# -- loader ------------------------------------------------------------------------------------------------
def test_loader_round_trip_and_load_corpus(corpus):
    out, _, episodes = corpus
    raw = [json.loads(ln) for ln in _lines(out / EPISODES_FILE)]
    assert [r["schema_version"] for r in raw] == [SCHEMA_VERSION] * 2
    assert [e.to_dict() for e in episodes] == raw
    stats = LoadStats()
    via_corpus = load_corpus("textworld", str(out / EPISODES_FILE), stats=stats)
    assert [e.to_dict() for e in via_corpus] == raw
    assert stats.episodes == 2 and stats.steps == sum(len(e.steps) for e in episodes)
    assert stats.qa_kept == sum(len(e.qa) for e in episodes) and stats.unknown_evidence_ids == []
    assert all(e.source == "textworld" for e in via_corpus)
    train, held = split_episodes(via_corpus, 0.5, seed=0)
    assert len(train) == len(held) == 1
    with pytest.raises(ValueError, match="textworld needs a path"):
        load_corpus("textworld")
    with pytest.raises(FileNotFoundError, match="synth textworld"):
        load_textworld(out / "missing")


def test_loader_errors_name_file_and_line(corpus, tmp_path):
    out, _, _ = corpus
    good = _lines(out / EPISODES_FILE)[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n" + '{"schema_version": 1, "episode_id": "x", "steps": [' + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=rf"{bad}:2: invalid JSON"):
        load_textworld(bad)
    bad.write_text(good + "\n\n" + json.dumps({"schema_version": 1, "episode_id": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=rf"{bad}:3: missing field\(s\) \['steps'\]"):
        load_textworld(bad)
    rec = json.loads(good)
    rec["steps"][1] = {"step_id": "T1"}  # no index / text
    bad.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=rf"{bad}:1: "):
        load_textworld(bad)
    bad.write_text(good + "\n" + good + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match=rf"{bad}:2: duplicate episode_id"):
        load_textworld(bad)
    bad.write_text(json.dumps({**json.loads(good), "schema_version": SCHEMA_VERSION + 1}) + "\n", encoding="utf-8")
    with pytest.raises(RecordError, match="newer than this reader"):
        load_textworld(bad)


def test_config_validation_and_cli_recipe(tmp_path):
    with pytest.raises(ValueError, match="tw-cooking"):
        TextWorldCorpusConfig(challenge="tw-simple")
    with pytest.raises(ValueError, match="1, 6, 9, 12"):
        TextWorldCorpusConfig(go=[5])
    with pytest.raises(ValueError, match="min_steps"):
        TextWorldCorpusConfig(min_steps=50, max_steps=40)
    from routers import cli

    rc = cli.main(["synth", "textworld", str(REPO / "configs/textworld/synth/corpus.yaml"),
                   "--output_dir", str(tmp_path / "tw"), "--n_games", "0"])
    assert rc == 0
    assert json.loads((tmp_path / "tw" / "stats.json").read_text())["games"] == 0
    assert (tmp_path / "tw" / "resolved_config.yaml").exists()


# -- the synthesis pipelines run on it as on LoCoMo -------------------------------------------------------
def test_sufficiency_and_retriever_synthesis_on_textworld(corpus, tmp_path):
    from data_synthesis.retriever import RetrieverSynthConfig, RetrieverSynthesizer
    from data_synthesis.sufficiency import SufficiencySynthConfig, SufficiencySynthesizer

    out, _, episodes = corpus
    scfg = SufficiencySynthConfig(output_dir=str(tmp_path / "suff"), corpus="textworld", corpus_path=str(out),
                                  encoder="none", answer_models=["none"], eval_fraction=0.5, max_qa_per_episode=8,
                                  max_eval_qa_per_episode=4)
    stats = SufficiencySynthesizer(scfg).run(progress=False)
    assert stats["train"]["samples"] == 16 and stats["eval"]["samples"] == 8
    assert set(stats["train"]["by_category"]) <= set(CATEGORIES)
    by_id = {e.episode_id: e for e in episodes}
    for line in _lines(tmp_path / "suff" / "train.jsonl"):
        rec = json.loads(line)
        assert rec["source"] == "textworld"
        ep = by_id[rec["episode_id"]]
        ids = set(rec["context_step_ids"])
        assert (set(rec["evidence_ids"]) <= ids) == (rec["label"] == 1)
        assert all(ep.has_step(i) for i in ids)
    rcfg = RetrieverSynthConfig(output_dir=str(tmp_path / "ret"), corpora=["textworld"], textworld_path=str(out),
                                textworld_eval_fraction=0.5, encoder="none", max_qa_per_episode=5)
    rstats = RetrieverSynthesizer(rcfg).run(progress=False)
    assert rstats["train"]["records"] == 5 and rstats["eval"]["records"] == 5
    assert rstats["train"]["by_source"] == {"textworld": 5}
