"""JSONL records: errors name file and line, resumable writer, crash repair, atomic writes (DESIGN §9)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routers import io as jsonl_mod
from routers.io import (RecordError, ResumableJsonlWriter, atomic_write_json, atomic_write_text, read_jsonl,
                                  repair_truncated_tail)


def _write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


# -- read_jsonl --------------------------------------------------------------------------------------
def test_read_valid_and_blank_lines(tmp_path):
    p = _write(tmp_path / "ok.jsonl", '{"id": "a", "x": 1}\n\n   \n{"id": "b", "x": [1, 2]}\n\t\n')
    assert list(read_jsonl(p, required=("id",))) == [{"id": "a", "x": 1}, {"id": "b", "x": [1, 2]}]


def test_invalid_json_names_file_and_line(tmp_path):
    p = _write(tmp_path / "bad.jsonl", '{"id": "a"}\n\n{"id": "b"\n{"id": "c"}\n')
    with pytest.raises(RecordError) as info:
        list(read_jsonl(p))
    err = info.value
    assert err.line == 3  # blank lines still count towards the line number
    assert err.path == str(p)
    assert str(err).startswith(f"{p}:3: invalid JSON")


def test_non_object_names_line(tmp_path):
    p = _write(tmp_path / "arr.jsonl", '{"id": "a"}\n[1, 2]\n')
    with pytest.raises(RecordError, match=r"arr\.jsonl:2: expected a JSON object, got list"):
        list(read_jsonl(p))


def test_missing_field_names_line(tmp_path):
    p = _write(tmp_path / "miss.jsonl", '{"id": "a", "q": 1}\n{"id": "b"}\n')
    with pytest.raises(RecordError, match=r"miss\.jsonl:2: missing field\(s\) \['q'\]"):
        list(read_jsonl(p, required=("id", "q")))


def test_validate_errors_become_record_errors(tmp_path):
    p = _write(tmp_path / "v.jsonl", '{"schema_version": 1}\n{"schema_version": 2}\n')

    def validate(rec):
        if rec["schema_version"] != 1:
            raise ValueError(f"unsupported schema_version {rec['schema_version']}")

    with pytest.raises(RecordError, match=r"v\.jsonl:2: unsupported schema_version 2"):
        list(read_jsonl(p, validate=validate))


def test_reader_is_lazy_and_errors_at_bad_line(tmp_path):
    p = _write(tmp_path / "lazy.jsonl", '{"id": 1}\n{"id": 2}\nnot json\n')
    it = read_jsonl(p)
    assert next(it) == {"id": 1} and next(it) == {"id": 2}
    with pytest.raises(RecordError) as info:
        next(it)
    assert info.value.line == 3


def test_truncated_tail_is_an_error_for_readers(tmp_path):
    p = _write(tmp_path / "t.jsonl", '{"id": "a"}\n{"id": "b", "te')
    with pytest.raises(RecordError) as info:
        list(read_jsonl(p))
    assert info.value.line == 2


_line_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8)
_lines = st.one_of(_line_text, _json_values.map(json.dumps), _json_values.map(lambda v: json.dumps(v)[:-1]))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_lines, max_size=6))
def test_fuzz_lines_parse_or_record_error(tmp_path, lines):
    p = tmp_path / "fuzz.jsonl"
    p.write_text("\n".join(lines), encoding="utf-8")
    try:
        records = list(read_jsonl(p))
    except RecordError as err:
        assert err.path == str(p) and 1 <= err.line <= len(lines)
        assert str(err).startswith(f"{p}:{err.line}: ")
        return
    expected = [json.loads(line) for line in lines if line.strip()]
    assert records == expected
    assert all(isinstance(r, dict) for r in records)


@pytest.mark.parametrize("line", ["1" * 5000, "[" * 100_000])
def test_pathological_lines_raise_record_error(tmp_path, line):
    p = _write(tmp_path / "path.jsonl", '{"id": 1}\n' + line + "\n")
    with pytest.raises(RecordError) as info:
        list(read_jsonl(p))
    assert info.value.line == 2


# -- ResumableJsonlWriter ----------------------------------------------------------------------------
def _ids(path):
    return [r["id"] for r in read_jsonl(path, required=("id",))]


def test_writer_skips_ids_across_reopen(tmp_path):
    p = tmp_path / "sub" / "out.jsonl"  # parent created on demand
    with ResumableJsonlWriter(p) as w:
        assert w.write({"id": "a", "v": 1}) is True
        assert w.write({"id": "b", "v": 2}) is True
        with pytest.raises(ValueError, match="'a' written twice in one run"):
            w.write({"id": "a", "v": 99})  # a duplicate within one run is a duplicate input id, not a resume
        assert "a" in w and "c" not in w
    with ResumableJsonlWriter(p) as w:
        assert w.repaired_bytes == 0
        assert w.done == {"a", "b"}
        assert w.write({"id": "a", "v": 3}) is False
        assert w.write({"id": "c", "v": 4}) is True
    assert list(read_jsonl(p)) == [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "c", "v": 4}]


def test_writer_custom_key_and_unicode(tmp_path):
    p = tmp_path / "k.jsonl"
    with ResumableJsonlWriter(p, key="qa_id") as w:
        w.write({"qa_id": "conv-1/q0", "text": "héllo – ✓"})
    assert p.read_text(encoding="utf-8") == '{"qa_id": "conv-1/q0", "text": "héllo – ✓"}\n'
    with ResumableJsonlWriter(p, key="qa_id") as w:
        assert w.write({"qa_id": "conv-1/q0"}) is False


def test_writer_repairs_killed_tail(tmp_path):
    p = tmp_path / "killed.jsonl"
    with ResumableJsonlWriter(p) as w:
        w.write({"id": "a", "v": 1})
        w.write({"id": "b", "v": 2})
    complete = p.read_bytes()
    partial = '{"id": "c", "v": [1, 2, 3], "text": "cut he'
    with open(p, "a", encoding="utf-8") as fh:  # simulate a writer killed mid-record
        fh.write(partial)
    with ResumableJsonlWriter(p) as w:
        assert w.repaired_bytes == len(partial.encode())
        assert w.done == {"a", "b"}
        assert p.read_bytes() == complete  # exactly the complete records remain
        assert w.write({"id": "c", "v": 3}) is True
    assert _ids(p) == ["a", "b", "c"]
    assert p.read_bytes() == complete + b'{"id": "c", "v": 3}\n'


def test_writer_repairs_tail_without_any_newline(tmp_path):
    p = _write(tmp_path / "only_partial.jsonl", '{"id": "a", "v"')
    with ResumableJsonlWriter(p) as w:
        assert w.repaired_bytes == len('{"id": "a", "v"') and w.done == set()
        w.write({"id": "a"})
    assert _ids(p) == ["a"]


def test_repair_truncated_tail_noops(tmp_path):
    assert repair_truncated_tail(tmp_path / "absent.jsonl") == 0
    empty = _write(tmp_path / "empty.jsonl", "")
    assert repair_truncated_tail(empty) == 0
    ok = _write(tmp_path / "ok.jsonl", '{"id": 1}\n')
    assert repair_truncated_tail(ok) == 0 and ok.read_text() == '{"id": 1}\n'
    multibyte = _write(tmp_path / "mb.jsonl", '{"id": 1}\n{"t": "é✓')
    assert repair_truncated_tail(multibyte) == len('{"t": "é✓'.encode()) and multibyte.read_text() == '{"id": 1}\n'


def test_writer_keeps_complete_record_without_newline(tmp_path):
    p = _write(tmp_path / "no_nl.jsonl", '{"id": "a"}\n{"id": "b"}')
    with ResumableJsonlWriter(p) as w:
        assert w.done == {"a", "b"}
        w.write({"id": "c"})
    assert _ids(p) == ["a", "b", "c"]


def test_writer_refuses_file_with_bad_middle_line(tmp_path):
    p = _write(tmp_path / "corrupt.jsonl", '{"id": "a"}\ngarbage\n{"id": "b"}\n')
    with pytest.raises(RecordError, match=r"corrupt\.jsonl:2:"):
        ResumableJsonlWriter(p)
    p2 = _write(tmp_path / "nokey.jsonl", '{"id": "a"}\n{"other": 1}\n')
    with pytest.raises(RecordError, match=r"nokey\.jsonl:2: missing field"):
        ResumableJsonlWriter(p2)


# -- atomic writes -----------------------------------------------------------------------------------
def test_atomic_write_json_no_temp_files(tmp_path):
    target = tmp_path / "out" / "result.json"
    atomic_write_json(target, {"b": 1, "a": [1.5, "é"], "p": tmp_path})
    assert os.listdir(target.parent) == ["result.json"]
    text = target.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert json.loads(text) == {"b": 1, "a": [1.5, "é"], "p": str(tmp_path)}
    atomic_write_json(target, [1, 2])
    assert os.listdir(target.parent) == ["result.json"]
    assert json.loads(target.read_text()) == [1, 2]


def test_atomic_write_failure_keeps_old_content(tmp_path, monkeypatch):
    target = tmp_path / "keep.json"
    atomic_write_json(target, {"v": 1})

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(jsonl_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new content")
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["keep.json"]
