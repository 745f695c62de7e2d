"""Structure of ``skfedspd``: no import cycle, no private name across modules, no pickle.

Static checks over the source (``ast``), so they see every module, the optional Flower
ones included, without importing anything:

- the graph of imports between skfedspd modules has no cycle, counting the imports
  inside functions too (a lazy import only defers a cycle to the first call);
- the core imports no ``skfedspd.flower`` module when it is imported (Flower is an extra);
- no module uses another skfedspd module's private name (``from .x import _y``,
  ``x._y`` on an imported skfedspd module);
- nothing in skfedspd imports ``pickle`` (or ``dill``, ``cloudpickle``, ``marshal``,
  ``shelve``) or loads with ``allow_pickle=True`` / ``torch.load``.
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import skfedspd

PACKAGE_DIR = Path(skfedspd.__file__).parent
UNSAFE_MODULES = {"pickle", "dill", "cloudpickle", "marshal", "shelve"}


def _module_name(path):
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _tree(name):
    return ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))


def _base(name, node):
    """The absolute module an ``ImportFrom`` node imports from."""
    if node.level == 0:
        return node.module or ""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _module_level(tree):
    """Statements run at import: the module body, into if / try / with blocks (not defs)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        if isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)


def _imported_modules(name, statements):
    """``[(imported skfedspd module, imported name or None)]`` of some statements."""
    out = []
    for node in statements:
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "skfedspd"]
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, node)
            if base.split(".")[0] != "skfedspd":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full, None) if full in MODULES else (base, alias.name))
    return out


def import_graph(in_functions=True):
    """``{module: [skfedspd modules it imports]}``; ``in_functions=False``: only the imports
    run when the module is imported."""
    def statements(name):
        tree = _tree(name)
        return ast.walk(tree) if in_functions else _module_level(tree)

    return {name: sorted({target for target, _ in _imported_modules(name, statements(name))
                          if target in MODULES and target != name})
            for name in MODULES}


def find_cycle(graph):
    """A cycle ``[a, b, ..., a]`` of the graph, or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for node in graph:
        if node not in state:
            cycle = visit(node, [node])
            if cycle:
                return cycle
    return None


def test_finds_every_module():
    assert {"skfedspd.engine", "skfedspd.federated", "skfedspd.flower.server", "skfedspd.flower.client"} <= set(MODULES)


def test_find_cycle_detects_a_cycle():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_no_import_cycle():
    graph = import_graph()
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_import_graph_counts_imports_in_functions():
    graph = import_graph()
    assert "skfedspd.dp_sgd" in graph["skfedspd.base"]  # imported when a site trains under DP
    assert "skfedspd.dp_sgd" not in import_graph(in_functions=False)["skfedspd.base"]


def test_core_does_not_import_flower_and_flower_uses_the_engine():
    """Not even inside a function: the core finds the Flower transport by its entry point."""
    graph = import_graph()
    for name, targets in graph.items():
        if not name.startswith("skfedspd.flower"):
            assert not [t for t in targets if t.startswith("skfedspd.flower")], name
    assert "skfedspd.run" in graph["skfedspd.flower.server"] and "skfedspd.client" in graph["skfedspd.flower.client"]
    assert "skfedspd.engine" in graph["skfedspd.flower.strategy"]
    assert not [t for t in graph["skfedspd.flower.server"] + graph["skfedspd.flower.client"]
                if t == "skfedspd.federated"]


#: The layers of ``skfedspd``, lowest first (``docs/guide/architecture.md``): a module imports
#: only modules of lower layers, lazy imports included. The Flower modules sit where their
#: imports put them: the transport below the estimator, the deployment tools above it.
LAYERS = [
    {"validation", "protocol"},
    {"functional", "stiefel", "messages", "spec", "training", "datasets",
     "flower.records", "flower.progress", "flower.runtime", "flower.simulation"},
    {"layers", "federated_module", "aggregation", "server_optimizer", "online", "persistence", "clients", "backends"},
    {"batchnorm", "renamed", "transfer"},
    {"nn"},
    {"dp_sgd"},
    {"privacy"},
    {"base"},
    {"classifier", "eegnet"},
    {"recenter", "client", "engine"},  # the client side and the server side, apart
    {"run", "flower.strategy"},
    {"local", "flower.secure"},
    {"flower.server", "flower.client"},
    {"flower.simulation_fit"},
    {"federated"},
    {"flower.deploy", "flower.app", "classical"},
    {"flower.loopback"},
    {"", "flower"},  # the packages' __init__
    {"flower.__main__"},
]


def _layer_of():
    layer = {}
    for rank, names in enumerate(LAYERS):
        for name in names:
            layer["skfedspd" + (f".{name}" if name else "")] = rank
    return layer


def test_every_module_has_a_layer():
    assert set(_layer_of()) == set(MODULES)


def test_no_upward_import():
    """No module imports one of its own layer or above, counting imports inside functions."""
    layer = _layer_of()
    upward = [f"{name} -> {target}" for name, targets in import_graph().items() for target in targets
              if layer[target] >= layer[name]]
    assert not upward, f"imports that go up or sideways: {upward}"


def _private(attr):
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_crosses_a_module_boundary(name):
    tree = _tree(name)
    everything = list(ast.walk(tree))
    violations = [f"from {target} import {imported}" for target, imported in _imported_modules(name, everything)
                  if imported is not None and _private(imported) and target != name]
    # Names bound to skfedspd modules (import skfedspd.x as m, from . import x as m) ...
    aliases = {}
    for node in everything:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("skfedspd"):
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    # ... and their private attributes.
    for node in everything:
        if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            if target is not None and target != name:
                violations.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    assert not violations, f"{name} uses private names of other modules: {violations}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_pickle(name):
    problems = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            problems += [a.name for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            problems.append(node.module)
        elif isinstance(node, ast.keyword) and node.arg == "allow_pickle":
            if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                problems.append(f"allow_pickle={ast.unparse(node.value)} (line {node.value.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr == "load" and ast.unparse(node.value) == "torch":
            problems.append(f"torch.load (line {node.lineno})")
    assert not problems, f"{name}: {problems}"


@pytest.mark.slow
def test_flower_backend_without_flower_names_the_extra():
    """``backend="flower"`` imports Flower when it fits: without it, an ImportError says
    which extra to install (run in a fresh interpreter, where Flower cannot be imported)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["flwr"] = None  # as if Flower were not installed
        import numpy as np
        from skfedspd import FederatedSPDnetClassifier
        from skfedspd.datasets import make_spd_classification
        X, y = make_spd_classification(n_matrices=12, n_channels=4, n_classes=2, seed=0)
        fed = FederatedSPDnetClassifier(n_rounds=1, backend="flower", random_state=0)
        try:
            fed.fit(X, y, groups=np.repeat([0, 1, 2], 4))
        except ImportError as error:
            print(type(error).__name__, error, hasattr(fed, "engine_"))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE_DIR.parent,
                            timeout=300)
    assert result.stdout.startswith("ImportError backend='flower' needs the flower extra: pip install "
                                    "'skfedspd[flower]'"), result.stdout + result.stderr
    assert result.stdout.strip().endswith("False")  # the estimator is left unfitted
