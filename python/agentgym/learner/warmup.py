"""Format warm-up: a short causal-LM pass on transcripts of a UNIFORMLY RANDOM policy.

A freshly initialised tiny model cannot even produce ``Action: move north<|im_end|>``, so RL
would spend its budget discovering the output format. :func:`warmup_model` teaches the
format, not a strategy: episodes are played with actions drawn uniformly at random from the
env's action vocabulary (the union of every valid action seen so far, so for the maze all
four moves, walls included — no oracle and no filtering by outcome), rendered exactly as the
rollout engine renders them (:class:`~agentgym.engine.chat.ChatFormatter`: chat template
once, then ``Action: <a>`` + end-of-turn + the wrapped observation per turn; with a
``reply_prefix``, as rollouts with ``RolloutConfig.reply_prefix``: the prefix closes the
prompt and each observation and the policy writes the rest of its action) and fitted with
next-token cross-entropy on the policy's tokens (each action and its end-of-turn token;
``loss_on="all"``: on every token). After it, the model's policy is the random
policy, so whatever success rate RL adds on top is RL's. A vision-language model on a
native env with image observations sees each observation's picture as in a rollout (its
markup before the text, the pixels beside the tokens; the markup is never a target).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from agentgym.engine.config import ConfigError, ConfigSection
from agentgym.progress import progress_bar

log = logging.getLogger(__name__)

__all__ = ["WarmupConfig", "WarmupError", "WarmupInterrupted", "random_policy_transcripts",
           "warmup_model"]


class WarmupConfig(ConfigSection):
    """Knobs of :func:`warmup_model`: the ``warmup`` section of a training config (a typed
    section: an unknown key or a wrong type is refused where the config is loaded, named
    ``warmup.<key>``). ``max_turns``, ``reply_prefix`` and ``seed`` left None follow the
    run (the trainer sets its last stage's horizon, its rollouts' reply prefix and its
    seed; :func:`warmup_model` alone uses 8, no prefix and 0)."""

    config_path: ClassVar[str] = "warmup"

    episodes: int = 512
    #: Turns of each random-policy episode (None: the run's last stage; alone: 8).
    max_turns: int | None = None
    steps: int = 300
    batch_size: int = 16
    #: Padded tokens per step: fewer rows than ``batch_size`` when transcripts are long (a
    #: Python env's long observations), so a step costs about the same on every env.
    max_tokens_per_step: int = 8192
    #: ``"actions"``: next-token loss on the policy's tokens only (each action and its
    #: end-of-turn token), which teaches the format where long observations would dominate
    #: the loss; ``"all"``: on every token.
    loss_on: str = "actions"
    #: Padded tokens over the whole warm-up: fewer steps than ``steps`` on envs whose
    #: transcripts are long (the format is learned from the turns, not from the text).
    max_tokens: int = 600_000
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_frac: float = 0.05
    action_template: str = "Action: {action}"
    #: ``RolloutConfig.reply_prefix`` of the rollouts this model will play: text that opens
    #: every assistant turn as prompt, not as the policy's reply (the part of an action that
    #: repeats it is left out of the reply). None: the run's (alone: none).
    reply_prefix: str | None = None
    #: None: the run's seed (alone: 0).
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.loss_on not in ("all", "actions"):
            raise ConfigError(f"warmup.loss_on must be 'all' or 'actions', got "
                              f"{self.loss_on!r}")
        for name in ("episodes", "steps", "batch_size", "max_tokens_per_step", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"warmup.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ConfigError(f"warmup.max_turns must be >= 1, got {self.max_turns}")


class WarmupError(ConfigError):
    """The warm-up cannot teach anything: the env gave it no action to draw (an env without
    ``valid_actions()``). The message says what to do."""


class WarmupInterrupted(Exception):
    """The warm-up stopped at a step boundary because ``stop`` was set (Ctrl-C)."""


def _no_actions(envs: list[str]) -> str:
    return (f"the format warm-up has nothing to learn from: env {', '.join(envs)} gave no "
            "valid_actions() to draw random actions from; give the env a valid_actions() "
            "method, or train without the warm-up (warmup: null, --no-warmup)")


def random_policy_transcripts(
    env_id: str,
    tokenizer: Any,
    *,
    episodes: int,
    max_turns: int,
    env_kwargs: dict | None = None,
    action_template: str = "Action: {action}",
    system_prompt: str | None = None,
    seed: int = 0,
    num_tasks: int | None = None,
    with_masks: bool = False,
    vision=None,
    reply_prefix: str = "",
    stop: threading.Event | None = None,
    stats: dict[str, Any] | None = None,
):
    """Token ids of ``episodes`` episodes of env ``env_id`` played by a uniformly random
    policy over the env's action vocabulary, formatted like rollouts. Episode ``i`` plays
    task ``i % num_tasks`` (``i`` when ``num_tasks`` is None). ``with_masks``: a list of
    ``(ids, mask)`` pairs instead, ``mask[t] == 1`` on the policy's tokens (each action and
    its end-of-turn token).

    ``vision`` (a :class:`~agentgym.models.vision.VisionSpec`) with a native env built with
    image observations: each observation's picture is shown as in a rollout (its markup
    before the text) and the pairs become ``(ids, mask, frames)`` triples, ``frames`` the
    pictures of the markup spans in order.

    ``reply_prefix`` (``RolloutConfig.reply_prefix``) closes the first prompt and every
    observation, and each reply is the action text after it (an action text that does not
    start with it is kept whole).

    ``stop`` (set from another thread, e.g. on Ctrl-C) ends the generation at the next turn
    with :class:`WarmupInterrupted`. ``stats`` (a dict) gets ``"actions"``: how many
    distinct actions the env offered (0: an env without ``valid_actions()``, whose
    transcripts teach no action)."""
    from agentgym.engine.chat import ChatFormatter
    from agentgym.envs.registry import is_game, is_native
    from agentgym.parse import after_reply_prefix
    from agentgym.pool import EnvPool

    if is_game(env_id):  # random legal moves: never without actions
        if stats is not None:
            stats["actions"] = -1
        return _game_transcripts(env_id, tokenizer, episodes, max_turns, env_kwargs or {},
                                 system_prompt, seed, num_tasks, with_masks, reply_prefix)
    fmt = ChatFormatter(tokenizer)
    n = min(episodes, 256)
    if is_native(env_id):
        pool = EnvPool(env_id, n, seed=seed, **(env_kwargs or {}))
    else:
        pool = _GymPool(env_id, n, seed=seed, **(env_kwargs or {}))
    shows = vision is not None and getattr(pool, "frame_shape", None) is not None
    pictures: list[list] = []

    def shown(ids: list[int], texts: list[str]) -> list[str]:
        """``texts`` with their pictures' markup, the pictures kept per episode."""
        if not shows:
            return texts
        out = []
        for i, text, frame in zip(ids, texts, pool.frames(ids)):
            if isinstance(frame, BaseException):
                raise frame
            if frame is None:
                out.append(text)
                continue
            pictures[i].append(frame)
            out.append(vision.observation(text, frame.shape[0], frame.shape[1]))
        return out

    system = pool.instructions if system_prompt is None else system_prompt
    rng = random.Random(seed)
    vocab: list[str] = []
    seen: set[str] = set()
    out: list = []
    task = 0
    while len(out) < episodes:
        k = min(n, episodes - len(out))
        ids = list(range(k))
        tasks = [t % num_tasks if num_tasks else t for t in range(task, task + k)]
        obs = pool.reset(ids, tasks=tasks, max_turns=[max_turns] * k)
        task += k
        pictures = [[] for _ in ids]
        obs = shown(ids, obs)
        seqs = [fmt.initial_prompt(system, o, reply_prefix) for o in obs]
        masks = [[0] * len(x) for x in seqs]
        live = list(ids)
        for _turn in range(max_turns):
            if not live:
                break
            if stop is not None and stop.is_set():
                raise WarmupInterrupted("the warm-up was interrupted while it played "
                                        "its transcripts")
            for i in live:
                for a in pool.valid_actions(i):
                    if a not in seen:
                        seen.add(a)
                        vocab.append(a)
            actions = [rng.choice(vocab) if vocab else "" for _ in live]
            o, _r, term, trunc = pool.step(live, actions)
            going, going_obs = [], []
            for j, i in enumerate(live):
                act = fmt.encode(after_reply_prefix(action_template.format(action=actions[j]),
                                                    reply_prefix))
                seqs[i] += act
                seqs[i].append(fmt.end_of_turn_id)
                masks[i] += [1] * (len(act) + 1)
                if not (term[j] or trunc[j]):
                    going.append(i)
                    going_obs.append(o[j])
            for i, ob_ids in zip(going, fmt.observation_ids(shown(going, going_obs),
                                                            reply_prefix)):
                seqs[i] += ob_ids
                masks[i] += [0] * len(ob_ids)
            live = going
        if live:
            pool.finish(live, "horizon")
        if shows:
            out.extend(zip(seqs, masks, pictures))
        else:
            out.extend(zip(seqs, masks) if with_masks else seqs)
    if stats is not None:
        stats["actions"] = len(vocab)
    return out


def _game_transcripts(game_id: str, tokenizer: Any, episodes: int, max_turns: int,
                      env_kwargs: dict, system_prompt: str | None, seed: int,
                      num_tasks: int | None, with_masks: bool, reply_prefix: str = ""):
    """:func:`random_policy_transcripts` of a multi-seat game: the rollout engine's own
    self-play episodes with a random legal move in every seat (``Action: <move>`` replies),
    each seat's record a transcript (episode ``i`` plays task ``i % num_tasks``)."""
    import concurrent.futures

    from agentgym.backends.scripted import ScriptedBackend
    from agentgym.engine import RolloutEngine

    engine = RolloutEngine(ScriptedBackend(tokenizer, "random", seed=seed,
                                           reply_prefix=reply_prefix), tokenizer,
                           max_turns=max_turns, opponent="self", seed=seed, progress=False,
                           system_prompt=system_prompt, reply_prefix=reply_prefix)
    try:
        tasks = [i % num_tasks if num_tasks else i for i in range(episodes)]
        # its own event loop on a thread: the trainer calls this from inside its loop
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            batch = ex.submit(engine.collect_sync, tasks, game_id,
                              env_kwargs=env_kwargs).result()
    finally:
        engine.close()
    out = [(t.token_ids, t.loss_mask) for t in batch.trajectories if t.num_turns]
    return out if with_masks else [ids for ids, _ in out]


class _GymPool:
    """The slice of the ``EnvPool`` API the transcript generator uses, over Python envs."""

    def __init__(self, env_id: str, n: int, seed: int = 0, **kw):
        import agentgym

        self.envs = [agentgym.make(env_id, **kw) for _ in range(n)]
        u = self.envs[0].unwrapped
        self.instructions = getattr(self.envs[0], "instructions", "") or getattr(
            u, "instructions", "")
        self.seed = seed
        self.turns = [0] * n
        self.caps = [None] * n

    def reset(self, ids, tasks, max_turns):
        out = []
        for i, t, h in zip(ids, tasks, max_turns):
            obs, _ = self.envs[i].reset(seed=self.seed + int(t), options={"task": t})
            self.turns[i], self.caps[i] = 0, h
            out.append(str(obs))
        return out

    def valid_actions(self, i):
        fn = getattr(self.envs[i].unwrapped, "valid_actions", None)
        return list(fn()) if fn else []

    def step(self, ids, actions):
        obs, rew, term, trunc = [], [], [], []
        for i, a in zip(ids, actions):
            o, r, te, tr, _ = self.envs[i].step(a)
            self.turns[i] += 1
            tr = tr or (self.caps[i] is not None and self.turns[i] >= self.caps[i])
            obs.append(str(o))
            rew.append(r)
            term.append(bool(te))
            trunc.append(bool(tr) and not te)
        return obs, np.array(rew, np.float32), np.array(term), np.array(trunc)

    def finish(self, ids, reason):
        return None


def warmup_model(
    model_dir: str | Path,
    out_dir: str | Path,
    env_id: str | list[str],
    *,
    env_kwargs: dict | None = None,
    config: WarmupConfig | None = None,
    system_prompt: str | None = None,
    progress: bool = False,
    num_tasks: int | None = None,
    stop: threading.Event | None = None,
) -> dict[str, float]:
    """Fit the model in ``model_dir`` on random-policy transcripts of ``env_id`` (a list of
    ids: ``episodes`` transcripts of each, same ``env_kwargs`` and ``num_tasks``) (tasks
    ``0 .. num_tasks - 1``, repeated as needed) and save it (with its tokenizer) to
    ``out_dir``. Returns ``{"warmup/steps", "warmup/rows_per_step", "warmup/loss_start",
    "warmup/loss_end", "warmup/seconds"}``.

    :class:`WarmupError` (one line) when no env offers an action to draw
    (``valid_actions()``): the transcripts would teach an empty action; an env among
    several without actions is logged. ``stop`` (a ``threading.Event`` set from another
    thread: the trainer sets it on Ctrl-C) ends the warm-up at its next step with
    :class:`WarmupInterrupted`; run the warm-up off the event loop for that
    (``asyncio.to_thread``), as the trainer does."""
    import torch
    from transformers import AutoTokenizer

    from agentgym.models.vision import VisionSpec, copy_processor_files, policy_class

    cfg = config or WarmupConfig()
    seed = 0 if cfg.seed is None else cfg.seed
    max_turns = 8 if cfg.max_turns is None else cfg.max_turns
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = policy_class(model_dir).from_pretrained(str(model_dir), dtype=torch.float32)
    vision = VisionSpec.from_model(model_dir)
    envs = [env_id] if isinstance(env_id, str) else list(env_id)
    pairs: list = []
    silent: list[str] = []
    for env in envs:
        stats: dict[str, Any] = {}
        pairs += random_policy_transcripts(
            env, tok, episodes=cfg.episodes, max_turns=max_turns, env_kwargs=env_kwargs,
            action_template=cfg.action_template, system_prompt=system_prompt, seed=seed,
            num_tasks=num_tasks, with_masks=True, vision=vision,
            reply_prefix=cfg.reply_prefix or "", stop=stop, stats=stats)
        if stats.get("actions") == 0:
            silent.append(env)
    if silent and len(silent) == len(envs):
        raise WarmupError(_no_actions(silent))
    if silent:
        log.warning("warm-up: %s", _no_actions(silent))
    seqs = [pair[0] for pair in pairs]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    longest = max(len(s) for s in seqs)
    rows_per_step = max(1, min(cfg.batch_size, len(seqs), cfg.max_tokens_per_step // longest))
    steps = max(1, min(cfg.steps, cfg.max_tokens // (rows_per_step * longest)))
    warm = max(1, int(cfg.warmup_frac * steps))

    def lr_at(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = np.random.default_rng(seed)
    model.train()
    losses: list[float] = []
    bar = None
    if progress:
        bar = progress_bar(steps, "warm-up (random-policy LM)", "step", show=True)
    for step in range(steps):
        if stop is not None and stop.is_set():
            if bar is not None:
                bar.close()
            raise WarmupInterrupted(f"the warm-up was interrupted at step {step} of {steps}")
        rows = rng.choice(len(seqs), size=rows_per_step, replace=False)
        batch = [seqs[i] for i in rows]
        width = max(len(s) for s in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        train = torch.zeros((len(batch), width), dtype=torch.bool)
        for i, row in enumerate(rows):
            s, policy = pairs[row][:2]
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
            train[i, : len(s)] = True if cfg.loss_on == "all" else torch.tensor(policy).bool()
        labels = ids.masked_fill(~train, -100)
        # the image markup is input, never a target; the pictures go in beside it
        frames = [f for row in rows for f in (pairs[row][2] if len(pairs[row]) > 2 else ())]
        pixels = vision.pixel_inputs(frames) if frames else {}
        if vision is not None:
            labels = labels.masked_fill(torch.isin(ids, torch.tensor(vision.input_only_ids)),
                                        -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, **pixels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if bar is not None:
        bar.close()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    copy_processor_files(model_dir, out)
    k = max(1, min(20, len(losses) // 5))
    return {"warmup/steps": float(steps), "warmup/rows_per_step": float(rows_per_step),
            "warmup/loss_start": float(np.mean(losses[:k])),
            "warmup/loss_end": float(np.mean(losses[-k:])),
            "warmup/seconds": time.perf_counter() - t0}
