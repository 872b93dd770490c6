#!/usr/bin/env python3
"""Import cycles inside ``python/agentgym``: prints the strongly connected components of the
package's module import graph (those with more than one module) as JSON.

Every ``import``/``from ... import`` statement is read with :mod:`ast`, at module level and
inside functions alike (a lazy import is still an edge: it runs the other module when the
function runs), except those under ``if TYPE_CHECKING:``, which never run. ``from P import
name`` is an edge to ``P.name`` where that is a module of the package, else to ``P``.
Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``; those implicit edges are
left out (with them every module would sit in one cycle through ``agentgym/__init__.py``).

Usage: ``python scripts/import_cycles.py [--root python] [--package agentgym]``; output
``{"cycles": [[module, ...], ...]}``, each component sorted, largest first.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

__all__ = ["cycles", "import_graph", "modules"]


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``: dotted name -> file (extension modules,
    such as ``agentgym._core``, included: they import nothing of the package)."""
    out = {}
    base = root / package
    for path in sorted([*base.rglob("*.py"), *base.rglob("*.so"), *base.rglob("*.pyd")]):
        parts = list(path.relative_to(root).parts)
        parts[-1] = parts[-1].split(".")[0]
        if parts[-1] == "__init__":
            parts.pop()
        out.setdefault(".".join(parts), path)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """The import statements of ``tree`` that can run (not under ``if TYPE_CHECKING:``)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring)."""
    mods = modules(root, package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        if path.suffix != ".py":
            continue
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in mods else base)
            for target in targets:
                while target and target not in mods:  # `import a.b.attr`-like: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative),
    each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parents[1]
    p.add_argument("--root", default=str(here / "python"), help="folder holding the package")
    p.add_argument("--package", default="agentgym")
    args = p.parse_args(argv)
    found = cycles(import_graph(Path(args.root), args.package))
    json.dump({"cycles": found}, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
