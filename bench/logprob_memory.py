"""Peak memory and time of the learner's log-prob head: the LM head, log-softmax, entropy
and their backward pass over the model tokens of a micro-batch, taken all at once
(``logprob_chunk_mib=0``) or in chunks (the default, 256 MiB of logits, is 1,365 tokens
here), at SmolLM2-135M's shape
(hidden 576, vocabulary 49,152) on this CPU in float32.

Each setting runs in its own process (so one setting's freed memory cannot hide another's
peak) and reports the process's peak resident memory above its state before the pass, the
wall time of forward + backward, and whether the logprobs and the head's gradient equal the
unchunked ones. Prints one JSON object.

    python bench/logprob_memory.py [--tokens 8192] [--chunks 0,512,2048]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

HIDDEN, VOCAB = 576, 49_152


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def one(tokens: int, chunk: int, repeats: int) -> dict:
    import torch

    from agentgym.learner.update import _head_logprobs

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    targets = torch.randint(0, VOCAB, (tokens,))
    base = _peak_kib()
    times = []
    for _ in range(repeats):
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        t0 = time.perf_counter()
        logp, ent = _head_logprobs(head, hidden, targets, 1.0, True, False, chunk)
        (logp.sum() + 0.01 * ent.sum()).backward()
        times.append(time.perf_counter() - t0)
    return {"chunk_tokens": chunk, "peak_mib_above_start": round((_peak_kib() - base) / 1024, 1),
            "seconds_best": round(min(times), 3), "logp_sum": float(logp.detach().sum()),
            "grad_sum": float(head.weight.grad.double().abs().sum())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192, help="model tokens in the micro-batch")
    ap.add_argument("--chunks", default="0,512,1365,2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.tokens, args.one, args.repeats)))
        return {}
    rows = []
    for chunk in [int(c) for c in args.chunks.split(",")]:
        out = subprocess.run([sys.executable, __file__, "--tokens", str(args.tokens),
                              "--repeats", str(args.repeats), "--one", str(chunk)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    ref = rows[0]
    for r in rows:
        r["logp_rel_diff"] = abs(r["logp_sum"] - ref["logp_sum"]) / abs(ref["logp_sum"])
        r["grad_rel_diff"] = abs(r["grad_sum"] - ref["grad_sum"]) / abs(ref["grad_sum"])
        r["peak_vs_unchunked"] = round(r["peak_mib_above_start"]
                                       / max(ref["peak_mib_above_start"], 1e-9), 3)
        r["time_vs_unchunked"] = round(r["seconds_best"] / ref["seconds_best"], 3)
    report = {"bench": "logprob_memory", "hidden": HIDDEN, "vocab": VOCAB,
              "model_tokens": args.tokens, "dtype": "float32",
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_avg": os.getloadavg()[0], "results": rows}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
