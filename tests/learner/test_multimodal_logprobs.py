"""The learner recomputes the logprobs of image episodes over the inputs the backend saw:
the packed rows' frames become the model's pixel inputs in each micro-batch."""

from __future__ import annotations

import numpy as np
import pytest

from agentgym.learner.microbatch import make_micro_batches
from agentgym.learner.update import compute_logprobs

torch = pytest.importorskip("torch")


def test_recomputed_logprobs_of_image_episodes_match_the_backends(tiny_vl_dir):
    from agentgym.engine.runner import open_runner

    opened = open_runner("transformers", tiny_vl_dir, max_concurrency=4, max_turns=3,
                         max_new_tokens=6, max_total_tokens=2048, temperature=1.0,
                         backend_kwargs={"seed": 0})
    try:
        batch = opened.runner.collect_sync(4, "maze", env_kwargs={"obs": "image",
                                                                  "difficulty": "easy"})
        model = opened.runner.backend.model
    finally:
        opened.runner.close()
    pb = batch.packed()
    assert pb.images is not None and all(r.refs for r in pb.images)
    model.eval()

    def recompute(blind: bool) -> np.ndarray:
        out = np.zeros(pb.num_tokens, np.float32)
        for mb in make_micro_batches(pb, max_tokens_per_microbatch=4096):
            assert len(mb.images) == sum(len(pb.images[b].refs) for b in mb.indices)
            if blind:  # the same tokens, black pictures
                mb.images = [np.zeros_like(a) for a in mb.images]
            with torch.no_grad():
                logp, _ = compute_logprobs(model, mb, with_entropy=False)
            for row, b in enumerate(mb.indices):
                start, n = int(pb.offsets[b]), int(mb.lengths[row])
                out[start + 1:start + n] = logp[row, :n - 1].numpy()
        return out

    model_tokens = pb.loss_mask.astype(bool)
    assert model_tokens.sum() > 0
    got = recompute(blind=False)
    np.testing.assert_allclose(got[model_tokens], pb.logprobs[model_tokens], atol=2e-3)
    # the pictures are really read: other pictures, other logprobs of the same tokens
    assert np.abs(recompute(blind=True)[model_tokens] - got[model_tokens]).max() > 1e-3
