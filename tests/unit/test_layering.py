"""The package's layering, checked from the source (ARCHITECTURE.md "Package layout").

- No import cycle between modules of ``ravenproxy/``, counting every import: module-level,
  inside functions, under ``TYPE_CHECKING`` (an upward dependency hidden there is still one),
  and ``importlib.import_module("ravenproxy...")`` with a literal name (the lazy loaders).
- ``wire/``, ``transport/``, ``model/``, ``pki/`` and ``kube/`` import nothing from ``server/``,
  ``agent/``, ``controller/`` or ``l3/``, nor from the entry points above them (``cli``,
  ``demo``, ``lab/``).
- ``server/``, ``agent/``, ``controller/`` and ``l3/`` import nothing from each other, except
  that the agent may embed ``l3/``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ravenproxy"
BELOW = ("wire", "transport", "model", "pki", "kube")
COMPONENTS = ("server", "agent", "controller", "l3")
ABOVE = (*COMPONENTS, "cli", "demo", "lab")
EMBEDS = {("agent", "l3")}
"""(importer, imported) component pairs the rule allows: the agent runs the L3 driver."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(
    name: str, source: str, known: set[str], *, is_package: bool = False
) -> Iterator[tuple[str, int]]:
    """(imported ravenproxy module, line) for every import in a module's source: module level,
    in functions, under ``if TYPE_CHECKING`` — ``ast.walk`` visits them all — and every
    ``import_module`` call with a literal ``ravenproxy`` name."""
    tree = ast.parse(source, name)
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ravenproxy":
                    yield _resolve(alias.name, known), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "ravenproxy":
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate if candidate in known else _resolve(base, known)), node.lineno
        elif isinstance(node, ast.Call) and _called(node.func) in ("import_module", "__import__"):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if first.value.split(".")[0] == "ravenproxy":
                    yield _resolve(first.value, known), node.lineno


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _resolve(dotted: str, known: set[str]) -> str:
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        source = path.read_text()
        for target, line in _imports(name, source, known, is_package=path.name == "__init__.py"):
            if target and target != name and target != "ravenproxy":
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_lower_layers_import_no_component() -> None:
    bad = [
        f"{module} imports {target} (line {line})"
        for module, edges in _graph().items()
        if _layer(module) in BELOW
        for target, line in edges.items()
        if _layer(target) in ABOVE
    ]
    assert not bad, "\n".join(bad)


def test_components_import_no_other_component() -> None:
    bad = [
        f"{module} imports {target} (line {line})"
        for module, edges in _graph().items()
        if _layer(module) in COMPONENTS
        for target, line in edges.items()
        if _layer(target) in COMPONENTS
        and _layer(target) != _layer(module)
        and (_layer(module), _layer(target)) not in EMBEDS
    ]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_function_level_and_type_checking_imports() -> None:
    # The rules above are only as good as the import finder: prove it finds the hidden kinds.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ravenproxy.server.app import ProxyServer\n"
        "def f():\n    from ravenproxy.agent import app\n"
        "from . import frames\n"
        "import ravenproxy.controller.kube.client\n"
        "def g():\n    return importlib.import_module('ravenproxy.l3.driver')\n"
    )
    known = {
        "ravenproxy.server.app",
        "ravenproxy.agent.app",
        "ravenproxy.wire.frames",
        "ravenproxy.controller.kube",
        "ravenproxy.l3.driver",
    }
    found = {target for target, _ in _imports("ravenproxy.wire.probe", source, known)}
    assert found == known


def _readme_layout() -> str:
    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## How it is built\n", 1)[1]
    return section.split("```", 2)[1]


def test_readme_shows_the_layout() -> None:
    # README "How it is built": every package and top-level module is named, and every module
    # it names exists.
    layout = _readme_layout()
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    unnamed = [f"{p}/" for p in packages if not re.search(rf"^\s*{p}/", layout, re.M)]
    top = sorted(p.name for p in PACKAGE.glob("*.py") if not p.name.startswith("__"))
    unnamed += [m for m in top if not re.search(rf"(?<![\w/]){re.escape(m)}\b", layout)]
    assert not unnamed, f"README 'How it is built' does not name: {unnamed}"
    existing = {p.name for p in PACKAGE.rglob("*.py")}
    named = set(re.findall(r"[\w/]*?(\w+\.py)\b", layout))
    assert named <= existing, f"README names modules that do not exist: {named - existing}"


MAX_LINES = 500


def test_no_module_over_500_lines() -> None:
    # One module per concept (STYLE.md): a module past 500 lines holds more than one; split it
    # by concept, not by cutting functions in half.
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
