"""The tiny model's tokenizer corpus."""

from agentgym.models.corpus import build_corpus


def test_corpus_is_deterministic_and_env_flavoured():
    a, b = build_corpus(seed=3), build_corpus(seed=3)
    assert a == b
    text = "\n".join(a)
    for word in ("Thought:", "Action:", "craft", "move", "guess"):
        assert word in text
