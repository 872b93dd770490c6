"""Valid-action decoding: on an env that lists its legal actions (``valid_actions``), each
reply is one of them, chosen by the probability the model gives that action's reply text
after the prompt, as TWOSOME and GLAM train language agents.

Before each reply the env's listed actions become candidate replies: the reply that plays
each (:func:`agentgym.parse.reply_text`: ``Action: <action>``, continued after the turn's
``reply_prefix``) and the end-of-turn token, tokenized once per distinct text. The backend
scores them all in one pass and samples one (``generate(..., choices=)``,
:func:`agentgym.backends.base.choose`: probability ``softmax(summed token logprobs /
temperature)``, the best at temperature 0). The chosen reply's tokens are the sample and
their logprobs, from that same forward pass, the behaviour logprobs, so the learner trains
it as any other reply. A turn where the env lists no action is generated freely, as
without the mechanism.

It needs a backend that scores choices (``scores_choices``: transformers, vllm); not with
``plan`` (a plan turn is free text).
"""

from __future__ import annotations

from agentgym.engine.mechanisms.base import Mechanism
from agentgym.parse import reply_text


class ValidActionDecoding(Mechanism):
    """The reply is one of the env's listed actions (see the module docs)."""

    name = "valid_action_decoding"

    def __init__(self, loop):
        super().__init__(loop)
        backend = loop.engine.backend
        if not getattr(backend, "scores_choices", False):
            raise ValueError(f"valid_action_decoding needs a backend that scores choices "
                             f"(transformers or vllm), not {type(backend).__name__}")
        self.prefix, self.eot = loop.cfg.reply_prefix, loop.fmt.end_of_turn_id
        self._ids: dict[str, list[int]] = {}

    def reply_ids(self, action: str) -> list[int]:
        """The tokens of the reply that plays ``action``, its end-of-turn token last."""
        ids = self._ids.get(action)
        if ids is None:
            if len(self._ids) > 65536:
                self._ids.clear()
            ids = self._ids[action] = self.loop.fmt.encode(
                reply_text(action, self.prefix)) + [self.eot]
        return ids

    async def before_reply(self, ep) -> None:
        """The candidate replies of ``ep``'s next turn (None: the env lists none)."""
        actions = await self.loop.driver.valid_actions(ep.slot)
        ep.state[self.name] = [self.reply_ids(a) for a in dict.fromkeys(actions)] or None

    def request_kwargs(self, ep) -> dict:
        choices = ep.state.get(self.name)
        return {"choices": choices} if choices else {}
