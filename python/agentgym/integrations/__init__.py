"""Adapters that embed the rollout engine in other RL trainers, one module per trainer:
``verl`` (an agent loop and its dataset rows), ``trl`` (a ``GRPOTrainer`` ``rollout_func``)
and ``skyrl`` (skyrl-gym envs and a SkyRL generator). Each imports its trainer's package,
installed by the extra of the same name; this package itself imports none of them."""
