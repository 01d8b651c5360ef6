"""A provider's saved directory: ``provider.json`` (format, parameters, id counter, stats) + ``items.jsonl``
(+ ``embeddings.npy`` for dense providers), written atomically (``routers.base.atomic_directory``) and read
back validated, so ``BaseProvider.load`` replaces its memory only with a complete, consistent state."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from routers.memagent.protocol import MemoryItem
from routers.memagent.providers.state import ProviderError, ProviderState

PROVIDER_FORMAT = "memroute.memagent.provider"
PROVIDER_SCHEMA_VERSION = 1
_ITEMS_FILE, _EMB_FILE, _META_FILE = "items.jsonl", "embeddings.npy", "provider.json"


def save_state(path, state: ProviderState, provider: str, class_name: str, params: dict) -> None:
    """Write ``provider.json`` + ``items.jsonl`` (+ ``embeddings.npy``) into ``path`` atomically."""
    from routers.base import atomic_directory

    st = state
    with atomic_directory(path, "provider") as tmp:
        with open(tmp / _ITEMS_FILE, "w", encoding="utf-8") as fh:
            for it in st.items:
                fh.write(json.dumps(dataclasses.asdict(it), ensure_ascii=False, default=str) + "\n")
        if st.embeddings is not None:
            np.save(tmp / _EMB_FILE, np.asarray(st.embeddings))
        meta = {"format": PROVIDER_FORMAT, "schema_version": PROVIDER_SCHEMA_VERSION, "provider": provider,
                "class": class_name, "params": params, "n_items": len(st.items),
                "next_id": st.next_id, "stats": dict(st.stats),
                "embedding_dim": None if st.embeddings is None else int(st.embeddings.shape[1])}
        (tmp / _META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def read_state(path, provider: str, dense: bool,
               encoder_dim: int | None = None) -> tuple[list[MemoryItem], np.ndarray | None, dict]:
    """The items, the key embeddings (``dense`` providers; else None) and ``provider.json`` of a saved
    ``provider``; anything missing, malformed or of another provider raises ``ProviderError`` /
    ``RecordError`` naming the file. ``encoder_dim``: the dimension the embeddings must have, when known."""
    from routers.io import read_jsonl

    path = Path(path)
    meta_file = path / _META_FILE
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProviderError(f"{meta_file}: missing (not a saved {provider} provider)") from None
    except ValueError as err:
        raise ProviderError(f"{meta_file}: invalid JSON ({err})") from None
    if meta.get("format") != PROVIDER_FORMAT or meta.get("schema_version") != PROVIDER_SCHEMA_VERSION:
        raise ProviderError(f"{meta_file}: not a {PROVIDER_FORMAT} v{PROVIDER_SCHEMA_VERSION} directory")
    if meta.get("provider") != provider:
        raise ProviderError(f"{meta_file}: saved provider is {meta.get('provider')!r}, not {provider!r}")
    fields = [f.name for f in dataclasses.fields(MemoryItem)]

    def check(rec):
        if rec["provider"] != provider:
            raise ValueError(f"item of provider {rec['provider']!r} in a {provider} store")

    items = [MemoryItem(**{k: rec[k] for k in fields})
             for rec in read_jsonl(path / _ITEMS_FILE, required=fields, validate=check)]
    emb = None
    if dense:
        emb_file = path / _EMB_FILE
        if not emb_file.exists():
            raise ProviderError(f"{emb_file}: missing")
        emb = np.load(emb_file, allow_pickle=False)
        if emb.ndim != 2 or emb.shape[0] != len(items) or not np.isfinite(emb).all():
            raise ProviderError(f"{emb_file}: expected ({len(items)}, dim) finite embeddings, got {emb.shape}")
        if len(items) and encoder_dim not in (None, emb.shape[1]):
            raise ProviderError(f"{emb_file}: dim {emb.shape[1]} != encoder dim {encoder_dim}")
    return items, emb, meta
