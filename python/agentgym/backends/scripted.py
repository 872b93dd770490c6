"""``ScriptedBackend``: a policy that answers instantly from the environment.

It plays the env's oracle action (or a uniformly random valid action) formatted as
``Action: <action>`` and encoded with the real tokenizer, plus the end-of-turn token. No
model runs, so the rollout engine's own overhead can be measured and tested in isolation.
It needs the engine's episode context (``needs_context = True``): the engine passes
``context=(driver, slot, episode_seed, sample_index)`` to ``generate``.
"""

from __future__ import annotations

import asyncio
import random
import zlib

from agentgym.backends.base import BackendError, GenerateResult, SamplingParams
from agentgym.parse import REPLY_TEMPLATE, reply_text


class ScriptedBackend:
    """Instant oracle/random policy. ``policy`` is ``"oracle"`` (falling back to a random
    valid action where the env has no oracle) or ``"random"``; the oracle policy refuses an
    env that gives neither an oracle action nor valid actions, each reply a
    :class:`BackendError` naming it (the episode ends ``backend_error``). A random choice is
    seeded by (``seed``, the episode's env seed and sample index, the prompt's length), so
    the same episode request replays the same episode. Logprobs are reported as 0.0 (the
    scripted policy is not a distribution over tokens). ``latency_s`` > 0 makes every
    reply take that long (an inference server's latency, without its compute).
    ``reply_prefix`` is the text the engine opens every assistant turn with
    (``RolloutConfig.reply_prefix``): a reply whose text starts with it continues it instead
    (``Action: 5`` after the prompt's ``Action:`` is written `` 5``)."""

    needs_context = True

    def __init__(self, tokenizer, policy: str = "oracle", seed: int = 0,
                 template: str = REPLY_TEMPLATE, end_of_turn: str | None = None,
                 latency_s: float = 0.0, reply_prefix: str = ""):
        if policy not in ("oracle", "random"):
            raise ValueError(f"policy must be 'oracle' or 'random', got {policy!r}")
        self.tokenizer = tokenizer
        self.policy = policy
        self.seed = seed
        self.template = template
        self.latency_s = float(latency_s)
        self.reply_prefix = reply_prefix
        eot = end_of_turn or tokenizer.eos_token
        self.end_of_turn_id = int(tokenizer.convert_tokens_to_ids(eot))
        self.policy_version = 0
        self.requests = 0
        #: action -> (token ids, logprobs, whole-reply result), shared by all its answers.
        self._cache: dict[str, tuple[list[int], list[float], GenerateResult]] = {}
        fast = getattr(tokenizer, "backend_tokenizer", None)
        self._encode = (lambda s: fast.encode(s, add_special_tokens=False).ids) if fast else (
            lambda s: tokenizer.encode(s, add_special_tokens=False))

    async def _random(self, context, turn_key: int) -> str:
        """A uniformly random valid action ("" if none; the oracle policy refuses an env
        that gives neither an oracle action nor valid actions: :class:`BackendError` naming
        it, rather than playing empty actions)."""
        driver, slot, episode_seed, sample_index = context
        valid = await driver.valid_actions(slot)
        if not valid:
            if self.policy == "oracle":
                env_id = getattr(driver, "env_id", "the env")
                raise BackendError(
                    f"ScriptedBackend: env {env_id!r} gives no oracle action and no valid "
                    "actions, so the oracle policy has nothing to play (a remote env answers "
                    "them only from this package's server, agentgym-rl serve-env)")
            return ""
        key = f"{self.seed}:{episode_seed}:{sample_index}:{turn_key}"
        return valid[random.Random(zlib.crc32(key.encode())).randrange(len(valid))]

    async def generate(self, prompt_ids, sampling: SamplingParams, request_id: str | None = None,
                       context=None, *, images=None) -> GenerateResult:
        """Answer from the env through ``context``; ``images`` (frames of the prompt's image
        markup) are accepted and ignored: the oracle reads the env, not the picture."""
        if context is None:
            raise BackendError("ScriptedBackend needs the engine's episode context")
        self.requests += 1
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        driver, slot = context[0], context[1]
        action = await driver.oracle_action(slot) if self.policy == "oracle" else None
        if action is None:
            action = await self._random(context, len(prompt_ids))
        hit = self._cache.get(action)
        if hit is None or hit[2].policy_version != self.policy_version:
            text = reply_text(action, self.reply_prefix, self.template)
            ids = self._encode(text) + [self.end_of_turn_id]
            if len(self._cache) > 65536:
                self._cache.clear()
            lps = [0.0] * len(ids)
            hit = self._cache[action] = (ids, lps, GenerateResult(
                token_ids=ids, logprobs=lps, finish_reason="stop",
                policy_version=self.policy_version))
        ids, logprobs, whole = hit
        if len(ids) > sampling.max_new_tokens:
            n = sampling.max_new_tokens
            return GenerateResult(token_ids=ids[:n], logprobs=logprobs[:n], finish_reason="length",
                                  policy_version=self.policy_version)
        # The result and its lists are shared by every answer of the same action: treat
        # them as read-only (the engine does).
        return whole

    async def abort(self, request_id: str) -> None:
        return None

    async def update_weights(self, state_dict_or_path) -> None:
        self.policy_version += 1

    async def close(self) -> None:
        return None
