"""OpenIE-lite: subject-relation-object triples from step text without a model, and an optional LLM extractor.

The heuristic extractor works per sentence: the subject is the speaker for first-person sentences ("I",
"we"; the player for TextWorld's "you" and commands), else a leading capitalized span or the first content
chunk; the relation is the first verb-like word (a small lexicon, -ed/-ing forms) with its particles; the
object the next content chunk (<= 4 words). Prepositional phrases after the object add (object, prep, noun)
triples, and a sentence without a verb gives (subject, "mentions", chunk). The LLM extractor follows the
two-stage HippoRAG2 prompts of MESA appendix C.2 (entities, then triples) per packed passage of steps and
anchors each triple to the passage step sharing most of its words; a passage whose reply does not parse falls
back to the heuristic.
"""

from __future__ import annotations

import json
import re

from routers.memory.retrieval import STOPWORDS, tokenize
from routers.memory.schema import Episode, Step
from routers.mesa.summary import split_sentences

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")
_SELF = {"i", "we", "me", "my", "our", "us", "i'm", "i've", "i'd", "i'll", "we're", "we've"}
_YOU = {"you", "your", "you're", "you've"}
_PREPS = {"to", "at", "in", "on", "with", "for", "from", "into", "about", "of", "by", "after", "before", "during"}
_FILLER = STOPWORDS | {"just", "really", "so", "very", "also", "too", "still", "even", "much", "lot", "some", "all",
                       "there", "here", "now", "again", "always", "never", "ever", "been", "am", "im", "it's",
                       "that's", "thanks", "oh", "wow", "hey", "hi", "yeah", "sure", "totally", "definitely"}
_VERBS = set("""is am are was were be been has have had do did does go goes went gone get got gets take took taken
make made makes love loves loved like likes liked see saw seen open opens opened close closed find found found
give gave buy bought read wrote write play played plays start started join joined visit visited want wants
wanted need needs feel felt think thought know knew say said tell told try tried help helped keep kept cook
cooked cut slice sliced chop chopped dice diced eat ate drop dropped put insert inserted examine enter entered
leave left move moved adopt adopted paint painted run ran win won lose lost meet met attend attended plan
planned learn learned teach taught work worked live lived move moved travel traveled travelled sign signed
""".split())


def _verbish(w: str) -> bool:
    lw = w.lower()
    return lw in _VERBS or (len(lw) > 4 and lw.endswith(("ed", "ing")) and lw not in _FILLER)


def _chunk(words: list[str], start: int, limit: int = 4) -> tuple[str, int]:
    """The next content chunk at or after ``start``: (surface text, index after it), or ("", start)."""
    i = start
    while i < len(words) and words[i].lower() in _FILLER:
        i += 1
    j = i
    while j < len(words) and words[j].lower() not in _FILLER and words[j].lower() not in _PREPS and j - i < limit:
        j += 1
    return " ".join(words[i:j]), j


def _subject(words: list[str], speaker: str | None, agent: str, names: frozenset = frozenset()) -> tuple[str, int]:
    first = words[0].lower()
    if first in _SELF:
        return speaker or agent, 1
    if first in _YOU:
        return agent, 1
    multi = len(words) > 1 and words[1][:1].isupper() and words[1].lower() not in _FILLER
    if words[0][:1].isupper() and first not in _FILLER and (words[0] in names or multi):
        j = 1
        while j < len(words) and words[j][:1].isupper() and words[j].lower() not in _FILLER:
            j += 1
        return " ".join(words[:j]), j
    return _chunk(words, 0)


def sentence_triples(sentence: str, speaker: str | None, agent: str = "player",
                     names: frozenset = frozenset()) -> list[tuple[str, str, str]]:
    """Triples of one sentence; ``names``: words known to be proper names (a capitalized first word is a
    subject only when it is one, so "Check the cookbook" does not make "Check" an entity)."""
    words = _WORD.findall(sentence)
    if len(words) < 2:
        return []
    subj, i = _subject(words, speaker, agent, names)
    if not subj:
        return []
    v = next((k for k in range(i, len(words)) if _verbish(words[k])), None)
    if v is None:
        obj, _ = _chunk(words, i)
        return [(subj, "mentions", obj)] if obj and obj.lower() != subj.lower() else []
    rel = [words[v].lower()]
    k = v + 1
    while k < len(words) and words[k].lower() in _PREPS | {"the", "a", "an", "to", "up", "out", "my", "his", "her"}:
        if words[k].lower() in _PREPS:
            rel.append(words[k].lower())
        k += 1
    obj, k = _chunk(words, k)
    out = []
    if obj:
        out.append((subj, " ".join(rel), obj))
    while k < len(words):  # prepositional phrases after the object
        if words[k].lower() in _PREPS:
            noun, nk = _chunk(words, k + 1)
            if noun and obj:
                out.append((obj, words[k].lower(), noun))
            k = max(nk, k + 1)
        else:
            k += 1
    return out


def step_sentences(step: Step) -> list[str]:
    text = step.text
    if text.startswith(">"):  # TextWorld: the command line reads as the player's action
        cmd, _, obs = text.partition("\n")
        return [f"you {cmd.lstrip('> ').strip()}"] + split_sentences(obs)
    return split_sentences(text)


def heuristic_triples(episode: Episode) -> list[dict]:
    agent = "player" if episode.source == "textworld" else "agent"
    names = {s.speaker for s in episode.steps if s.speaker}
    for s in episode.steps:  # capitalized words seen after the first word of a sentence
        for sent in step_sentences(s):
            names.update(w for w in _WORD.findall(sent)[1:] if w[:1].isupper())
    names = frozenset(names)
    out, seen = [], set()
    for s in episode.steps:
        for sent in step_sentences(s):
            for h, r, t in sentence_triples(sent, s.speaker if s.speaker != "agent" else None, agent, names):
                key = (h.lower(), r, t.lower(), s.index)
                if key not in seen:
                    seen.add(key)
                    out.append({"h": h, "r": r, "t": t, "step": s.index, "step_id": s.step_id})
    return out


NER_PROMPT = ("Your task is to extract named entities from the given paragraph. Respond with a JSON list of "
              "entities.\nParagraph:\n{passage}")
TRIPLE_PROMPT = ("Your task is to construct an RDF graph from the given passage and named entity list. Respond "
                 "with a JSON list of triples [subject, relation, object]; each triple should contain at least one "
                 "of the named entities; resolve pronouns to names.\nParagraph:\n{passage}\n{entities}")


def _json_list(text: str):
    m = re.search(r"\[.*\]", text, re.S)
    if m is None:
        return None
    try:
        value = json.loads(m.group(0))
    except ValueError:
        return None
    return value if isinstance(value, list) else None


def llm_triples(episode: Episode, backend, passage_steps: int = 8, max_new_tokens: int = 256) -> tuple[list[dict], int]:
    """Triples from the two-stage LLM extraction; returns (triples, passages that fell back to the heuristic)."""
    steps = episode.steps
    packs = [steps[i:i + passage_steps] for i in range(0, len(steps), passage_steps)]
    texts = ["\n".join(f"Step {s.step_id}: {s.render()}" for s in p) for p in packs]
    ents = backend.generate([[{"role": "user", "content": NER_PROMPT.format(passage=t)}] for t in texts],
                            max_new_tokens=max_new_tokens)
    reps = backend.generate([[{"role": "user", "content": TRIPLE_PROMPT.format(passage=t, entities=json.dumps(
        {"named_entities": _json_list(e) or []}))}] for t, e in zip(texts, ents)], max_new_tokens=max_new_tokens)
    out, fallbacks = [], 0
    for pack, reply in zip(packs, reps):
        triples = [t for t in (_json_list(reply) or []) if isinstance(t, list) and len(t) == 3
                   and all(isinstance(x, str) and x.strip() for x in t)]
        if not triples:
            fallbacks += 1
            sub = Episode(episode.episode_id, pack, source=episode.source)
            out.extend(heuristic_triples(sub))
            continue
        for h, r, t in triples:
            words = set(tokenize(f"{h} {r} {t}"))
            best = max(pack, key=lambda s: (len(words & set(tokenize(s.text))), -s.index))
            out.append({"h": h.strip(), "r": r.strip().lower(), "t": t.strip(), "step": best.index,
                        "step_id": best.step_id})
    return out, fallbacks
