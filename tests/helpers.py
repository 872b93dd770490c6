"""Helpers shared by the test modules (``from tests.helpers import ...``)."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import numpy as np

import agentgym
from agentgym.data import Trajectory
from agentgym.envs import BaseEnv

# A textcraft task the env refuses (``InvalidTaskError``).
BAD_TEXTCRAFT = "this is not a textcraft task"


#: The envs that run a real simulator, and the package each needs.
SIMULATORS = {"babyai": "minigrid", "sciworld": "scienceworld",
              "sciworld-agentgym": "scienceworld"}


def env_param(env_id: str, *marks):
    """``env_id`` as a ``pytest.param`` with what it needs: ``slow`` for a simulator, Java
    and a long timeout for ScienceWorld, and ``marks``."""
    import shutil

    import pytest

    out = [pytest.mark.slow] if env_id in SIMULATORS else []
    if env_id.startswith("sciworld"):
        out += [pytest.mark.timeout(600),
                pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld needs Java")]
    return pytest.param(env_id, marks=[*out, *marks])


def mask_runs(mask) -> list[tuple[int, int, int]]:
    """Maximal runs of equal loss-mask value: ``[(mask, start, end), ...]``."""
    out: list[list[int]] = []
    for i, m in enumerate(mask):
        if out and out[-1][0] == m:
            out[-1][2] = i + 1
        else:
            out.append([m, i, i + 1])
    return [tuple(r) for r in out]


#: How vLLM's log names a request that ``OpenAIBackend`` sent as ``request_id``:
#: cmpl-{request_id}-{attempt}-{8 hex}-{prompt index} (completions API) or
#: generate-tokens-{request_id}-{attempt}-{8 hex} (token API), then -{8 hex} inside the engine.
_VLLM_REQUEST = r"(?:cmpl|generate-tokens)-(\S+?)-\d+-[0-9a-f]{8}(?:-0)?(?:-[0-9a-f]{8})?"


def vllm_request_log(server) -> tuple[set[str], set[str]]:
    """The request ids (as ``OpenAIBackend``'s callers named them) that a vLLM server
    launched with ``--enable-log-requests`` has logged as added to its engine, and as
    aborted (its connection closed before the request finished)."""
    text = Path(server.log_path).read_text(errors="replace")
    added = {m[1] for m in re.finditer(rf"Added request {_VLLM_REQUEST}\.", text)}
    aborted = {m[1] for m in re.finditer(rf"Request {_VLLM_REQUEST} aborted\.", text)}
    return added, aborted


def make_trajectory(token_ids, loss_mask, **fields) -> Trajectory:
    """A ``Trajectory`` with ``token_ids`` and ``loss_mask`` and defaults for every other
    field: logprobs 0.0, reward 0, no turn rewards, ``num_turns`` = number of model-token
    runs, ``prompt_len`` = tokens before the first model token, stop reason ``done``, group,
    sample, policy version and task 0."""
    mask = [int(m) for m in loss_mask]
    runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    prompt_len = next((i for i, m in enumerate(mask) if m), len(mask))
    defaults = dict(task_id=0, env_id="test", group_id=0, sample_index=0,
                    logprobs=[0.0] * len(mask), prompt_len=prompt_len, turn_rewards=[],
                    reward=0.0, num_turns=runs, stop_reason="done", policy_version=0)
    return Trajectory(token_ids=list(token_ids), loss_mask=mask, **{**defaults, **fields})


def play_to_end(pool: agentgym.EnvPool, policy: str, rng: random.Random) -> np.ndarray:
    """Play every slot of a reset pool to the end with the env's oracle (``"oracle"``) or a
    uniformly random valid action (``"random"``); returns the total reward per slot."""
    alive = list(range(len(pool)))
    total = np.zeros(len(pool))
    while alive:
        if policy == "oracle":
            actions = pool.oracle_actions(alive)
        else:
            actions = [rng.choice(pool.valid_actions(i)) for i in alive]
        _, rewards, terminated, truncated = pool.step(alive, actions)
        total[alive] += rewards
        alive = [i for i, t, u in zip(alive, terminated, truncated, strict=True) if not (t or u)]
    return total


def run_policy(pool: agentgym.EnvPool, choose, max_steps: int):
    """Reset ``pool`` and play every slot with ``choose(pool, live) -> actions`` for at most
    ``max_steps`` turns; returns (total reward per slot, trace of step outputs, turns)."""
    trace = [pool.reset()]
    live = list(range(pool.num_envs))
    rewards = np.zeros(pool.num_envs, dtype=np.float32)
    for _ in range(max_steps):
        obs, rew, term, trunc = pool.step(live, choose(pool, live))
        trace.append((obs, rew.tolist(), term.tolist()))
        rewards[live] += rew
        live = [i for i, done in zip(live, term | trunc, strict=True) if not done]
        if not live:
            break
    return rewards, trace, pool.turns.copy()


class ThreadProbeEnv(BaseEnv):
    """Records the thread of every step; ends after three turns."""

    instructions = "Say anything."
    num_tasks = 100
    threads: set = set()
    step_threads: list = []

    def reset(self, task=None, seed=None):
        self.t = 0
        return "start"

    def step(self, action):
        ThreadProbeEnv.threads.add(threading.get_ident())
        ThreadProbeEnv.step_threads.append(threading.get_ident())
        self.t += 1
        return f"turn {self.t}", 0.0, self.t >= 3, {}


class TaskEnv(BaseEnv):
    """Test-only base env: 100 tasks; ``reset`` keeps the task in ``self.task``, sets the step
    count ``self.n`` to 0 and answers ``task <task>``. Subclasses define ``step``."""

    instructions = "Say anything."
    num_tasks = 100

    def reset(self, task=None, seed=None):
        self.task, self.n = task, 0
        return f"task {task}"


class LineEnv(BaseEnv):
    """A line of cells from 0: ``right`` moves on and earns ``step_reward(new cell)``,
    ``stay`` stays (reward 0), anything else is refused as invalid; cell ``goal`` ends the
    episode (reward 1, done). It can snapshot (``snapshot_safe``)."""

    instructions = "Walk right. Reply with Action: right or Action: stay."
    num_tasks = 10
    snapshot_safe = True
    goal = 6

    def step_reward(self, pos: int) -> float:
        return 0.5

    def reset(self, task=None, seed=None):
        self.pos = 0
        return "at 0"

    def step(self, action):
        if action == "right":
            self.pos += 1
            if self.pos == self.goal:
                return "goal", 1.0, True, {}
            return f"at {self.pos}", self.step_reward(self.pos), False, {}
        if action == "stay":
            return f"at {self.pos}", 0.0, False, {}
        return f"invalid; at {self.pos}", 0.0, False, {"invalid": True}

    def oracle_action(self):
        return "right"

    def valid_actions(self):
        return ["right", "stay"]


class PickEnv(BaseEnv):
    """One turn: reward 1 for 'move east', else 0 (a bandit the policy must learn)."""

    instructions = "Maze. Reply with Action: move north, move south, move east or move west."
    num_tasks = 1000

    def reset(self, task=None, seed=None):
        return "North: open. South: open. East: open. West: open."

    def step(self, action):
        ok = action.strip().lower().endswith("east")
        return ("You reached the goal!" if ok else "Nothing here."), float(ok), True, {}

    def valid_actions(self):
        return ["move north", "move south", "move east", "move west"]


def play_actions(env: BaseEnv, actions: list[str]) -> tuple[float, dict]:
    """Step ``env`` (already reset) with ``actions`` until one ends the episode; returns the
    last step's reward and info."""
    reward, info = 0.0, {}
    for a in actions:
        _, reward, done, info = env.step(a)
        if done:
            break
    return reward, info


def assert_steps_match_reference(pool: agentgym.EnvPool, py, rng: random.Random,
                                 max_turns: int, extra_actions: list[str]) -> None:
    """Play slot 0 of the one-slot ``pool`` and the Python reference env ``py`` (both reset to
    the same episode) side by side for at most ``max_turns`` turns with random choices among
    the valid actions and ``extra_actions``: the valid actions and every (observation,
    reward, terminated) must be equal."""
    for _ in range(max_turns):
        valid = pool.valid_actions(0)
        assert valid == py.valid_actions()
        action = rng.choice(valid + extra_actions)
        obs, reward, terminated, _ = pool.step([0], [action])
        assert (obs[0], float(reward[0]), bool(terminated[0])) == py.step(action)
        if terminated[0]:
            break


def assert_oracle_play_matches(e1, e2) -> tuple:
    """Play two Gymnasium envs reset alike with ``e1``'s oracle actions until ``e1``'s episode
    terminates, asserting equal (observation, reward, terminated) each step; returns ``e1``'s
    last step."""
    while True:
        action = e1.unwrapped.oracle_action()
        step = e1.step(action)
        assert step[:3] == e2.step(action)[:3]
        if step[2]:
            return step


def process_gone(pid: int, wait_s: float = 15.0) -> bool:
    """True once ``pid`` no longer runs (absent or a zombie), waiting up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def assert_pools_play_alike(a: agentgym.EnvPool, b: agentgym.EnvPool, actions, turns: int):
    """Step the running slots of two reset pools ``turns`` times with the same actions,
    ``actions(k, ids)`` at turn ``k`` for the running slot ids ``ids``, asserting equal
    observations each turn."""
    for k in range(turns):
        ids = [i for i, s in enumerate(a.stop_reasons()) if s is None]
        acts = actions(k, ids)
        assert a.step(ids, acts)[0] == b.step(ids, acts)[0]


def assert_invalid_action_is_a_free_turn(env_id: str, action: str) -> agentgym.EnvPool:
    """A one-slot pool of ``env_id`` answers ``action`` with ``Invalid action. ...``, reward 0
    and the episode still running; returns the pool."""
    pool = agentgym.EnvPool(env_id, 1)
    pool.reset()
    obs, r, term, _ = pool.step([0], [action])
    assert obs[0].startswith("Invalid action.") and r[0] == 0 and not term[0]
    return pool


def read_wandb_history(run_dir: str | Path, at_least: int = 0,
                       patience_s: float = 30.0) -> list[dict[str, float]]:
    """The history rows (``wandb.log`` calls) of an offline Weights & Biases run folder,
    read from its ``run-<id>.wandb`` file: a LevelDB-style log (a 7-byte file header, then
    32 KiB blocks of records, each ``crc32 u32, length u16, type u8`` then the bytes; types
    full 1, first 2, middle 3, last 4) of ``wandb_internal_pb2.Record`` messages.

    wandb's service process writes that file on its own; on a busy machine its last records
    can land after ``finish()`` returned, so the file is read again (up to ``patience_s``)
    until it holds ``at_least`` history rows. What the rows hold is the caller's to check."""
    import time

    deadline = time.monotonic() + patience_s
    while True:
        rows = _wandb_rows(run_dir)
        if len(rows) >= at_least or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _wandb_rows(run_dir: str | Path) -> list[dict[str, float]]:
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("run-*.wandb")
    data, block = path.read_bytes(), 32768
    pos, part, rows = 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and n == 0:  # zero padding to the block's end
            pos += left - 7
            continue
        part += data[pos:pos + n]
        pos += n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(part)
            part = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({it.key or "/".join(it.nested_key): json.loads(it.value_json)
                             for it in rec.history.item})
    return rows


def collect_run(collector, stop_after: int | None = None):
    """Run ``collector`` to the end, or stop consuming after ``stop_after`` trajectories
    (the rest of the run is abandoned, as a crash would); its summary (None where stopped
    before the end: the rows handed out are committed, the summary says ``interrupted``).
    The collector is closed either way."""
    import contextlib

    from agentgym.engine.loop import run

    async def main():
        seen = 0
        async with contextlib.aclosing(collector.stream()) as it:
            async for _ in it:
                seen += 1
                if stop_after is not None and seen >= stop_after:
                    break
        summary = collector.summary
        return None if summary is None or summary.get("interrupted") else summary

    try:
        return run(main())
    finally:
        collector.close()

