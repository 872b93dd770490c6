"""No import cycles inside ``python/agentgym`` (``scripts/import_cycles.py``: module-level and
function-level imports are edges, ``TYPE_CHECKING`` ones are not)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("import_cycles",
                                                  ROOT / "scripts" / "import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycles():
    ic = _checker()
    graph = ic.import_graph(ROOT / "python", "agentgym")
    assert "agentgym.envs.registry" in graph and "agentgym._core" in graph
    found = ic.cycles(graph)
    assert not found, f"import cycles: {json.dumps(found, indent=1)}"


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
