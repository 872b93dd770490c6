"""Trajectories: the stop reasons, the ``Trajectory`` struct, the packed batch and its
packer (``agentgym.data.trajectories``), and verl/SkyRL exports (``agentgym.data.exports``)."""

from agentgym.data.trajectories import *  # noqa: F403
from agentgym.data.trajectories import __all__  # noqa: F401
