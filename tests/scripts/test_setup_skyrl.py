"""scripts/setup.sh --skyrl: which CPython 3.12 makes .venv-skyrl (PYTHON312, else pyenv's
newest 3.12, under `pyenv root`, PYENV_ROOT or ~/.pyenv), and a clear message without
failing the setup where there is none. Each test runs a copy of the script in a temporary
folder with stub pythons that record their arguments (a stub asked for ``-m venv DIR`` makes
``DIR/bin/python``, another stub), so nothing is installed and the checkout's virtualenvs are
never touched."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/bin/sh
echo "$0 $@" >> "{log}"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi
exit {rc}
"""


def _stub(path: Path, log: Path, rc: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STUB.format(log=log, rc=rc))
    path.chmod(0o755)
    return path


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copytree(ROOT / "requirements", repo / "requirements")
    log = tmp_path / "calls.log"
    _stub(repo / ".venv" / "bin" / "python", log)  # the main virtualenv's steps: no-ops
    return repo, log


def _pyenv(tmp_path: Path, versions: list[str], log: Path) -> Path:
    """A ``pyenv`` on PATH whose root holds stub pythons of ``versions``."""
    root = tmp_path / "pyenv-root"
    for v in versions:
        _stub(root / "versions" / v / "bin" / "python3.12", log)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pyenv = bin_dir / "pyenv"
    listing = "\\n".join(versions)
    pyenv.write_text(f'#!/bin/sh\ncase "$1" in\n  root) echo "{root}" ;;\n'
                     f'  versions) printf "{listing}\\n" ;;\nesac\n')
    pyenv.chmod(0o755)
    return bin_dir


def _run(repo: Path, path_dirs: list[Path], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("AGENTGYM_SHARED", "AGENTGYM_TORCH_INDEX", "VIRTUAL_ENV",
                          "PYTHON312", "PYENV_VERSION", "PYENV_ROOT")}
    clean["PATH"] = os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"])
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), "--no-vllm", "--skyrl"],
                          capture_output=True, text=True, timeout=60, env={**clean, **env})


def test_without_python312_it_says_so_and_skips(tmp_path):
    repo, log = _repo(tmp_path)
    not312 = _stub(tmp_path / "py311" / "python3", tmp_path / "other.log", rc=1)
    out = _run(repo, [_pyenv(tmp_path, ["3.11.7", "3.13.0"], log)], PYTHON312=str(not312))
    assert out.returncode == 0, out.stderr
    assert "--skyrl: no CPython 3.12" in out.stderr and "skipping .venv-skyrl" in out.stderr
    assert "PYTHON312" in out.stderr
    assert not (repo / ".venv-skyrl").exists()


def test_python312_from_the_environment_makes_the_virtualenv(tmp_path):
    repo, log = _repo(tmp_path)
    py312 = _stub(tmp_path / "py312" / "python3.12", log)
    out = _run(repo, [], PYTHON312=str(py312))
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    assert f"{py312} -m venv .venv-skyrl" in calls
    assert (repo / ".venv-skyrl" / "bin" / "python").exists()
    (install,) = [c for c in calls if c.startswith(".venv-skyrl/bin/python") and " -r " in c]
    assert install.endswith("install -q -r requirements/skyrl.txt")


def test_else_pyenvs_newest_312(tmp_path):
    repo, log = _repo(tmp_path)
    bin_dir = _pyenv(tmp_path, ["3.11.7", "3.12.1", "3.12.10", "3.13.0"], log)
    out = _run(repo, [bin_dir], PYTHON312=str(tmp_path / "nonexistent"))
    assert out.returncode == 0, out.stderr
    newest = tmp_path / "pyenv-root" / "versions" / "3.12.10" / "bin" / "python3.12"
    assert f"{newest} -m venv .venv-skyrl" in log.read_text().splitlines()


def test_pyenv_root_without_the_pyenv_command(tmp_path):
    repo, log = _repo(tmp_path)
    _pyenv(tmp_path, ["3.12.1"], log)  # its root only: no pyenv on PATH
    out = _run(repo, [], PYTHON312=str(tmp_path / "nonexistent"),
               PYENV_ROOT=str(tmp_path / "pyenv-root"))
    assert out.returncode == 0, out.stderr
    found = tmp_path / "pyenv-root" / "versions" / "3.12.1" / "bin" / "python3.12"
    assert f"{found} -m venv .venv-skyrl" in log.read_text().splitlines()
