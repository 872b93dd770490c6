"""AgentGym's env-server HTTP protocols: the server and the client.

- :mod:`agentgym.serving.service`: :class:`~agentgym.serving.service.EnvService`, the env
  table behind the protocol (request checks, live envs, caps, idle expiry), without HTTP.
- :mod:`agentgym.serving.dialects`: each AgentGym family's dialect of the protocol (TextCraft,
  BabyAI, SciWorld, WebShop, SearchQA), as routes over the env table.
- :mod:`agentgym.serving.server`: the aiohttp server (``agentgym-rl serve-env``).
- :mod:`agentgym.serving.openenv`: any single-agent env as an OpenEnv environment, served by
  OpenEnv's own server (``agentgym-rl serve-env --protocol openenv``).
- :mod:`agentgym.serving.client`: :class:`~agentgym.serving.client.RemoteEnv`, a Gymnasium env
  backed by such a server (``agentgym.make("remote:ENV", url=...)``; also importable as
  ``agentgym.envs.RemoteEnv``).
"""
