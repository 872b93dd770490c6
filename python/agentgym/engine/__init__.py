"""The asyncio rollout engine."""

from agentgym.engine.chat import ChatFormatter, ChatTemplateError
from agentgym.engine.config import RolloutConfig
from agentgym.engine.orchestrator import EpisodeBatch, EpisodeRequest, RolloutBatch, RolloutEngine

__all__ = [
    "ChatFormatter",
    "ChatTemplateError",
    "EpisodeBatch",
    "EpisodeRequest",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutEngine",
]
