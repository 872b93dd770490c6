"""The asyncio rollout engine."""

from agentgym.engine.chat import ChatFormatter, ChatTemplateError
from agentgym.engine.config import RolloutConfig
from agentgym.engine.orchestrator import EpisodeRequest, RolloutBatch, RolloutEngine

__all__ = [
    "ChatFormatter",
    "ChatTemplateError",
    "EpisodeRequest",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutEngine",
]
