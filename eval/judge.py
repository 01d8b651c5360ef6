"""Binary LLM-as-a-judge for QA answers: the AMA-Bench correctness prompt (seed 002, appendix C.4).

The whole prompt is sent as one user message, no system message, as in the original. The verdict is the
first word of the reply: ``yes`` -> 1, ``no`` -> 0, anything else -> None (counted as wrong and reported
as unparsed by the caller).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

AMA_JUDGE_PROMPT = (
    "You are an expert evaluator. You will be given a question, a reference answer, and a predicted answer. "
    "Your task is to determine if the predicted answer is correct based on:\n"
    "1. Factual correctness compared to the reference\n"
    "2. Completeness of the answer\n"
    "3. Relevance to the question\n"
    "{context_str}\n"
    "Question: {question}\n"
    "Reference Answer: {golden_answer}\n"
    "Predicted Answer: {predicted_answer}\n"
    "Is the predicted answer correct? Respond with ONLY 'yes' or 'no'. Do not include any thinking process, "
    "explanation, or additional text.\n"
    "Answer:")
_WORD = re.compile(r"[a-z]+")


def judge_messages(question: str, gold: str, prediction: str, context: str | None = None) -> list[dict]:
    context_str = f"Context: {context}\n" if context else ""
    return [{"role": "user", "content": AMA_JUDGE_PROMPT.format(context_str=context_str, question=question,
                                                                  golden_answer=gold, predicted_answer=prediction)}]


def parse_verdict(reply: str) -> int | None:
    """1 for yes, 0 for no, None when the reply starts with neither."""
    m = _WORD.search(reply.lower())
    if m is None:
        return None
    return {"yes": 1, "no": 0}.get(m.group(0))


def judge_answers(generate: Callable[..., list[str]], items: Sequence[tuple[str, str, str]],
                  max_new_tokens: int = 4) -> tuple[list[int | None], list[str]]:
    """(verdicts, raw replies) for (question, gold, prediction) triples in one call.

    ``generate(conversations, max_new_tokens)``: a backend's ``generate`` (or a retrying wrapper).
    """
    if not items:
        return [], []
    replies = list(generate([judge_messages(q, g, p) for q, g, p in items], max_new_tokens))
    return [parse_verdict(r) for r in replies], replies
