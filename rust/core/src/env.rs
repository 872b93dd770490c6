//! The native environment contract.
//!
//! A native env is deterministic: `reset(task, seed)` followed by the same actions always
//! yields the same observations and rewards. Envs never see the horizon; the pool owns it.

use crate::error::Result;

/// Which task an episode plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    /// The env's task number `i` (envs take it modulo their task count where that is finite).
    Index(u64),
    /// An explicit task in the env's own text format (see each env's README), e.g. a
    /// TextCraft task given as commands text plus a goal item.
    Spec(String),
}

/// The result of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub observation: String,
    pub reward: f32,
    /// The episode reached a terminal state of the env (success or irrecoverable failure).
    pub terminated: bool,
}

impl Step {
    pub fn new(observation: impl Into<String>, reward: f32, terminated: bool) -> Self {
        Self {
            observation: observation.into(),
            reward,
            terminated,
        }
    }
}

/// A native environment. `Send` so that the pool can step envs on worker threads.
pub trait Env: Send {
    /// Start an episode of `task`; `seed` drives every random choice (distractors, layout).
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String>;
    /// [`reset`](Env::reset) that appends the observation to `obs` (see [`Env::step_into`]);
    /// on error `obs` may hold partial text, which the caller discards.
    fn reset_into(&mut self, task: &Task, seed: u64, obs: &mut String) -> Result<()> {
        obs.push_str(&self.reset(task, seed)?);
        Ok(())
    }
    /// Apply one action (already extracted from model text). Invalid actions are not
    /// errors: they return a message as observation and reward 0.
    fn step(&mut self, action: &str) -> Step;
    /// Whether the last step refused its action as unreadable: not one of the env's commands,
    /// or one whose arguments do not parse. Such a step changes nothing but the turn count;
    /// the pool counts them per episode (`Episode::invalid_turns`). Default: never.
    fn refused(&self) -> bool {
        false
    }
    /// [`step`](Env::step) that appends the observation to `obs` instead of returning a new
    /// `String`; returns `(reward, terminated)`. The pool calls this one, with `obs` pointing
    /// into a batch-wide buffer, so an env that overrides it steps without allocating. The
    /// default forwards to `step`; an override must observe exactly what `step` does.
    fn step_into(&mut self, action: &str, obs: &mut String) -> (f32, bool) {
        let step = self.step(action);
        obs.push_str(&step.observation);
        (step.reward, step.terminated)
    }
    /// A hint from the pool that this env steps next: start loading the state a step reads
    /// first (e.g. with [`crate::util::prefetch`] on heap buffers). Must not change anything
    /// observable; the default does nothing.
    fn prefetch(&self) {}
    /// The actions that are currently meaningful (for random/scripted policies and `play`).
    fn valid_actions(&self) -> Vec<String>;
    /// An action from the env's reference solver for the current state, if it has one.
    fn oracle_action(&self) -> Option<String> {
        None
    }
    /// Number of distinct indexed tasks (`u64::MAX` for procedurally unbounded envs).
    fn num_tasks(&self) -> u64;
    /// Instructions for the agent (what it sees, the action format); used as system prompt.
    fn instructions(&self) -> String;
    /// A copy of this env's whole state, independent of it from now on: stepping either
    /// never changes what the other observes, and the copy continues exactly as this env
    /// would (the same actions give the same observations, rewards, termination and
    /// refusals). Data that never changes after construction (word lists, catalogues,
    /// recipe books) may be shared. `None`: this env cannot snapshot (the default).
    /// Native envs implement it with `Clone` ([`snapshot_of`]).
    fn snapshot(&self) -> Option<Box<dyn Env>> {
        None
    }
    /// Heap bytes this env owns beyond its own struct (`size_of_val`): the capacities of
    /// its buffers, not shared read-only data. What a snapshot of it costs besides the
    /// struct; used for reports only. Default: 0.
    fn heap_bytes(&self) -> usize {
        0
    }
    /// The current state's picture, for an env built to observe images (the `obs` kwarg of
    /// `maze` and `gridworld`): appends it to `out` as row-major RGB bytes (top row first,
    /// left to right, 3 bytes per pixel: `height * width * 3` in all), leaving what `out`
    /// already holds untouched, and returns `Some((height, width))`, both multiples of
    /// [`FRAME_ALIGN`]. The same state always draws the same bytes. `None`, with nothing
    /// appended: this env, or this build of it, has no picture, or no episode has started.
    /// Default: `None`.
    fn frame_into(&self, _out: &mut Vec<u8>) -> Option<(u32, u32)> {
        None
    }
    /// `(height, width)` of the frames [`frame_into`](Env::frame_into) draws for this
    /// build's indexed tasks, fixed at construction (an env whose task texts may change the
    /// picture's size says so in its README); `None` when it draws none. Default: `None`.
    fn frame_shape(&self) -> Option<(u32, u32)> {
        None
    }
}

/// What an env that has pictures observes: its `obs` kwarg.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ObsMode {
    /// Text only (the default; the observations of envs without pictures).
    #[default]
    Text,
    /// A frame ([`Env::frame_into`]) carries the state; the text keeps only what the
    /// picture cannot say (the last action's outcome, the mission, the success line).
    Image,
    /// The full text observation and a frame.
    Both,
}

impl ObsMode {
    /// The `obs` kwarg (`"text"`, `"image"` or `"both"`, default `"text"`); any other value
    /// is the reader's named `InvalidArgument`.
    pub fn read(kwargs: &crate::registry::KwargsReader<'_>) -> Result<Self> {
        kwargs.choice(
            "obs",
            "text",
            &[
                ("text", ObsMode::Text),
                ("image", ObsMode::Image),
                ("both", ObsMode::Both),
            ],
        )
    }

    /// Whether observations carry the full text description (`text` and `both`).
    pub fn describes(self) -> bool {
        self != ObsMode::Image
    }

    /// Whether the env draws frames (`image` and `both`).
    pub fn draws(self) -> bool {
        self != ObsMode::Text
    }
}

/// The side, in pixels, that the height and width of every frame are multiples of: a
/// vision model's 14-pixel patches, merged 2 x 2.
pub const FRAME_ALIGN: usize = 28;

/// Pixel geometry of a frame that draws a grid of `rows` x `cols` square cells:
/// `(cell, height, width)`. `cell` is the side of a cell in pixels, at least `min_cell`:
/// the largest one that keeps the grid's longer side within the smallest multiple of
/// [`FRAME_ALIGN`] that holds it at `min_cell`. `height` and `width` are the grid's pixel
/// sides rounded up to multiples of [`FRAME_ALIGN`]; the envs fill that margin (bottom and
/// right) with their wall colour.
pub fn frame_geometry(rows: usize, cols: usize, min_cell: usize) -> (usize, usize, usize) {
    let align = |px: usize| px.div_ceil(FRAME_ALIGN).max(1) * FRAME_ALIGN;
    let side = rows.max(cols).max(1);
    let cell = (align(side * min_cell) / side).max(min_cell);
    (cell, align(rows * cell), align(cols * cell))
}

/// Appends a `height` x `width` RGB frame to `out`, the colour of each pixel given by
/// `pixel(y, x)`; returns `Some((height, width))` for [`Env::frame_into`].
pub fn draw_frame(
    out: &mut Vec<u8>,
    height: usize,
    width: usize,
    mut pixel: impl FnMut(usize, usize) -> [u8; 3],
) -> Option<(u32, u32)> {
    out.reserve(height * width * 3);
    for y in 0..height {
        for x in 0..width {
            out.extend_from_slice(&pixel(y, x));
        }
    }
    Some((height as u32, width as u32))
}

/// [`draw_frame`] of a picture made of `block` x `block` squares of one colour each: the
/// square at block row `by`, block column `bx` has colour `colour(by, bx)`, asked once per
/// square (each pixel row is built once per block row and copied), the same bytes as
/// `draw_frame(out, height, width, |y, x| colour(y / block, x / block))`.
pub fn draw_blocks(
    out: &mut Vec<u8>,
    height: usize,
    width: usize,
    block: usize,
    mut colour: impl FnMut(usize, usize) -> [u8; 3],
) -> Option<(u32, u32)> {
    out.reserve(height * width * 3);
    let mut row = Vec::with_capacity(width * 3);
    for by in 0..height.div_ceil(block) {
        row.clear();
        for bx in 0..width.div_ceil(block) {
            let c = colour(by, bx);
            for _ in 0..block.min(width - bx * block) {
                row.extend_from_slice(&c);
            }
        }
        for _ in 0..block.min(height - by * block) {
            out.extend_from_slice(&row);
        }
    }
    Some((height as u32, width as u32))
}

/// [`Env::snapshot`] of an env that is `Clone`.
pub fn snapshot_of<E: Env + Clone + 'static>(env: &E) -> Option<Box<dyn Env>> {
    Some(Box::new(env.clone()))
}

/// Heap bytes of a `Vec`'s buffer (its capacity), for [`Env::heap_bytes`].
pub fn vec_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * std::mem::size_of::<T>()
}

/// The closing lines of every env's instructions: the reply format, said once, with one
/// example (`agentgym.envs.base.action_line` in Python writes the same text).
pub fn action_line(example: &str) -> String {
    format!("\nReply with Action: followed by one action, and nothing else. For example:\nAction: {example}")
}

/// Appends the decimal form of `v` (for observations built in [`Env::step_into`], without
/// `format!`'s machinery).
pub fn push_decimal(s: &mut String, mut v: u64) {
    if v < 10 {
        s.push(char::from(b'0' + v as u8));
        return;
    }
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    s.push_str(std::str::from_utf8(&buf[i..]).expect("ascii digits"));
}

#[cfg(test)]
mod tests {
    #[test]
    fn frame_geometry_aligns_to_the_patch_grid() {
        // (rows, cols, min_cell) -> (cell, height, width)
        for (rows, cols, min, want) in [
            (9, 9, 3, (3, 28, 28)),
            (13, 13, 3, (4, 56, 56)),
            (19, 19, 3, (4, 84, 84)),
            (5, 3, 3, (5, 28, 28)),
            (7, 7, 5, (8, 56, 56)),
            (10, 10, 5, (5, 56, 56)),
            (14, 3, 5, (6, 84, 28)),
        ] {
            assert_eq!(
                super::frame_geometry(rows, cols, min),
                want,
                "{rows}x{cols}"
            );
        }
        for rows in 1..80 {
            for cols in 1..80 {
                let (cell, h, w) = super::frame_geometry(rows, cols, 3);
                assert!(cell >= 3 && h % 28 == 0 && w % 28 == 0);
                assert!(rows * cell <= h && cols * cell <= w);
            }
        }
    }

    #[test]
    fn push_decimal_writes_like_display() {
        for v in [0, 7, 10, 99, 12_345, u64::MAX] {
            let mut s = String::from("n=");
            super::push_decimal(&mut s, v);
            assert_eq!(s, format!("n={v}"));
        }
    }

    #[test]
    fn draw_blocks_draws_what_draw_frame_draws() {
        let colour = |by: usize, bx: usize| [by as u8, bx as u8, (by * 7 + bx) as u8];
        for (h, w, block) in [(28, 28, 4), (56, 84, 5), (28, 56, 3), (7, 9, 2), (5, 5, 8)] {
            let (mut a, mut b) = (vec![1u8], vec![1u8]);
            let sa = super::draw_blocks(&mut a, h, w, block, colour);
            let sb = super::draw_frame(&mut b, h, w, |y, x| colour(y / block, x / block));
            assert_eq!((sa, a.len()), (sb, 1 + h * w * 3));
            assert_eq!(a, b, "{h}x{w} in blocks of {block}");
        }
    }
}
