"""The layering the code relies on: the pure core imports without Ray or Spark, and no module of the
project imports another that (directly or not) imports it back."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "verticles", "topologies", "riqr")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` with the garbage collector held off: on CPython 3.11 a finalizer that runs during the
    AST conversion (py4j's, once the integration tests' Spark objects are collected in the same process)
    can make it fail with "AST constructor recursion depth mismatch"."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        if enabled:
            gc.enable()


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports anywhere in its file (function-level imports count too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` names a module when pkg.mod is one; otherwise it imports from pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    modules = project_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph["verticles.deploy"] >= {"verticles.registry", "verticles.query"}  # the graph is really read
    assert find_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_imports_the_actor_creation_module() -> None:
    modules = project_modules()
    importers = sorted(n for n, p in modules.items() if "verticles.deploy" in imports_of(n, p, modules))
    # The command line and its helpers (riqr.access asks the registry for the deployment's secret).
    assert importers == ["riqr.access", "riqr.cli", "riqr.demo"]


def test_the_core_imports_without_ray_or_spark() -> None:
    core = sorted(n for n in project_modules() if n == "runtime" or n.startswith("runtime."))
    assert "runtime.facade.routing" in core and "runtime.rest.handlers" in core
    code = (
        "import importlib, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('ray', 'pyspark') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_every_runtime_module_imports_first_in_a_fresh_interpreter() -> None:
    """The package no longer imports its modules in a fixed order (its names load on first use), so each
    module must import on its own: an import cycle through a module-level ``from x import y`` would show
    here as an ImportError, whichever module came first."""
    core = sorted(n for n in project_modules() if n.startswith("runtime."))
    # One interpreter; before each module, every runtime module is dropped from sys.modules, so each is
    # imported first (its third-party imports stay loaded: they cannot take part in a cycle of ours).
    code = (
        "import importlib, sys\n"
        f"for name in {core!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'runtime' or m.startswith('runtime.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as err:\n"
        "        print(name, err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout == "", done.stdout


def test_the_runtime_package_gives_its_names_on_first_use_and_riqr_cli_imports_light() -> None:
    code = (
        "import sys\n"
        "import riqr.cli, runtime\n"
        "light = sorted(m for m in ('aiohttp', 'pyarrow', 'ray', 'pyspark', 'jwt') if m in sys.modules)\n"
        "from runtime import Store, connect, RiqrError\n"
        "import runtime.client, runtime.errors\n"
        "assert (Store, connect) == (runtime.client.Store, runtime.client.connect)\n"
        "assert RiqrError is runtime.errors.RiqrError\n"
        "for name in runtime.__all__:\n"
        "    assert getattr(runtime, name) is not None, name\n"
        "try:\n"
        "    runtime.nothing_of_that_name\n"
        "except AttributeError as err:\n"
        "    assert 'nothing_of_that_name' in str(err)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
        "print(light)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", "riqr's command line imports only what its commands need when run"
