"""``agentgym-rl train``'s flags against the config tree: every flag sets a field that
exists (or is one of the few that set none), and an option ``train`` shares with ``collect``
is spelled the same in both."""

from __future__ import annotations

import argparse

from agentgym.cli import build_parser


def _options(name: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {flag: action for action in sub.choices[name]._actions
            for flag in action.option_strings if flag.startswith("--")}


def test_every_train_flag_names_a_config_field():
    from agentgym.cli.train import CLI_ONLY, FLAG_FIELDS
    from agentgym.learner.train_config import has_field

    flags = _options("train")
    for flag in flags:
        if flag in CLI_ONLY:
            continue
        assert flag in FLAG_FIELDS, (f"train {flag} names no config field: map it in "
                                     "agentgym.cli.train.FLAG_FIELDS (or CLI_ONLY)")
        assert has_field(FLAG_FIELDS[flag]), f"train {flag} -> {FLAG_FIELDS[flag]}: no such field"
    stale = (set(FLAG_FIELDS) | set(CLI_ONLY)) - set(flags)
    assert not stale, f"FLAG_FIELDS/CLI_ONLY name flags train does not have: {sorted(stale)}"


def test_a_new_flag_without_a_field_fails_the_check(monkeypatch):
    """The check above bites: a flag added without a field mapping is caught."""
    from agentgym.cli import train
    from agentgym.learner.train_config import has_field

    monkeypatch.setitem(train.FLAG_FIELDS, "--max-stepz", "max_stepz")
    assert not has_field(train.FLAG_FIELDS["--max-stepz"])


def test_train_spells_shared_options_as_collect_does():
    from agentgym.cli.args import ROLLOUT_FLAGS
    from agentgym.cli.train import FLAG_FIELDS

    train, collect = _options("train"), _options("collect")
    shared = {"--env", "--env-kwarg", "--model", "--backend", "--n-samples", "--max-turns",
              "--max-new-tokens", "--max-total-tokens", "--temperature", "--seed",
              "--system-prompt", "--max-concurrency", "--opponent", "--ray", "--num-workers",
              "--worker-cpus", "--worker-gpus", "--undo", "--reflection", "--branch-at",
              "--branch-width", "--plan", "--context-window"}
    assert shared <= set(collect), sorted(shared - set(collect))
    assert shared <= set(train), sorted(shared - set(train))
    # a rollout field train sets is set by collect's flag for it
    for field, flag in ROLLOUT_FLAGS.items():
        train_flags = {f for f, path in FLAG_FIELDS.items() if path == f"rollout.{field}"}
        if train_flags:
            assert flag in train_flags, (field, flag, train_flags)
