"""The asyncio rollout engine."""

from agentgym.engine.chat import ChatFormatter, ChatTemplateError
from agentgym.engine.config import RolloutConfig
from agentgym.engine.orchestrator import RolloutBatch, RolloutEngine

__all__ = ["ChatFormatter", "ChatTemplateError", "RolloutBatch", "RolloutConfig", "RolloutEngine"]
