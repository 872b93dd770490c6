"""Pure-Python baselines of the native envs, one module ``<env_id>_py`` each.

Interface (shared): ``make(**kwargs) -> Env``; ``Env.reset(task: int, seed: int) -> str``;
``Env.step(action: str) -> tuple[str, float, bool]`` (observation, reward, terminated);
``Env.valid_actions() -> list[str]``. One object per episode, as AgentGym's servers keep them.
"""
