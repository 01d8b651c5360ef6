"""Check JSON/YAML values against dataclass field types, so bad input fails with a message naming the
file and the option instead of a TypeError from deep inside a constructor.

Only what JSON and YAML can hold is checked: ``bool``, ``int``, ``float`` (ints accepted), ``str``,
``list[...]``, ``dict[...]``, ``X | None``, unions, ``Literal`` and enums (by value). Anything else
(``Any``, classes) passes.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing
from typing import Any, Union


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


def field_types(cls) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields (string annotations evaluated)."""
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
