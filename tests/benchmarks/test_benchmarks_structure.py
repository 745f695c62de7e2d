"""Structure of ``benchmarks/``: no import cycle between its modules.

Static (``ast``): every import counts, those inside functions too (a lazy import only
defers a cycle to its first call).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


#: The two families of ``benchmarks/``: the speed scripts (``bench_*.py``, with ``_machine.py``,
#: the machine helper they share with the harness) and the one accuracy harness
#: (``experiments/``, its results in ``records/``).
TOP_LEVEL = {"__init__.py", "_machine.py", "experiments", "records"}
def test_benchmarks_hold_the_speed_scripts_and_one_harness():
    entries = {p.name for p in BENCHMARKS.iterdir() if p.name != "__pycache__"}
    speed = {name for name in entries if name.startswith("bench_") and name.endswith(".py")}
    assert entries - speed - TOP_LEVEL == set()


#: What reads EEG (PhysioNet's files, MOABB's datasets): only ``experiments/data.py`` calls it.
LOADERS = {"load_physionet_mi", "load_moabb", "load_weibo2014", "find_physionet_root", "configure_offline",
           "PhysionetMI", "Weibo2014", "eegbci"}


def loader_names(path):
    """The names of :data:`LOADERS` that ``path`` imports or uses."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return names & LOADERS


def test_the_harness_reads_eeg_through_its_data_module():
    harness = BENCHMARKS / "experiments"
    readers = {str(p.relative_to(harness)): sorted(loader_names(p)) for p in sorted(harness.rglob("*.py"))}
    assert {path: names for path, names in readers.items() if names and path != "data.py"} == {}
    assert {"load_physionet_mi", "load_moabb", "PhysionetMI", "Weibo2014"} <= set(readers["data.py"])


def test_every_speed_script_writes_a_record():
    """A speed script's figures reach the docs only through its record (``benchmarks/records/speed.py``)."""
    scripts = sorted(BENCHMARKS.glob("bench_*.py"))
    assert scripts
    assert [p.name for p in scripts if "write_speed_record(" not in p.read_text()] == []
