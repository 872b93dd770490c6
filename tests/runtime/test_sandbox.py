"""Escape attempts against ``agentgym.runtime.sandbox``: each is contained, the parent survives.

Tests that switch the audit hook off check the OS-level layer on its own; they are skipped
where that layer is unavailable (``sandbox_capabilities()``).
"""

from __future__ import annotations

import os
import select
import socket
import tempfile
import time

import pytest

from agentgym.runtime.sandbox import SandboxLimits, run_python, sandbox_capabilities

pytestmark = pytest.mark.timeout(60)

CAPS = sandbox_capabilities()
needs_netns = pytest.mark.skipif(not CAPS.get("netns"), reason="no network namespace here")
needs_uid_drop = pytest.mark.skipif(not CAPS.get("uid_drop"), reason="not running as root")


def test_runs_code_and_reports_layers():
    res = run_python("import math\nprint(math.factorial(5))")
    assert res.ok and res.stdout == "120\n"
    assert res.enforced["audit_hook"] is True
    assert res.enforced["netns"] == CAPS["netns"]


def test_cwd_is_fresh_temp_dir_and_removed_afterwards():
    res = run_python("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))",
                     files={"data.txt": "hello"})
    cwd, listing = res.stdout.splitlines()
    assert "agentgym-sbx-" in cwd and listing == "['data.txt', 'main.py']"
    assert not os.path.exists(cwd)


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("AGENTGYM_SECRET_TOKEN", "hunter2")
    res = run_python("import os\nprint(sorted(os.environ))")
    assert "AGENTGYM_SECRET_TOKEN" not in res.stdout
    assert res.stdout.strip() == "['HOME', 'LANG', 'PATH', 'TMPDIR']"


def _listener() -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    return srv


def _connect_code(port: int) -> str:
    return (
        "try:\n"
        "    import socket\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('BLOCKED', type(e).__name__, e)\n"
    )


@pytest.mark.parametrize("hook", [True, pytest.param(False, marks=needs_netns)])
def test_network_connect_to_local_listener_never_arrives(hook):
    srv = _listener()
    try:
        res = run_python(_connect_code(srv.getsockname()[1]), audit_hook=hook)
        assert "CONNECTED" not in res.stdout
        # with the hook: the import is refused; without: the namespace has no route
        assert res.stdout.startswith("BLOCKED")
        if hook:
            assert "import of socket is not allowed" in res.stdout
        ready, _, _ = select.select([srv], [], [], 0.2)
        assert ready == []  # no connection is pending on the listener
    finally:
        srv.close()


def test_fork_bomb_is_blocked_and_parent_survives():
    res = run_python("import os\nwhile True:\n    os.fork()\n", limits=SandboxLimits(wall_s=5))
    assert res.returncode == 1 and "os.fork is not allowed" in res.stderr
    for code in ("import subprocess", "import os\nos.system('true')",
                 "import os\nos.posix_spawn('/bin/true', ['true'], {})",
                 "import os\nos.execv('/bin/true', ['true'])"):
        res = run_python(code)
        assert res.returncode == 1 and "not allowed" in res.stderr, code


def _live_sandbox_uids() -> list[int]:
    uids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(ln.split(":", 1) for ln in fh if ":" in ln)
        except OSError:
            continue
        uid = int(fields["Uid"].split()[0])
        if uid >= 100000 and not fields["State"].strip().startswith("Z"):
            uids.append(uid)
    return uids


@needs_uid_drop
def test_fork_bomb_without_audit_hook_is_capped_by_rlimit_nproc():
    before = set(_live_sandbox_uids())
    code = (
        "import os, time\n"
        "n = 0\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            continue\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        print('capped', n, flush=True)\n"
        "        time.sleep(60)\n"
    )
    res = run_python(code, audit_hook=False, limits=SandboxLimits(nproc=8, wall_s=3))
    assert res.timed_out  # the bomb was cut off by the wall clock, not by exhausting the host
    assert "capped" in res.stdout
    for _ in range(100):  # SIGKILL is delivered asynchronously: give the kernel a moment
        if set(_live_sandbox_uids()) <= before:
            break
        time.sleep(0.05)
    assert set(_live_sandbox_uids()) <= before  # every forked process was killed


def test_huge_output_is_capped():
    res = run_python("print('x' * (50 * 1024 * 1024))", limits=SandboxLimits(output_bytes=4096))
    assert res.ok and res.stdout_truncated and len(res.stdout) == 4096
    res = run_python("while True:\n    print('y' * 10000)",
                     limits=SandboxLimits(output_bytes=1000, wall_s=1.5))
    assert res.timed_out and res.stdout_truncated and len(res.stdout) == 1000


def test_infinite_loop_is_killed_by_cpu_limit_and_sleep_by_wall_clock():
    res = run_python("while True:\n    pass", limits=SandboxLimits(cpu_s=1, wall_s=20))
    assert not res.timed_out and res.returncode is not None and res.returncode < 0
    res = run_python("import time\ntime.sleep(100)", limits=SandboxLimits(wall_s=1))
    assert res.timed_out and res.returncode is None


@pytest.mark.parametrize("hook", [True, False])
def test_memory_hog_hits_address_space_limit(hook):
    code = "try:\n    x = bytearray(2 << 30)\nexcept MemoryError:\n    print('MemoryError')"
    res = run_python(code, audit_hook=hook, limits=SandboxLimits(memory_mb=256))
    assert res.ok and res.stdout.strip() == "MemoryError"


@pytest.mark.parametrize("hook", [True, False])
def test_huge_file_is_capped_by_rlimit_fsize(hook):
    code = (
        "import os\n"
        "try:\n"
        "    with open('big.bin', 'wb') as fh:\n"
        "        for _ in range(64):\n"
        "            fh.write(b'x' * (1 << 20))\n"
        "except OSError as e:\n"
        "    print('error', e.errno)\n"
        "print(os.path.getsize('big.bin'))\n"
    )
    res = run_python(code, audit_hook=hook, limits=SandboxLimits(file_size_mb=2))
    lines = res.stdout.split()
    assert lines[:2] == ["error", "27"]  # EFBIG
    assert int(lines[2]) <= 2 << 20


def test_too_many_files_are_refused():
    code = "for i in range(100):\n    open(f'f{i}', 'w').close()"
    res = run_python(code, limits=SandboxLimits(max_files=10))
    assert res.returncode == 1 and "too many files" in res.stderr


@pytest.fixture
def secret_file():
    d = tempfile.mkdtemp(prefix="agentgym-secret-")
    path = os.path.join(d, "secret.txt")
    with open(path, "w") as fh:
        fh.write("TOP-SECRET")
    os.chmod(path, 0o600)
    yield path
    os.remove(path)
    os.rmdir(d)


def _read_code(path: str) -> str:
    return (
        "try:\n"
        f"    print(open({path!r}).read())\n"
        "except OSError as e:\n"
        "    print('denied', type(e).__name__)\n"
    )


@pytest.mark.parametrize("hook", [True, pytest.param(False, marks=needs_uid_drop)])
def test_reading_a_secret_outside_the_temp_dir_is_denied(secret_file, hook):
    res = run_python(_read_code(secret_file), audit_hook=hook)
    assert "TOP-SECRET" not in res.stdout and res.stdout.startswith("denied PermissionError")


def test_reading_world_readable_files_outside_is_denied_by_the_hook():
    res = run_python(_read_code("/etc/hostname" if os.path.exists("/etc/hostname")
                                else "/etc/passwd"))
    assert res.stdout.startswith("denied PermissionError")
    res = run_python("import os\nprint(os.listdir('/'))")
    assert res.returncode == 1 and "not allowed" in res.stderr


def test_writing_outside_the_temp_dir_is_denied():
    target = os.path.join(tempfile.gettempdir(), f"agentgym-escape-{os.getpid()}")
    code = (f"try:\n    open({target!r}, 'w').write('x')\n"
            "except OSError as e:\n    print('denied', type(e).__name__)\n"
            "import os\n"
            "for op in (lambda: os.remove('/etc/hostname'), lambda: os.mkdir('/tmp/zz'),\n"
            "           lambda: os.symlink('/etc/passwd', 'p')):\n"
            "    try:\n        op()\n    except PermissionError:\n        print('denied')\n")
    res = run_python(code)
    assert res.stdout.split("\n")[:4] == ["denied PermissionError", "denied", "denied", "denied"]
    assert not os.path.exists(target)


@needs_uid_drop
def test_without_hook_root_owned_dirs_stay_unwritable():
    d = tempfile.mkdtemp(prefix="agentgym-ro-")
    os.chmod(d, 0o755)
    try:
        target = os.path.join(d, "x")
        res = run_python(f"open({target!r}, 'w')", audit_hook=False)
        assert "PermissionError" in res.stderr and not os.path.exists(target)
    finally:
        os.rmdir(d)


@pytest.mark.parametrize("code", [
    "import ctypes",
    "import os\nos.kill(os.getppid(), 9)",
    "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))",
])
def test_other_escape_routes_are_blocked(code):
    res = run_python(code)
    assert res.returncode == 1 and "not allowed" in res.stderr


@needs_uid_drop
def test_signals_to_the_parent_fail_without_hook():
    res = run_python("import os\nos.kill(os.getppid(), 9)", audit_hook=False)
    assert res.returncode == 1 and "PermissionError" in res.stderr


def test_stdin_is_passed_and_bad_file_names_are_refused():
    res = run_python("import sys\nprint(sys.stdin.read().upper())", stdin="abc")
    assert res.stdout == "ABC\n"
    with pytest.raises(ValueError):
        run_python("pass", files={"../evil.py": ""})
