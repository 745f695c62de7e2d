"""Structure of ``benchmarks/``: no import cycle between its modules.

Static (``ast``): every import counts, those inside functions too (a lazy import only
defers a cycle to its first call).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(BENCHMARKS.rglob("*.py"))}


def imported(name, path):
    """The benchmarks modules ``name`` imports (``from .x import y``: ``x.y`` when a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return sorted(t for t in targets if t in MODULES and t != name)


def find_cycle(graph):
    """A cycle ``[a, ..., a]`` of ``graph``, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = "done"
        return None

    for node in graph:
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_benchmarks_have_no_import_cycle():
    graph = {name: imported(name, path) for name, path in MODULES.items()}
    assert find_cycle(graph) is None


def test_a_cycle_is_found():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a"]}) is None
