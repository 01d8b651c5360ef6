"""The ``memroute`` logger: library code logs, it never prints, so users can silence or redirect it.

Library modules call ``get_logger(__name__)``; only CLI entry points call ``setup_cli_logging()``, which
attaches one stderr handler to the ``memroute`` logger and keeps rank 0 alone talking under distributed
runs (other ranks log warnings and errors only). Importing this module changes no global state.
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "memroute"


def get_logger(name: str | None = None) -> logging.Logger:
    """A child of the ``memroute`` logger (``memroute.train.sufficiency`` for ``train.sufficiency``)."""
    if not name or name == ROOT:
        return logging.getLogger(ROOT)
    return logging.getLogger(name if name.startswith(ROOT + ".") else f"{ROOT}.{name}")


def process_rank() -> int:
    """This process's rank under torchrun / accelerate launch (0 when not distributed)."""
    for key in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(key)
        if value and value.lstrip("-").isdigit():
            return int(value)
    return 0


class _RankZeroFilter(logging.Filter):
    """Let every record through on rank 0; on other ranks only warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        return process_rank() == 0 or record.levelno >= logging.WARNING


class _StderrHandler(logging.StreamHandler):
    """A stream handler that writes to ``sys.stderr`` as it is *now*, not as it was at setup: a later
    ``contextlib.redirect_stderr`` (or a test's stderr capture) sees memroute's messages too."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ / setStream assign it: always the current sys.stderr
        pass


def setup_cli_logging(level: int | str | None = None) -> logging.Logger:
    """Attach one stderr handler to the ``memroute`` logger (idempotent). ``MEMROUTE_LOG_LEVEL`` overrides."""
    logger = logging.getLogger(ROOT)
    level = level or os.environ.get("MEMROUTE_LOG_LEVEL") or logging.INFO
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    if not any(getattr(h, "_memroute_cli", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        handler.addFilter(_RankZeroFilter())
        handler._memroute_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = False
    return logger
