"""Large-scale rollout collection into a resumable run folder (``agentgym-rl collect``).

* :mod:`~agentgym.collection.collector`: ``Collector`` (any
  :class:`~agentgym.engine.runner.Runner`), ``collect`` (synchronous, opens a runner);
* :mod:`~agentgym.collection.store`: the run folder (shards, manifest, metadata, resume,
  atomic writes) and its named errors;
* :mod:`~agentgym.collection.schema`: the one row schema (Parquet and JSONL);
* :mod:`~agentgym.collection.progress`: the progress bar and the summary;
* :mod:`~agentgym.collection.export`: a run folder in verl's, SkyRL's or TRL's shape.
"""

from agentgym.collection.collector import Collector, collect
from agentgym.collection.schema import FIELDS, SCHEMA, SCHEMA_VERSION
from agentgym.collection.store import (
    CollectionError,
    DiskFullError,
    OutputNotWritableError,
    RunLockedError,
    RunMismatchError,
    RunStore,
    ShardError,
    read_run,
)

__all__ = [
    "FIELDS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "CollectionError",
    "Collector",
    "DiskFullError",
    "OutputNotWritableError",
    "RunLockedError",
    "RunMismatchError",
    "RunStore",
    "ShardError",
    "collect",
    "read_run",
]
