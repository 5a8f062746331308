#!/usr/bin/env python3
"""The include graph of libtnt: which layer includes which, and a check that
the library reads top-down.

libtnt's layers, from the top: api -> fusion -> engine -> collectives ->
transport -> util (src/<layer>/). A file may include headers of its own
layer and of the layers below it, never above, and no two headers may
include each other, however indirectly. Prints the graph between layers
(with how many includes make each edge) and every violation; exits 1 when
there is one.

Usage: tools/include_graph.py [--files] [SRC_DIR]   (default: src/ next to tools/)
  --files   also print the graph between files
"""
import os
import re
import sys

LAYERS = ["api", "fusion", "engine", "collectives", "transport", "util"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_graph(src):
    """{file: [included file]} for the files of the layers, paths relative to src."""
    graph = {}
    for layer in LAYERS:
        for name in sorted(os.listdir(os.path.join(src, layer))):
            if not name.endswith((".c", ".h", ".def")):  # .def: X-macro lists
                continue
            path = f"{layer}/{name}"
            with open(os.path.join(src, path), encoding="utf-8") as f:
                text = f.read()
            graph[path] = [inc for inc in INCLUDE.findall(text)
                           if inc.split("/")[0] in LAYERS]
    return graph


def find_cycle(graph):
    """One include cycle as a list of files, or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in graph:
        if state.get(node) is None:
            found = visit(node)
            if found:
                return found
    return None


def main(argv):
    show_files = "--files" in argv
    args = [a for a in argv if a != "--files"]
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    graph = read_graph(src)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    edges = {}
    problems = []
    for path, incs in graph.items():
        here = path.split("/")[0]
        for inc in incs:
            there = inc.split("/")[0]
            if inc not in graph:
                problems.append(f"{path} includes {inc}, which does not exist")
                continue
            if there != here:
                edges[(here, there)] = edges.get((here, there), 0) + 1
            if rank[there] < rank[here]:
                problems.append(f"{path} includes {inc}: {here} may not depend on {there}, "
                                f"which is above it")
    cycle = find_cycle(graph)
    if cycle:
        problems.append("include cycle: " + " -> ".join(cycle))

    print("layers, top down: " + " -> ".join(LAYERS))
    for here in LAYERS:
        below = [f"{there} ({edges[(here, there)]})" for there in LAYERS
                 if (here, there) in edges]
        print(f"  {here:<12} includes {', '.join(below) if below else 'nothing of libtnt'}")
    if show_files:
        for path in sorted(graph):
            print(f"  {path} -> {', '.join(graph[path]) or '-'}")
    print(f"{len(graph)} files, {sum(len(v) for v in graph.values())} includes, "
          f"{'no cycle' if not cycle else 'a cycle'}, "
          f"{'every include points down or sideways' if not problems else 'problems:'}")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
