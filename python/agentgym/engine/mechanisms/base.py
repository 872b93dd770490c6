"""``Mechanism``: one agent mechanism, a set of hooks the turn loop calls at fixed points.

A mechanism is built once per run (``stream`` call) when its switch is on
(:meth:`Mechanism.wanted`), keeps what it needs per episode in ``episode.state[name]``,
and changes the episode only through its hooks. A hook a mechanism does not define stays
``None`` on the class, and the loop never calls it: a run with no mechanism on pays for
none of them.

Where the loop calls each hook (:class:`~agentgym.engine.turn_loop.TurnLoop`):

``begun(eps, obs) -> list[BaseException | None]`` (async)
    After the tick's resets, before the first prompts: the episodes whose reset
    succeeded and their observations (the hook may rewrite ``obs[k]``); a failure ends
    only its own episode.
``before_reply(ep)`` (async)
    Before each reply of an attempt; it may play replies of its own (plan turns) or stop
    the episode (``ep.stop_reason``).
``context(ep) -> (prompt, resume)`` and ``replied(ep, resume, start, end)``
    At most one mechanism per run: the tokens the next reply is generated from (default
    the whole record), and the stored reply's span once it is recorded.
``before_step(turns)``
    Before the tick's envs step (the turns of running episodes).
``stepped(turns, outs) -> outs`` (async)
    The step outcomes of an env its driver steps, before they are recorded.
``recorded(turns)``
    After the tick's turns are recorded in the store.
``after_turn(ep, logprobs)`` (async)
    After each turn that left the episode running.
``retry(ep) -> bool`` (async)
    At most one mechanism per run: after an attempt ends, whether the episode plays
    another attempt (the hook puts the env and the record where it begins).
``forked(root, child)``
    A running episode was copied into ``child`` (branched groups): copy the state.
``closing(eps, overrides) -> overrides``
    The tick's finished episodes, before their rows are drained: ``overrides`` (None, or
    one reward per episode, NaN for the store's own sum) replaces their rewards.
``row(eps) -> dict``, ``trajectory_fields(eps) -> dict``, ``packed_fields(eps) -> dict``
    The mechanism's fields of the drained rows: :class:`~agentgym.data.RowInfo` fields,
    keyword arguments of :func:`~agentgym.data.trajectories.trajectories`, and extra arrays
    of the packed batch.
``request_kwargs(ep) -> dict``
    What the backend's ``generate`` gets beside the tokens for this episode.
``aborted(ep)``
    The episode was cancelled (its slot is released at once).

docs/mechanisms.md shows how to write one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from agentgym.engine.config import RolloutConfig
    from agentgym.engine.turn_loop import TurnLoop

#: The hooks the loop calls, in the order the module docs list them.
HOOKS = ("begun", "before_reply", "context", "replied", "before_step", "stepped",
         "recorded", "after_turn", "retry", "forked", "closing", "row", "trajectory_fields",
         "packed_fields", "request_kwargs", "aborted")


class PoolCounter:
    """A per-episode count a native env's pool keeps in its episode record (read when the
    episode closes, kept across a restart of the slot): ``read(slots)`` the pool's counts,
    ``add(ep, n)`` onto the episode's. A mechanism appends its own to the loop's
    ``pool_counters``."""

    __slots__ = ("read", "add")

    def __init__(self, read, add):
        self.read, self.add = read, add


class Mechanism:
    """The base of every mechanism (see the module docs)."""

    #: The key of its per-episode state, and how messages name it: the
    #: :class:`~agentgym.engine.config.RolloutConfig` field that turns it on.
    name: ClassVar[str]
    #: It can play an env that shows pictures (``obs="image"`` or ``"both"``).
    with_images: ClassVar[bool] = False
    #: Switched on by name (``mechanisms=["undo"]``, ``{"undo": 2}``): the count a name
    #: alone gives (None: not switched by name), the config field the count sets (None:
    #: the switch itself takes it, else the switch is set True), and older names.
    default_count: ClassVar[int | None] = None
    count_field: ClassVar[str | None] = None
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Its :class:`~agentgym.data.RowInfo` fields (its ``row`` hook's keys) and their
    #: values where it did not play.
    row_defaults: ClassVar[dict[str, Any]] = {}

    begun = before_reply = context = replied = before_step = stepped = recorded = None
    after_turn = retry = forked = closing = row = trajectory_fields = None
    packed_fields = request_kwargs = aborted = None

    @classmethod
    def configured(cls, cfg: RolloutConfig) -> bool:
        """Whether ``cfg`` switches the mechanism on (default: its config field is set)."""
        return bool(getattr(cfg, cls.name))

    @classmethod
    def wanted(cls, cfg: RolloutConfig, driver: Any) -> bool:
        """Whether a run of ``cfg`` on ``driver`` plays with the mechanism (default: as
        :meth:`configured`)."""
        return cls.configured(cfg)

    @classmethod
    def driver_needs(cls, cfg: RolloutConfig) -> dict[str, Any]:
        """What the env driver must be built with for it (``make_driver``'s ``undo``,
        ``restarts``, ``forks``, ``lasts``); checked before any episode starts."""
        return {}

    def __init__(self, loop: TurnLoop):
        self.loop = loop
        self.cfg = loop.cfg

    def play_strategy(self):
        """The strategy that plays this run's units of work, where the mechanism changes
        what a unit is (None: one episode per unit)."""
        return None
