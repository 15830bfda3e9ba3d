"""The core's import contract (issue 29): no import circle inside ``conduit/`` (every import counts:
module level, inside functions and under ``TYPE_CHECKING``), no import of an integration or of Ray's
private modules from the core, and every package of the distribution listed in ``pyproject.toml``."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("conduit_rllib", "conduit_verl", "conduit_verl_cpu", "ray._private", "benchmarks")


def module_names(package: Path) -> dict[str, Path]:
    """``dotted name -> file`` for every module under ``package`` (a package is named by its ``__init__``)."""
    out = {}
    for path in package.rglob("*.py"):
        parts = path.with_suffix("").relative_to(package.parent).parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``name`` imports, resolved against ``known`` where it is one of them (else kept as written)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known}
            found.update(subs if len(subs) == len(node.names) else {mod, *subs})
    return found - {name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def import_graph(package: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(internal edges, all imports)`` per module of ``package``."""
    mods = module_names(package)
    every = {m: imports_of(m, p, set(mods)) for m, p in mods.items()}
    return {m: {t for t in every[m] if t in mods} for m in mods}, every


def test_the_core_has_no_import_circle() -> None:
    internal, _ = import_graph(ROOT / "conduit")
    assert len(internal) > 30, "the walk found too few modules to mean anything"
    assert cycles(internal) == []


def test_the_core_imports_no_integration_and_no_private_ray() -> None:
    _, every = import_graph(ROOT / "conduit")
    bad = {m: sorted(t for t in ts if t.startswith(FORBIDDEN)) for m, ts in every.items()}
    assert {m: ts for m, ts in bad.items() if ts} == {}


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"a.py": "from pkg import b\n", "b.py": "def f():\n    from pkg.a import x\n"},
            [["pkg.a", "pkg.b"]],
        ),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
                "b.py": "import pkg.a\n",
            },
            [["pkg.a", "pkg.b"]],
        ),
        ({"a.py": "from . import b\n", "b.py": "import os\n"}, []),
        ({"__init__.py": "from pkg.a import x\n", "a.py": "from pkg import helpers\n", "helpers.py": ""}, []),
    ],
)
def test_the_checker_finds_circles_through_functions_and_type_checking(tmp_path, files, expected) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).write_text(text)
    internal, _ = import_graph(pkg)
    assert cycles(internal) == expected


def test_every_package_is_in_the_distribution() -> None:
    """A package missing from ``[tool.setuptools] packages`` is absent from a non-editable install."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(setup["packages"]), setup["package-dir"]
    found = set()
    for top, where in dirs.items():
        for init in (ROOT / where).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / where).parts
            found.add(".".join((top, *rel)))
    assert found - listed == set()
