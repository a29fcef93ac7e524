"""The import graph of src/meridian, built from the sources: no cycle anywhere (imports
inside functions count too), and the shared modules never import a tool."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "meridian"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (`from .x import y` -> `meridian.a.x`)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports. `from pkg import mod` is an import of
    `pkg.mod` when that is a module, else of `pkg`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = resolve(name, path.name == "__init__.py", node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_resolve_relative_imports() -> None:
    up2, up3 = (ast.parse(f"from {dots}hist import Log2Hist").body[0] for dots in ("..", "..."))
    assert isinstance(up2, ast.ImportFrom) and isinstance(up3, ast.ImportFrom)
    assert resolve("meridian.tools.io.cli", False, up3) == "meridian.hist"
    assert resolve("meridian.tools.io", True, up2) == "meridian.tools.hist"
    assert resolve("meridian.tools.biolat", False, up2) == "meridian.hist"


def test_no_import_cycle() -> None:
    edges = graph()
    assert "meridian.cli" in edges and len(edges) > 20
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_shared_modules_import_no_tool() -> None:
    """Only the entry point and the tools themselves may import a tool."""
    offenders = sorted(
        f"{name} imports {dep}"
        for name, deps in graph().items()
        if not name.startswith("meridian.tools") and name != "meridian.cli"
        for dep in deps
        if dep.startswith("meridian.tools")
    )
    assert offenders == []


def test_tools_import_no_other_tool() -> None:
    """A tool package stands alone (doctor only reads each tool's strategies)."""
    offenders = []
    for name, deps in graph().items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] != "tools" or parts[2] == "doctor":
            continue
        for dep in deps:
            dparts = dep.split(".")
            if len(dparts) >= 3 and dparts[1] == "tools" and dparts[2] != parts[2]:
                offenders.append(f"{name} imports {dep}")
    assert sorted(offenders) == []


def tool_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph of the tools' sub-packages (and top modules), `tool.sub`: one
    imports another when any module of the first imports any of the second."""
    out: dict[str, set[str]] = {}

    def package(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[2:4]) if len(parts) > 3 and parts[1] == "tools" else None

    for name, deps in edges.items():
        if (mine := package(name)) is None:
            continue
        out.setdefault(mine, set())
        for dep in deps:
            other = package(dep)
            if other is not None and other != mine and other.split(".")[0] == mine.split(".")[0]:
                out[mine].add(other)
    return out


def test_tool_packages_sees_a_cycle_no_module_closes() -> None:
    t = "meridian.tools.t"
    edges = {f"{t}.a.x": {f"{t}.b.y"}, f"{t}.b.y": set(), f"{t}.b.z": {f"{t}.a.w"}}
    assert find_cycle(edges) is None
    assert find_cycle(tool_packages(edges)) == ["t.a", "t.b", "t.a"]


def test_no_package_cycle_inside_a_tool() -> None:
    """No sub-package of a tool imports one that imports it back, even through others
    (sentinel's api/ is typed against control.Control: the agent starts the API, and
    the API never imports the agent)."""
    packages = tool_packages(graph())
    assert "sentinel.api" in packages["sentinel.agent"]
    cycle = find_cycle(packages)
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


SENTINEL = "meridian.tools.sentinel"
# Sentinel's layers: a sub-package may import only these of sentinel's others (the
# agent and the CLI build on everything, the API on all but the agent, which it knows
# as control.Control; storage and detectors are plug-ins).
LAYERS = {
    "model": set(),
    "symbols": {"model"},
    "sources": {"model"},
    "config": {"model", "sources"},  # the events key is parsed by the PMU event specs
    "pipeline": {"model", "symbols", "config"},
    "detectors": {"model"},
    "storage": {"model"},
    "query": {"model", "storage", "sources", "config"},
    "outputs": {"model", "config", "pipeline"},
    # what the API asks of a running agent: a Protocol over the layers' types
    "control": {"model", "symbols", "config", "pipeline", "storage"},
    "api": {"model", "config", "pipeline", "storage", "query", "control"},
}
LAYERS["agent"] = set(LAYERS)  # every one above, the API too (it starts the server)


def layer_of(module: str) -> str | None:
    """The sub-package of a sentinel module (None: not sentinel's, or its `cli`)."""
    if not module.startswith(SENTINEL + "."):
        return None
    first = module.removeprefix(SENTINEL + ".").split(".")[0]
    return None if first == "cli" else first


def test_sentinel_layers_import_only_what_lies_below() -> None:
    """model/ imports nothing of sentinel; pipeline/ never imports outputs or the API;
    query/ never the outputs, the pipeline or the config's internals; the API never the
    agent: the architecture is in the imports."""
    offenders = sorted(
        f"{name} imports {dep}"
        for name, deps in graph().items()
        if (layer := layer_of(name)) in LAYERS
        for dep in deps
        if (other := layer_of(dep)) is not None and other != layer and other not in LAYERS[layer]
    )
    assert offenders == []
    config_internals = sorted(
        f"{name} imports {dep}"
        for name, deps in graph().items()
        if layer_of(name) == "query"
        for dep in deps
        if layer_of(dep) == "config" and dep != f"{SENTINEL}.config"
    )
    assert config_internals == [], "query/ takes the config's public names only"


def test_every_sentinel_module_is_in_a_layer() -> None:
    """Only the package's entry (`__init__`, `cli`) sits at its top."""
    top = sorted(n for n in graph() if n.startswith(SENTINEL) and layer_of(n) is None)
    assert top == [SENTINEL, f"{SENTINEL}.cli"]
    assert set(LAYERS) >= {layer_of(n) for n in graph() if layer_of(n)}
