"""The model the trainer-adapter tests generate with: the tiny model with its end-of-turn
logit raised, so that real sampled turns end on their own after a few tokens and episodes
run several turns (the untrained tiny model almost never emits the end-of-turn token; the
format warm-up that teaches it takes a minute here)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def turn_model_dir(tmp_path_factory, tiny_model_dir) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.models import IM_END

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    eot = tok.convert_tokens_to_ids(IM_END)
    with torch.no_grad():
        # A constant component on hidden unit 0 of every token embedding, read only by the
        # end-of-turn row of the output layer: about one turn in five ends per token.
        model.model.embed_tokens.weight[:, 0] += 0.02
        model.lm_head.weight[eot].zero_()
        model.lm_head.weight[eot, 0] = 5.0
    out = tmp_path_factory.mktemp("turn_model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
