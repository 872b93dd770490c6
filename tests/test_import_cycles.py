"""No import cycles inside ``python/agentgym`` (``scripts/import_cycles.py``), except the known
ones below, which may only shrink."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The import cycles that remain, as the strongly connected components they form. Each goes
#: through ``agentgym.engine`` (rebuilt by its owner) or through the package's lazy
#: ``agentgym.collect`` (``agentgym/__init__.py``'s ``__getattr__`` imports
#: ``agentgym.collection``, whose collector imports ``__version__`` from ``agentgym``: taking
#: it from ``agentgym._core`` ends that one). This set may only shrink: a cycle that is not
#: inside one of these components fails the test, and so does a component that grew.
KNOWN: list[frozenset[str]] = [
    frozenset({
        "agentgym",
        "agentgym.collection",
        "agentgym.collection.collector",
        "agentgym.distributed.rollout_workers",
        "agentgym.engine.drivers",
        "agentgym.engine.drivers.process",
        "agentgym.engine.drivers.python",
        "agentgym.engine.orchestrator",
        "agentgym.engine.runner",
    }),
]

#: The cycles that do not go through ``agentgym/engine/`` or ``agentgym/learner/`` (those
#: modules left out of the graph): only the collector's, above. May only shrink.
KNOWN_OUTSIDE: list[frozenset[str]] = [
    frozenset({"agentgym", "agentgym.collection", "agentgym.collection.collector"}),
]


def _checker():
    spec = importlib.util.spec_from_file_location("import_cycles",
                                                  ROOT / "scripts" / "import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _within(found: list[list[str]], known: list[frozenset[str]]) -> list[list[str]]:
    """The components of ``found`` that no known component holds."""
    return [c for c in found if not any(set(c) <= k for k in known)]


def test_no_new_import_cycles():
    ic = _checker()
    graph = ic.import_graph(ROOT / "python", "agentgym")
    assert "agentgym.envs.registry" in graph and "agentgym._core" in graph
    new = _within(ic.cycles(graph), KNOWN)
    assert not new, f"new import cycles: {json.dumps(new, indent=1)}"


def test_no_cycles_outside_the_engine_and_the_learner():
    ic = _checker()
    graph = ic.import_graph(ROOT / "python", "agentgym")
    outside = ("agentgym.engine", "agentgym.learner")
    kept = {m: {t for t in ts if not t.startswith(outside)}
            for m, ts in graph.items() if not m.startswith(outside)}
    new = _within(ic.cycles(kept), KNOWN_OUTSIDE)
    assert not new, f"import cycles outside engine/ and learner/: {json.dumps(new, indent=1)}"


def test_the_checker_finds_cycles(tmp_path):
    """Module-level, function-level and relative imports are edges; ``TYPE_CHECKING`` ones
    and an extension module's name are not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "c.py").write_text("import pkg.a\nfrom pkg import _ext\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from pkg import e\n")
    (pkg / "e.py").write_text("from pkg.d import x\n")
    (pkg / "_ext.so").write_bytes(b"")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py"),
                           "--root", str(tmp_path), "--package", "pkg"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"cycles": [["pkg.a", "pkg.b", "pkg.sub.c"]]}
