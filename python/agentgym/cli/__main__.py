"""``python -m agentgym.cli ...``: the same as the ``agentgym-rl`` command."""

import sys

from agentgym.cli import main

sys.exit(main())
