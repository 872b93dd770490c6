"""A sandbox for running untrusted (model-written) Python code in a subprocess.

``run_python(code, files=..., limits=...)`` writes ``code`` as ``main.py`` into a fresh
temporary directory, runs it with ``python -I`` (isolated mode: no ``PYTHON*`` variables, no
user site, no cwd on ``sys.path``) in that directory, and returns a :class:`SandboxResult`.
The directory is deleted afterwards. The parent never executes the code and always survives.

Layers, in the order the child's trusted boot code (``_BOOT``) applies them before the
untrusted code runs:

1. **Network namespace** (``unshare(CLONE_NEWNET)``): as root, or unprivileged where user
   namespaces are allowed. The child sees only a down loopback device: every connect fails
   and nothing reaches a listener outside. Where no namespace can be made, the audit hook
   (5) is the only network block.
2. **Resource limits** (``setrlimit``, soft = hard): CPU seconds, address space, size of any
   file written, open files, processes/threads (``RLIMIT_NPROC``), no core dumps.
3. **Privilege drop** when started as root: common stdlib modules are imported first, then
   the process switches to a throw-away uid/gid (``100000 + pid``, no supplementary groups)
   that owns only the temp directory. ``RLIMIT_NPROC`` then binds (the kernel exempts root
   from it), other sandboxes' files and signals are out of reach, and root-only files
   (mode 0600/0700) are unreadable and non-root-writable places are unwritable.
4. **Scrubbed environment**: only ``PATH``, ``LANG``, ``HOME=<tmpdir>``, ``TMPDIR=<tmpdir>``.
5. **Audit hook** (``sys.addaudithook``, defense in depth; CPython documents that audit
   hooks are not a security boundary on their own): blocks sockets, ``fork``/``exec``/
   ``spawn``/``system``/``subprocess``, signals to other processes, ``ctypes``, raising
   rlimits; opens for writing, file creation/removal/renaming only inside the temp
   directory (at most ``max_files`` files created); opens for reading and directory listings
   only inside the temp directory and the Python installation.

The parent adds: a wall-clock timeout that SIGKILLs the whole process group
(``start_new_session``), caps on captured stdout/stderr (the rest is drained and dropped),
and no stdin unless given. See ``envs/code_debug/README.md`` for what is guaranteed.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "sandbox_capabilities"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    cpu_s: int = 5  #: RLIMIT_CPU, seconds of CPU time
    wall_s: float = 10.0  #: wall-clock timeout; the process group is killed after it
    memory_mb: int = 512  #: RLIMIT_AS, address space
    file_size_mb: int = 4  #: RLIMIT_FSIZE, largest file the code may write
    max_files: int = 32  #: files the code may create (audit hook)
    nproc: int = 8  #: RLIMIT_NPROC, processes + threads of the sandbox uid
    nofile: int = 64  #: RLIMIT_NOFILE, open file descriptors
    output_bytes: int = 64 * 1024  #: captured bytes per stream (stdout, stderr)


@dataclass
class SandboxResult:
    """What a sandboxed run produced."""

    returncode: int | None  #: exit code; negative = killed by that signal
    stdout: str
    stderr: str
    timed_out: bool = False  #: the wall-clock limit killed it
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    enforced: dict = field(default_factory=dict)  #: which layers were active

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


# Trusted boot code run as the child's ``-c`` program. argv[1] is the JSON config.
_BOOT = r'''
import json, os, sys
cfg = json.loads(sys.argv[1])
work = os.path.realpath(cfg["workdir"])
enforced = {"netns": False, "uid_drop": False, "audit_hook": False}
if cfg["netns"]:
    _ids = (os.geteuid(), os.getegid())
    flags = 0x40000000 if _ids[0] == 0 else (0x40000000 | 0x10000000)  # NEWNET (| NEWUSER)
    if hasattr(os, "unshare"):
        try:
            os.unshare(flags)
            enforced["netns"] = True
        except OSError:
            pass
    else:
        import ctypes
        enforced["netns"] = ctypes.CDLL(None, use_errno=True).unshare(flags) == 0
        del ctypes
        for _m in [m for m in sys.modules if m.partition(".")[0] in ("ctypes", "_ctypes")]:
            del sys.modules[_m]
    if enforced["netns"] and _ids[0] != 0:
        # map our own ids into the new user namespace, or file creation fails (EOVERFLOW)
        try:
            for _f, _v in (("setgroups", "deny"), ("uid_map", f"{_ids[0]} {_ids[0]} 1"),
                           ("gid_map", f"{_ids[1]} {_ids[1]} 1")):
                with open(f"/proc/self/{_f}", "w") as _fh:
                    _fh.write(_v)
        except OSError:
            pass
    del flags, _ids
import resource
def _lim(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass
_lim(resource.RLIMIT_CPU, cfg["cpu_s"])
_lim(resource.RLIMIT_AS, cfg["memory_mb"] << 20)
_lim(resource.RLIMIT_FSIZE, cfg["file_size_mb"] << 20)
_lim(resource.RLIMIT_NOFILE, cfg["nofile"])
_lim(resource.RLIMIT_NPROC, cfg["nproc"])
_lim(resource.RLIMIT_CORE, 0)
# Preloaded because the stdlib may be unreadable after the privilege drop (3.).
import ast, bisect, collections, contextlib, copy, functools, heapq, io, itertools  # noqa
import math, operator, random, re, signal, string, struct, typing, posix, stat  # noqa
if not cfg["audit"]:
    import socket, encodings.idna  # noqa: lets tests reach the namespace layer (1.)
if cfg["uid_drop"] and os.geteuid() == 0:
    uid = 100000 + os.getpid()
    try:
        os.chown(work, uid, uid)
        for _n in os.listdir(work):
            os.chown(os.path.join(work, _n), uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        enforced["uid_drop"] = True
    except OSError:  # e.g. a container without CAP_SETUID: keep going without this layer
        pass
    del uid
def _install_hook(work, roots, max_files):
    # Everything the hook uses is captured here, so patching modules later cannot change it.
    import posix, stat as _stat
    lstat, readlink, getcwd, fsdecode = posix.lstat, posix.readlink, posix.getcwd, os.fsdecode
    islnk, sep, path_types = _stat.S_ISLNK, "/", (str, bytes)
    wflags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    dev = ("/dev/null", "/dev/urandom", "/dev/random")
    made = [0]
    blocked = ("socket.", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
               "os.system", "os.kill", "os.killpg", "os.startfile", "subprocess.", "ctypes.",
               "resource.setrlimit", "resource.prlimit", "pty.", "os.setuid", "os.setgid",
               "sys.remote_exec", "sys.settrace", "sys.setprofile", "sys._current_frames",
               "gc.get_objects", "gc.get_referrers", "gc.get_referents", "winreg.",
               "webbrowser.", "cpython.remove_remote_exec")
    no_import = ("ctypes", "_ctypes", "_posixsubprocess", "subprocess", "multiprocessing", "socket",
                 "_socket", "_multiprocessing", "pty", "_xxsubinterpreters", "_testcapi",
                 "_testinternalcapi")
    frames = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")
    path_ops = ("os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown",
                "os.truncate", "os.utime", "os.chflags", "os.lchmod", "os.lchown", "shutil.")

    def resolve(path, depth=0):
        p = fsdecode(path)
        if not p.startswith(sep):
            p = getcwd() + sep + p
        out = []
        for part in p.split(sep):
            if part in ("", "."):
                continue
            if part == "..":
                out = out[:-1]
                continue
            cur = sep + sep.join(out + [part])
            try:
                link = islnk(lstat(cur).st_mode)
            except OSError:
                link = False
            if link and depth < 16:
                target = readlink(cur)
                base = sep + sep.join(out)
                full = target if target.startswith(sep) else base + sep + target
                out = resolve(full, depth + 1).split(sep)[1:]
                out = [x for x in out if x]
            else:
                out.append(part)
        return sep + sep.join(out)

    def inside(path, allowed):
        if type(path) not in path_types:
            return False
        p = resolve(path)
        for r in allowed:
            if p == r or p.startswith(r + sep):
                return True
        return False

    readable = (work,) + roots

    def hook(event, args):
        if event.startswith(blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import":
            if str(args[0]).partition(".")[0] in no_import:
                raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
        elif event == "object.__getattr__":
            if args[1] in frames:
                raise PermissionError("sandbox: access to frames is not allowed")
        elif event == "open":
            path, mode, flags = args
            if path is None or type(path) is int:
                return
            writing = (type(mode) is str and any(c in mode for c in "wax+")) or (
                type(flags) is int and flags & wflags)
            if writing:
                if not inside(path, (work,)):
                    raise PermissionError(f"sandbox: writing {path!r} is not allowed")
                try:
                    lstat(resolve(path))
                except OSError:
                    made[0] += 1
                    if made[0] > max_files:
                        raise PermissionError("sandbox: too many files created") from None
            elif not (type(path) is str and path in dev) and not inside(path, readable):
                raise PermissionError(f"sandbox: reading {path!r} is not allowed")
        elif event in ("os.listdir", "os.scandir", "os.chdir"):
            path = args[0] if args and args[0] is not None else "."
            if type(path) is not int and not inside(path, readable):
                raise PermissionError(f"sandbox: {event} {path!r} is not allowed")
        elif event in ("os.symlink", "os.link"):
            raise PermissionError(f"sandbox: {event} is not allowed")
        elif event.startswith(path_ops):
            for path in args:
                if path is None or type(path) is int:
                    continue
                if not inside(path, (work,)):
                    raise PermissionError(f"sandbox: {event} {path!r} is not allowed")

    sys.addaudithook(hook)


if cfg["audit"]:
    _install_hook(work, tuple(os.path.realpath(p) for p in cfg["read_roots"]), cfg["max_files"])
    enforced["audit_hook"] = True
del _install_hook
del cfg["read_roots"]
if cfg["report_fd"] >= 0:
    os.write(cfg["report_fd"], json.dumps(enforced).encode())
    os.close(cfg["report_fd"])
sys.argv = ["main.py"]
_code = compile(open("main.py", encoding="utf-8").read(), "main.py", "exec")
_g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
del json, cfg, enforced, _lim, work, resource
exec(_code, _g)
'''


def _read_roots() -> list[str]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(os.path.realpath(r) for r in roots)


_CAPS: dict | None = None


def sandbox_capabilities() -> dict:
    """Which isolation layers work on this machine (probed once by running an empty program)."""
    global _CAPS
    if _CAPS is None:
        res = run_python("pass", limits=SandboxLimits(wall_s=30.0))
        _CAPS = dict(res.enforced) if res.ok else {"netns": False, "uid_drop": False}
        _CAPS.update(rlimits=True, process_group_kill=True, scrubbed_env=True, audit_hook=True)
    return dict(_CAPS)


def _drain(
    proc: subprocess.Popen, report_r: int, wall_s: float, cap: int
) -> tuple[bytes, bytes, bool, bool, bool, bytes]:
    """Read stdout/stderr (keep ``cap`` bytes each, drop the rest) until exit or timeout."""
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray(), report_r: bytearray()}
    trunc = {proc.stdout: False, proc.stderr: False, report_r: False}
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    sel.register(report_r, selectors.EVENT_READ)
    deadline = time.monotonic() + wall_s
    timed_out = False
    open_streams = 3
    while open_streams:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            fd = key.fd
            chunk = os.read(fd, 65536)
            stream = key.fileobj
            if not chunk:
                sel.unregister(stream)
                open_streams -= 1
                continue
            buf = bufs[stream]
            room = cap - len(buf)
            if room > 0:
                buf += chunk[:room]
            if len(chunk) > room:
                trunc[stream] = True
    sel.close()
    if not timed_out:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            timed_out = True
    return (
        bytes(bufs[proc.stdout]),
        bytes(bufs[proc.stderr]),
        trunc[proc.stdout],
        trunc[proc.stderr],
        timed_out,
        bytes(bufs[report_r]),
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def run_python(
    code: str,
    *,
    files: dict[str, str | bytes] | None = None,
    stdin: str | None = None,
    limits: SandboxLimits | None = None,
    network_namespace: bool = True,
    drop_privileges: bool = True,
    audit_hook: bool = True,
) -> SandboxResult:
    """Run ``code`` (as ``main.py``) in a fresh sandboxed subprocess; see the module doc.

    ``files`` are written into the temp directory first (relative names only). The three
    flags exist to test each layer on its own; keep them on for untrusted code.
    """
    limits = limits or SandboxLimits()
    files = dict(files or {})
    workdir = tempfile.mkdtemp(prefix="agentgym-sbx-")
    report_r, report_w = os.pipe()
    try:
        for name, content in {**files, "main.py": code}.items():
            if os.path.isabs(name) or ".." in name.split("/"):
                raise ValueError(f"sandbox file name must be relative: {name!r}")
            path = os.path.join(workdir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            with open(path, "wb") as fh:
                fh.write(data)
        cfg = {
            **asdict(limits),
            "workdir": workdir,
            "netns": network_namespace,
            "uid_drop": drop_privileges,
            "audit": audit_hook,
            "read_roots": _read_roots(),
            "report_fd": report_w,
        }
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-u", "-c", _BOOT, json.dumps(cfg)],
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_w,),
            start_new_session=True,
            close_fds=True,
        )
        os.close(report_w)
        report_w = -1
        if stdin is not None:
            try:
                proc.stdin.write(stdin.encode()[: 1 << 20])
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        try:
            out, err, t_out, t_err, timed_out, report = _drain(
                proc, report_r, limits.wall_s, limits.output_bytes
            )
        finally:
            _kill_group(proc)  # also reaps anything the code left behind in its group
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        try:
            enforced = json.loads(report) if report else {}
        except ValueError:
            enforced = {}
        return SandboxResult(
            returncode=None if timed_out else proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=timed_out,
            stdout_truncated=t_out,
            stderr_truncated=t_err,
            enforced=enforced,
        )
    finally:
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)
        shutil.rmtree(workdir, ignore_errors=True)
