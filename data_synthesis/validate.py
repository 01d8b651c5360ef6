"""``memroute validate FILE [FILE ...]``: check a corpus of your own episodes before any job uses it.

Every bad record is reported (``FILE:LINE: field and reason``; ``FILE:row N`` for parquet / Hub rows), not only
the first, and the exit status is 2 when any record is bad. A good file gets one summary line: episodes, steps,
questions, questions with evidence (only those are used by the routers). The formats are those of
``--corpus episodes`` (:mod:`data_synthesis.episodes_corpus`).

    python -m data_synthesis.validate data/my_episodes.jsonl
"""

from __future__ import annotations

import argparse
import sys

from data_synthesis.episodes_corpus import scan
from routers.logs import get_logger, setup_cli_logging

logger = get_logger("data_synthesis.validate")  # also under python -m


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memroute validate", description="Check Episode corpora (JSONL, JSON list, parquet, Hub id): every "
        "bad record is reported with its file, line (or row) and field; exit status 2 when any is bad.")
    parser.add_argument("paths", nargs="+", metavar="FILE", help="corpus file(s), as given to --corpus_path")
    parser.add_argument("--max_shown", type=int, default=None,
                        help="report at most this many bad records per file (default: all)")
    return parser


def validate(path: str, max_shown: int | None = None) -> bool:
    """Log every bad record of ``path`` (or its summary when it has none); True when it is good."""
    result = scan(path)
    c = result.counts()
    if result.problems:
        shown = result.problems if max_shown is None else result.problems[:max_shown]
        for problem in shown:
            logger.error("%s", problem)
        hidden = len(result.problems) - len(shown)
        logger.error("%s: %d bad record(s)%s; %d good episode(s)", result.source, len(result.problems),
                     f" ({hidden} not shown)" if hidden else "", c["episodes"])
        return False
    logger.info("%s: OK: %d episodes, %d steps, %d questions, %d with evidence", result.source, c["episodes"],
                c["steps"], c["questions"], c["questions_with_evidence"])
    if not c["questions_with_evidence"]:
        logger.warning("%s: no question has evidence: the routers cannot be trained or evaluated on it", result.source)
    return True


def main(argv=None) -> int:
    """0 when every file is good, 2 when a record is bad. A missing or unreadable file raises (``memroute``
    prints it as one line and exits 2)."""
    setup_cli_logging()
    args = make_parser().parse_args(argv)
    ok = [validate(p, args.max_shown) for p in args.paths]
    return 0 if all(ok) else 2


if __name__ == "__main__":
    sys.exit(main())
