"""MemAgent memory providers: gates, k and word limits (paper Tables 6, 7, 10, 11), retrieval by goal, the
vectorized Begin probe against the per-provider loop, atomic store/save/load, failure isolation in store_all."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from memagent_provider_fakes import GOALS, HashEncoder, ScriptedLLM, trajectory  # noqa: E402

from routers.io import RecordError  # noqa: E402
from routers.memagent.protocol import FAMILIES, MemoryItem, MemoryProvider, TrajectoryStep  # noqa: E402
from routers.memagent.providers import (PROVIDER_NAMES, STM_SECTIONS, ProviderError, ProviderProbe,  # noqa: E402
                                        ShortTermMemory, build_providers, count_words, limit_sentences,
                                        limit_words, load_providers, probe_loop, save_providers, store_all)
from routers.memagent.providers.keyword import KeywordIndex, term_counts  # noqa: E402
from routers.memagent.providers.short_term import COLLECTED_DATA, PAGES_VISITED, RECENT_SEARCHES  # noqa: E402

# (family, gate, k, per-memory word limit) -- the paper's values where it gives them (Tables 6, 7, 11, 15)
EXPECTED = {
    "voyager": ("similarity", "all", 1, 150), "dilu": ("similarity", "all", 1, 150),
    "generative": ("similarity", "all", 1, 150), "cheatsheet": ("similarity", "all", 3, 80),
    "awm": ("structural", "success", 1, 200), "skillweaver": ("structural", "success", 3, 150),
    "memp": ("structural", "success", 1, 150), "expel": ("insight", "all", 3, 40),
    "agent_kb": ("insight", "success", 2, 200), "insightgraph": ("insight", "all", 2, 30),
    "mobile_e": ("insight", "all", 4, 40), "evolver": ("insight", "all", 3, 40),
    "lightweight": ("insight", "success", 2, 60),
}


def make(names=None, **kw):
    return build_providers(names, encoder=kw.pop("encoder", HashEncoder()), llm=kw.pop("llm", ScriptedLLM()), **kw)


def filled(success_pattern=(True, False, True, True)):
    providers = make()
    for i, (g, ok) in enumerate(zip(GOALS, success_pattern)):
        report = store_all(providers, trajectory(i, g, ok), list(providers))
        assert report.ok, report.errors
    return providers


def test_names_parameters_and_protocol():
    assert PROVIDER_NAMES == ("voyager", "dilu", "generative", "cheatsheet", "awm", "skillweaver", "memp",
                              "expel", "agent_kb", "insightgraph", "mobile_e", "evolver", "lightweight")
    providers = make()
    assert list(providers) == list(PROVIDER_NAMES)
    for name, p in providers.items():
        assert isinstance(p, MemoryProvider)
        assert (p.family, p.gate, p.k, p.word_limit) == EXPECTED[name], name
        assert p.family in FAMILIES
        assert p.describe_storage() and p.describe_retrieval()
        assert p.describe_gate() in p.describe("end") and p.describe_retrieval() in p.describe("begin")
    assert providers["expel"].retrieval == "hybrid" and providers["expel"].score_dense_weight == 0.7
    assert providers["expel"].keyword_weight == pytest.approx(0.3) and providers["expel"].keyword_kind == "tfidf"
    assert providers["mobile_e"].retrieval == "keyword" and (providers["mobile_e"].n_tips, providers["mobile_e"].n_shortcuts) == (2, 2)
    assert providers["generative"].llm_rerank and providers["generative"].n_candidates == 3
    assert providers["voyager"].max_sentences == 6
    assert sum(p.llm_rerank for p in providers.values()) == 1
    with pytest.raises(ValueError, match="unknown provider"):
        build_providers(["voyager", "memgpt"])
    assert make(["expel"], overrides={"expel": {"k": 5}})["expel"].k == 5


def test_gates_success_only_vs_all():
    providers = make()
    fail = trajectory(0, GOALS[0], success=False)
    report = store_all(providers, fail, list(providers))
    success_only = {n for n, (_, gate, _, _) in EXPECTED.items() if gate == "success"}
    assert set(report.gated) == success_only == {"awm", "skillweaver", "memp", "agent_kb", "lightweight"}
    for name, p in providers.items():
        assert (len(p) == 0) == (name in success_only), name
    report = store_all(providers, trajectory(1, GOALS[1], success=True), list(providers))
    assert report.ok and not report.gated
    assert all(len(p) > 0 for p in providers.values())
    # ExpeL: insights from every outcome, refined trajectories only from successes
    kinds = [it.meta["kind"] for it in providers["expel"].items]
    assert kinds.count("trajectory") == 1 and kinds.count("insight") == 2
    # Mobile-E: shortcuts only from the success
    assert [it.source_task_id for it in providers["mobile_e"].items if it.meta["kind"] == "shortcut"] == ["t1"]
    # an errored rollout is never stored
    errored = trajectory(2, GOALS[2], success=True, error="agent crashed")
    assert all(not p.accepts(errored) for p in providers.values())


def test_word_limits_are_enforced_and_counted():
    providers = make(llm=ScriptedLLM(verbose=True))
    for i, g in enumerate(GOALS[:3]):
        assert store_all(providers, trajectory(i, g, True), list(providers)).ok
    for name, p in providers.items():
        if name == "skillweaver":  # code cannot be cut: over-long skills are rejected and counted
            assert len(p) == 0 and p.stats["rejected_skills"] == 3 and p.stats["rejected_over_limit"] == 3
            continue
        assert len(p) > 0, name
        for it in p.items:
            limit = p.word_limit
            if name == "expel" and it.meta["kind"] == "trajectory":
                limit = p.trajectory_words + count_words(f"Task: {it.meta['goal']}")
            if name == "mobile_e" and it.meta["kind"] == "shortcut":
                limit = p.shortcut_words
            assert count_words(it.text) <= limit, (name, count_words(it.text))
        cut = p.stats.get("words_dropped", 0) + p.stats.get("sentences_dropped", 0)
        assert p.stats["truncated"] > 0 and cut > 0, name
        out = p.retrieve(GOALS[0])
        assert count_words(out.text) <= p.output_limit, name
    voyager = providers["voyager"]
    assert all(limit_sentences(it.meta["summary"], 6)[1] == 0 for it in voyager.items)
    assert voyager.stats["sentences_dropped"] == 3 * 3  # 9 sentences written (8 + the padding), 6 kept


def test_skill_parsing_and_replacement():
    p = make(["skillweaver"])["skillweaver"]
    written = p.store(trajectory(0, GOALS[0]))
    assert len(written) == 1 and written[0].meta["function"] == "solve_cook_the_red_apple_in_the_oven"
    compile(written[0].text, "<skill>", "exec")  # stored code is valid Python
    again = p.store(trajectory(5, GOALS[0]))  # same function name: replaces, does not duplicate
    assert len(p) == 1 and again[0].source_task_id == "t5" and p.stats["replaced_skills"] == 1
    assert p.retrieve(GOALS[0]).text.startswith("Reusable skills (callable tools):\n```python\ndef solve_")


@pytest.mark.parametrize("name", PROVIDER_NAMES)
def test_retrieves_the_matching_memory_and_respects_k(name):
    providers = filled((True, True, True, True))
    p = providers[name]
    for i, goal in enumerate(GOALS):
        got = p.retrieve(goal)
        assert got.provider == name and got.text
        assert 1 <= len(got.item_ids) <= p.k
        first = next(it for it in p.items if it.item_id == got.item_ids[0])
        assert first.source_task_id == f"t{i}", (name, goal, got.item_ids)
        assert goal in got.text
    probe = p.probe(GOALS[2])
    assert probe.n_items == len(p) and probe.snippet and count_words(probe.snippet) <= p.snippet_words + 8
    if name == "mobile_e":
        kinds = [next(it for it in p.items if it.item_id == i).meta["kind"] for i in p.retrieve(GOALS[1]).item_ids]
        assert kinds.count("tip") <= 2 and kinds.count("shortcut") <= 2 and len(kinds) == 4


def test_generative_reranks_three_candidates_with_the_llm():
    p = make(["generative"])["generative"]
    for i, g in enumerate(GOALS):
        p.store(trajectory(i, g))

    class PreferThird(ScriptedLLM):
        def respond(self, s, u):
            return "1: 2\n2: 5\n3: 9" if "rate the importance" in s else super().respond(s, u)

    dense_first = p.retrieve(GOALS[0]).item_ids
    p.llm = PreferThird()
    reranked = p.retrieve(GOALS[0]).item_ids
    scores = p.score_items(*p.query(GOALS[0]))
    third = p.items[int(np.argsort(-scores, kind="stable")[2])].item_id
    assert dense_first == ["generative-000000"] and reranked == [third]
    p.llm = None
    with pytest.raises(ProviderError, match="rerank"):
        p.retrieve(GOALS[0])


def test_expel_operations_update_votes_and_remove():
    p = make(["expel"])["expel"]
    p.store(trajectory(0, GOALS[0], success=False))
    (ins,) = p.items
    assert ins.meta == {**ins.meta, "kind": "insight", "votes": 2}

    class Ops(ScriptedLLM):
        def __init__(self, answer):
            super().__init__()
            self.answer = answer

        def respond(self, s, u):
            return self.answer if "general insights" in s else super().respond(s, u)

    p.llm = Ops("UPVOTE 1\nEDIT 1: Always inspect the oven and the apple first")
    p.store(trajectory(1, GOALS[1], success=False))
    assert [(it.item_id, it.text, it.meta["votes"]) for it in p.items] == [
        ("expel-000000", "Always inspect the oven and the apple first", 4)]
    # the edited key was re-indexed: same scores as an index built from scratch
    fresh = KeywordIndex.from_texts([it.key for it in p.items], "tfidf")
    q = term_counts("inspect the oven")
    np.testing.assert_array_equal(p.state.keyword.scores(*q), fresh.scores(*q))
    assert p.state.embeddings.shape == (1, 256) and p.probe("inspect the oven").snippet.startswith("Always inspect")
    p.llm = Ops("DOWNVOTE 1\nDOWNVOTE 1")
    p.store(trajectory(2, GOALS[2], success=False))
    assert p.items[0].meta["votes"] == 2
    p.store(trajectory(3, GOALS[3], success=False))  # 2 -> 0 votes: removed
    assert len(p) == 0 and p.stats["insights_removed"] == 1


def test_evolver_credits_shown_principles_and_merges_repeats():
    p = make(["evolver"])["evolver"]
    p.store(trajectory(0, GOALS[0]))
    shown = p.retrieve(GOALS[0])
    p.store(trajectory(1, GOALS[0], success=True, begin_provider="evolver", begin_memory=shown.text))
    (principle,) = p.items  # the repeat merged into the first principle
    assert principle.meta["uses"] == 1 and principle.meta["successes"] == 1 and principle.meta["merged"] == 1
    assert "score 0.67" in p.retrieve(GOALS[0]).text


def test_probe_matches_the_per_provider_loop():
    from eval.bench.memagent import random_unit, synthetic_items

    rng = np.random.default_rng(0)
    enc = HashEncoder(64)
    providers = make(encoder=enc)
    for name, p in providers.items():  # a few hundred realistic memories each, random keys
        p.bulk_load(synthetic_items(p, 300, rng), random_unit(rng, 300, 64) if p.uses_dense else None)
    for i, g in enumerate(GOALS):  # plus LLM-written ones
        assert store_all(providers, trajectory(i, g, i != 1), list(providers)).ok
    fast, exact = ProviderProbe(providers), ProviderProbe(providers, quantized=False)
    queries = GOALS + ["find the red key in the garden", "check the annual report", "zzz unknown words"]
    for q in queries:
        ref = probe_loop(providers, q)
        for probe in (fast, exact):
            got = probe.probe(q)
            assert [(x.provider, x.snippet, x.n_items) for x in got] == [(x.provider, x.snippet, x.n_items) for x in ref]
            np.testing.assert_allclose([x.score for x in got], [x.score for x in ref], rtol=0, atol=1e-6)
        assert [x.provider for x in ref] == list(PROVIDER_NAMES)
    calls = enc.calls
    fast.probe(GOALS[0])
    assert enc.calls == calls + 1  # the goal is encoded once for all 12 dense providers
    # a store replaces the provider's state: the cache is rebuilt and the new memory shows up
    rebuilds = fast.rebuilds
    providers["voyager"].store(trajectory(9, "polish the golden lamp in the attic"))
    got = fast.probe("polish the golden lamp in the attic")[0]
    assert fast.rebuilds == rebuilds + 1 and got.n_items == 300 + 4 + 1 and "golden lamp" in got.snippet
    assert got == probe_loop(providers, "polish the golden lamp in the attic")[0]


def test_probe_edge_cases():
    providers = make(["voyager", "mobile_e", "expel"])
    assert ProviderProbe(providers).probe(GOALS[0]) == probe_loop(providers, GOALS[0])  # all empty
    assert all(p.score == 0.0 and p.n_items == 0 and p.snippet == "" for p in ProviderProbe(providers).probe("x"))
    providers["mobile_e"].store(trajectory(0, GOALS[0]))  # keyword-only provider alone
    got = ProviderProbe(providers).probe(GOALS[0])
    assert got == probe_loop(providers, GOALS[0]) and got[1].score > 0 and got[0].n_items == 0
    providers["voyager"].store(trajectory(1, GOALS[1]))
    other = make(["dilu"], encoder=HashEncoder(32))
    other["dilu"].store(trajectory(0, GOALS[0]))
    with pytest.raises(ValueError, match="different dimensions"):
        ProviderProbe({**providers, **other}).probe(GOALS[0])


def test_save_load_round_trip(tmp_path):
    providers = filled()
    save_providers(providers, tmp_path / "mem")
    fresh = make()
    load_providers(fresh, tmp_path / "mem")
    for name in PROVIDER_NAMES:
        a, b = providers[name], fresh[name]
        assert a.items == b.items and a.stats == b.stats and a.state.next_id == b.state.next_id
        if a.uses_dense:
            np.testing.assert_array_equal(a.state.embeddings, b.state.embeddings)
        assert a.retrieve(GOALS[2]) == b.retrieve(GOALS[2])
    assert ProviderProbe(fresh).probe(GOALS[3]) == ProviderProbe(providers).probe(GOALS[3])
    # new ids continue after the loaded ones
    new = fresh["dilu"].store(trajectory(7, "feed the cat"))
    assert new[0].item_id not in {it.item_id for it in providers["dilu"].items}
    meta = json.loads((tmp_path / "mem" / "expel" / "provider.json").read_text())
    assert meta["params"]["dense_weight"] == 0.7 and meta["n_items"] == len(providers["expel"])


def test_load_rejects_bad_state_and_keeps_memory(tmp_path):
    providers = filled()
    p = providers["voyager"]
    p.save(tmp_path / "v")
    before = p.state
    lines = (tmp_path / "v" / "items.jsonl").read_text().splitlines()
    (tmp_path / "v" / "items.jsonl").write_text(lines[0] + "\n{not json\n")
    with pytest.raises(RecordError, match=r"items.jsonl:2: invalid JSON"):
        p.load(tmp_path / "v")
    assert p.state is before
    with pytest.raises(ProviderError, match="saved provider is 'voyager', not 'dilu'"):
        providers["dilu"].load(tmp_path / "v")
    p.save(tmp_path / "v2")
    np.save(tmp_path / "v2" / "embeddings.npy", np.zeros((1, 256), np.float32))
    with pytest.raises(ProviderError, match="embeddings.npy: expected"):
        p.load(tmp_path / "v2")
    # load_providers validates everything before replacing anything
    save_providers(providers, tmp_path / "all")
    (tmp_path / "all" / "memp" / "provider.json").write_text("{")
    fresh = make()
    with pytest.raises(ProviderError, match="memp/provider.json: invalid JSON"):
        load_providers(fresh, tmp_path / "all")
    assert all(len(q) == 0 for q in fresh.values())


def test_failed_save_keeps_the_previous_directory(tmp_path, monkeypatch):
    p = filled()["dilu"]
    p.save(tmp_path / "d")
    old = (tmp_path / "d" / "items.jsonl").read_text()
    p.store(trajectory(8, "a new task to remember"))
    monkeypatch.setattr(np, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        p.save(tmp_path / "d")
    assert (tmp_path / "d" / "items.jsonl").read_text() == old
    assert [x.name for x in tmp_path.iterdir()] == ["d"]


def test_store_all_isolates_a_raising_provider():
    providers = make(llm=ScriptedLLM(fail_on="Induce a reusable workflow"))
    providers["awm"].llm = ScriptedLLM()
    store_all(providers, trajectory(0, GOALS[0]), ["awm"])
    awm_state = providers["awm"].state
    providers["awm"].llm = ScriptedLLM(fail_on="Induce a reusable workflow")
    report = store_all(providers, trajectory(1, GOALS[1]), {n: True for n in PROVIDER_NAMES} | {"dilu": False})
    assert list(report.errors) == ["awm"] and "scripted LLM failure" in report.errors["awm"]
    assert providers["awm"].state is awm_state and len(providers["awm"]) == 1
    assert set(report.stored) == set(PROVIDER_NAMES) - {"awm", "dilu"}
    assert len(providers["dilu"]) == 0
    assert all(providers[n].items and report.stored[n] for n in report.stored)
    assert report.to_dict()["errors"] == {"awm": report.errors["awm"]}
    with pytest.raises(ValueError, match="unknown provider"):
        store_all(providers, trajectory(2, GOALS[2]), ["voyager", "nope"])
    assert len(providers["voyager"]) == 1  # nothing stored when the decision is invalid


def test_store_is_atomic_when_encoding_fails_after_the_llm_wrote():
    class Flaky(HashEncoder):
        fail = False

        def encode(self, texts):
            if self.fail:
                raise RuntimeError("encoder down")
            return super().encode(texts)

    enc = Flaky()
    providers = make(["voyager", "insightgraph"], encoder=enc)
    store_all(providers, trajectory(0, GOALS[0]), list(providers))
    states = {n: p.state for n, p in providers.items()}
    enc.fail = True
    report = store_all(providers, trajectory(1, GOALS[1]), list(providers))
    assert set(report.errors) == {"voyager", "insightgraph"}
    assert all(providers[n].state is states[n] for n in providers)
    assert providers["voyager"].stats["llm_calls"] == 1  # the failed attempt's counters were not committed


def test_no_llm_is_a_clear_error():
    p = build_providers(["dilu"], encoder=HashEncoder())["dilu"]
    with pytest.raises(ProviderError, match="needs an LLM backend"):
        p.store(trajectory(0, GOALS[0]))
    assert len(p) == 0 and p.probe("anything").n_items == 0


def test_short_term_memory_follows_table_10():
    assert [(s.name, s.min_show, s.max_items, s.priority) for s in STM_SECTIONS] == [
        (COLLECTED_DATA, 2, 8, 0), (PAGES_VISITED, 3, 15, 1), (RECENT_SEARCHES, 4, 8, 2)]
    stm = ShortTermMemory(max_words=10_000)
    stm.update(TrajectoryStep(0, "Paris is the capital of France. Nice weather?", "search capital of France"))
    assert stm.entries(COLLECTED_DATA) == ["Paris is the capital of France."]
    assert stm.entries(RECENT_SEARCHES) == ["capital of France"] and stm.summary() == ""  # below thresholds
    stm.update(TrajectoryStep(1, "The Eiffel Tower is 330 metres tall.", "visit https://en.wikipedia.org/wiki/Eiffel_Tower"))
    assert stm.summary() == ("## Collected Data\n- Paris is the capital of France.\n"
                             "- The Eiffel Tower is 330 metres tall.")
    for i in range(30):
        stm.update(TrajectoryStep(2 + i, f"Fact number {i} is {i * 7}. Page https://site{i}.org/x",
                                  f'search(query="query {i}")'))
    assert stm.entries(COLLECTED_DATA) == [f"Fact number {i} is {i * 7}." for i in range(22, 30)]
    assert len(stm.entries(PAGES_VISITED)) == 15 and stm.entries(PAGES_VISITED)[-1] == "https://site29.org/x"
    assert stm.entries(RECENT_SEARCHES) == [f"query {i}" for i in range(22, 30)]
    assert stm.dropped == {COLLECTED_DATA: 24, PAGES_VISITED: 16, RECENT_SEARCHES: 23}
    text = stm.summary()
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## Collected Data", "## Pages Visited", "## Recent Searches"]
    # under a word budget the lowest-priority section loses entries first, and disappears below its minimum
    tight = ShortTermMemory(max_words=90)
    for i in range(30):
        tight.update(TrajectoryStep(i, f"Fact number {i} is {i * 7}. Page https://site{i}.org/x", f"search query {i}"))
    vis = tight.visible()
    assert RECENT_SEARCHES not in vis and len(vis[COLLECTED_DATA]) == 8 and len(vis[PAGES_VISITED]) == 15
    assert count_words(tight.summary()) == 84 <= 90
    # text-game observations: rooms are the pages, examine is a search
    tw = ShortTermMemory()
    for room in ("Kitchen", "Pantry", "Garden"):
        tw.update(TrajectoryStep(0, f"-= {room} =- You see a wooden chest here.", "examine chest"))
    assert tw.entries(PAGES_VISITED) == ["Kitchen", "Pantry", "Garden"]
    assert tw.entries(RECENT_SEARCHES) == ["examine chest"]
    assert tw.entries(COLLECTED_DATA) == ["You see a wooden chest here."]


def test_text_limits_and_keyword_scores():
    text = "line one has words\n  indented line two\nthree"
    assert limit_words(text, 6) == ("line one has words\n  indented line", 2)
    assert limit_words(text, 99) == (text, 0)
    assert limit_sentences("A b. C d! E f? G h.", 2) == ("A b. C d!", 2)
    from sklearn.feature_extraction.text import TfidfVectorizer

    docs = ["the red apple is in the kitchen", "open the wooden chest", "red chest key garden", "apple apple pie"]
    ix = KeywordIndex.from_texts(docs, "tfidf")
    vec = TfidfVectorizer(token_pattern=r"[a-z0-9]+", stop_words=["the", "is", "in"])
    ref = (vec.fit_transform(docs) @ vec.transform(["red apple chest"]).T).toarray().ravel()
    np.testing.assert_allclose(ix.scores(*term_counts("red apple chest")), ref, atol=1e-12)
    bm = KeywordIndex.from_texts(docs, "bm25").scores(*term_counts("apple pie"))
    assert int(np.argmax(bm)) == 3 and 0 < bm.max() <= 1 and bm[1] == 0


def test_bulk_load_and_item_validation():
    p = make(["dilu"])["dilu"]
    items = [MemoryItem("dilu", f"dilu-{i:06d}", f"goal {i}", f"text {i}", f"s{i}") for i in range(3)]
    p.bulk_load(items)
    assert len(p) == 3 and p.state.next_id == 3 and p.state.embeddings.shape == (3, 256)
    assert not p.state.embeddings.flags.writeable
    with pytest.raises(ProviderError, match="duplicate item id"):
        p.bulk_load(items + items[:1])
    with pytest.raises(ProviderError, match="not a dilu MemoryItem"):
        p.bulk_load([MemoryItem("awm", "x", "k", "t", "s")])
    assert len(p) == 3


def test_bench_memagent_probe_small():
    from eval.bench.memagent import bench_memagent_probe

    res = bench_memagent_probe(n_memories=200, n_queries=3, seed=1, encoder=None)
    assert res["benchmark"] == "memagent_probe" and res["agreement"]["identical"] == "3/3"
    names = [f["name"] for f in res["figures"]]
    assert names == ["probe_latency_p50", "probe_latency_p95", "probe_latency_p50_vs_budget", "probe_vs_paper",
                     "query_encode_p50"]
    budget = res["figures"][2]
    assert budget["baseline"] == 0.010 and budget["target"]["text"] == "ratio <= 1"
    assert res["memories"]["total"] == 13 * 200 and res["memories"]["keyword_providers"] == [
        "expel", "agent_kb", "mobile_e"]


@pytest.mark.slow
def test_real_minilm_retrieval_and_probe():
    providers = build_providers(llm=ScriptedLLM())  # default encoder: all-MiniLM-L6-v2
    for i, g in enumerate(GOALS):
        assert store_all(providers, trajectory(i, g), list(providers)).ok
    assert providers["voyager"].state.embeddings.shape == (4, 384)
    paraphrase = "bake the red apple using the oven"
    for name in ("voyager", "dilu", "memp", "agent_kb"):
        first = providers[name].retrieve(paraphrase).item_ids[0]
        assert next(it for it in providers[name].items if it.item_id == first).source_task_id == "t0", name
    got, ref = ProviderProbe(providers).probe(paraphrase), probe_loop(providers, paraphrase)
    assert [(x.provider, x.snippet) for x in got] == [(x.provider, x.snippet) for x in ref]
    np.testing.assert_allclose([x.score for x in got], [x.score for x in ref], atol=1e-6)
