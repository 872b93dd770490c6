"""How much of each community suite plays through its adapter (agentgym.envs.suites).

For every env a suite registers (``agentgym-rl list --suite NAME``), one smoke run through
the adapter, as the engine would drive it:

* a single-agent env (``make(id)``): two episodes (tasks 0 and 1), each reset and played to
  its end by uniformly random listed actions (a free-text env: Reasoning Gym answers its
  oracle answer in one episode and a wrong answer in the other; TextArena without listed
  moves plays a random bracketed number), the return checked against the suite's range
  (OpenSpiel: the game's ``[min_utility, max_utility]``; TextArena: [-1, 1]; Reasoning Gym:
  [0, 1]); then, where the registry says it snapshots, a round trip: snapshot after the
  first step, five seeded random steps, restore, the same five steps, the same results;
* a game (``game_pool(id, 1)``): two games played by random listed moves to their end,
  each seat's final reward in range, and the snapshot round trip where supported.

An env passes when every check holds within ``--max-steps`` moves and ``--timeout-s``
seconds. TextArena ids that differ only by TextArena's wrapper variants (``-raw``,
``-train``: the adapter drops the wrappers) play alike: the smoke runs one of each group
(same entry point and kwargs) and counts the ids it covers. The envs run one at a time in
one worker process (restarted after a hang), so the run stays on one core.

    python bench/suite_coverage.py [--suites openspiel textarena reasoning_gym]
                                   [--max-steps 2000] [--timeout-s 60] [--out PATH]

Prints one JSON object: per suite the envs registered, the smoke runs, how many passed, and
each failure with its reason; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import time
from importlib.metadata import version
from pathlib import Path

SUITES = ("openspiel", "textarena", "reasoning_gym")
PACKAGES = {"openspiel": "open-spiel", "textarena": "textarena",
            "reasoning_gym": "reasoning-gym"}


def _range(env_id: str) -> tuple[float, float]:
    if env_id.startswith("openspiel:"):
        from agentgym.envs.suites.openspiel import load

        g = load(env_id.split(":", 1)[1])
        return float(g.min_utility()), float(g.max_utility())
    if env_id.startswith("textarena:"):
        return -1.0, 1.0
    return 0.0, 1.0


def _in_range(value: float, lo: float, hi: float) -> bool:
    return lo - 1e-6 <= value <= hi + 1e-6


def _fallback(env_id: str, rng: random.Random, k: int, oracle) -> str:
    if env_id.startswith("reasoning_gym:"):
        return (oracle() or "") if k == 0 else "not the answer"
    return f"[{rng.randint(0, 9)}]"


def _smoke_env(env_id: str, max_steps: int) -> dict:
    from agentgym.envs.registry import make, snapshots

    lo, hi = _range(env_id)
    env = make(env_id)
    inner = env.unwrapped.env if hasattr(env.unwrapped, "env") else env.unwrapped
    listed = False
    try:
        for k in range(2):
            rng = random.Random(k)
            env.reset(seed=k, options={"task": k})
            total, done, steps = 0.0, False, 0
            while not done and steps < max_steps:
                moves = inner.valid_actions()
                listed = listed or bool(moves)
                action = rng.choice(moves) if moves else _fallback(env_id, rng, k,
                                                                   inner.oracle_action)
                _, reward, term, trunc, _ = env.step(action)
                total += reward
                done = term or trunc
                steps += 1
            if not done:
                return {"ok": False, "reason": f"no end within {max_steps} steps"}
            if not _in_range(total, lo, hi):
                return {"ok": False, "reason": f"return {total} outside [{lo}, {hi}]"}
        snap = bool(snapshots(env_id))
        if snap:
            reason = _env_round_trip(env, inner, env_id)
            if reason:
                return {"ok": False, "reason": reason}
        return {"ok": True, "listed_moves": listed, "snapshots": snap}
    finally:
        env.close()


def _env_round_trip(env, inner, env_id: str) -> str | None:
    env.reset(seed=5, options={"task": 5})
    moves = inner.valid_actions()
    first = env.step(moves[0] if moves else _fallback(env_id, random.Random(0), 1,
                                                      inner.oracle_action))
    if first[2] or first[3]:
        return None  # over in one step: nothing to go back to

    def run():
        rng, out = random.Random(9), []
        for _ in range(5):
            ms = inner.valid_actions()
            step = env.step(rng.choice(ms) if ms else "not the answer")
            out.append(step[:4])
            if step[2] or step[3]:
                break
        return out

    saved = env.unwrapped.snapshot()  # the adapter's: the env's state and its turn count
    a = run()
    env.unwrapped.restore(saved)
    b = run()
    return None if a == b else "snapshot round trip: the replay differs"


def _smoke_game(env_id: str, max_steps: int) -> dict:
    from agentgym.envs.registry import game_pool, snapshots

    lo, hi = _range(env_id)
    pool = game_pool(env_id, 1)
    listed = True
    try:
        for k in range(2):
            rng = random.Random(k)
            view = pool.reset([0], [k], [k])[0]
            steps = 0
            while not isinstance(view, BaseException) and not view[2] and steps < max_steps:
                moves = []
                for seat in view[0]:
                    legal = pool.valid_actions(0, seat)
                    listed = listed and bool(legal)
                    moves.append(rng.choice(legal) if legal else f"[{rng.randint(0, 9)}]")
                view = pool.step([0], [moves])[0]
                steps += 1
            if isinstance(view, BaseException):
                why = " ".join(f"{type(view).__name__}: {view}".split())
                return {"ok": False, "reason": why[:300]}
            if not view[2]:
                return {"ok": False, "reason": f"no end within {max_steps} moves"}
            bad = [r for r in view[3] if not _in_range(r, lo, hi)]
            if bad:
                return {"ok": False, "reason": f"rewards {view[3]} outside [{lo}, {hi}]"}
        snap = bool(snapshots(env_id))
        if snap:
            view = pool.reset([0], [5], [5])[0]
            if not view[2]:
                saved = pool.snapshot(0)

                def run():
                    rng, out = random.Random(9), []
                    for _ in range(5):
                        game = pool._games[0]
                        movers = game.to_move() if game is not None else []
                        if not movers:
                            break
                        v = pool.step([0], [[rng.choice(pool.valid_actions(0, s) or ["[0]"])
                                             for s in movers]])[0]
                        out.append(repr(v))
                        if isinstance(v, BaseException) or v[2]:
                            break
                    return out

                a = run()
                pool.restore(0, saved)
                if run() != a:
                    return {"ok": False, "reason": "snapshot round trip: the replay differs"}
        return {"ok": True, "listed_moves": listed, "snapshots": snap}
    finally:
        pool.close()


def smoke(env_id: str, max_steps: int) -> dict:
    """One env's smoke run (see the module docs): ``{"ok": ...}`` or the reason it failed."""
    from agentgym.envs.registry import kind

    t0 = time.perf_counter()
    try:
        out = (_smoke_game if kind(env_id) == "game" else _smoke_env)(env_id, max_steps)
    except BaseException as e:  # noqa: BLE001 - a third-party failure is the finding
        out = {"ok": False, "reason": " ".join(f"{type(e).__name__}: {e}".split())[:300]}
    out["s"] = round(time.perf_counter() - t0, 3)
    return out


def _worker(conn, max_steps: int) -> None:
    import logging
    import os
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the suites' own prints (pyspiel's, TextArena's) stay out of JSON
    os.dup2(devnull, 2)
    while True:
        env_id = conn.recv()
        if env_id is None:
            return
        conn.send(smoke(env_id, max_steps))


class _Runner:
    """One worker process running smoke runs one at a time; killed and restarted after a
    run that passes the time limit."""

    def __init__(self, max_steps: int, timeout_s: float):
        self.max_steps, self.timeout_s = max_steps, timeout_s
        self.ctx = mp.get_context("spawn")
        self.proc = None

    def _start(self) -> None:
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child, self.max_steps), daemon=True)
        self.proc.start()

    def run(self, env_id: str) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send(env_id)
        if self.conn.poll(self.timeout_s):
            try:
                return self.conn.recv()
            except EOFError:
                self.proc = None
                return {"ok": False, "reason": "the worker died (a crash in the suite)"}
        self.proc.kill()
        self.proc.join()
        self.proc = None
        return {"ok": False, "reason": f"timed out after {self.timeout_s:g} s"}

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(5)


def _targets(suite: str) -> tuple[list[str], dict[str, int], int]:
    """The ids to smoke, the ids each stands for, and the ids registered."""
    from agentgym.envs.suites import list_suite

    rows = list_suite(suite)
    if suite != "textarena":
        return [r.env_id for r in rows], {r.env_id: 1 for r in rows}, len(rows)
    from textarena.envs.registration import ENV_REGISTRY

    groups: dict[str, list[str]] = {}
    for r in rows:
        es = ENV_REGISTRY[r.env_id.split(":", 1)[1]]
        key = f"{es.entry_point}|{sorted(es.kwargs.items())!r}"
        groups.setdefault(key, []).append(r.env_id)
    chosen = {min(ids, key=len): len(ids) for ids in groups.values()}
    return sorted(chosen), chosen, len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    ap.add_argument("--max-steps", type=int, default=2000)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.max_steps < 1:
        ap.error("--max-steps: must be >= 1")
    if args.timeout_s <= 0:
        ap.error("--timeout-s: must be > 0")
    report: dict = {"versions": {}, "suites": {}, "max_steps": args.max_steps,
                    "timeout_s": args.timeout_s}
    runner = _Runner(args.max_steps, args.timeout_s)
    t0 = time.perf_counter()
    try:
        for suite in args.suites:
            report["versions"][PACKAGES[suite]] = version(PACKAGES[suite])
            ids, covers, registered = _targets(suite)
            results = {}
            for env_id in ids:
                results[env_id] = runner.run(env_id)
                print(f"{env_id}: {'ok' if results[env_id]['ok'] else 'FAIL'}",
                      file=sys.stderr, flush=True)
            passed = [e for e, r in results.items() if r["ok"]]
            report["suites"][suite] = {
                "registered": registered,
                "smoked": len(ids),
                "passed": len(passed),
                "ids_covered_by_passes": sum(covers[e] for e in passed),
                "passed_with_listed_moves": sum(1 for e in passed
                                                if results[e].get("listed_moves")),
                "snapshot_round_trips": sum(1 for e in passed if results[e].get("snapshots")),
                "failures": [{"env_id": e, "reason": r["reason"]}
                             for e, r in results.items() if not r["ok"]],
            }
    finally:
        runner.close()
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
