"""The Python package's modules import each other in one direction: no
import cycle, and no import hidden inside a function to get around one."""
import ast
import os

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "python", "tarantella")


def _module(path):
    name = os.path.relpath(path, os.path.join(ROOT, "python"))[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _is_module(name):
    if name == "tarantella._core":  # the extension module, built from src/python
        return True
    base = os.path.join(ROOT, "python", *name.split("."))
    return os.path.exists(base + ".py") or os.path.exists(os.path.join(base, "__init__.py"))


def _sources():
    for folder, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path) as src:
                    yield path, ast.parse(src.read())


def _imports(nodes):
    """Tarantella modules that the import statements among `nodes` name."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tarantella"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if _is_module(full) else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tarantella")}
    return found


def test_no_import_cycles():
    graph = {_module(path): _imports(tree.body) for path, tree in _sources()}
    cycles, state, stack = [], {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dep in sorted(graph.get(module, ())):
            if dep not in graph:
                continue
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(cycles)
    assert len(graph) > 20  # the walk found the package


def test_no_imports_inside_functions():
    hidden = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for name in _imports(ast.walk(node)):
                    hidden.append(f"{os.path.relpath(path, ROOT)}:{node.name} imports {name}")
    assert not hidden, "\n".join(hidden)
