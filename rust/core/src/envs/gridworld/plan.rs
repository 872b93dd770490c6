//! The gridworld's reference planner (`oracle_action`): BFS over (cell, heading).

use super::*;

impl GridEnv {
    pub(super) fn plan_is_possible(&self) -> bool {
        let target = match self.mission {
            Mission::GoTo(t) | Mission::PickUp(t) | Mission::Open(t) => t,
        };
        let key = Obj {
            kind: Kind::Key,
            color: target.color,
            state: 0,
        };
        let needs_key = matches!(self.mission, Mission::Open(d) if d.state == LOCKED);
        self.route_to(&target, false).is_some()
            && (!needs_key || self.route_to(&key, false).is_some())
    }

    pub(super) fn find(&self, o: &Obj) -> Option<usize> {
        self.tiles
            .iter()
            .position(|t| matches!(t, Tile::Thing(p) if p.same(o)))
    }

    /// First action of a shortest (cell, heading) path that ends facing `o`; `None` when
    /// `o` is not on the grid or not reachable; `Some(None)` when already facing it.
    /// With `relaxed`, cells holding a movable object count as passable (to plan clearing).
    pub(super) fn route_to(&self, o: &Obj, relaxed: bool) -> Option<Option<usize>> {
        let goal = self.find(o)?;
        let states = self.side * self.side * 4;
        let mut first = vec![u8::MAX; states];
        let start = self.pos * 4 + self.dir;
        if self.front() == Some(goal) {
            return Some(None);
        }
        first[start] = 7;
        let mut queue = VecDeque::from([start]);
        while let Some(st) = queue.pop_front() {
            let (cell, dir) = (st / 4, st % 4);
            let moves = [
                (0, Some(cell * 4 + (dir + 3) % 4)),
                (1, Some(cell * 4 + (dir + 1) % 4)),
                (
                    2,
                    self.ahead(cell, dir)
                        .filter(|&c| {
                            self.passable(c)
                                || relaxed
                                    && matches!(self.tiles[c], Tile::Thing(t) if t.kind != Kind::Door)
                        })
                        .map(|c| c * 4 + dir),
                ),
            ];
            for (a, next) in moves {
                let Some(next) = next else { continue };
                if first[next] != u8::MAX {
                    continue;
                }
                first[next] = if st == start { a } else { first[st] };
                if self.ahead(next / 4, next % 4) == Some(goal) {
                    return Some(Some(first[next] as usize));
                }
                queue.push_back(next);
            }
        }
        None
    }
    fn next_to(&self, o: &Obj) -> bool {
        self.find(o)
            .is_some_and(|c| (0..4).any(|d| self.ahead(self.pos, d) == Some(c)))
    }

    /// The oracle's next action (an index of `ACTIONS`), `None` once the episode is over.
    pub(super) fn plan(&self) -> Option<usize> {
        if self.done || !self.started {
            return None;
        }
        let (target, want_hold) = match self.mission {
            Mission::GoTo(t) => (t, None),
            Mission::PickUp(t) => (t, Some(t)),
            Mission::Open(d) if d.state == LOCKED => {
                let locked_now = self
                    .find(&d)
                    .is_some_and(|c| matches!(self.tiles[c], Tile::Thing(x) if x.state == LOCKED));
                let key = Obj {
                    kind: Kind::Key,
                    color: d.color,
                    state: 0,
                };
                if locked_now && !self.carrying.is_some_and(|k| k.same(&key)) {
                    (key, Some(key))
                } else {
                    (d, None)
                }
            }
            Mission::Open(d) => (d, None),
        };
        let front_tile = self.front().map_or(Tile::Wall, |c| self.tiles[c]);
        let pickable = matches!(front_tile, Tile::Thing(t) if t.kind != Kind::Door);
        let a = match self.carrying {
            // A carried go-to target is put down in front (which completes the mission).
            Some(c) if matches!(self.mission, Mission::GoTo(t) if t.same(&c)) => {
                if front_tile == Tile::Floor {
                    4
                } else {
                    0
                }
            }
            // Hands must be free to pick up the target: put the load down next to it.
            Some(c) if want_hold.is_some_and(|w| !w.same(&c)) && self.next_to(&target) => {
                if front_tile == Tile::Floor {
                    4
                } else {
                    0
                }
            }
            _ => match self.route_to(&target, false) {
                Some(None) if want_hold.is_some() => 3,
                Some(None) => 5,
                Some(Some(a)) => a,
                // Walled in by objects: walk the relaxed route, picking up what blocks it.
                None => match self.route_to(&target, true) {
                    Some(Some(2)) if pickable && self.carrying.is_none() => 3,
                    Some(Some(2)) if pickable => 0,
                    Some(Some(a)) => a,
                    _ => 0,
                },
            },
        };
        Some(a)
    }
}
