//! `gridworld`: a BabyAI-style room seen through text. The agent (position and heading) sees
//! the objects (balls, boxes, keys in six colours) and doors within a 7x7 egocentric view and
//! follows a mission: `go to the red ball`, `pick up the blue key`, `open the green door`
//! (locked doors need the key of their colour). See `envs/gridworld/README.md`.
//!
//! Layouts are a function of the task index, preset and split (SplitMix64); the seed is
//! unused. `oracle_action()` plans with BFS over (cell, heading), fetching a key first for a
//! locked door and dropping whatever the agent holds when it needs its hands.

use crate::env::{snapshot_of, vec_bytes, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};
use std::collections::VecDeque;
use std::fmt::Write;

const SALT: u64 = 0x6772_6964; // "grid"
pub const COLORS: [&str; 6] = ["red", "green", "blue", "purple", "yellow", "grey"];
const HEADINGS: [&str; 4] = ["north", "east", "south", "west"];
const DX: [i32; 4] = [0, 1, 0, -1];
const DY: [i32; 4] = [-1, 0, 1, 0];
const ACTIONS: [&str; 6] = [
    "turn left",
    "turn right",
    "move forward",
    "pick up",
    "drop",
    "toggle",
];
const HELP: &str =
    "Invalid action. Use turn left, turn right, move forward, pick up, drop or toggle.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ball,
    Box,
    Key,
    Door,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ball => "ball",
            Kind::Box => "box",
            Kind::Key => "key",
            Kind::Door => "door",
        }
    }
}

/// Door states.
const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const LOCKED: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Obj {
    pub kind: Kind,
    pub color: u8,
    /// Doors: `OPEN`, `CLOSED` or `LOCKED`; 0 for other objects.
    pub state: u8,
}

impl Obj {
    fn same(&self, other: &Obj) -> bool {
        self.kind == other.kind && self.color == other.color
    }
    fn write(&self, out: &mut String) {
        let state = match (self.kind, self.state) {
            (Kind::Door, OPEN) => "open ",
            (Kind::Door, CLOSED) => "closed ",
            (Kind::Door, _) => "locked ",
            _ => "",
        };
        let article = if state == "open " { "an" } else { "a" };
        let _ = write!(
            out,
            "{article} {state}{} {}",
            COLORS[self.color as usize],
            self.kind.name()
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tile {
    Floor,
    Wall,
    Thing(Obj),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mission {
    GoTo(Obj),
    PickUp(Obj),
    Open(Obj),
}

/// Constructor settings.
#[derive(Debug, Clone)]
pub struct GridConfig {
    pub size: usize,
    pub num_objects: usize,
    pub num_doors: usize,
    pub locked: bool,
    pub view: i32,
    pub split: u64,
}

#[derive(Clone)]
pub struct GridEnv {
    cfg: GridConfig,
    /// `(size+2)^2` tiles, row-major, walls around.
    tiles: Vec<Tile>,
    side: usize,
    pos: usize,
    dir: usize,
    carrying: Option<Obj>,
    mission: Mission,
    started: bool,
    done: bool,
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
}

/// `gridworld` kwargs: `difficulty` (easy | medium | hard), `size` (room side 3..=12),
/// `num_objects`, `num_doors` (0..=4), `locked` (doors may be locked), `view` (odd 3..=11),
/// `split` (train | test).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let allowed = [
        "difficulty",
        "size",
        "num_objects",
        "num_doors",
        "locked",
        "view",
        "split",
    ];
    let r = KwargsReader::new("gridworld", kwargs, &allowed)?;
    let bad = |m: String| CoreError::InvalidArgument(format!("gridworld: {m}"));
    let (size, objs, doors, locked) = r.choice(
        "difficulty",
        "medium",
        &[
            ("easy", (5, 2, 1, false)),
            ("medium", (6, 4, 2, false)),
            ("hard", (8, 6, 3, true)),
        ],
    )?;
    let size = r.u64_or("size", size)? as usize;
    let num_objects = r.u64_or("num_objects", objs)? as usize;
    let num_doors = r.u64_or("num_doors", doors)? as usize;
    let view = r.u64_or("view", 7)?;
    if !(3..=12).contains(&size) {
        return Err(bad(format!("size must be in 3..=12, got {size}")));
    }
    if num_doors > 4 || num_objects > 12 || num_objects + num_doors == 0 {
        return Err(bad(
            "num_doors must be <= 4, num_objects <= 12, not both 0".into()
        ));
    }
    if num_objects + 2 > size * size {
        return Err(bad(format!(
            "{num_objects} objects do not fit a {size}x{size} room"
        )));
    }
    if !(3..=11).contains(&view) || view % 2 == 0 {
        return Err(bad(format!("view must be odd and in 3..=11, got {view}")));
    }
    let split = r.choice("split", "train", &[("train", 0), ("test", 1)])?;
    let cfg = GridConfig {
        size,
        num_objects,
        num_doors,
        locked: r.bool_or("locked", locked)?,
        view: view as i32,
        split,
    };
    Ok(Box::new(GridEnv::new(cfg)))
}

/// Parse an action (ASCII case-insensitive; short forms `left`, `right`, `forward`, `pickup`,
/// `open` accepted) into an index of `ACTIONS`.
pub fn parse_action(action: &str) -> Option<usize> {
    let s = action.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c' | '.'));
    const ALIASES: [(&str, usize); 11] = [
        ("left", 0),
        ("right", 1),
        ("forward", 2),
        ("go forward", 2),
        ("move forward", 2),
        ("pickup", 3),
        ("pick up", 3),
        ("turn left", 0),
        ("turn right", 1),
        ("drop", 4),
        ("toggle", 5),
    ];
    if s.eq_ignore_ascii_case("open") {
        return Some(5);
    }
    ALIASES
        .iter()
        .find(|(name, _)| s.eq_ignore_ascii_case(name))
        .map(|&(_, a)| a)
}

fn plural(n: i32, what: &str, out: &mut String) {
    let _ = write!(out, "{n} step{} {what}", if n == 1 { "" } else { "s" });
}

impl GridEnv {
    pub fn new(cfg: GridConfig) -> Self {
        Self {
            cfg,
            tiles: Vec::new(),
            side: 0,
            pos: 0,
            dir: 0,
            carrying: None,
            mission: Mission::GoTo(Obj {
                kind: Kind::Ball,
                color: 0,
                state: 0,
            }),
            started: false,
            done: false,
            refused: false,
        }
    }

    fn front(&self) -> Option<usize> {
        self.ahead(self.pos, self.dir)
    }

    fn ahead(&self, cell: usize, dir: usize) -> Option<usize> {
        let (x, y) = ((cell % self.side) as i32, (cell / self.side) as i32);
        let (nx, ny) = (x + DX[dir], y + DY[dir]);
        let s = self.side as i32;
        (nx >= 0 && ny >= 0 && nx < s && ny < s).then(|| (ny * s + nx) as usize)
    }

    fn passable(&self, cell: usize) -> bool {
        match self.tiles[cell] {
            Tile::Floor => true,
            Tile::Thing(o) => o.kind == Kind::Door && o.state == OPEN,
            Tile::Wall => false,
        }
    }

    /// Lay out the room for `key`; false when the mission would be unsolvable (retry).
    fn generate(&mut self, rng: &mut SplitMix64) -> bool {
        let n = self.cfg.size;
        self.side = n + 2;
        let s = self.side;
        self.tiles.clear();
        self.tiles.resize(s * s, Tile::Floor);
        for i in 0..s {
            for c in [i, (s - 1) * s + i, i * s, i * s + s - 1] {
                self.tiles[c] = Tile::Wall;
            }
        }
        let mut colors: Vec<u8> = (0..6).collect();
        let mut doors = Vec::new();
        while doors.len() < self.cfg.num_doors {
            let (side, off) = (rng.below(4) as usize, 1 + rng.below(n as u64) as usize);
            let cell = match side {
                0 => off,
                1 => off * s + s - 1,
                2 => (s - 1) * s + off,
                _ => off * s,
            };
            if self.tiles[cell] != Tile::Wall {
                continue;
            }
            let color = colors.swap_remove(rng.below(colors.len() as u64) as usize);
            let state = if self.cfg.locked && rng.below(2) == 0 {
                LOCKED
            } else {
                CLOSED
            };
            let door = Obj {
                kind: Kind::Door,
                color,
                state,
            };
            self.tiles[cell] = Tile::Thing(door);
            doors.push(door);
        }
        let kinds = [Kind::Ball, Kind::Box, Kind::Key];
        let mut objs: Vec<Obj> = Vec::new();
        let kind_of_mission = if doors.is_empty() {
            rng.below(2)
        } else {
            rng.below(3)
        };
        if kind_of_mission == 2 {
            let door = doors[rng.below(doors.len() as u64) as usize];
            self.mission = Mission::Open(door);
            if door.state == LOCKED {
                objs.push(Obj {
                    kind: Kind::Key,
                    color: door.color,
                    state: 0,
                });
            }
        }
        while objs.len() < self.cfg.num_objects.max(usize::from(kind_of_mission < 2)) {
            let o = Obj {
                kind: kinds[rng.below(3) as usize],
                color: rng.below(6) as u8,
                state: 0,
            };
            if !objs.iter().any(|p| p.same(&o)) {
                objs.push(o);
            }
        }
        let floor = |t: &[Tile], rng: &mut SplitMix64| loop {
            let c = (1 + rng.below(n as u64) as usize) * s + 1 + rng.below(n as u64) as usize;
            if t[c] == Tile::Floor {
                return c;
            }
        };
        for o in &objs {
            let c = floor(&self.tiles, rng);
            self.tiles[c] = Tile::Thing(*o);
        }
        match kind_of_mission {
            0 => {
                let pick = rng.below((objs.len() + doors.len()) as u64) as usize;
                let t = if pick < objs.len() {
                    objs[pick]
                } else {
                    doors[pick - objs.len()]
                };
                self.mission = Mission::GoTo(t);
            }
            1 => self.mission = Mission::PickUp(objs[rng.below(objs.len() as u64) as usize]),
            _ => {}
        }
        self.pos = floor(&self.tiles, rng);
        self.dir = rng.below(4) as usize;
        self.carrying = None;
        self.plan_is_possible()
    }
    fn success(&self) -> bool {
        match self.mission {
            Mission::GoTo(t) => {
                matches!(self.front().map(|c| self.tiles[c]), Some(Tile::Thing(p)) if p.same(&t))
            }
            Mission::PickUp(t) => self.carrying.is_some_and(|c| c.same(&t)),
            Mission::Open(t) => self
                .find(&t)
                .is_some_and(|c| matches!(self.tiles[c], Tile::Thing(d) if d.state == OPEN)),
        }
    }

    fn describe(&self, out: &mut String) {
        let _ = write!(out, " You face {} and carry ", HEADINGS[self.dir]);
        match self.carrying {
            Some(o) => o.write(out),
            None => out.push_str("nothing"),
        }
        out.push_str(". You see");
        let mut seen = 0;
        let right = (self.dir + 1) % 4;
        let (px, py) = ((self.pos % self.side) as i32, (self.pos / self.side) as i32);
        let half = self.cfg.view / 2;
        for f in 0..self.cfg.view {
            for l in -half..=half {
                if f == 0 && l == 0 {
                    continue;
                }
                let x = px + f * DX[self.dir] + l * DX[right];
                let y = py + f * DY[self.dir] + l * DY[right];
                let s = self.side as i32;
                if x < 0 || y < 0 || x >= s || y >= s {
                    continue;
                }
                let tile = self.tiles[(y * s + x) as usize];
                // Walls only straight ahead or straight to the sides, like BabyAI-text.
                let wall_line = (l == 0) || (f == 0);
                match tile {
                    Tile::Thing(o) => {
                        out.push_str(if seen == 0 { " " } else { ", " });
                        o.write(out);
                    }
                    Tile::Wall if wall_line && self.first_wall(f, l) => {
                        out.push_str(if seen == 0 { " a wall" } else { ", a wall" })
                    }
                    _ => continue,
                }
                seen += 1;
                out.push(' ');
                if f > 0 {
                    plural(f, "forward", out);
                }
                if l != 0 {
                    out.push_str(if f > 0 { " and " } else { "" });
                    plural(l.abs(), if l < 0 { "left" } else { "right" }, out);
                }
            }
        }
        out.push_str(if seen == 0 { " nothing." } else { "." });
    }

    /// Whether the wall at relative (f, l) is the nearest one along its line.
    fn first_wall(&self, f: i32, l: i32) -> bool {
        let right = (self.dir + 1) % 4;
        let (px, py) = ((self.pos % self.side) as i32, (self.pos / self.side) as i32);
        let steps = f.max(l.abs());
        (1..steps).all(|k| {
            let (ff, ll) = if f > 0 { (k, 0) } else { (0, k * l.signum()) };
            let x = px + ff * DX[self.dir] + ll * DX[right];
            let y = py + ff * DY[self.dir] + ll * DY[right];
            self.tiles[(y * self.side as i32 + x) as usize] != Tile::Wall
        })
    }

    fn apply(&mut self, a: usize, out: &mut String) {
        let front = self.front();
        let front_tile = front.map_or(Tile::Wall, |c| self.tiles[c]);
        match a {
            0 => {
                self.dir = (self.dir + 3) % 4;
                out.push_str("You turn left.");
            }
            1 => {
                self.dir = (self.dir + 1) % 4;
                out.push_str("You turn right.");
            }
            2 => match front {
                Some(c) if self.passable(c) => {
                    self.pos = c;
                    out.push_str("You move forward.");
                }
                _ => out.push_str("You cannot move forward: something is in the way."),
            },
            3 => match front_tile {
                Tile::Thing(o) if o.kind != Kind::Door => {
                    if let Some(held) = self.carrying {
                        out.push_str("Your hands are full: you already carry ");
                        held.write(out);
                        out.push('.');
                    } else {
                        self.carrying = Some(o);
                        self.tiles[front.expect("front exists")] = Tile::Floor;
                        out.push_str("You pick up ");
                        o.write(out);
                        out.push('.');
                    }
                }
                _ => out.push_str("There is nothing to pick up in front of you."),
            },
            4 => match (self.carrying, front_tile) {
                (Some(o), Tile::Floor) => {
                    self.tiles[front.expect("front exists")] = Tile::Thing(o);
                    self.carrying = None;
                    out.push_str("You drop ");
                    o.write(out);
                    out.push('.');
                }
                (None, _) => out.push_str("You carry nothing to drop."),
                _ => out.push_str("You cannot drop here: the cell in front is not empty."),
            },
            _ => match front_tile {
                Tile::Thing(mut d) if d.kind == Kind::Door => {
                    let key = self
                        .carrying
                        .is_some_and(|k| k.kind == Kind::Key && k.color == d.color);
                    let color = COLORS[d.color as usize];
                    match d.state {
                        LOCKED if !key => {
                            let _ = write!(out, "The {color} door is locked.");
                        }
                        LOCKED => {
                            d.state = OPEN;
                            let _ = write!(out, "You unlock and open the {color} door.");
                        }
                        CLOSED => {
                            d.state = OPEN;
                            let _ = write!(out, "You open the {color} door.");
                        }
                        _ => {
                            d.state = CLOSED;
                            let _ = write!(out, "You close the {color} door.");
                        }
                    }
                    self.tiles[front.expect("front exists")] = Tile::Thing(d);
                }
                _ => out.push_str("Nothing happens."),
            },
        }
    }
}

impl Env for GridEnv {
    fn reset(&mut self, task: &Task, _seed: u64) -> Result<String> {
        let Task::Index(i) = task else {
            return Err(CoreError::InvalidTask {
                env: "gridworld".into(),
                message: "gridworld tasks are indices only".into(),
            });
        };
        let c = &self.cfg;
        let key = derive(&[
            SALT,
            c.size as u64,
            c.num_objects as u64,
            c.num_doors as u64,
            u64::from(c.locked),
            c.split,
            *i,
        ]);
        let mut rng = SplitMix64::new(key);
        while !self.generate(&mut rng) || self.success() {}
        self.started = true;
        self.done = false;
        let mut out = String::with_capacity(256);
        out.push_str("Mission: ");
        out.push_str(&self.mission_text());
        out.push('.');
        self.describe(&mut out);
        Ok(out)
    }

    fn step(&mut self, action: &str) -> Step {
        self.refused = false;
        if self.done || !self.started {
            return Step::new("The episode is over.", 0.0, true);
        }
        let mut out = String::with_capacity(200);
        match parse_action(action) {
            Some(a) => self.apply(a, &mut out),
            None => {
                self.refused = true;
                out.push_str(HELP)
            }
        }
        if self.success() {
            self.done = true;
            out.push_str(" You completed the mission!");
            return Step::new(out, 1.0, true);
        }
        self.describe(&mut out);
        Step::new(out, 0.0, false)
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        if self.done || !self.started {
            return Vec::new();
        }
        let front = self.front();
        let tile = front.map_or(Tile::Wall, |c| self.tiles[c]);
        let ok = [
            true,
            true,
            front.is_some_and(|c| self.passable(c)),
            self.carrying.is_none() && matches!(tile, Tile::Thing(o) if o.kind != Kind::Door),
            self.carrying.is_some() && tile == Tile::Floor,
            matches!(tile, Tile::Thing(o) if o.kind == Kind::Door),
        ];
        (0..6)
            .filter(|&a| ok[a])
            .map(|a| ACTIONS[a].to_string())
            .collect()
    }

    fn oracle_action(&self) -> Option<String> {
        self.plan().map(|a| ACTIONS[a].to_string())
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    fn heap_bytes(&self) -> usize {
        vec_bytes(&self.tiles)
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn instructions(&self) -> String {
        "You are in a room of a grid world and must complete the mission (go to, pick up or \
         open an object). Each turn you see which way you face, what you carry, and the walls, \
         doors and objects in view, counted in steps forward, left and right of you. The \
         actions are turn left, turn right, move forward, pick up, drop and toggle. You go \
         to an object by facing it from the next cell; pick up and toggle act on the cell in \
         front of you; you carry one object at a time; a locked door opens with the key of its \
         colour. Completing the mission gives reward 1 and ends the episode."
            .to_string()
            + &crate::env::action_line("move forward")
    }
}

impl GridEnv {
    /// Whether `o` lies on a cell next to the agent.
    fn mission_text(&self) -> String {
        let (verb, t) = match self.mission {
            Mission::GoTo(t) => ("go to", t),
            Mission::PickUp(t) => ("pick up", t),
            Mission::Open(t) => ("open", t),
        };
        format!("{verb} the {} {}", COLORS[t.color as usize], t.kind.name())
    }
}

#[cfg(test)]
mod tests;

mod plan;
