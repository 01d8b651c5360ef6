"""The exported-router contract (:class:`ExportedRouter`), the router registry, and the export conventions every
router follows (DESIGN §9)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from routers.errors import ExportTargetError, RouterConfigError  # noqa: F401 (re-exported)

ROUTER_CONFIG = "router_config.json"
CALIBRATION = "calibration.json"
MODEL_CARD = "README.md"
ROUTER_SCHEMA_VERSION = 1

# router_type -> "module:Class". load_router imports the module on first use, so a fresh process can load any
# export without importing the router class first (strings, as TRL's lazy _import_structure).
ROUTERS = {"sufficiency": "routers.sufficiency:SufficiencyRouter",
           "retriever": "routers.retriever:RetrieverRouter",
           "memagent": "routers.memagent.router:MemAgentRouter"}
# MESA query-adaptive structure selector (issue 19): a policy.json export, no weights.
ROUTERS["mesa_selector"] = "routers.mesa.selector:MesaSelector"




def _read_json_file(file: Path, what: str):
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RouterConfigError(f"{file}: missing ({what})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # JSONDecodeError, huge ints, deep nesting
        raise RouterConfigError(f"{file}: invalid JSON ({getattr(err, 'msg', None) or type(err).__name__})") from None
    except OSError as err:
        raise RouterConfigError(f"{file}: cannot be read ({err.strerror or err})") from None


def check_schema_version(raw: dict, file: str | os.PathLike) -> int:
    """The ``schema_version`` of an export's ``router_config.json``: present, an integer, and one this code reads
    (1..ROUTER_SCHEMA_VERSION); a newer one means the export was written by a newer memroute."""
    if "schema_version" not in raw:
        raise RouterConfigError(f"{file}: schema_version missing (not written by memroute?)")
    version = raw["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise RouterConfigError(f"{file}: schema_version must be an integer, got {version!r:.80}")
    if version > ROUTER_SCHEMA_VERSION:
        raise RouterConfigError(f"{file}: schema_version {version} was written by a newer memroute (this one reads "
                                f"up to {ROUTER_SCHEMA_VERSION}); upgrade memroute to load it")
    if version < 1:
        raise RouterConfigError(f"{file}: schema_version must be >= 1, got {version}")
    return version


def _read_object(file: Path, what: str) -> dict:
    raw = _read_json_file(file, what)
    if not isinstance(raw, dict):
        raise RouterConfigError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    return raw


def read_router_config(path: str | os.PathLike, router_type: str | None = None, config_cls=None) -> dict:
    """``router_config.json`` of an export, checked: a JSON object, the expected ``router_type``, a
    ``schema_version`` this code reads, and (with ``config_cls``) every field the dataclass needs, with the right
    JSON type and (``config_cls.check_values``) a valid value. Errors are RouterConfigError naming the file."""
    from routers.validation import check_fields

    path = Path(path)
    file = path / ROUTER_CONFIG
    raw = _read_object(file, "not a router export directory?")
    if router_type is not None and raw.get("router_type") != router_type:
        raise RouterConfigError(f"{file}: router_type is {raw.get('router_type')!r:.80}, expected {router_type!r}")
    check_schema_version(raw, file)
    if config_cls is not None:
        fields = dataclasses.fields(config_cls)
        missing = [f.name for f in fields if f.init and f.name not in raw
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise RouterConfigError(f"{file}: missing field(s) {missing}")
        values = {f.name: raw[f.name] for f in fields if f.name in raw}
        check_fields(values, config_cls, str(file), error=RouterConfigError)
        check = getattr(config_cls, "check_values", None)
        if check is not None:
            try:
                check(values)
            except ValueError as err:
                raise RouterConfigError(f"{file}: {err}") from None
    return raw


# Calibrated thresholds: key -> (lowest, highest, null allowed). A router reads the keys it declares in
# ``calibration_keys`` (the retriever's threshold is a cosine in [-1, 1] or null); by default these three.
PROBABILITY = (0.0, 1.0, False)
CALIBRATION_THRESHOLDS = ("threshold", "in_threshold", "end_threshold")


def read_calibration(path: str | os.PathLike, keys: dict[str, tuple] | None = None) -> dict:
    """``calibration.json`` of an export ({} when absent): a JSON object whose thresholds, when present, are
    finite numbers in range. ``keys`` maps each threshold to ``(low, high, null_allowed)``; the default checks
    ``threshold``, ``in_threshold`` and ``end_threshold`` as probabilities in [0, 1]."""
    from routers.validation import real_number

    file = Path(path) / CALIBRATION
    if not file.exists():
        return {}
    cal = _read_object(file, "calibration")
    keys = keys if keys is not None else dict.fromkeys(CALIBRATION_THRESHOLDS, PROBABILITY)
    for key, (low, high, nullable) in keys.items():
        if key in cal and not (nullable and cal[key] is None):
            try:
                real_number(cal[key], key, low, high)
            except ValueError as err:
                raise RouterConfigError(f"{file}: {err}") from None
    return cal


def router_class(router_type, source: str | os.PathLike | None = None) -> type:
    """The router class for ``router_type`` (see ROUTERS), importing its module on first use."""
    where = f"{source}: " if source is not None else ""
    if router_type is None:
        raise RouterConfigError(f"{where}router_type missing (not a router export?)")
    if not isinstance(router_type, str):
        raise RouterConfigError(f"{where}router_type must be a string, got {router_type!r:.80}")
    if router_type not in ROUTERS:
        raise RouterConfigError(f"{where}unknown router_type {router_type!r:.80}; known: {sorted(ROUTERS)}")
    module, name = ROUTERS[router_type].split(":")
    return getattr(importlib.import_module(module), name)


def load_router(path: str | os.PathLike, **kwargs):
    """Load any exported router by reading its ``router_config.json`` (the class's ``from_pretrained`` then
    checks the whole export)."""
    file = Path(path) / ROUTER_CONFIG
    raw = _read_object(file, "not a router export directory?")
    return router_class(raw.get("router_type"), file).from_pretrained(path, **kwargs)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("memroute", "torch", "transformers", "peft", "trl", "accelerate", "datasets",
                "sentence-transformers", "scikit-learn"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def git_revision() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None




def _json_field(file: Path, key: str):
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return raw.get(key) if isinstance(raw, dict) else None


def saved_kind(path: str | os.PathLike) -> str | None:
    """What memroute wrote into ``path``: a router's ``router_type``, ``"vector_index"``, ``"provider"``,
    ``"providers"`` (a provider-store directory), or None when it is not something memroute saved."""
    path = Path(path)
    if (path / ROUTER_CONFIG).is_file():
        return _json_field(path / ROUTER_CONFIG, "router_type")
    if (path / "index.json").is_file() and _json_field(path / "index.json", "format") == "memroute.vector_index":
        return "vector_index"
    if (path / "provider.json").is_file() and _json_field(path / "provider.json", "format") == "memroute.memagent.provider":
        return "provider"
    if (path / "providers.json").is_file():
        return "providers"
    return None


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_export_target(target: str | os.PathLike, kind: str, protect: tuple = ()) -> Path:
    """Refuse an export target that would destroy user data, before any work is done.

    Allowed: an absent path, an empty directory, or a previous save of the same ``kind``. Refused: a file,
    a directory with other content, the working directory or one of its parents, and any target equal to
    or containing a path in ``protect`` (a training output_dir, the checkpoint being exported)."""
    raw = Path(target)
    target = raw.resolve()
    for p in protect:
        if p is None:
            continue
        p = Path(p).resolve()
        if _inside(p, target):
            raise ExportTargetError(f"{raw}: refusing to export here: it is or contains {p}, which the export "
                                    "must not replace; choose another directory")
    if _inside(Path.cwd().resolve(), target):
        raise ExportTargetError(f"{raw}: refusing to replace the working directory or one of its parents")
    if not os.path.lexists(target):
        return target
    if not target.is_dir() or target.is_symlink():
        raise ExportTargetError(f"{raw}: exists and is not a directory; refusing to replace it")
    if not any(target.iterdir()):
        return target
    found = saved_kind(target)
    if found != kind:
        what = f"a saved {found!r}" if found else "files that memroute did not write"
        raise ExportTargetError(f"{raw}: holds {what}; refusing to replace it with a {kind!r} export "
                                "(remove it yourself or choose an empty / new directory)")
    return target


@contextmanager
def atomic_directory(target: str | os.PathLike, kind: str, protect: tuple = ()):
    """Yield a temporary sibling directory; on success it replaces ``target`` in one rename.

    A crash mid-export leaves the previous export (or nothing) in place, never a half-written one. Only an
    absent / empty directory or a previous save of the same ``kind`` is replaced (:func:`check_export_target`);
    the directory gets the permissions the user's umask gives (mkdtemp alone would make it owner-only).
    """
    target_path = Path(target)
    check_export_target(target_path, kind, protect)
    target_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target_path.name}.tmp-", dir=target_path.parent))
    try:
        yield tmp
        _apply_umask(tmp)
        check_export_target(target_path, kind, protect)  # still safe after the (possibly long) write
        old = None
        if target_path.exists():
            old = target_path.with_name(f".{target_path.name}.old-{os.getpid()}")
            os.replace(target_path, old)
        os.replace(tmp, target_path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _apply_umask(root: Path) -> None:
    """Give the export the modes a plain ``open()`` / ``mkdir`` would: mkdtemp and some libraries' own atomic
    writes (safetensors) create owner-only entries that a team folder or another account could not read."""
    mask = current_umask()
    os.chmod(root, 0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777 & ~mask)
        for f in filenames:
            path = os.path.join(dirpath, f)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


def current_umask() -> int:
    """The process umask (read by setting and restoring it; there is no read-only call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: Any) -> None:
    """Pretty JSON, atomically (readers see the old or the new file, never half of one)."""
    from routers.io import atomic_write_json

    atomic_write_json(path, obj)


def model_card_json_sections(training: dict | None = None, metrics: dict | None = None) -> list[str]:
    """The "Training" / "Evaluation" sections every router's model card carries, as Markdown lines."""
    lines: list[str] = []
    for title, payload in (("Training", training), ("Evaluation", metrics)):
        if payload:
            lines += ["", f"## {title}", "", "```json", json.dumps(payload, indent=2, default=str), "```"]
    return lines


class ExportedRouter:
    """A router that memroute exports as one directory and loads back: the contract all three routers share.

    * ``from_pretrained(path, device=None, dtype=None)`` loads an export (or ``routers.base.load_router(path)``,
      which picks the class from ``router_config.json``); ``save_pretrained(path, model_card=None,
      calibration=None) -> Path`` writes one; ``router_config()`` is the dict written as router_config.json.
    * ``score(...)`` returns floats (a torch.Tensor, or a numpy array for the retriever) for the router's own
      inputs: question + context (sufficiency), query + steps (retriever), a phase + its inputs (MemAgent).
    * ``decide(scores, threshold=None)`` turns scores into a list of decisions ("terminate" / "continue", the
      indices of the steps to keep); ``threshold=None`` uses the calibrated / configured one. MemAgent decides
      per phase (``phase=``): the Begin option, an In bool, the End providers.

    The export directory holds the weights (and tokenizer) written by :meth:`_save_weights`,
    ``router_config.json`` (``schema_version``, ``router_type`` and the ``config_cls`` fields),
    ``calibration.json`` (the ``calibration_keys`` thresholds, which override the config's when present) and
    the model card ``README.md``. It is written atomically (:func:`atomic_directory`) and every file is checked
    when read (a RouterConfigError names the file).

    A subclass sets ``router_type`` (its key in :data:`ROUTERS`), ``config_cls`` (a dataclass with
    ``check_values``) and ``calibration_keys``; its ``__init__`` takes the model arguments plus ``config=`` and
    ``calibration=``; it implements :meth:`_load_weights`, :meth:`_save_weights` and :meth:`model_card`, and
    optionally :meth:`_check_loaded` and :meth:`_description`.
    """

    router_type: ClassVar[str]
    config_cls: ClassVar[type]
    calibration_keys: ClassVar[dict[str, tuple]] = {}  # threshold -> (low, high, null allowed)

    config: Any
    calibration: dict

    # -- loading -------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | None = None, dtype=None):
        """Load an export: ``router_config.json`` (type, schema version, fields, values), ``calibration.json``
        (optional; its thresholds override the config's), the weights files' headers, then the weights.

        ``dtype``: None = float32; ``"auto"`` = the dtype the export was written in (``config.json``); or a torch
        dtype / its name (``"bfloat16"``, ``"bf16"``, ...)."""
        from routers.validation import check_safetensors_files

        path = Path(path)
        raw = read_router_config(path, cls.router_type, cls.config_cls)  # checks types and values
        names = [f.name for f in dataclasses.fields(cls.config_cls) if f.init]
        config = cls.config_cls(**{k: raw[k] for k in names if k in raw})
        calibration = read_calibration(path, cls.calibration_keys)  # thresholds checked: finite, in range
        for key in cls.calibration_keys:
            if key in calibration:
                setattr(config, key, None if calibration[key] is None else float(calibration[key]))
        check_safetensors_files(path)
        dtype = stored_dtype(path) if dtype == "auto" else torch_dtype(dtype)
        router = cls(**cls._load_weights(path, config, device=device, dtype=dtype), config=config,
                     calibration=calibration)
        router._check_loaded(path, raw)
        return router

    @classmethod
    def _load_weights(cls, path: Path, config, device: str | None = None, dtype=None) -> dict:
        """The constructor's model arguments (``{"model": ..., "tokenizer": ...}``) loaded from ``path`` onto
        ``device``; library errors become RouterConfigErrors naming the part (``routers.validation.load_errors``)."""
        raise NotImplementedError

    def _check_loaded(self, path: Path, raw: dict) -> None:
        """Checks that need the loaded weights (``raw`` is router_config.json as read); RouterConfigError."""

    # -- saving --------------------------------------------------------------------------------------------
    def router_config(self) -> dict:
        """router_config.json: schema version, router type, :meth:`_description`, the config fields, versions."""
        return {"schema_version": ROUTER_SCHEMA_VERSION, "router_type": self.router_type, **self._description(),
                **dataclasses.asdict(self.config), "library_versions": library_versions(),
                "git_revision": git_revision()}

    def _description(self) -> dict:
        """Informative router_config.json entries written before the config fields (``labels``: what the scores
        mean); not read back."""
        return {}

    def default_calibration(self) -> dict:
        """What calibration.json holds when none is given: the loaded calibration, else the config's thresholds."""
        return self.calibration or {key: getattr(self.config, key) for key in self.calibration_keys}

    def save_pretrained(self, path: str | os.PathLike, model_card: str | None = None,
                        calibration: dict | None = None) -> Path:
        """Write the weights, router_config.json, calibration.json and README.md atomically (a crash leaves the
        previous export or nothing; only an empty directory or a previous export of this type is replaced)."""
        calibration = calibration if calibration is not None else self.default_calibration()
        with atomic_directory(path, self.router_type) as tmp:
            self._save_weights(tmp)
            write_json(tmp / ROUTER_CONFIG, self.router_config())
            write_json(tmp / CALIBRATION, calibration)
            (tmp / MODEL_CARD).write_text(model_card or self.model_card())
        return Path(path)

    def _save_weights(self, directory: Path) -> None:
        """Write the weights (and tokenizer) into ``directory`` (the temporary export directory)."""
        raise NotImplementedError

    def model_card(self, metrics: dict | None = None, training: dict | None = None) -> str:
        """The README.md model card (``training`` / ``metrics`` become JSON sections)."""
        raise NotImplementedError


DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}


def torch_dtype(dtype):
    """A torch dtype from a torch dtype, None, or a name (``fp32`` / ``bf16`` / ``fp16`` / ``float32`` ...)."""
    if dtype is None or not isinstance(dtype, str):
        return dtype
    import torch

    name = DTYPES.get(dtype.lower().removeprefix("torch."))
    if name is None:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {dtype!r:.40}")
    return getattr(torch, name)


def cast_weights(model, dtype):
    """``model`` with its parameters and persistent floating buffers in ``dtype``, as ``from_pretrained(dtype=...)``
    builds it: non-persistent buffers (rotary ``inv_freq``) keep their precision, which ``model.to(dtype)`` would
    drop, so an export scores exactly like the same export loaded back in its dtype."""
    dtype = torch_dtype(dtype)
    if dtype is None:
        return model
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and buf.is_floating_point() and name not in module._non_persistent_buffers_set:
                setattr(module, name, buf.to(dtype))
    return model


def stored_dtype(path: str | os.PathLike):
    """The dtype an export's weights were written in (``config.json`` ``dtype`` / ``torch_dtype``; for a
    sentence-transformers folder or an adapter, the same file of the model inside), float32 when not recorded."""
    path = Path(path)
    for file in (path / "config.json", path / "0_Transformer" / "config.json"):
        value = _json_field(file, "dtype") or _json_field(file, "torch_dtype") if file.is_file() else None
        if isinstance(value, str) and value.lower().removeprefix("torch.") in DTYPES:
            return torch_dtype(value)
    return torch_dtype("float32")


def check_router_dir(router: str | os.PathLike, router_type: str, option: str = "--router") -> dict:
    """A router export given on the command line: its checked ``router_config.json``. A missing path or a plain
    file is one clear error naming the option, before any model loads."""
    path = Path(router)
    if not path.exists():
        raise FileNotFoundError(f"{option} {router}: no such directory (give a `memroute export {router_type}` "
                                "directory, or leave the option out)")
    if not path.is_dir():
        raise RouterConfigError(f"{option} {router}: not a directory (give a router export directory)")
    return read_router_config(path, router_type)
