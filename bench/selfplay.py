"""Self-play throughput, same run: the engine's game episodes against its single-agent
episodes, and the native games against TextArena's Python games.

    python bench/selfplay.py [--episodes 2048] [--concurrency 256] [--games 4096] [--repeats 3]

* ``engine``: seat-turns per second of self-play ``tictactoe`` and ``kuhn_poker`` (the
  scripted oracle in every seat: the game's solver) against turns per second of the
  single-agent engine on the native ``maze`` with the scripted oracle, at the same
  ``max_concurrency``, through the same ``RolloutEngine`` and tokenizer (the tiny model's).
  A seat-turn is one reply of one seat: the unit of work a backend sees, like a
  single-agent turn. The ratio is game over maze.
* ``games``: moves per second of ``_core.GamePool`` (all games in one batched call per move,
  GIL released) against TextArena's ``TicTacToe-v0-raw`` and ``KuhnPoker-v0-raw``
  (``max_rounds=1``), one env per game as TextArena runs them, playing the same move
  sequences (random legal games drawn beforehand with ``_core.Game``; a reset counts with
  its game). Both read every observation the next mover gets, so the string work is alike.

Each measurement runs ``--repeats`` times, interleaved, and the best is reported (noise only
slows a run down); every run is listed. Prints one JSON object; ``--out`` writes it to
``bench/results/selfplay.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
import warnings
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentgym import _core  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "selfplay.json"
TA_IDS = {"tictactoe": "TicTacToe-v0-raw", "kuhn_poker": "KuhnPoker-v0-raw"}


# -- the engine ---------------------------------------------------------------------------
async def _engine_rate(env: str, episodes: int, concurrency: int, tokenizer) -> dict:
    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.engine import RolloutEngine

    eng = RolloutEngine(ScriptedBackend(tokenizer, "oracle"), tokenizer, max_turns=12,
                        max_concurrency=concurrency, max_total_tokens=4096, progress=False)
    try:
        await eng.collect(min(episodes, concurrency), env)  # warm: drivers, codec caches
        t0 = time.perf_counter()
        batch = await eng.collect(episodes, env)
        wall = time.perf_counter() - t0
    finally:
        eng.close()
    turns = sum(t.num_turns for t in batch)
    return {"turns": turns, "rows": len(batch), "wall_s": wall, "turns_per_s": turns / wall,
            "stop_reasons": sorted({t.stop_reason for t in batch})}


def engine_bench(args, tokenizer) -> dict:
    envs = ("maze", "tictactoe", "kuhn_poker")
    runs: dict[str, list[dict]] = {e: [] for e in envs}
    for _ in range(args.repeats):
        for env in envs:
            runs[env].append(asyncio.run(_engine_rate(env, args.episodes, args.concurrency,
                                                      tokenizer)))
    best = {e: max(r["turns_per_s"] for r in rs) for e, rs in runs.items()}
    return {
        "concurrency": args.concurrency, "episodes": args.episodes,
        "single_agent_turns_per_s": {"maze": round(best["maze"])},
        "seat_turns_per_s": {g: round(best[g]) for g in envs[1:]},
        "ratio_vs_single_agent": {g: round(best[g] / best["maze"], 3) for g in envs[1:]},
        "runs": {e: [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
                     for r in rs] for e, rs in runs.items()},
    }


# -- the games against TextArena -----------------------------------------------------------
def random_games(game_id: str, n: int, seed: int) -> list[tuple[int, list[str]]]:
    """``n`` random legal games of ``game_id``: (task, moves) each."""
    rng = random.Random(seed)
    game = _core.Game(game_id)
    out = []
    for i in range(n):
        task = 0 if game_id == "tictactoe" else i % game.num_tasks  # TextArena: empty board
        game.reset(task, i)
        moves = []
        while not game.over:
            (seat,) = game.to_move()
            move = rng.choice(game.valid_actions(seat))
            game.step([move])
            moves.append(move)
        out.append((task, moves))
    return out


def native_rate(game_id: str, games: list[tuple[int, list[str]]]) -> dict:
    pool = _core.GamePool(game_id, len(games))
    slots = list(range(len(games)))
    t0 = time.perf_counter()
    views = pool.reset(slots, [t for t, _ in games], list(range(len(games))))
    chars = sum(len(o) for v in views for o in v[1])
    live = slots
    k = 0
    moves = 0
    while live:
        views = pool.step(live, [[games[s][1][k]] for s in live])
        moves += len(live)
        chars += sum(len(o) for v in views for o in v[1])
        k += 1
        live = [s for s, v in zip(live, views) if not v[2]]
    wall = time.perf_counter() - t0
    return {"moves": moves, "wall_s": wall, "moves_per_s": moves / wall, "chars": chars}


def textarena_rate(game_id: str, games: list[tuple[int, list[str]]]) -> dict:
    import textarena as ta

    kw = {"max_rounds": 1} if game_id == "kuhn_poker" else {}
    fmt = (lambda m: f"[{int(m) - 1}]") if game_id == "tictactoe" else (lambda m: f"[{m}]")
    state = random.getstate()
    t0 = time.perf_counter()
    moves = chars = 0
    for i, (_, seq) in enumerate(games):
        env = ta.make(TA_IDS[game_id], **kw)
        env.reset(num_players=2, seed=i)
        chars += len(str(env.get_observation()[1]))
        for m in seq:
            done, _ = env.step(fmt(m))
            moves += 1
            if done:
                break
            chars += len(str(env.get_observation()[1]))
        env.close()
    wall = time.perf_counter() - t0
    random.setstate(state)
    return {"moves": moves, "wall_s": wall, "moves_per_s": moves / wall, "chars": chars}


def games_bench(args) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import textarena  # noqa: F401
    out = {}
    for game_id in TA_IDS:
        games = random_games(game_id, args.games, seed=0)
        runs = {"native": [], "textarena": []}
        for _ in range(args.repeats):
            runs["native"].append(native_rate(game_id, games))
            runs["textarena"].append(textarena_rate(game_id, games))
        nat = max(r["moves_per_s"] for r in runs["native"])
        ta_best = max(r["moves_per_s"] for r in runs["textarena"])
        out[game_id] = {
            "games": len(games), "moves": runs["native"][0]["moves"],
            "textarena_moves": runs["textarena"][0]["moves"],
            "native_moves_per_s": round(nat), "textarena_moves_per_s": round(ta_best),
            "ratio": round(nat / ta_best, 1),
            "runs": {k: [round(r["moves_per_s"]) for r in v] for k, v in runs.items()},
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--games", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="engine,games")
    ap.add_argument("--out", nargs="?", const=str(RESULTS), default=None)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from agentgym.models import cached_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(cached_tiny_model())
    report = {"bench": "selfplay", "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_avg_start": os.getloadavg()[0]}
    parts = args.parts.split(",")
    if "engine" in parts:
        report["engine"] = engine_bench(args, tokenizer)
    if "games" in parts:
        report["games"] = games_bench(args)
    report["load_avg_end"] = os.getloadavg()[0]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
