"""MESA's five memory structures on a tiny hand-made episode: exact hits, formulas, composition, failures."""

from __future__ import annotations

import pytest

from routers.memory.schema import QA, Episode, Step
from routers.mesa.base import StepResolver
from routers.mesa.compose import TokenCounter, compose_prompt, fit_sections
from routers.mesa.graph import GraphMemory, proximity_bonus
from routers.mesa.library import MemoryLibrary, default_structures
from routers.mesa.raw import RawWindows, window_size, windows
from routers.mesa.summary import SummaryMemory, summary_quality
from routers.mesa.temporal import TemporalStore
from routers.mesa.vector import HashingEncoder, VectorStore

TEXTS = [
    "> start\nYou are in the kitchen. You see a fridge and a table.",
    "> open fridge\nYou open the fridge. Inside is a red carrot.",
    "> take carrot from fridge\nYou take the red carrot from the fridge.",
    "> go north\nYou enter the garden. A shovel lies on the grass.",
    "> take shovel\nYou take the shovel.",
    "> go south\nYou are back in the kitchen.",
    "> slice carrot with knife\nYou can't see any knife.",
    "> examine table\nThe table holds a cookbook and a silver knife.",
]


@pytest.fixture
def episode():
    steps = [Step(step_id=f"T{i}", index=i, text=t, speaker="agent") for i, t in enumerate(TEXTS)]
    qa = [QA("q0", "Where did the player take the carrot from?", "fridge", ["T2"]),
          QA("q1", "What was on the table?", "cookbook, knife", ["T7"])]
    return Episode("tw-tiny", steps, qa=qa, source="textworld")


def test_temporal_single_step_reference(episode):
    store = TemporalStore()
    acc = store.access(store.build(episode), episode, "What happened at step 3?")
    assert acc.steps == [3]
    assert "garden" in acc.text and "fridge" not in acc.text


def test_temporal_ranges_lists_until_and_prefixed_ids(episode):
    store = TemporalStore()
    state = store.build(episode)
    assert store.access(state, episode, "What did the player do in steps 2-4?").steps == [2, 3, 4]
    assert store.access(state, episode, "Compare steps 1, 3 and 6.").steps == [1, 3, 6]
    assert store.access(state, episode, "Where was the shovel until step 4?").steps == [0, 1, 2, 3, 4]
    assert store.access(state, episode, "Why did the action fail at step T6?").steps == [6]
    assert store.access(state, episode, "What happened between step 5 and step 7?").steps == [5, 6, 7]


def test_temporal_falls_back_to_lexical_top5(episode):
    store = TemporalStore()
    acc = store.access(store.build(episode), episode, "Where is the shovel?")
    assert len(acc.steps) == 5 and {3, 4} <= set(acc.steps)
    assert acc.steps == sorted(acc.steps) and acc.top_score > 0


def test_locomo_dia_ids_and_sessions():
    steps = [Step(f"D{s}:{t}", i, f"turn {t} of session {s}", speaker="A", session=str(s))
             for i, (s, t) in enumerate([(1, 1), (1, 2), (2, 1), (2, 2), (2, 3)])]
    ep = Episode("c", steps, source="locomo")
    refs = StepResolver(ep).parse("What was said in D2:3 and in session 1?")
    assert sorted(refs.exact) == [0, 1, 4]
    assert StepResolver(ep).parse("How did her study sessions go?").exact == []


@pytest.mark.parametrize("n,w,d", [(5, 3, 1), (40, 4, 1), (400, 16, 4)])
def test_raw_window_formula(n, w, d):
    assert window_size(n) == (w, d)
    spans = windows(n)
    assert all(b - a == w for a, b in spans)
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(spans[i + 1][0] - spans[i][0] <= w - d for i in range(len(spans) - 1))  # stride w - d (last may overlap more)
    covered = set().union(*(range(a, b) for a, b in spans))
    assert covered == set(range(n))


def test_raw_returns_positive_windows_else_best(episode):
    raw = RawWindows()
    state = raw.build(episode)
    assert state["spans"] == [[0, 3], [2, 5], [4, 7], [5, 8]]
    acc = raw.access(state, episode, "shovel garden")
    assert 3 in acc.steps and 4 in acc.steps and acc.top_score > 0
    none = raw.access(state, episode, "zebra")  # no positive window: the single best one
    assert len(none.steps) == 3


def test_graph_proximity_bonus_and_step_local_seeds(episode):
    assert proximity_bonus(5, [5]) == pytest.approx(1.25)
    assert proximity_bonus(7, [5]) == pytest.approx(1.25 / 3)
    assert proximity_bonus(2, [9, 3]) == pytest.approx(1.25 / 2)
    assert proximity_bonus(2, []) == 0.0
    graph = GraphMemory(k=2, neighbours=1)
    state = graph.build(episode)
    assert any(e["h"] == "player" and e["r"].startswith("take") and "carrot" in e["t"] for e in state["edges"])
    acc = graph.access(state, episode, "What happened at step 4?")
    focal = [line for line in acc.text.splitlines() if not line.startswith("    ")]
    assert focal[0].startswith("(T4)")  # the step-local seed with the full bonus ranks first
    assert len(focal) == 2 and acc.top_score >= 1.25


def test_graph_neighbours_share_an_entity(episode):
    graph = GraphMemory(k=1, neighbours=4)
    acc = graph.access(graph.build(episode), episode, "shovel")
    lines = acc.text.splitlines()
    assert "shovel" in lines[0]
    assert 1 <= len(lines) <= 5 and all(line.startswith("    ") for line in lines[1:])


def test_vector_cosine_top5(episode):
    vec = VectorStore(encoder=HashingEncoder(), k=5)
    acc = vec.access(vec.build(episode), episode, "take the shovel")
    assert len(acc.steps) == 5 and 4 in acc.steps
    assert acc.steps == sorted(acc.steps) and 0 < acc.top_score <= 1.0 + 1e-6


def test_summary_extractive_keeps_anchored_sentences(episode):
    summ = SummaryMemory(segment_steps=4, ratio=0.5, min_sentences=1)
    state = summ.build(episode)
    assert state["text"].count("Segment ") == 2
    assert state["steps"] and all(f"[T{i}]" in state["text"] for i in state["steps"])
    acc = summ.access(state, episode, "anything")
    assert acc.top_score is None and acc.steps == state["steps"]
    q = summary_quality(episode, state)
    assert q["evidence_steps"] == 2 and 0.0 <= q["share_surviving"] <= 1.0


class _Echo:
    name = "echo"

    def __init__(self):
        self.calls = 0

    def generate(self, conversations, max_new_tokens=64):
        self.calls += 1
        return ["[T2] player took the red carrot from the fridge" for _ in conversations]


def test_summary_llm_builder_goes_through_the_backend(episode):
    backend = _Echo()
    state = SummaryMemory(builder="llm", backend=backend, segment_steps=4).build(episode)
    assert backend.calls == 1 and state["text"].count("Segment ") == 2
    assert 2 in state["steps"]  # its key words survive in the summary


def test_composition_sections_and_token_count(smollm2_tokenizer):
    evidence = {"summary": "alpha beta", "temporal": "", "raw": "gamma delta epsilon"}
    prompt = compose_prompt("Task line.", "What?", evidence, ["raw", "summary", "temporal"])
    assert prompt.index("# State Memory (compressed)") < prompt.index("# Chunked Context (BM25 over trajectory)")
    assert "# Temporal Turns" not in prompt  # empty sections are omitted
    assert "# Knowledge Graph" not in prompt and prompt.rstrip().endswith("Answer:")
    words = TokenCounter("whitespace")
    assert words(evidence["summary"]) + words(evidence["raw"]) == 5
    tok = TokenCounter(smollm2_tokenizer)
    assert tok("gamma delta epsilon") == len(smollm2_tokenizer.encode("gamma delta epsilon", add_special_tokens=False))
    fitted = fit_sections({"summary": "a b c d\ne f g h", "raw": "i j\nk l"}, ["summary", "raw"], 6, words)
    assert sum(words(t) for t in fitted.values()) <= 6 and fitted["summary"] == "a b c d"


class _Broken:
    name = "graph"

    def fingerprint(self):
        return {}

    def build(self, episode):
        raise RuntimeError("extractor crashed")


def test_a_failed_structure_is_isolated_and_cached(episode, tmp_path, caplog):
    structures = default_structures(encoder=HashingEncoder())
    structures["graph"] = _Broken()
    lib = MemoryLibrary(structures, cache_dir=tmp_path)
    mem = lib.build(episode)
    assert not mem.ok("graph") and "extractor crashed" in mem.failures["graph"]
    assert all(mem.ok(n) for n in ("summary", "temporal", "vector", "raw"))
    assert "failed to build" in caplog.text
    acc = lib.access(mem, "What happened at step 3?")
    assert acc["graph"] is None and acc["temporal"].steps == [3]
    again = MemoryLibrary(structures, cache_dir=tmp_path)
    mem2 = again.build(episode)
    assert sum(again.build_calls.values()) == 0 and mem2.failures == mem.failures  # all from the cache
    assert mem2.states["vector"]["embeddings"].shape == mem.states["vector"]["embeddings"].shape
