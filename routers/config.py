"""YAML recipe + CLI overrides for dataclass configs (TRL style), strict about unknown keys.

``python -m train.sufficiency configs/sufficiency/train/smollm2.yaml --max_steps 10`` or
``... --config configs/sufficiency/train/smollm2.yaml --max_steps 10``: the YAML gives defaults, flags
override them, and a key that no dataclass knows is an error (with the closest valid names).
"""

from __future__ import annotations

import argparse
import json
import dataclasses
import difflib
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from routers.io import atomic_write_json, atomic_write_text


class ConfigError(ValueError):
    pass


def _field_names(types: Sequence[type]) -> set[str]:
    return {f.name for t in types for f in dataclasses.fields(t) if f.init}


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: recipe not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a YAML recipe") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    except (UnicodeDecodeError, RecursionError) as err:
        raise ConfigError(f"{path}: unreadable YAML ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of option -> value")
    return data


def check_keys(keys, types: Sequence[type], source: str) -> None:
    valid = _field_names(types)
    unknown = [k for k in keys if k not in valid]
    if unknown:
        hints = {k: difflib.get_close_matches(k, valid, n=3) for k in unknown}
        raise ConfigError(f"{source}: unknown option(s) {unknown}; did you mean {hints}?")


def make_arg_parser(types: Sequence[type], prog: str | None = None, description: str | None = None):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(tuple(types), prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--config", default=None, help="YAML recipe; CLI flags override its values")
    return parser


def _pop_config_flag(argv: list[str], config_path: str | None) -> str | None:
    """Take ``--config FILE`` or ``--config=FILE`` out of ``argv`` (given once; a value is required)."""
    found = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if len(found) > 1 or (found and config_path):
        raise ConfigError("give the recipe once (a first .yaml argument or --config FILE), not several")
    if not found:
        return config_path
    i = found[0]
    if argv[i].startswith("--config="):
        value = argv[i].split("=", 1)[1]
        del argv[i]
    else:
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            raise ConfigError("--config needs a value: the path of a YAML recipe")
        value = argv[i + 1]
        del argv[i:i + 2]
    if not value:
        raise ConfigError("--config needs a value: the path of a YAML recipe")
    return value


def _optional_fields(types: Sequence[type]) -> set[str]:
    """Fields whose type admits None (``X | None``): ``--field null`` sets them to None, as ``field: null`` does."""
    import types as _types
    import typing

    out = set()
    for t in types:
        try:
            hints = typing.get_type_hints(t)
        except Exception:  # an unresolvable annotation: such a field simply takes no CLI null
            continue
        for f in dataclasses.fields(t):
            tp = hints.get(f.name)
            union = typing.get_origin(tp) in (typing.Union, _types.UnionType)
            if f.init and union and type(None) in typing.get_args(tp):
                out.add(f.name)
    return out


def _pop_null_flags(argv: list[str], types: Sequence[type]) -> dict[str, None]:
    """Remove ``--field null`` / ``--field=null`` of optional fields from ``argv``; return {field: None}.

    argparse would read ``null`` as the string (or refuse it for an int), so a recipe's value could not be
    cleared from the command line -- e.g. ``--eval_episodes null --eval_fraction 0.2``."""
    optional, nulls, i = _optional_fields(types), {}, 0
    while i < len(argv):
        tok = argv[i]
        name, eq, value = tok[2:].partition("=") if tok.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        if name in optional and ((eq and value == "null") or (not eq and i + 1 < len(argv) and argv[i + 1] == "null")):
            del argv[i:i + (1 if eq else 2)]
            nulls[name] = None
            continue
        i += 1
    return nulls


def parse_config(parser, types: Sequence[type], argv: Sequence[str] | None = None):
    """Parse ``[recipe.yaml] [--config recipe.yaml] [--flag value ...]`` into dataclass instances."""
    argv = list(sys.argv[1:] if argv is None else argv)
    config_path = None
    if argv and argv[0].endswith((".yaml", ".yml")) and not argv[0].startswith("-"):
        config_path = argv.pop(0)
    config_path = _pop_config_flag(argv, config_path)
    nulls = _pop_null_flags(argv, types)
    if config_path:
        values = load_yaml(config_path)
        check_keys(values, types, config_path)
        from routers.validation import check_fields

        for t in types:  # strings are converted (or refused) by argparse with the field's type
            check_fields(values, t, str(config_path), error=ConfigError, strings_convert=True)
        parser.set_defaults(**values)
    exit_on_error = getattr(parser, "exit_on_error", True)
    parser.exit_on_error = False  # a bad value raises ConfigError instead of printing usage and exiting
    try:
        namespace, remaining = parser.parse_known_args(argv)
    except argparse.ArgumentError as err:
        raise ConfigError(f"{config_path or 'command line'}: {err}") from None
    finally:
        parser.exit_on_error = exit_on_error
    if remaining:
        raise ConfigError(f"unknown command-line option(s): {remaining}")
    out = []
    args = vars(namespace)
    args.pop("config", None)
    args.update(nulls)
    for t in types:
        names = {f.name for f in dataclasses.fields(t) if f.init}
        try:
            out.append(t(**{k: v for k, v in args.items() if k in names}))
        except (ValueError, TypeError) as err:  # a dataclass's own checks (e.g. TrainingArguments.__post_init__)
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(f"{config_path or 'command line'}: invalid {t.__name__}: {err}") from None
    return out


def config_to_dict(*objs) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for o in objs:
        d = o.to_dict() if hasattr(o, "to_dict") else dataclasses.asdict(o)
        # TrainingArguments.to_dict() redacts secrets as "<HUB_TOKEN>"-style placeholders: drop them
        # so a saved config can be reused as a recipe.
        out.update({k: v for k, v in d.items() if not k.startswith("_")
                    and not (isinstance(v, str) and v.startswith("<") and v.endswith("TOKEN>"))})
    return out


def save_resolved_config(output_dir: str | os.PathLike, *objs, name: str = "resolved_config.yaml") -> Path:
    path = Path(output_dir) / name
    atomic_write_text(path, yaml.safe_dump(config_to_dict(*objs), sort_keys=True, default_flow_style=False))
    return path


# -- resuming: a run continues only with the settings it started with ---------------------------------------
RESUME_CHOICES = ("auto", "never")
FINGERPRINT_FILE = "run_fingerprint.json"


def check_resume_value(resume: str) -> str:
    """``resume`` is 'auto' (continue from output_dir's last checkpoint) or 'never' (start over); anything
    else (``true``, ``yes``...) is an error rather than a silent 'never'."""
    if resume not in RESUME_CHOICES:
        raise ConfigError(f"resume must be one of {list(RESUME_CHOICES)}, got {resume!r}")
    return resume


def fingerprint_diff(old: dict, new: dict) -> dict[str, tuple]:
    """{key: (old, new)} for every key whose value differs (keys missing on one side count)."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k, "<unset>"), new.get(k, "<unset>")) for k in keys if old.get(k, "<unset>") != new.get(k, "<unset>")}


def check_run_fingerprint(output_dir: str | os.PathLike, fingerprint: dict, resuming: bool,
                          what: str = "run", file: str = FINGERPRINT_FILE, added_later: dict | None = None) -> None:
    """Refuse to continue a run (training from a checkpoint, synthesis into existing files) with settings
    that differ from the ones it started with; otherwise (re)write the fingerprint.

    ``resuming`` says whether earlier work in ``output_dir`` will be reused. The error names every differing
    key, so the user either restores them or passes ``--resume never`` / a fresh ``output_dir``.
    ``added_later``: options introduced after runs were already written, with the behaviour those runs had; a
    stored fingerprint without such a key counts as that value (not as unset).
    """
    path = Path(output_dir) / file
    fingerprint = json.loads(json.dumps(fingerprint, default=str))  # the JSON view, as it is stored
    if resuming and path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path}: unreadable fingerprint ({err}); remove it or pass --resume never") from None
        if isinstance(old, dict):
            old = {**json.loads(json.dumps(added_later or {}, default=str)), **old}
        diff = fingerprint_diff(old, fingerprint) if isinstance(old, dict) else {"<file>": (old, fingerprint)}
        if diff:
            shown = "; ".join(f"{k}: {a!r:.60} -> {b!r:.60}" for k, (a, b) in diff.items())
            raise ConfigError(f"{output_dir}: this {what} was started with other settings ({shown}). Continuing "
                              "would mix them; restore them, pass --resume never to start over, or use another "
                              "output directory")
    atomic_write_json(path, fingerprint)


def prepare_output(output_dir: str | os.PathLike, fingerprint: dict, resume: str, resumable: list[str],
                   derived: list[str] = (), what: str = "synthesis", added_later: dict | None = None) -> bool:
    """Before a synthesis job writes into ``output_dir`` (with its lock held): with ``resume: never`` remove
    the earlier run's files (``resumable`` record files, ``derived`` summaries/directories and the
    fingerprint) so the run starts over; otherwise, when a non-empty ``resumable`` file exists, refuse
    settings whose ``fingerprint`` differs from the stored one (naming each key). Returns True when resuming."""
    import shutil

    check_resume_value(resume)
    out = Path(output_dir)
    if resume == "never":
        for name in [*resumable, *derived, FINGERPRINT_FILE]:
            path = out / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    resuming = any((out / n).is_file() and (out / n).stat().st_size > 0 for n in resumable)
    check_run_fingerprint(out, fingerprint, resuming, what=what, added_later=added_later)
    return resuming
