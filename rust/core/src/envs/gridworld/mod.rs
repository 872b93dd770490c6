//! `gridworld`: a BabyAI-style room seen through text. The agent (position and heading) sees
//! the objects (balls, boxes, keys in six colours) and doors within a 7x7 egocentric view and
//! follows a mission: `go to the red ball`, `pick up the blue key`, `open the green door`
//! (locked doors need the key of their colour). With `obs="image"` or `"both"` it also draws
//! the whole room from above as an RGB frame ([`Env::frame_into`]); in image mode the text
//! keeps the mission, the outcome of the last action and what the agent carries. See
//! `envs/gridworld/README.md`.
//!
//! Layouts are a function of the task index, preset and split (SplitMix64); the seed is
//! unused. `oracle_action()` plans with BFS over (cell, heading), fetching a key first for a
//! locked door and dropping whatever the agent holds when it needs its hands.

use crate::env::{frame_geometry, snapshot_of, vec_bytes, Env, ObsMode, Step, Task};
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
/// Frame colours (RGB): walls (and the margin that pads a frame to the patch grid), floor,
/// the agent, and the objects' colours in [`COLORS`] order.
pub const WALL_RGB: [u8; 3] = [100, 100, 100];
pub const FLOOR_RGB: [u8; 3] = [0, 0, 0];
pub const AGENT_RGB: [u8; 3] = [255, 255, 255];
pub const COLOR_RGB: [[u8; 3]; 6] = [
    [255, 0, 0],
    [0, 255, 0],
    [0, 0, 255],
    [112, 39, 195],
    [255, 255, 0],
    [190, 190, 190],
];
/// Smallest side of a tile in pixels (enough for the shapes of [`tile_pixel`]).
const MIN_TILE_PX: usize = 5;
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
    /// Text, image or both ([`ObsMode`]); image mode replaces the view's description by
    /// what the agent carries.
    pub obs: ObsMode,
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
/// `split` (train | test), `obs` (text | image | both, default text).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let allowed = [
        "difficulty",
        "size",
        "num_objects",
        "num_doors",
        "locked",
        "view",
        "split",
        "obs",
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
        obs: ObsMode::read(&r)?,
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

    /// What the agent perceives after the mission line or the outcome of an action: its
    /// heading, load and view; in image mode only its load (`You carry ...`: the picture
    /// shows the rest).
    fn describe(&self, out: &mut String) {
        if !self.cfg.obs.describes() {
            out.push_str(" You carry ");
            match self.carrying {
                Some(o) => o.write(out),
                None => out.push_str("nothing"),
            }
            out.push('.');
            return;
        }
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

    /// In image and both modes: the whole room from above, walls included, one square tile
    /// per cell (north up; [`tile_pixel`] draws walls, floor, objects and doors), the agent
    /// a white triangle pointing where it faces, padded at the bottom and right with wall
    /// colour to multiples of 28 pixels ([`GridEnv::frame_pixels`]). What the agent
    /// carries is not drawn (the text says it).
    fn frame_into(&self, out: &mut Vec<u8>) -> Option<(u32, u32)> {
        if !self.cfg.obs.draws() || !self.started {
            return None;
        }
        let side = self.side;
        let (tile, height, width) = Self::frame_pixels(self.cfg.size);
        let (ax, ay) = (self.pos % side, self.pos / side);
        // Row by row; a plain wall or floor tile (most of them) is one run of its colour,
        // the others are drawn pixel by pixel.
        out.reserve(height * width * 3);
        let t = tile as i32;
        for y in 0..height {
            let ty = y / tile;
            // Offset from the tile's centre in half-pixels (-t+1 ..= t-1).
            let dv = 2 * (y % tile) as i32 + 1 - t;
            for tx in 0..width.div_ceil(tile) {
                let n = tile.min(width - tx * tile);
                let cell = (ty < side && tx < side).then(|| self.tiles[ty * side + tx]);
                let solid = match cell {
                    None | Some(Tile::Wall) => Some(WALL_RGB),
                    Some(Tile::Floor) if (tx, ty) != (ax, ay) => Some(FLOOR_RGB),
                    _ => None,
                };
                if let Some(c) = solid {
                    for _ in 0..n {
                        out.extend_from_slice(&c);
                    }
                    continue;
                }
                let cell = cell.expect("a tile inside the grid");
                for px in 0..n {
                    let du = 2 * px as i32 + 1 - t;
                    let c = if (tx, ty) == (ax, ay) && in_arrow(self.dir, du, dv, t) {
                        AGENT_RGB
                    } else {
                        tile_pixel(cell, du, dv, t)
                    };
                    out.extend_from_slice(&c);
                }
            }
        }
        Some((height as u32, width as u32))
    }

    fn frame_shape(&self) -> Option<(u32, u32)> {
        self.cfg.obs.draws().then(|| {
            let (_, h, w) = Self::frame_pixels(self.cfg.size);
            (h as u32, w as u32)
        })
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn instructions(&self) -> String {
        let mut s = String::from(
            "You are in a room of a grid world and must complete the mission (go to, pick up or \
             open an object).",
        );
        if self.cfg.obs.draws() {
            s.push_str(
                " Each turn you see a picture of the whole room from above, north up: grey \
                 squares are walls, black is floor, and you are the white triangle, pointing \
                 the way you face. Objects have their colour (red, green, blue, purple, yellow \
                 or grey): a ball is a round blob, a box a hollow square, a key a small key \
                 shape; a door in the wall is a full square when locked, a square with a black \
                 slot across its middle when closed, and four coloured corners when open.",
            );
        }
        s.push_str(match self.cfg.obs {
            ObsMode::Text => {
                " Each turn you see which way you face, what you carry, and the walls, doors \
                 and objects in view, counted in steps forward, left and right of you."
            }
            ObsMode::Both => {
                " The text also says which way you face, what you carry, and the walls, doors \
                 and objects in view, counted in steps forward, left and right of you."
            }
            ObsMode::Image => {
                " The text says the mission, what your last action did and what you carry."
            }
        });
        s.push_str(
            " The actions are turn left, turn right, move forward, pick up, drop and toggle. \
             You go to an object by facing it from the next cell; pick up and toggle act on \
             the cell in front of you; you carry one object at a time; a locked door opens \
             with the key of its colour. Completing the mission gives reward 1 and ends the \
             episode.",
        );
        s + &crate::env::action_line("move forward")
    }
}

/// The colour of the pixel at `(du, dv)` half-pixels from the centre of a `t`-pixel tile
/// holding `tile`: walls and floor fill it; on floor, a ball is a disc (radius 0.4 of the
/// tile), a box a hollow square (the outer 0.15 of each side), a key a ring-headed stem with
/// one tooth; a door fills it when locked, leaves a floor-coloured slot across its middle
/// when closed, and keeps only its four corners when open. Integer arithmetic only.
pub fn tile_pixel(tile: Tile, du: i32, dv: i32, t: i32) -> [u8; 3] {
    let o = match tile {
        Tile::Wall => return WALL_RGB,
        Tile::Floor => return FLOOR_RGB,
        Tile::Thing(o) => o,
    };
    let (au, av) = (du.abs(), dv.abs());
    let inside = match (o.kind, o.state) {
        (Kind::Ball, _) => 25 * (du * du + dv * dv) <= 16 * t * t,
        (Kind::Box, _) => {
            let m = au.max(av);
            10 * m > 6 * t && 10 * m <= 9 * t
        }
        (Kind::Key, _) => {
            let head = 25 * du * du + (5 * dv + 2 * t).pow(2) <= 4 * t * t;
            let stem = 5 * au < t && (-2 * t..=4 * t).contains(&(5 * dv));
            let tooth = (0..=3 * t).contains(&(5 * du)) && (2 * t..=4 * t).contains(&(5 * dv));
            head || stem || tooth
        }
        (Kind::Door, LOCKED) => true,
        (Kind::Door, CLOSED) => 5 * av > t,
        (Kind::Door, _) => 10 * au > 6 * t && 10 * av > 6 * t,
    };
    if inside {
        COLOR_RGB[o.color as usize]
    } else {
        FLOOR_RGB
    }
}

/// Whether `(du, dv)` (half-pixels from the centre of a `t`-pixel tile) lies in the agent's
/// triangle for heading `dir` (its apex towards the heading, its base across the far side).
fn in_arrow(dir: usize, du: i32, dv: i32, t: i32) -> bool {
    // Forward and sideways offsets for the heading (north is up: dv < 0).
    let (f, l) = match dir {
        0 => (-dv, du),
        1 => (du, dv),
        2 => (dv, du),
        _ => (-du, dv),
    };
    5 * f >= -4 * t && 10 * l.abs() <= 4 * t - 5 * f
}

impl GridEnv {
    /// `(tile, height, width)` in pixels of the frame of a `size` x `size` room
    /// ([`frame_geometry`] over its `size+2` tiles a side, walls included, at least 5
    /// pixels each): 56x56 for every preset (easy 8-pixel tiles, medium 7, hard 5).
    pub fn frame_pixels(size: usize) -> (usize, usize, usize) {
        frame_geometry(size + 2, size + 2, MIN_TILE_PX)
    }

    /// The mission as text (`go to the red ball`).
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
