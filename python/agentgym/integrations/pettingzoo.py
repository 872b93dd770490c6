"""The native multi-seat games (``tictactoe``, ``kuhn_poker``, ``negotiation``;
``agentgym._core.Game``) as PettingZoo AEC environments: the field's multi-agent
convention, for users who bring their own agents or compare with other PettingZoo code.

Agents are named by their seat's role (``X``/``O``, ``first``/``second``, ``A``/``B``).
Observations and actions are text (:class:`~agentgym.envs.spaces.TextSpace`): an observation
is the seat's own view (the game never puts another seat's private information in it), an
action the move's text (``"5"``, ``"bet"``, ``"propose: book=1 hat=2 ball=0"``). A game's
rewards are final: every agent's reward is 0 until the game ends, then its return (an
unreadable or illegal move ends the game with -1 for its agent and 0 for the others).
``infos[agent]["valid_actions"]`` lists the legal moves of the agent to move and
``infos[agent]["oracle_action"]`` the reference strategy's (minimax, Kuhn's equilibrium, a
scripted negotiator). ``reset(seed, options={"task": i})`` picks the opening, deal or pool
(default: task 0); the same task and seed replay the same game.

    from agentgym.integrations.pettingzoo import GameAEC
    env = GameAEC("kuhn_poker")
    env.reset(seed=0, options={"task": 3})
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else info["oracle_action"])
"""

from __future__ import annotations

import json
from typing import Any

from pettingzoo import AECEnv

from agentgym import _core
from agentgym.envs.registry import list_envs
from agentgym.envs.spaces import TextSpace

__all__ = ["GameAEC", "game_ids"]

#: Longest observation or action text the spaces admit (a negotiation's longest view is
#: about 12,200 bytes).
MAX_TEXT = 16384


def game_ids() -> list[str]:
    """The native multi-seat games."""
    return list_envs(kind="game")


class GameAEC(AECEnv):
    """Native game ``game_id`` (keyword arguments: the game's own) as a PettingZoo AEC env."""

    metadata = {"name": "agentgym_game", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(self, game_id: str, render_mode: str | None = None, **kwargs: Any):
        super().__init__()
        self.game = _core.Game(game_id, json.dumps(kwargs))
        self.metadata = {**self.metadata, "name": game_id}
        self.render_mode = render_mode
        self.possible_agents = [self.game.role(s) for s in range(self.game.seats)]
        self._seat = {a: s for s, a in enumerate(self.possible_agents)}
        self.observation_spaces = {a: TextSpace(MAX_TEXT) for a in self.possible_agents}
        self.action_spaces = {a: TextSpace(MAX_TEXT) for a in self.possible_agents}
        self._task = 0
        self._seed = 0

    def observation_space(self, agent: str) -> TextSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self.action_spaces[agent]

    def instructions(self, agent: str) -> str:
        """The system prompt of ``agent``'s seat."""
        return self.game.instructions(self._seat[agent])

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self._seed = int(seed)
        self._task = int((options or {}).get("task", self._task))
        self.game.reset(self._task, self._seed)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._select()

    def _select(self) -> None:
        """The next agent to act: the seat to move, or (once over) the agents left to see
        their final reward, in seat order."""
        movers = self.game.to_move()
        if movers:
            self.agent_selection = self.possible_agents[movers[0]]
        elif self.agents:
            self.agent_selection = self.agents[0]
        for a in self.agents:
            seat = self._seat[a]
            self.infos[a] = {"valid_actions": self.game.valid_actions(seat),
                             "oracle_action": self.game.oracle_action(seat)}

    def observe(self, agent: str) -> str:
        return self.game.observation(self._seat[agent])

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if not isinstance(action, str):
            raise TypeError(f"{agent}'s action must be a str, got {type(action).__name__}")
        self._cumulative_rewards[agent] = 0.0
        self.game.step([action])
        self.rewards = {a: 0.0 for a in self.agents}
        if self.game.over:
            final = self.game.rewards()
            for a in self.agents:
                self.rewards[a] = float(final[self._seat[a]])
                self.terminations[a] = True
        self._select()
        self._accumulate_rewards()

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return "\n\n".join(f"{a}: {self.observe(a)}" for a in self.possible_agents)
        return None

    def close(self) -> None:
        return None
