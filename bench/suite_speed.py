"""Episodes per second of each community suite's own loop against the same env played
through this engine, and of the native ``tictactoe`` and ``kuhn_poker`` against OpenSpiel's
own loop of the same games.

    python bench/suite_speed.py [--rows NAME ...] [--episodes N] [--own-episodes M]
                                [--in-flight 64 512] [--repeats 5] [--out [PATH]]

Every row times three arms, interleaved by ``bench/harness.py`` (one untimed warm-up of
each, then ``--repeats`` rounds with the order rotated), and reports two comparison blocks,
``engine_64 / own`` and ``engine_512 / own``: the median of the per-round ratios of episodes
per second with their range (``tie`` where the range includes 1.0). One run of an engine
arm plays ``--episodes`` episodes, one run of the own loop ``--own-episodes`` (default: the
row's counts in ``ROWS``, sized for about 1-3 s a run; the own loops are the faster, so they
play more episodes a run). The metric is a rate, so the counts need not match.

* ``own``: the suite's own loop, in plain Python, one episode at a time as the suite's users
  write it, playing uniformly random legal moves (``random.Random``, seeded per run) and
  computing what the engine needs of every turn: the observation string of the player to
  move, its legal actions as strings, and at the end each player's returns.

  - OpenSpiel: ``game = pyspiel.load_game(name)`` once; per episode
    ``state = game.new_initial_state()``, chance nodes sampled from
    ``state.chance_outcomes()``, per turn ``state.observation_string(player)`` and
    ``state.action_to_string(player, a)`` for ``a`` in ``state.legal_actions(player)``, then
    ``state.apply_action``; ``state.returns()`` at the end.
  - TextArena: per episode ``env = textarena.make(env_id)`` (its default wrappers, which
    render each player's observation as one string) and ``env.reset(num_players, seed=i)``;
    per turn ``env.get_observation()``, the legal moves read from that string by the
    adapter's own parser (``agentgym.envs.suites.textarena._moves``: TextArena has no legal
    move list of its own) and ``env.step(move)``; ``env.close()``'s rewards at the end.
  - Reasoning Gym: the dataset built once (``reasoning_gym.create_dataset(name, seed=0,
    size=10000)``, as the adapter builds it); per episode item ``i``, its ``question``,
    and ``dataset.score_answer(entry["answer"], entry)``. The dataset's answers are free
    text, so both arms answer the item's own answer (the engine's scripted ``oracle``).

* ``engine_64``, ``engine_512``: ``RolloutEngine(ScriptedBackend(tokenizer, "random"),
  tokenizer, max_concurrency=K)`` with the tiny model's tokenizer, ``collect(tasks, env_id)``
  with K episodes in flight (a game episode takes one slot: K games, every seat played by
  the scripted random policy, ``opponent="self"``): the engine's whole turn (chat template,
  tokens, trajectory store, the adapter's env or ``SuiteGamePool``, the trajectories out).
  Tasks ``0..N-1`` (OpenSpiel: the chance seeds; TextArena: ``reset(seed=i)``; Reasoning
  Gym: the items); the native ``tictactoe`` plays task 0, the empty board, every episode as
  OpenSpiel does. One engine per arm, kept across runs (its drivers stay built).

Rows (``--rows``): the OpenSpiel games ``tic_tac_toe`` and ``kuhn_poker`` (two seats) and
``catch`` (one player), TextArena's ``FrozenLake-v0`` (one player, listed moves) and
``TicTacToe-v0`` (two players), Reasoning Gym's ``basic_arithmetic``, and ``native_tictactoe``,
``native_kuhn_poker``: this project's Rust games through the engine against OpenSpiel's own
loop of ``tic_tac_toe`` and ``kuhn_poker`` (the move-for-move equality of those games is
``tests/integrations/test_openspiel_native.py``'s).

Prints one JSON object (``rows``, each with its blocks, and every block under
``comparisons``); ``--out`` writes it with ``write_json_atomic`` (default path
``bench/results/suite_speed.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import random
import sys
import time
import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import Harness, add_arguments, fmt_ratio, write_json_atomic  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "suite_speed.json"
PACKAGES = ("open-spiel", "textarena", "reasoning-gym")
#: The engine's turn cap and context cap: above what any row's episode takes, so every
#: episode ends by the game's own end (the report lists the stop reasons).
MAX_TURNS = 100
MAX_TOTAL_TOKENS = 16384


@dataclass(frozen=True)
class Row:
    """One row: the env the engine plays, the suite loop it is compared with, the default
    episodes per run of the engine's arms and of the own loop (each sized for about 1-3 s
    on the 2-core machine: the own loops ran 3-25x faster than the engine), the scripted
    policy, and whether every episode plays task 0."""

    name: str
    engine_env: str
    own: str  # "openspiel:<game>", "textarena:<EnvId>@<players>", "reasoning_gym:<name>"
    episodes: int
    own_episodes: int
    policy: str = "random"
    task_zero: bool = False
    num_tasks: int | None = None  # task i is i mod num_tasks (None: unbounded)


ROWS = (
    Row("openspiel:tic_tac_toe", "openspiel:tic_tac_toe", "openspiel:tic_tac_toe", 2048,
        32768),
    Row("openspiel:kuhn_poker", "openspiel:kuhn_poker", "openspiel:kuhn_poker", 4096, 131072),
    Row("openspiel:catch", "openspiel:catch", "openspiel:catch", 1024, 16384),
    Row("textarena:FrozenLake-v0", "textarena:FrozenLake-v0", "textarena:FrozenLake-v0@1",
        1024, 2048),
    Row("textarena:TicTacToe-v0", "textarena:TicTacToe-v0", "textarena:TicTacToe-v0@2",
        1024, 2048),
    Row("reasoning_gym:basic_arithmetic", "reasoning_gym:basic_arithmetic",
        "reasoning_gym:basic_arithmetic", 8192, 16384, policy="oracle", num_tasks=10_000),
    Row("native_tictactoe", "tictactoe", "openspiel:tic_tac_toe", 2048, 32768,
        task_zero=True),
    Row("native_kuhn_poker", "kuhn_poker", "openspiel:kuhn_poker", 8192, 131072),
)


# -- the suites' own loops -------------------------------------------------------------------
def openspiel_loop(game_name: str):
    """OpenSpiel's own loop of ``game_name`` (module docs): a function ``run(n, seed)``
    playing ``n`` random games one after another."""
    import pyspiel

    game = pyspiel.load_game(game_name)
    by_observation = game.get_type().provides_observation_string

    def run(n: int, seed: int) -> dict:
        rng = random.Random(seed)
        moves = chars = 0
        total = [0.0] * game.num_players()
        t0 = time.perf_counter()
        for _ in range(n):
            state = game.new_initial_state()
            while not state.is_terminal():
                if state.is_chance_node():
                    outcomes, probs = zip(*state.chance_outcomes())
                    state.apply_action(rng.choices(outcomes, probs)[0])
                    continue
                player = state.current_player()
                text = (state.observation_string(player) if by_observation
                        else state.information_state_string(player))
                legal = state.legal_actions(player)
                names = [state.action_to_string(player, a) for a in legal]
                chars += len(text) + sum(map(len, names))
                state.apply_action(rng.choice(legal))
                moves += 1
            for p, r in enumerate(state.returns()):
                total[p] += r
        return _rate(n, time.perf_counter() - t0, moves=moves, chars=chars,
                     mean_returns=[round(r / n, 4) for r in total])

    return run


def textarena_loop(env_id: str, players: int):
    """TextArena's own loop of ``env_id`` (module docs): ``run(n, seed)`` plays ``n``
    episodes, seeds ``seed .. seed + n - 1``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import textarena as ta

        from agentgym.envs.suites.textarena import _moves

    def run(n: int, seed: int) -> dict:
        rng = random.Random(seed)
        outer = random.getstate()  # TextArena's reset reseeds the global generator
        moves = chars = unlisted = 0
        total = [0.0] * players
        t0 = time.perf_counter()
        for i in range(n):
            env = ta.make(env_id)
            env.reset(num_players=players, seed=seed + i)
            done = False
            while not done:
                _, text = env.get_observation()
                legal = _moves(text)
                chars += len(text)
                unlisted += not legal
                done, _ = env.step(rng.choice(legal) if legal else "[0]")
                moves += 1
            rewards, _ = env.close()
            for p in range(players):
                total[p] += float((rewards or {}).get(p, 0.0))
        wall = time.perf_counter() - t0
        random.setstate(outer)
        return _rate(n, wall, moves=moves, chars=chars, turns_without_listed_moves=unlisted,
                     mean_returns=[round(r / n, 4) for r in total])

    return run


def reasoning_gym_loop(name: str):
    """Reasoning Gym's own loop of dataset ``name`` (module docs): ``run(n, seed)`` scores
    the answers of items ``0 .. n-1``."""
    import reasoning_gym

    from agentgym.envs.suites.reasoning_gym import DEFAULT_SIZE

    data = reasoning_gym.create_dataset(name, seed=0, size=DEFAULT_SIZE)

    def run(n: int, seed: int) -> dict:
        chars, score = 0, 0.0
        t0 = time.perf_counter()
        for i in range(n):
            entry = data[i % DEFAULT_SIZE]
            chars += len(entry["question"])
            score += float(data.score_answer(answer=entry["answer"], entry=entry))
        return _rate(n, time.perf_counter() - t0, moves=n, chars=chars,
                     mean_returns=[round(score / n, 4)])

    return run


def own_loop(spec: str):
    """The own-loop function of ``spec`` (a :class:`Row`'s ``own``)."""
    suite, _, local = spec.partition(":")
    if suite == "openspiel":
        return openspiel_loop(local)
    if suite == "textarena":
        env_id, _, players = local.rpartition("@")
        return textarena_loop(env_id, int(players))
    if suite == "reasoning_gym":
        return reasoning_gym_loop(local)
    raise ValueError(f"no own loop for {spec!r}")


def _rate(episodes: int, wall: float, **extra) -> dict:
    return {"episodes": episodes, "wall_s": round(wall, 4),
            "episodes_per_s": episodes / wall, **extra}


# -- the engine ------------------------------------------------------------------------------
def engine_arm(row: Row, in_flight: int, tokenizer, episodes: int):
    """The engine's arm of ``row`` at ``in_flight`` episodes (module docs): an async
    ``run()`` collecting ``episodes`` episodes, and the engine (to close)."""
    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.engine import RolloutEngine

    eng = RolloutEngine(ScriptedBackend(tokenizer, row.policy, seed=0), tokenizer,
                        max_turns=MAX_TURNS, max_concurrency=in_flight,
                        max_total_tokens=MAX_TOTAL_TOKENS, progress=False)
    tasks = [0 if row.task_zero else i % (row.num_tasks or episodes) for i in range(episodes)]

    async def run() -> dict:
        t0 = time.perf_counter()
        batch = await eng.collect(tasks, row.engine_env)
        wall = time.perf_counter() - t0
        trajs = list(batch)
        stops = collections.Counter(t.stop_reason for t in trajs)
        return _rate(episodes, wall, trajectories=len(trajs),
                     turns=sum(t.num_turns for t in trajs), stop_reasons=dict(stops))

    return run, eng


# -- the bench -------------------------------------------------------------------------------
async def measure_row(row: Row, hs: Harness, tokenizer, episodes: int, own_episodes: int,
                      in_flight: list[int]) -> dict:
    """One row's interleaved arms and its ``engine_K / own`` blocks."""
    own = own_loop(row.own)
    seeds = iter(range(10**9))
    arms = {"own": lambda: own(own_episodes, next(seeds) * own_episodes)}
    engines = []
    for k in in_flight:
        run, eng = engine_arm(row, k, tokenizer, episodes)
        arms[f"engine_{k}"] = run
        engines.append(eng)
    try:
        first, rows = await hs.acompare(
            f"{row.name}: engine_{in_flight[0]} / own", arms, metric="episodes_per_s",
            numerator=f"engine_{in_flight[0]}", denominator="own")
    finally:
        for eng in engines:
            await eng.aclose()
    blocks = [first]
    for k in in_flight[1:]:
        blocks.append(hs.block_from_runs(
            f"{row.name}: engine_{k} / own", rows, metric="episodes_per_s",
            numerator=f"engine_{k}", denominator="own", order=first["order"],
            load_before=first["load_before"], load_after=first["load_after"]))
    for block, k in zip(blocks, in_flight):
        block.update({"row": row.name, "engine_env": row.engine_env, "own": row.own,
                      "in_flight": k, "episodes": episodes, "own_episodes": own_episodes,
                      "policy": row.policy})
    last = {arm: {k: v for k, v in rs[-1].items() if k not in ("episodes_per_s", "wall_s")}
            for arm, rs in rows.items()}
    return {
        "row": row.name, "engine_env": row.engine_env, "own": row.own,
        "episodes": episodes, "own_episodes": own_episodes, "policy": row.policy,
        "episodes_per_s": {arm: round(b["median"], 1) for arm, b in first["arms"].items()},
        "ratio": {f"engine_{k}/own": {key: round(b["ratio"][key], 3)
                                       for key in ("median", "min", "max")} | {"tie": b["tie"]}
                  for k, b in zip(in_flight, blocks)},
        "last_run": last,
        "blocks": blocks,
    }


def _versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


async def run_bench(args, hs: Harness, tokenizer) -> dict:
    chosen = [r for r in ROWS if not args.rows or r.name in args.rows]
    report = {"bench": "suite_speed", "machine": f"{platform.machine()}, "
              f"{os.cpu_count()} cores", "versions": _versions(), "repeats": hs.repeats,
              "in_flight": args.in_flight, "rows": [], "comparisons": []}
    for row in chosen:
        out = await measure_row(row, hs, tokenizer, args.episodes or row.episodes,
                                args.own_episodes or row.own_episodes, args.in_flight)
        report["comparisons"] += out.pop("blocks")
        report["rows"].append(out)
        for b in report["comparisons"][-len(args.in_flight):]:
            print(f"{b['name']}: {fmt_ratio(b)}", file=sys.stderr, flush=True)
    return report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", default=None, choices=[r.name for r in ROWS],
                    metavar="NAME", help="rows to run (default: all): "
                    + ", ".join(r.name for r in ROWS))
    ap.add_argument("--episodes", type=int, default=None,
                    help="episodes per run of the engine's arms (default: each row's count)")
    ap.add_argument("--own-episodes", type=int, default=None,
                    help="episodes per run of the own loop (default: each row's count)")
    ap.add_argument("--in-flight", type=int, nargs="+", default=[64, 512],
                    help="the engine's episodes in flight, one arm each (default 64 512)")
    ap.add_argument("--out", nargs="?", const=str(RESULTS), default=None,
                    help=f"write the JSON here (default path {RESULTS.relative_to(ROOT)})")
    add_arguments(ap)
    args = ap.parse_args(argv)
    counts = [n for n in (args.episodes, args.own_episodes) if n is not None]
    if min(counts + args.in_flight) < 1:
        ap.error("--episodes, --own-episodes and --in-flight must be at least 1")
    hs = Harness.from_args(args, with_server=False)
    hs.pin_client()
    from transformers import AutoTokenizer

    from agentgym.models import cached_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(cached_tiny_model())
    report = asyncio.run(run_bench(args, hs, tokenizer))
    print(json.dumps(report))
    if args.out:
        write_json_atomic(args.out, report)
    return report


if __name__ == "__main__":
    main()
