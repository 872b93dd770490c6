"""TRL's own multi-turn loop vs the agentgym ``rollout_func``: trajectories per second on the
same multi-turn workload, same model, same run.

    python bench/trl_rollout.py --json [--tasks 8] [--num-generations 4] [--max-turns 4]
                                [--max-new-tokens 16] [--repeats 2] [--model DIR]

Both paths play maze episodes (the same tasks, horizon and tokens per turn, temperature 1)
with one ``trl.GRPOTrainer``'s model on CPU:

- ``trl_loop``: TRL's multi-turn structure, as its tool loop (``_tool_call_loop``) runs it:
  one batched ``GRPOTrainer._generate_single_turn`` call for every live episode per turn,
  then the envs step and every context gets the reply and the templated observation; the
  next turn waits for the whole batch. A turn cut at the token cap without its end-of-turn
  token ends the episode (the engine's rule too).
- ``agentgym``: ``AgentGymRollout`` as the trainer's ``rollout_func`` (the engine: one
  coroutine per episode, the transformers backend batching whatever is in flight).

Without ``--model`` the local tiny model is built with its end-of-turn logit raised so that
sampled turns end after a few tokens (the untrained model almost never ends a turn). Each
path runs ``--repeats`` times, interleaved; ``trajectories_per_s`` is the best run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import warnings

import numpy as np


def turn_model(out_dir: str) -> str:
    """The tiny model whose end-of-turn logit reads a constant embedding component."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.models import IM_END, build_tiny_model

    src = str(build_tiny_model(os.path.join(out_dir, "tiny"), seed=0))
    tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
    eot = tok.convert_tokens_to_ids(IM_END)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 0.02
        model.lm_head.weight[eot].zero_()
        model.lm_head.weight[eot, 0] = 5.0
    out = os.path.join(out_dir, "turn")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def trl_loop(trainer, env_id: str, tasks: list[int], n: int, max_turns: int) -> dict:
    """TRL's per-turn barrier loop over ``len(tasks) * n`` episodes (module docs)."""
    import agentgym
    from agentgym.engine.chat import ChatFormatter
    from agentgym.parse import parse_actions

    tok = trainer.processing_class
    fmt = ChatFormatter(tok)
    eot = fmt.end_of_turn_id
    pool = agentgym.EnvPool(env_id, len(tasks) * n, seed=0, max_turns=max_turns)
    episode_tasks = [t for t in tasks for _ in range(n)]
    obs = pool.reset(tasks=episode_tasks)
    ctx = [fmt.initial_prompt(pool.instructions, o) for o in obs]
    turns = [0] * len(ctx)
    live = list(range(len(ctx)))
    cap = trainer.max_completion_length
    t0 = time.perf_counter()
    while live:
        replies, _ = trainer._generate_single_turn([ctx[i] for i in live], None, {}, 1)
        ended = [bool(r) and r[-1] == eot for r in replies]
        texts = tok.batch_decode([r[:-1] if e else r for r, e in zip(replies, ended)])
        actions = [a if a is not None else t for a, t in zip(parse_actions(texts), texts)]
        go = [k for k, i in enumerate(live) if ended[k] or len(replies[k]) < cap]
        for k, i in enumerate(live):
            ctx[i].extend(replies[k])
        stepped = [live[k] for k in go]
        for i in stepped:  # turns that reached the env (the engine's num_turns)
            turns[i] += 1
        nxt = []
        if stepped:
            o, _, term, trunc = pool.step(stepped, [actions[k] for k in go])
            obs_ids = fmt.observation_ids(list(o))
            for j, i in enumerate(stepped):
                if not ended[go[j]]:
                    ctx[i].append(eot)
                if not (term[j] or trunc[j]):
                    ctx[i].extend(obs_ids[j])
                    nxt.append(i)
        live = nxt
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "episodes": len(ctx), "trajectories_per_s": len(ctx) / wall,
            "turns_mean": float(np.mean(turns))}


def agentgym_path(trainer, rollout, env_id: str, tasks: list[int], n: int) -> dict:
    from agentgym.integrations.trl import prompt_messages

    prompts = [prompt_messages(env_id, t) for t in tasks for _ in range(n)]
    t0 = time.perf_counter()
    rollout(prompts, trainer)
    wall = time.perf_counter() - t0
    trajs = rollout.last_trajectories
    return {"wall_s": wall, "episodes": len(trajs), "trajectories_per_s": len(trajs) / wall,
            "turns_mean": float(np.mean([t.num_turns for t in trajs]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="maze")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

    from agentgym.integrations.trl import AgentGymRollout, env_reward

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or turn_model(tmp)
        rollout = AgentGymRollout(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                                  max_total_tokens=4096)
        n = args.num_generations
        cfg = GRPOConfig(output_dir=os.path.join(tmp, "out"), per_device_train_batch_size=n,
                         num_generations=n, max_completion_length=args.max_new_tokens,
                         report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                         temperature=1.0, seed=0)
        trainer = GRPOTrainer(model=model, args=cfg, reward_funcs=env_reward,
                              train_dataset=AgentGymRollout.dataset(args.env, range(args.tasks)),
                              rollout_func=rollout)
        trainer.model.eval()
        tasks = list(range(args.tasks))
        runs: dict[str, list[dict]] = {"trl_loop": [], "agentgym": []}
        agentgym_path(trainer, rollout, args.env, tasks[:1], n)  # load the backend once
        for _ in range(args.repeats):
            runs["trl_loop"].append(trl_loop(trainer, args.env, tasks, n, args.max_turns))
            runs["agentgym"].append(agentgym_path(trainer, rollout, args.env, tasks, n))
        rollout.close()

    best = {k: max(r["trajectories_per_s"] for r in v) for k, v in runs.items()}
    result = {
        "bench": "trl_rollout", "env": args.env, "episodes": args.tasks * n,
        "num_generations": n, "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens, "model": args.model or "tiny (turn-ending)",
        "trajectories_per_s": best, "speedup": best["agentgym"] / best["trl_loop"],
        "runs": runs, "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
