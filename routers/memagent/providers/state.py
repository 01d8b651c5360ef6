"""A provider's whole memory, :class:`ProviderState`: immutable, replaced as a whole (see ``BaseProvider``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from routers.memagent.protocol import MemoryItem
from routers.memagent.providers.keyword import KeywordIndex


class ProviderError(RuntimeError):
    """A provider cannot do what was asked (no LLM to write with, incompatible saved state, ...)."""



@dataclass(frozen=True, eq=False)
class ProviderState:
    """Everything a provider remembers; replaced as a whole, never modified."""

    items: tuple[MemoryItem, ...] = ()
    embeddings: np.ndarray | None = None     # (n, d) float32, read-only; None for keyword-only providers
    keyword: KeywordIndex | None = None      # over the item keys; None for dense-only providers
    next_id: int = 0
    stats: Mapping[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)


def frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.flags.writeable = False
    return a
