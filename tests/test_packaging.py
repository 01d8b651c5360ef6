"""Packaging tells the truth: every imported third-party package is declared, optional ones are extras with real
floors, ``routers`` ships ``py.typed``, and nothing outside the TextWorld modules imports textworld at import time."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("routers", "data_synthesis", "train", "eval")
# import name -> distribution name (where they differ)
DIST = {"yaml": "pyyaml", "sklearn": "scikit-learn", "sentence_transformers": "sentence-transformers",
        "rank_bm25": "rank-bm25", "huggingface_hub": "huggingface-hub", "faiss": "faiss-cpu"}
OPTIONAL_UNDECLARED = {"jieba", "flash_attn"}   # probed with find_spec / try-import, never required
EXTRAS = {"textworld": "agent", "faiss": "faiss"}
FLOORS = {"transformers": "5.17", "sentence-transformers": "5.7", "trl": "0.26", "huggingface-hub": "1.5"}


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def names(reqs) -> dict[str, Requirement]:
    return {Requirement(r).name.lower(): Requirement(r) for r in reqs}


def third_party_imports() -> set[str]:
    out = set()
    stdlib = set(sys.stdlib_module_names)
    for pkg in PACKAGES:
        for file in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    mods = [node.module]
                else:
                    continue
                out |= {m.split(".")[0] for m in mods}
    return {m for m in out if m not in stdlib and m not in PACKAGES and m != "__future__"}


def test_every_imported_package_is_declared():
    deps = names(project()["dependencies"])
    extras = {k: names(v) for k, v in project()["optional-dependencies"].items()}
    missing = []
    for mod in sorted(third_party_imports() - OPTIONAL_UNDECLARED):
        dist = DIST.get(mod, mod).lower()
        if mod in EXTRAS:
            if dist not in extras[EXTRAS[mod]]:
                missing.append(f"{mod} (extra {EXTRAS[mod]})")
        elif dist not in deps:
            missing.append(mod)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_optional_packages_are_extras_not_requirements():
    deps = names(project()["dependencies"])
    extras = project()["optional-dependencies"]
    for dist in ("textworld", "faiss-cpu", "openai", "tensorboard"):
        assert dist not in deps, dist
    assert set(extras) >= {"test", "agent", "faiss", "openai", "tensorboard", "all"}
    assert "textworld" in names(extras["agent"]) and "tensorboard" in names(extras["tensorboard"])
    assert Requirement(extras["all"][0]).extras >= {"agent", "faiss", "tensorboard"}


def test_floors_are_at_least_the_apis_the_code_uses():
    deps = names(project()["dependencies"])
    for dist, floor in FLOORS.items():
        lows = [Version(s.version) for s in deps[dist].specifier if s.operator == ">="]
        assert lows and max(lows) >= Version(floor), (dist, str(deps[dist].specifier), floor)


def test_py_typed_ships():
    assert (REPO / "routers" / "py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["routers"]


def test_ci_installs_the_agent_extra():
    assert ".[test,agent]" in (REPO / ".ci" / "run").read_text()


def test_no_module_imports_textworld_at_import_time():
    """Import every module with textworld blocked (as if the agent extra were not installed)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['textworld'] = None\n"
        "bad = []\n"
        "for pkg in ('routers', 'data_synthesis', 'train', 'eval'):\n"
        "    p = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(p.__path__, prefix=pkg + '.'):\n"
        "        if info.name.endswith('__main__'):\n"
        "            continue\n"
        "        try:\n"
        "            importlib.import_module(info.name)\n"
        "        except ImportError as err:\n"
        "            if 'textworld' in info.name.split('.')[-1]:\n"
        "                continue  # the TextWorld modules themselves may need it\n"
        "            bad.append(f'{info.name}: {err}')\n"
        "print('\\n'.join(bad) or 'ok')\n")
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok", proc.stdout
