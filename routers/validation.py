"""Check JSON/YAML values against dataclass field types, so bad input fails with a message naming the
file and the option instead of a TypeError from deep inside a constructor.

Only what JSON and YAML can hold is checked: ``bool``, ``int``, ``float`` (ints accepted), ``str``,
``list[...]``, ``dict[...]``, ``X | None``, unions, ``Literal`` and enums (by value). Anything else
(``Any``, classes) passes.
"""

from __future__ import annotations

import dataclasses
import functools
import enum
import sys
import types
import typing
from typing import Any, Union

from routers.errors import RouterConfigError


def _describe(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def type_error(value: Any, tp) -> str | None:
    """None when ``value`` fits the annotation ``tp``, else a short reason."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is typing.Any:
        return None
    if origin in (Union, getattr(types, "UnionType", Union)):
        reasons = [type_error(value, arg) for arg in typing.get_args(tp)]
        return None if any(r is None for r in reasons) else f"expected {_describe(tp)}, got {value!r:.80}"
    if tp is type(None):
        return None if value is None else f"expected null, got {value!r:.80}"
    if origin is typing.Literal:
        return None if value in typing.get_args(tp) else f"expected one of {list(typing.get_args(tp))}, got {value!r:.80}"
    if origin in (list, tuple, set, typing.Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return f"expected a list, got {value!r:.80}"
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any  # list[X], set[X], tuple[X, ...]
        for i, item in enumerate(value):
            reason = type_error(item, item_tp)
            if reason:
                return f"item {i}: {reason}"
        return None
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            return f"expected a mapping, got {value!r:.80}"
        args = typing.get_args(tp)
        if len(args) == 2:
            for k, v in value.items():
                reason = type_error(k, args[0]) or type_error(v, args[1])
                if reason:
                    return f"key {k!r:.40}: {reason}"
        return None
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            vals = [m.value for m in tp]
            return None if isinstance(value, tp) or value in vals else f"expected one of {vals}, got {value!r:.80}"
        if tp is bool:
            return None if isinstance(value, bool) else f"expected true/false, got {value!r:.80}"
        if tp is int:
            return None if isinstance(value, int) and not isinstance(value, bool) else f"expected an integer, got {value!r:.80}"
        if tp is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return None if ok else f"expected a number, got {value!r:.80}"
        if tp is str:
            return None if isinstance(value, str) else f"expected a string, got {value!r:.80}"
        if tp in (list, dict):
            return None if isinstance(value, tp) else f"expected a {tp.__name__}, got {value!r:.80}"
    return None


def _list_only(tp) -> bool:
    """True when every non-null alternative of ``tp`` is a list type (a bare string cannot convert)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
        Union, getattr(types, "UnionType", Union)) else [tp]
    return bool(args) and all(a in (list, tuple) or typing.get_origin(a) in (list, tuple, set) for a in args)


@functools.lru_cache(maxsize=None)
def field_types(cls) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields (string annotations evaluated). Cached per class:
    record loaders check every step of a corpus against the same few classes (resolving hints each time
    was most of the load time of a 150k-step corpus)."""
    module = sys.modules.get(cls.__module__)
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            try:
                hints.update(typing.get_type_hints(klass, vars(sys.modules.get(klass.__module__, module))))
            except Exception:  # noqa: BLE001 - an annotation we cannot resolve is not checked
                pass
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def check_fields(values: dict, cls, source: str, error=ValueError, strings_convert: bool = False,
                 what: str = "option") -> None:
    """Raise ``error`` naming ``source`` and the field when a value does not fit its dataclass field.

    ``strings_convert``: a string given for a field that is not a string is left to the caller's
    conversion (argparse converts string defaults with the field's type, e.g. YAML's ``3e-4``).
    """
    types_ = field_types(cls)
    for key, value in values.items():
        if key in types_:
            if strings_convert and isinstance(value, str) and not _list_only(types_[key]):
                continue
            reason = type_error(value, types_[key])
            if reason:
                raise error(f"{source}: {what} {key!r}: {reason}")


# -- router inputs: runtime arguments and the values an export may hold -----------------------------------------
class RouterInputError(TypeError, ValueError):
    """A bad argument to a router's scoring / decision method (wrong type, length or range).

    Both a TypeError and a ValueError: callers catching either see it, and the CLI prints it as one line."""


def _real_scalar(value) -> float | None:
    """``value`` as a float when it is one real number (python / numpy scalar, 0-d tensor or array), else None.
    Booleans, strings, complex numbers and anything with more than one element are not real numbers here."""
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "tolist"):  # 0-d torch tensor / numpy array
        item = value.tolist()
        if isinstance(item, numbers.Real) and not isinstance(item, bool):
            return float(item)
    return None


def real_number(value, name: str, lo: float | None = None, hi: float | None = None,
                error=RouterInputError) -> float:
    """A finite real number (in [lo, hi] when given) as a float; else ``error`` naming ``name``."""
    import math

    v = _real_scalar(value)
    if v is None:
        raise error(f"{name} must be a number, got {type(value).__name__} {value!r:.80}")
    if not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        where = f" in [{lo:g}, {hi:g}]" if lo is not None and hi is not None else (
            f" >= {lo:g}" if lo is not None else (f" <= {hi:g}" if hi is not None else ""))
        raise error(f"{name} must be a finite number{where}, got {v!r}")
    return v


def probability(value, name: str = "threshold", error=RouterInputError) -> float:
    """A threshold on a probability: a finite real number in [0, 1]."""
    return real_number(value, name, 0.0, 1.0, error=error)


def positive_int(value, name: str, error=RouterInputError) -> int:
    """A positive integer (python or numpy; bool is not one)."""
    import numbers

    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be a positive integer, got {type(value).__name__} {value!r:.80}")
    if int(value) <= 0:
        raise error(f"{name} must be a positive integer, got {int(value)}")
    return int(value)


def sequence_items(value, name: str, what: str) -> list:
    """The items of a list-like argument (not a string, bytes, mapping, set or scalar), else an error."""
    from collections.abc import Iterable, Mapping, Set

    if value is None or isinstance(value, (str, bytes, bytearray, Mapping, Set)) or not isinstance(value, Iterable):
        raise RouterInputError(f"{name} must be {what}, got {type(value).__name__} {value!r:.80}")
    if getattr(value, "ndim", 1) != 1:  # numpy arrays / tensors: one axis only
        raise RouterInputError(f"{name} must be {what}, got an array of shape {tuple(value.shape)}")
    return list(value)


def text_list(value, name: str) -> list[str]:
    """A sequence of strings as a list; anything else (None, numbers, bytes, dicts, a bare string) is an
    error naming the argument and the offending index."""
    items = sequence_items(value, name, "a list of strings")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise RouterInputError(f"{name}[{i}] must be a string, got {type(item).__name__} {item!r:.80}")
    return items


def score_list(scores, name: str = "scores", lo: float | None = None, hi: float | None = None) -> list[float]:
    """One score (python / numpy scalar, 0-d tensor) or a 1-D sequence / tensor / array of scores, as a list of
    floats. NaN is allowed (it means "no score", e.g. over the input budget); with ``lo``/``hi`` every other
    value must lie in that range. bool, str, None and arrays with more than one axis are errors."""
    import math

    one = _real_scalar(scores)
    items = [one] if one is not None else None
    if items is None:
        if getattr(scores, "ndim", None) == 0:
            raise RouterInputError(f"{name} must hold real numbers, got {scores!r:.80}")
        what = "one score or a 1-D sequence of scores"
        raw = sequence_items(scores, name, what)
        if hasattr(scores, "tolist"):
            raw = scores.tolist()
        items = []
        for i, s in enumerate(raw):
            v = _real_scalar(s)
            if v is None:
                raise RouterInputError(f"{name}[{i}] must be a real number, got {type(s).__name__} {s!r:.80}")
            items.append(v)
    for i, v in enumerate(items):
        if math.isnan(v):
            continue
        if math.isinf(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f" in [{lo:g}, {hi:g}] (or NaN)" if lo is not None and hi is not None else " (or NaN)"
            raise RouterInputError(f"{name}[{i}] must be a finite number{rng}, got {v!r}")
    return items


def template_placeholders(template: str) -> list[str]:
    """The ``{name}`` fields of a ``str.format`` template, in order (``{{`` / ``}}`` are literal braces).
    ValueError for a template ``str.format`` cannot parse (a lone ``{`` or ``}``)."""
    import string

    return [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]


def check_template(template: str, allowed: tuple[str, ...], name: str) -> str | None:
    """None when every placeholder of ``template`` is one of ``allowed`` (bare, no attribute / index access),
    else a short reason naming the first offending placeholder."""
    try:
        fields = template_placeholders(template)
    except ValueError as err:
        return f"{name} is not a valid template ({err}); write literal braces as {{{{ and }}}}"
    allowed_text = ", ".join("{" + a + "}" for a in allowed)
    for field in fields:
        if field not in allowed:
            return f"{name} has unknown placeholder {{{field}}} (allowed: {allowed_text})"
    return None


def check_safetensors_files(path) -> None:
    """Open the header of every ``*.safetensors`` file under an export directory (cheap: no tensor is read).
    A truncated, empty or corrupt file is a RouterConfigError naming that file, instead of safetensors'
    "incomplete metadata, file not fully covered" with no file name when the model loads."""
    from pathlib import Path

    from safetensors import safe_open


    for file in sorted(Path(path).rglob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy"):
                pass
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError, ...: all mean "unreadable weights"
            raise RouterConfigError(f"{file}: unreadable weights file, truncated or corrupt "
                                    f"({type(err).__name__}: {err})") from None


class load_errors:  # noqa: N801 - used as a context manager: ``with load_errors(path, "weights"): ...``
    """Turn an error raised while a library loads part of an export (weights, tokenizer, HF config) into a
    RouterConfigError naming the directory and the part, so the CLI prints one line that says where."""

    def __init__(self, path, what: str):
        self.path, self.what = path, what

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
    
        if err is None or isinstance(err, RouterConfigError) or not isinstance(err, Exception):
            return False
        if isinstance(err, (ImportError, MemoryError)):  # not a property of the export
            return False
        msg = " ".join(str(err).split())
        raise RouterConfigError(f"{self.path}: cannot load the {self.what} ({type(err).__name__}: {msg:.300})") from err


# -- config options (checked in a config dataclass's __post_init__; parse_config names the recipe) --------
def check_positive(cfg, *names: str) -> None:
    """Each named option is None (when allowed by its default) or an integer >= 1."""
    for name in names:
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def check_non_negative(cfg, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if v is not None and v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def check_unit_interval(cfg, *names: str) -> None:
    for name in names:
        v = getattr(cfg, name)
        if not 0.0 <= v <= 1.0:  # also false for NaN
            raise ValueError(f"{name} must be in [0, 1], got {v}")


# -- config options, collected: every bad option of a config reported in one error ----------------------------
def option_problems(checks) -> list[str]:
    """The messages of the ``(ok, message)`` pairs that failed."""
    return [msg for ok, msg in checks if not ok]


def raise_option_problems(problems: list[str]) -> None:
    """One ValueError listing every bad option (``parse_config`` prefixes the recipe / command line)."""
    if problems:
        raise ValueError("; ".join(problems))


def _finite(x) -> bool:
    import math

    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def int_option(value, name: str, allow_none: bool = False, minimum: int = 1) -> tuple[bool, str]:
    """``(ok, message)`` for an integer option >= ``minimum`` (collected by :func:`option_problems`)."""
    if value is None and allow_none:
        return True, ""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    return ok, f"{name} must be an integer >= {minimum}{' or null' if allow_none else ''}, got {value!r}"


def number_option(value, name: str, low: float | None = None, high: float | None = None, allow_none: bool = False,
              low_open: bool = False, high_open: bool = False) -> tuple[bool, str]:
    """``(ok, message)`` for a finite number in [low, high] (open ends with ``low_open`` / ``high_open``)."""
    if value is None and allow_none:
        return True, ""
    ok = _finite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
    rng = " and ".join(p for p in (lo, hi) if p) or "finite"
    return ok, f"{name} must be a number {rng}{' or null' if allow_none else ''}, got {value!r}"
