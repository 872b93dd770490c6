"""Micro-batch planning under a token budget and collation of packed rows into padded,
next-token-shifted tensors."""

import numpy as np
import pytest

from agentgym.data import pack
from agentgym.learner.microbatch import collate, plan_micro_batches
from tests.helpers import make_trajectory


def test_micro_batch_plan_respects_budget_and_sorts():
    lengths = np.array([5, 100, 7, 90, 6, 8])
    plan = plan_micro_batches(lengths, 200)
    assert [p.tolist() for p in plan] == [[1, 3], [5, 2, 4, 0]]
    for p in plan:
        assert len(p) * lengths[p].max() <= 200
    # an over-long sequence gets its own micro-batch; max_seqs caps the count
    assert [p.tolist() for p in plan_micro_batches(lengths, 50)][0] == [1]
    assert all(len(p) <= 2 for p in plan_micro_batches(lengths, 10_000,
                                                       max_seqs_per_microbatch=2))


def test_collate_shifts_masks_for_next_token_prediction():
    pytest.importorskip("torch")
    batch = pack([make_trajectory([11, 12, 13, 14], [0, 1, 0, 1], logprobs=[0, -0.5, 0, -0.25]),
                  make_trajectory([21, 22], [0, 1], logprobs=[0, -1.0])])
    adv = np.arange(6, dtype=np.float32)
    mb = collate(batch, np.array([0, 1]), {"advantages": adv}, pad_token_id=0)
    assert mb.input_ids.tolist() == [[11, 12, 13, 14], [21, 22, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert mb.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert mb.old_logprobs.tolist() == [[-0.5, 0, -0.25], [-1.0, 0, 0]]
    assert mb.advantages.tolist() == [[1, 0, 3], [5, 0, 0]]
