"""Process infrastructure that hosts env code outside the caller.

- :mod:`agentgym.runtime.workers`: :class:`~agentgym.runtime.workers.ProcessEnvPool`, env
  instances in worker processes (restart on crash, kill on hang), used by the engine's
  process driver.
- :mod:`agentgym.runtime.files`: :func:`~agentgym.runtime.files.fsync_dir` and
  :func:`~agentgym.runtime.files.fsync_tree`, durable publication of files and folders.
- :mod:`agentgym.runtime.sandbox`: :func:`~agentgym.runtime.sandbox.run_python`, untrusted
  Python in a fresh, resource-limited subprocess (used by ``code_debug``).
"""
