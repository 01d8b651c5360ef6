"""MemAgent's memory providers: 13 long-term providers in three families, the short-term provider, the
Begin probe over all of them, and End storage into a chosen subset.

    from routers.memagent.providers import build_providers, ProviderProbe, store_all
    providers = build_providers(llm=make_backend("smollm2"))      # all 13, MiniLM keys (loaded lazily)
    probe = ProviderProbe(providers)
    previews = probe.probe(task.goal)                               # Begin: no LLM, one pass over all keys
    memory = providers["expel"].retrieve(task.goal).text            # inject into the task prompt
    report = store_all(providers, trajectory, ["expel", "awm"])     # End: failures isolated per provider
"""

from __future__ import annotations

from routers.memagent.providers.base import BaseProvider
from routers.memagent.providers.encoder import TextEncoder, as_encoder, default_encoder
from routers.memagent.providers.state import ProviderError, ProviderState
from routers.memagent.providers.text_limits import count_words, limit_sentences, limit_words
from routers.memagent.providers.insight import AgentKB, EvolveR, ExpeL, InsightGraph, LightWeight, MobileE
from routers.memagent.providers.probe import (ProviderProbe, StoreReport, load_providers, probe_loop,
                                              save_providers, store_all)
from routers.memagent.providers.short_term import (STM_SECTIONS, LLMExtractor, RuleExtractor, ShortTermMemory,
                                                   STMSection)
from routers.memagent.providers.similarity import DILU, Cheatsheet, Generative, Voyager
from routers.memagent.providers.structural import AWM, Memp, SkillWeaver

PROVIDER_CLASSES: dict[str, type[BaseProvider]] = {
    cls.name: cls for cls in (Voyager, DILU, Generative, Cheatsheet, AWM, SkillWeaver, Memp,
                              ExpeL, AgentKB, InsightGraph, MobileE, EvolveR, LightWeight)
}
PROVIDER_NAMES: tuple[str, ...] = tuple(PROVIDER_CLASSES)


def build_providers(names=None, encoder=None, llm=None, overrides: dict[str, dict] | None = None,
                    **kw) -> dict[str, BaseProvider]:
    """Providers by name (default: all 13, in ``PROVIDER_NAMES`` order) sharing one encoder and one LLM.

    ``encoder``: None (MiniLM, loaded on first use and shared), an alias/path, or any object with
    ``encode(list[str])``. ``kw`` goes to every provider (``snippet_words``, ``max_prompt_words``, ...);
    ``overrides`` per provider (``{"expel": {"k": 5}}``)."""
    names = list(PROVIDER_NAMES if names is None else names)
    unknown = [n for n in names if n not in PROVIDER_CLASSES]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}; choose from {list(PROVIDER_NAMES)}")
    overrides = overrides or {}
    bad = [n for n in overrides if n not in names]
    if bad:
        raise ValueError(f"overrides for provider(s) not built: {bad}")
    enc = as_encoder(encoder)
    return {n: PROVIDER_CLASSES[n](encoder=enc, llm=llm, **{**kw, **overrides.get(n, {})}) for n in names}


__all__ = [
    "PROVIDER_NAMES", "PROVIDER_CLASSES", "build_providers", "BaseProvider", "ProviderError", "ProviderState",
    "TextEncoder", "as_encoder", "default_encoder", "count_words", "limit_words", "limit_sentences",
    "Voyager", "DILU", "Generative", "Cheatsheet", "AWM", "SkillWeaver", "Memp", "ExpeL", "AgentKB", "InsightGraph",
    "MobileE", "EvolveR", "LightWeight", "ProviderProbe", "probe_loop", "store_all", "StoreReport",
    "save_providers", "load_providers", "ShortTermMemory", "STMSection", "STM_SECTIONS", "RuleExtractor",
    "LLMExtractor",
]
