"""Trainer checkpoints: model (Hugging Face folder), optimizer(s), trainer state and RNGs.

Layout of one checkpoint folder ``<output>/checkpoints/step_<N>/``:

* ``model/`` — ``save_pretrained`` weights + config + tokenizer (loadable by every backend
  and by ``agentgym-rl eval --model``),
* ``critic.pt`` — the PPO critic's state dict (PPO only),
* ``optim.pt`` — optimizer (and critic optimizer) state dicts (one process and ``ddp``),
* ``dcp/`` — under a sharded strategy (``fsdp``, ``hsdp``): the policy's, the optimizer's
  (and the critic's) shards, written by every rank with ``torch.distributed.checkpoint``,
  which a run of any world size reads back into its own shards,
* ``adapter/`` — a LoRA run's adapter (peft's folder); ``model/`` then holds the base
  weights with the adapter merged, so every backend and ``eval`` load it as a plain model,
* ``trainer_state.pt`` — step, policy version, horizon schedule state, task sampler state,
  the torch/numpy/python RNG states and the config it was written with,
* ``config.yaml`` — that config as readable YAML (the trainer writes it; ``--resume``
  reads it: :func:`checkpoint_config`).

``latest`` (a text file in ``checkpoints/``) names the newest complete checkpoint; a
checkpoint is written to a temporary folder, fsynced and renamed (then ``latest`` the same
way), so a crash never leaves a half-written one behind ``latest``.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.models.vision import copy_processor_files
from agentgym.runtime.files import fsync_tree, write_text_atomic

__all__ = ["capture_rng", "checkpoint_config", "find_checkpoint", "load_checkpoint",
           "restore_rng", "save_checkpoint"]


def capture_rng() -> dict[str, Any]:
    """The global torch (CPU and CUDA), numpy and python RNG states."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    critic: torch.nn.Module | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    keep: int | None = 2,
    model_dir: str | Path | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    critic_weights: dict[str, torch.Tensor] | None = None,
    extras: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` (``root/step_<step>``) and point ``latest``
    at it; keep only the newest ``keep`` checkpoints (None keeps all). ``model_dir``: the
    folder the model came from, whose processor files (a vision-language model's image
    processor) the checkpoint's model folder gets too. ``weights`` / ``critic_weights``:
    the state dicts to write instead of the modules' own (gathered shards, LoRA merged into
    the base weights); ``optimizer`` None writes no ``optim.pt`` (a sharded run's optimizer
    is in ``dcp/``); ``extras(folder)`` writes more into the folder before it is renamed."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    base.save_pretrained(tmp / "model", state_dict=weights, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    if model_dir is not None:
        copy_processor_files(model_dir, tmp / "model")
    if optimizer is not None:
        optim = {"optimizer": optimizer.state_dict()}
        if critic_optimizer is not None:
            optim["critic_optimizer"] = critic_optimizer.state_dict()
        torch.save(optim, tmp / "optim.pt")
    if critic is not None:
        torch.save(critic_weights if critic_weights is not None else critic.state_dict(),
                   tmp / "critic.pt")
    if extras is not None:
        extras(tmp)
    torch.save({**state, "rng": capture_rng()}, tmp / "trainer_state.pt")
    fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    write_text_atomic(root / "latest", final.name + "\n")
    if keep is not None:
        olds = sorted((p for p in root.glob("step_*") if p.is_dir()),
                      key=lambda p: int(p.name.split("_")[1]))
        for p in olds[:-keep] if keep > 0 else []:
            if p != final:
                shutil.rmtree(p, ignore_errors=True)
    return final


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a checkpoint folder: a ``step_<N>`` folder itself, a ``checkpoints`` folder
    (its ``latest``), or a run's output folder (its ``checkpoints/latest``)."""
    p = Path(path)
    for cand in (p, p / "checkpoints"):
        if (cand / "trainer_state.pt").is_file():
            return cand
        latest = cand / "latest"
        if latest.is_file():
            return cand / latest.read_text(encoding="utf-8").strip()
    raise FileNotFoundError(f"no checkpoint at {p} (expected trainer_state.pt or latest)")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint: ``{"dir", "model_dir", "state", "optim", "critic"}`` (``optim``
    None for a sharded run's, whose optimizer is in ``dir/dcp``; RNG states
    are in ``state["rng"]``; call :func:`restore_rng` to apply them)."""
    ckpt = find_checkpoint(path)
    out: dict[str, Any] = {"dir": ckpt, "model_dir": ckpt / "model"}
    out["state"] = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    optim = ckpt / "optim.pt"
    out["optim"] = torch.load(optim, weights_only=False) if optim.is_file() else None
    critic = ckpt / "critic.pt"
    out["critic"] = torch.load(critic, weights_only=True) if critic.is_file() else None
    out["config"] = checkpoint_config(ckpt, state=out["state"])
    return out


def checkpoint_config(path: str | Path, *, state: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """The training config a checkpoint (or a run folder's latest one) was written with,
    as a mapping: its ``config.yaml``; for a checkpoint written before there was one, the
    config in ``trainer_state.pt`` (old flat spellings included: ``TrainerConfig.from_dict``
    reads them). FileNotFoundError when there is no checkpoint."""
    ckpt = find_checkpoint(path)
    yml = ckpt / "config.yaml"
    if yml.is_file():
        import yaml

        return dict(yaml.safe_load(yml.read_text(encoding="utf-8")) or {})
    if state is None:
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    return dict(state.get("config") or {})
