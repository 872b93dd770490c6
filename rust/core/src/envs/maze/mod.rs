//! `maze`: a grid maze with text observations. The agent sees its position and what lies
//! north, south, east and west (wall, open or goal) and moves one cell per turn; reaching the
//! goal gives reward 1 and ends the episode. With `obs="image"` or `"both"` it also draws the
//! whole maze from above as an RGB frame ([`Env::frame_into`]); in image mode the text keeps
//! only the outcome of the last move, and the goal is only in the picture. See
//! `envs/maze/README.md`.
//!
//! The layout (a perfect maze carved by randomized depth-first search, optionally with extra
//! openings that make loops), the start and the goal are a function of the task index, the
//! size and the split only; the episode seed is unused, so every member of a GRPO group that
//! plays task `i` sees the same maze. `bench/baselines/maze_py.py` reproduces it bit for bit.

use crate::env::{
    draw_blocks, frame_geometry, push_decimal, snapshot_of, vec_bytes, Env, ObsMode, Step, Task,
};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};
use std::collections::VecDeque;
use std::fmt::Write;

const SALT: u64 = 0x6D61_7A65; // "maze"
const MAX_SIDE: u64 = 64;
/// Direction order everywhere (generation, observations, valid actions): N, S, E, W.
const DIRS: [&str; 4] = ["north", "south", "east", "west"];
const TITLES: [&str; 4] = ["North", "South", "East", "West"];
const UNREACHED: u32 = u32::MAX;
/// Frame colours (RGB): walls (and the margin that pads a frame to the patch grid), open
/// floor, the agent, the goal.
pub const WALL_RGB: [u8; 3] = [40, 40, 40];
pub const FLOOR_RGB: [u8; 3] = [235, 235, 235];
pub const AGENT_RGB: [u8; 3] = [220, 30, 30];
pub const GOAL_RGB: [u8; 3] = [30, 170, 60];
/// Smallest side of a block (a cell, or the wall or passage between two cells) in pixels.
const MIN_BLOCK_PX: usize = 3;

/// A maze: `open[c]` has bit `d` set when the wall on side `d` of cell `c` is open.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    pub width: usize,
    pub height: usize,
    pub open: Vec<u8>,
    pub start: usize,
    pub goal: usize,
    /// Bit `d` of `inside[c]`: cell `c` has a neighbour in direction `d` (no division later).
    inside: Vec<u8>,
}

/// Reusable buffers of generation and search (a reset allocates nothing once warm). They
/// hold no state between resets, so a clone is empty (a snapshot does not copy them).
#[derive(Debug, Default)]
pub struct Scratch {
    visited: Vec<bool>,
    stack: Vec<usize>,
    dist: Vec<u32>,
    queue: VecDeque<usize>,
}

impl Clone for Scratch {
    fn clone(&self) -> Self {
        Scratch::default()
    }
}

impl Layout {
    /// An all-walls layout of `width` x `height` cells (buffers reused).
    fn set_size(&mut self, width: usize, height: usize) {
        self.open.clear();
        self.open.resize(width * height, 0);
        if (width, height) != (self.width, self.height) || self.inside.len() != width * height {
            self.width = width;
            self.height = height;
            self.inside = (0..width * height)
                .map(|c| {
                    let (x, y) = (c % width, c / width);
                    u8::from(y > 0)
                        | u8::from(y + 1 < height) << 1
                        | u8::from(x + 1 < width) << 2
                        | u8::from(x > 0) << 3
                })
                .collect();
        }
    }

    /// The cell next to `c` in direction `d` (which must be inside the grid).
    #[inline]
    fn step_to(&self, c: usize, d: usize) -> usize {
        match d {
            0 => c - self.width,
            1 => c + self.width,
            2 => c + 1,
            _ => c - 1,
        }
    }

    /// The neighbour of cell `c` in direction `d`, if inside the grid.
    #[inline]
    pub fn neighbor(&self, c: usize, d: usize) -> Option<usize> {
        (self.inside[c] & (1 << d) != 0).then(|| self.step_to(c, d))
    }

    fn carve(&mut self, c: usize, d: usize) {
        let n = self.step_to(c, d);
        self.open[c] |= 1 << d;
        self.open[n] |= 1 << (d ^ 1);
    }

    /// Breadth-first distances from `from` (in `out`, reused); `UNREACHED` where unreachable.
    pub fn distances(&self, from: usize, out: &mut Vec<u32>, queue: &mut VecDeque<usize>) {
        out.clear();
        out.resize(self.open.len(), UNREACHED);
        queue.clear();
        out[from] = 0;
        queue.push_back(from);
        while let Some(c) = queue.pop_front() {
            for d in 0..4 {
                if self.open[c] & (1 << d) != 0 {
                    let n = self.step_to(c, d);
                    if out[n] == UNREACHED {
                        out[n] = out[c] + 1;
                        queue.push_back(n);
                    }
                }
            }
        }
    }

    /// Carve a maze for `key` (see [`Layout::generate_with`]).
    pub fn generate(&mut self, width: usize, height: usize, loops: u64, key: u64) {
        self.generate_with(width, height, loops, key, &mut Scratch::default());
    }

    /// Carve a maze for `key`: randomized DFS, then `loops` extra openings, then a random
    /// start and a goal drawn among the cells at least half the maximum distance away.
    pub fn generate_with(&mut self, w: usize, h: usize, loops: u64, key: u64, s: &mut Scratch) {
        let n = w * h;
        self.set_size(w, h);
        let mut rng = SplitMix64::new(key);
        s.visited.clear();
        s.visited.resize(n, false);
        let first = rng.below(n as u64) as usize;
        s.visited[first] = true;
        s.stack.clear();
        s.stack.push(first);
        while let Some(&c) = s.stack.last() {
            let mut options = [0usize; 4];
            let mut count = 0;
            for d in 0..4 {
                if self.inside[c] & (1 << d) != 0 && !s.visited[self.step_to(c, d)] {
                    options[count] = d;
                    count += 1;
                }
            }
            if count == 0 {
                s.stack.pop();
                continue;
            }
            let d = options[rng.below(count as u64) as usize];
            self.carve(c, d);
            let nb = self.step_to(c, d);
            s.visited[nb] = true;
            s.stack.push(nb);
        }
        for _ in 0..loops {
            let c = rng.below(n as u64) as usize;
            let d = rng.below(4) as usize;
            if self.inside[c] & (1 << d) != 0 {
                self.carve(c, d);
            }
        }
        self.start = rng.below(n as u64) as usize;
        self.distances(self.start, &mut s.dist, &mut s.queue);
        let far = s.dist.iter().copied().max().unwrap_or(0);
        let threshold = far.div_ceil(2).max(1);
        let count = s.dist.iter().filter(|&&d| d >= threshold).count();
        let k = rng.below(count as u64) as usize;
        self.goal = (0..n)
            .filter(|&c| s.dist[c] >= threshold)
            .nth(k)
            .expect("k-th far cell exists");
    }

    /// The layout as text: `#` walls, `S` start, `G` goal, spaces for open cells and passages
    /// (`2*height+1` lines of `2*width+1` characters). [`Layout::parse`] reads it back.
    pub fn render(&self) -> String {
        let (w, h) = (2 * self.width + 1, 2 * self.height + 1);
        let mut grid = vec![b'#'; w * h];
        for c in 0..self.open.len() {
            let (x, y) = (2 * (c % self.width) + 1, 2 * (c / self.width) + 1);
            grid[y * w + x] = match c {
                _ if c == self.start => b'S',
                _ if c == self.goal => b'G',
                _ => b' ',
            };
            if self.open[c] & 2 != 0 {
                grid[(y + 1) * w + x] = b' ';
            }
            if self.open[c] & 4 != 0 {
                grid[y * w + x + 1] = b' ';
            }
        }
        let lines: Vec<&str> = grid
            .chunks(w)
            .map(|l| std::str::from_utf8(l).expect("ascii"))
            .collect();
        lines.join("\n")
    }

    /// Parse the text form of [`Layout::render`] (`.` also counts as open); the goal must be
    /// reachable from the start.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let lines: Vec<&[u8]> = text
            .trim_matches('\n')
            .lines()
            .map(|l| l.trim_end_matches('\r').as_bytes())
            .collect();
        let rows = lines.len();
        let cols = lines.first().map_or(0, |l| l.len());
        if rows < 3 || cols < 3 || rows % 2 == 0 || cols % 2 == 0 {
            return Err("the layout needs an odd number (>= 3) of lines and columns".into());
        }
        if lines.iter().any(|l| l.len() != cols) {
            return Err("all lines of the layout must have the same length".into());
        }
        let at = |x: usize, y: usize| lines[y][x];
        for x in 0..cols {
            if at(x, 0) != b'#' || at(x, rows - 1) != b'#' {
                return Err("the layout's border must be walls (#)".into());
            }
        }
        for (y, line) in lines.iter().enumerate() {
            if line[0] != b'#' || line[cols - 1] != b'#' {
                return Err(format!("line {} must start and end with a wall (#)", y + 1));
            }
        }
        let (width, height) = (cols / 2, rows / 2);
        let mut layout = Layout::default();
        layout.set_size(width, height);
        let (mut start, mut goal) = (None, None);
        for c in 0..width * height {
            let (x, y) = (2 * (c % width) + 1, 2 * (c / width) + 1);
            match at(x, y) {
                b'S' if start.is_none() => start = Some(c),
                b'G' if goal.is_none() => goal = Some(c),
                b' ' | b'.' => {}
                other => {
                    return Err(format!(
                        "cell at line {}, column {} is {:?}; cells are ' ', '.', one S, one G",
                        y + 1,
                        x + 1,
                        other as char
                    ))
                }
            }
            if x + 1 < cols - 1 && at(x + 1, y) != b'#' {
                layout.carve(c, 2);
            }
            if y + 1 < rows - 1 && at(x, y + 1) != b'#' {
                layout.carve(c, 1);
            }
        }
        let (Some(start), Some(goal)) = (start, goal) else {
            return Err("the layout needs exactly one S (start) and one G (goal)".into());
        };
        layout.start = start;
        layout.goal = goal;
        let mut dist = Vec::new();
        layout.distances(goal, &mut dist, &mut VecDeque::new());
        if dist[start] == UNREACHED {
            return Err("the goal is not reachable from the start".into());
        }
        Ok(layout)
    }
}

/// Constructor settings of the maze env.
#[derive(Debug, Clone)]
pub struct MazeConfig {
    pub width: usize,
    pub height: usize,
    pub loops: u64,
    pub goal_hint: bool,
    /// An open side one step closer to the goal (BFS) reads `closer` instead of `open`, and
    /// a move that went one step closer says so (`Moved north, closer.`).
    pub signpost: bool,
    pub show_position: bool,
    pub shaping: f32,
    pub split: u64,
    /// Text, image or both ([`ObsMode`]); image mode leaves the status sentence out.
    pub obs: ObsMode,
}

#[derive(Clone)]
pub struct MazeEnv {
    cfg: MazeConfig,
    layout: Layout,
    /// BFS distance of every cell to the goal (oracle and shaping).
    to_goal: Vec<u32>,
    scratch: Scratch,
    pos: usize,
    started: bool,
    done: bool,
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
}

/// `maze` kwargs: `difficulty` (easy 4x4 | medium 6x6 | hard 9x9, default medium), `size`
/// (square side) or `width`/`height` (2..=64), `loops` (extra openings, default 0),
/// `goal_hint` (default false), `signpost` (open sides on a shortest path read `closer`,
/// default false), `show_position` (default true), `shaping` (per-step reward
/// `shaping * (distance before - distance after)`, default 0), `split` (train | test),
/// `obs` (text | image | both, default text; image mode refuses `goal_hint` and `signpost`,
/// which would say in text where the goal is).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let allowed = [
        "difficulty",
        "size",
        "width",
        "height",
        "loops",
        "goal_hint",
        "signpost",
        "show_position",
        "shaping",
        "split",
        "obs",
    ];
    let r = KwargsReader::new("maze", kwargs, &allowed)?;
    let side = r.choice(
        "difficulty",
        "medium",
        &[("easy", 4), ("medium", 6), ("hard", 9)],
    )?;
    let side = r.u64_or("size", side)?;
    let (width, height) = (r.u64_or("width", side)?, r.u64_or("height", side)?);
    if !(1..=MAX_SIDE).contains(&width) || !(1..=MAX_SIDE).contains(&height) || width * height < 2 {
        return Err(CoreError::InvalidArgument(format!(
            "maze: width and height must be in 1..={MAX_SIDE} with at least 2 cells, got {width}x{height}"
        )));
    }
    let shaping = match kwargs.get("shaping") {
        None | Some(serde_json::Value::Null) => 0.0,
        Some(v) => v.as_f64().filter(|s| s.is_finite()).ok_or_else(|| {
            CoreError::InvalidArgument("maze: shaping must be a finite number".into())
        })? as f32,
    };
    let split = r.choice("split", "train", &[("train", 0), ("test", 1)])?;
    let cfg = MazeConfig {
        width: width as usize,
        height: height as usize,
        loops: r.u64_or("loops", 0)?,
        goal_hint: r.bool_or("goal_hint", false)?,
        signpost: r.bool_or("signpost", false)?,
        show_position: r.bool_or("show_position", true)?,
        shaping,
        split,
        obs: ObsMode::read(&r)?,
    };
    if cfg.obs == ObsMode::Image && (cfg.goal_hint || cfg.signpost) {
        return Err(CoreError::InvalidArgument(
            "maze: obs=\"image\" shows the goal only in the picture; goal_hint and signpost \
             need obs=\"text\" or \"both\""
                .into(),
        ));
    }
    Ok(Box::new(MazeEnv::new(cfg)))
}

/// The parsed direction of a move action (`move north`, `go n`, `North.` ...), if any.
pub fn parse_direction(action: &str) -> Option<usize> {
    let s = action.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c' | '.'));
    let mut rest = s;
    for prefix in ["move ", "go "] {
        if s.len() >= prefix.len()
            && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        {
            rest = s[prefix.len()..].trim_start_matches(' ');
            break;
        }
    }
    const SHORT: [&str; 4] = ["n", "s", "e", "w"];
    (0..4).find(|&d| rest.eq_ignore_ascii_case(DIRS[d]) || rest.eq_ignore_ascii_case(SHORT[d]))
}

impl MazeEnv {
    pub fn new(cfg: MazeConfig) -> Self {
        Self {
            cfg,
            layout: Layout::default(),
            to_goal: Vec::new(),
            scratch: Scratch::default(),
            pos: 0,
            started: false,
            done: false,
            refused: false,
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// `(block, height, width)` in pixels of the frame of a `width` x `height` maze
    /// ([`frame_geometry`] over its `2*height+1` x `2*width+1` blocks, at least 3 pixels
    /// each): easy (4x4) 28x28 with 3-pixel blocks, medium (6x6) 56x56 and hard (9x9)
    /// 84x84 with 4-pixel blocks.
    pub fn frame_pixels(width: usize, height: usize) -> (usize, usize, usize) {
        frame_geometry(2 * height + 1, 2 * width + 1, MIN_BLOCK_PX)
    }

    /// The status sentence: position, the four sides, the optional goal hint. Nothing in
    /// image mode (the picture shows all of it).
    fn describe(&self, out: &mut String) {
        if !self.cfg.obs.describes() {
            return;
        }
        let l = &self.layout;
        if self.cfg.show_position {
            out.push_str(" Position: row ");
            push_decimal(out, (self.pos / l.width + 1) as u64);
            out.push_str(", column ");
            push_decimal(out, (self.pos % l.width + 1) as u64);
            out.push('.');
        }
        for (d, title) in TITLES.iter().enumerate() {
            let what = if l.open[self.pos] & (1 << d) == 0 {
                ": wall."
            } else if l.neighbor(self.pos, d) == Some(l.goal) {
                ": goal."
            } else if self.cfg.signpost
                && l.neighbor(self.pos, d).map(|n| self.to_goal[n] + 1)
                    == Some(self.to_goal[self.pos])
            {
                ": closer."
            } else {
                ": open."
            };
            out.push(' ');
            out.push_str(title);
            out.push_str(what);
        }
        if self.cfg.goal_hint {
            let (dy, dx) = (
                (l.goal / l.width) as i64 - (self.pos / l.width) as i64,
                (l.goal % l.width) as i64 - (self.pos % l.width) as i64,
            );
            out.push_str(" Goal:");
            if dy != 0 {
                let _ = write!(
                    out,
                    " {} {}",
                    dy.abs(),
                    if dy < 0 { "north" } else { "south" }
                );
            }
            if dx != 0 {
                let sep = if dy != 0 { "," } else { "" };
                let _ = write!(
                    out,
                    "{sep} {} {}",
                    dx.abs(),
                    if dx < 0 { "west" } else { "east" }
                );
            }
            out.push('.');
        }
    }
}

impl Env for MazeEnv {
    fn reset(&mut self, task: &Task, _seed: u64) -> Result<String> {
        match task {
            Task::Index(i) => {
                let (w, h) = (self.cfg.width, self.cfg.height);
                let key = derive(&[SALT, w as u64, h as u64, self.cfg.loops, self.cfg.split, *i]);
                self.layout
                    .generate_with(w, h, self.cfg.loops, key, &mut self.scratch);
            }
            Task::Spec(text) => {
                self.layout = Layout::parse(text).map_err(|message| CoreError::InvalidTask {
                    env: "maze".into(),
                    message,
                })?;
            }
        }
        let goal = self.layout.goal;
        self.layout
            .distances(goal, &mut self.to_goal, &mut self.scratch.queue);
        self.pos = self.layout.start;
        self.started = true;
        self.done = false;
        let mut out = String::with_capacity(160);
        let _ = write!(
            out,
            "You are in a {}x{} maze. Find the goal.",
            self.layout.width, self.layout.height
        );
        self.describe(&mut out);
        Ok(out)
    }

    fn step(&mut self, action: &str) -> Step {
        let mut out = String::with_capacity(128);
        let (reward, terminated) = self.step_into(action, &mut out);
        Step::new(out, reward, terminated)
    }

    fn step_into(&mut self, action: &str, out: &mut String) -> (f32, bool) {
        self.refused = false;
        if self.done || !self.started {
            out.push_str("The episode is over.");
            return (0.0, true);
        }
        let Some(d) = parse_direction(action) else {
            self.refused = true;
            out.push_str("Invalid action. Use move north, move south, move east or move west.");
            self.describe(out);
            return (0.0, false);
        };
        if self.layout.open[self.pos] & (1 << d) == 0 {
            out.push_str("Blocked: wall to the ");
            out.push_str(DIRS[d]);
            out.push('.');
            self.describe(out);
            return (0.0, false);
        }
        let before = self.to_goal[self.pos];
        self.pos = self.layout.step_to(self.pos, d);
        out.push_str("Moved ");
        out.push_str(DIRS[d]);
        if self.pos == self.layout.goal {
            self.done = true;
            out.push_str(". You reached the goal!");
            return (1.0, true);
        }
        let delta = before as f32 - self.to_goal[self.pos] as f32;
        if self.cfg.signpost && delta > 0.0 {
            out.push_str(", closer");
        }
        out.push('.');
        self.describe(out);
        (self.cfg.shaping * delta, false)
    }

    fn prefetch(&self) {
        // The cells around the current position that a step reads (walls, distances).
        crate::util::prefetch(self.layout.open.as_ptr().wrapping_add(self.pos));
        crate::util::prefetch(self.layout.inside.as_ptr().wrapping_add(self.pos));
        crate::util::prefetch(self.to_goal.as_ptr().wrapping_add(self.pos));
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        if self.done || !self.started {
            return Vec::new();
        }
        (0..4)
            .filter(|d| self.layout.open[self.pos] & (1 << d) != 0)
            .map(|d| format!("move {}", DIRS[d]))
            .collect()
    }

    fn oracle_action(&self) -> Option<String> {
        if self.done || !self.started {
            return None;
        }
        let here = self.to_goal[self.pos];
        (0..4)
            .find(|&d| {
                self.layout.open[self.pos] & (1 << d) != 0
                    && self.layout.neighbor(self.pos, d).map(|n| self.to_goal[n]) == Some(here - 1)
            })
            .map(|d| format!("move {}", DIRS[d]))
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    /// In image and both modes: the maze from above, one square block per cell and per
    /// wall or passage between cells (`2*height+1` x `2*width+1` blocks, walls
    /// [`WALL_RGB`], open floor [`FLOOR_RGB`], the agent [`AGENT_RGB`], the goal
    /// [`GOAL_RGB`]; the agent covers the goal once it stands on it), padded at the bottom
    /// and right with wall colour to multiples of 28 pixels ([`MazeEnv::frame_pixels`]).
    fn frame_into(&self, out: &mut Vec<u8>) -> Option<(u32, u32)> {
        if !self.cfg.obs.draws() || !self.started {
            return None;
        }
        let l = &self.layout;
        let (block, height, width) = Self::frame_pixels(l.width, l.height);
        let (rows, cols) = (2 * l.height + 1, 2 * l.width + 1);
        let colour = |by: usize, bx: usize| -> [u8; 3] {
            if by >= rows || bx >= cols {
                return WALL_RGB;
            }
            let open = match (by % 2, bx % 2) {
                // A cell.
                (1, 1) => {
                    let c = (by / 2) * l.width + bx / 2;
                    return if c == self.pos {
                        AGENT_RGB
                    } else if c == l.goal {
                        GOAL_RGB
                    } else {
                        FLOOR_RGB
                    };
                }
                // Between two cells of a row: the west cell's east side.
                (1, 0) => {
                    bx > 0 && bx < cols - 1 && l.open[(by / 2) * l.width + bx / 2 - 1] & 4 != 0
                }
                // Between two cells of a column: the north cell's south side.
                (0, 1) => {
                    by > 0 && by < rows - 1 && l.open[(by / 2 - 1) * l.width + bx / 2] & 2 != 0
                }
                _ => false,
            };
            if open {
                FLOOR_RGB
            } else {
                WALL_RGB
            }
        };
        draw_blocks(out, height, width, block, colour)
    }

    fn frame_shape(&self) -> Option<(u32, u32)> {
        self.cfg.obs.draws().then(|| {
            let (_, h, w) = Self::frame_pixels(self.cfg.width, self.cfg.height);
            (h as u32, w as u32)
        })
    }

    fn heap_bytes(&self) -> usize {
        vec_bytes(&self.layout.open)
            + vec_bytes(&self.layout.inside)
            + vec_bytes(&self.to_goal)
            + vec_bytes(&self.scratch.visited)
            + vec_bytes(&self.scratch.stack)
            + vec_bytes(&self.scratch.dist)
            + self.scratch.queue.capacity() * std::mem::size_of::<usize>()
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn instructions(&self) -> String {
        let mut s = String::from("You are in a grid maze. Reach the goal.");
        if self.cfg.obs.draws() {
            s.push_str(
                " Each turn you see a picture of the whole maze from above: dark grey squares \
                 are walls, light grey squares are open floor, the red square is you and the \
                 green square is the goal. North is up, east is right.",
            );
        }
        if self.cfg.obs.describes() {
            s.push_str(if self.cfg.obs.draws() {
                " The text also says"
            } else {
                " Each turn you see"
            });
            if self.cfg.show_position {
                s.push_str(
                    " your position (rows count from north to south, columns from west to \
                     east) and",
                );
            }
            s.push_str(" what lies to the north, south, east and west: wall, open or goal.");
            if self.cfg.signpost {
                s.push_str(
                    " An open side that leads one step closer to the goal reads closer, and \
                     so does a move that went there.",
                );
            }
            if self.cfg.goal_hint {
                s.push_str(" You also see how far the goal is in each direction.");
            }
        } else {
            s.push_str(" The text says what your last move did.");
        }
        s.push_str(
            " The actions are move north, move south, move east and move west. Reaching the \
             goal gives reward 1 and ends the episode.",
        );
        s.push_str(&crate::env::action_line("move north"));
        s
    }
}

#[cfg(test)]
mod tests;
