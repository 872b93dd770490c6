//! TextCraft (AgentGym): craft a Minecraft item from base items with a list of recipes.
//!
//! A faithful reimplementation of AgentGym's `agentenv-textcraft` on the same recipe files
//! (bundled at build time from `envs/textcraft/recipes`); see `envs/textcraft/README.md`
//! for what the agent sees, the action grammar, rewards, tasks and the few differences.
//!
//! - [`book`]: the shared recipe book (loading rules, interned names, depths, goal order).
//! - [`spec`]: SplitMix64, Python-compatible string rules, explicit task specs.
//! - [`solver`]: `valid_actions` and the oracle planner.

pub mod book;
mod solver;
pub mod spec;
#[cfg(test)]
mod tests;

use crate::env::{push_decimal, Env, Step, Task};
use crate::error::Result;
use crate::registry::{Kwargs, KwargsReader};
use book::{Book, Recipe};
use spec::{push_id, split_count, SplitMix64};
use std::cell::RefCell;
use std::sync::Arc;

/// Distinct uses sampled per input name when drawing distractor candidates (AgentGym: 10).
const USES_PER_INPUT: usize = 10;

const INSTRUCTIONS: &str = "You are crafting items in Minecraft from a few given crafting \
recipes. Each observation is the result of your last action; answer with exactly one action.\n\
Actions:\n\
- get N ITEM: fetch N of a base item (one that no recipe makes), e.g. `get 1 lapis lazuli`.\n\
- craft N ITEM using A X, B Y: craft with one of the given recipes, e.g. \
`craft 1 golden carrot using 8 gold nugget, 1 carrot`. Give the counts exactly as the \
recipe lists them; one command crafts one batch.\n\
- inventory: list what you carry.\n\
A recipe may name a generic ingredient such as `planks`; use a concrete kind in the \
command, e.g. `craft 4 stick using 2 oak planks`. Use only the recipes given. The episode \
ends with reward 1 when the goal item is crafted.";

/// A TextCraft episode.
pub struct TextCraft {
    book: Arc<Book>,
    max_distractors: usize,
    goal: u32,
    /// Held items in first-added order, as AgentGym's dict (an item at zero is dropped).
    inventory: Vec<(u32, u64)>,
    /// Recipes shown in the commands, in display order.
    listed: Vec<u32>,
    /// Scratch for item ids in failure messages (`minecraft:` + text with underscores).
    key: String,
    /// Apply AgentGym's client-side action cleanup before the server rules.
    sanitize: bool,
    /// Scratch for the cleaned action.
    clean: String,
}

/// A parsed craft input: the name (None when unknown), its count, and whether it is a tag.
#[derive(Clone, Copy)]
struct Part {
    name: Option<u32>,
    count: u64,
    is_tag: bool,
}

thread_local! {
    /// Per-thread scratch of resets: sample buffer, candidate pool, dedupe stamps and their
    /// epoch, sparse-shuffle swaps.
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new((Vec::new(), Vec::new(), Vec::new(), 0, Vec::new()))
    };
    static PARTS: RefCell<Vec<Part>> = const { RefCell::new(Vec::new()) };
}

type Scratch = (Vec<u32>, Vec<u32>, Vec<u32>, u32, Vec<(usize, u32)>);

/// All of `src` in order when `k >= len` (no draws); else the first `k` of a partial
/// Fisher-Yates shuffle of a copy of `src`, appended to `out` without copying `src`
/// (swapped positions live in `swaps`; same draws as [`partial_shuffle`] on a copy).
fn sample_sparse(
    rng: &mut SplitMix64,
    src: &[u32],
    k: usize,
    out: &mut Vec<u32>,
    swaps: &mut Vec<(usize, u32)>,
) {
    if k >= src.len() {
        out.extend_from_slice(src); // everything, in order, without draws
        return;
    }
    swaps.clear();
    let get = |swaps: &[(usize, u32)], pos: usize| {
        swaps.iter().find(|e| e.0 == pos).map_or(src[pos], |e| e.1)
    };
    for i in 0..k {
        let j = i + rng.below(src.len() - i);
        let (vi, vj) = (get(swaps, i), get(swaps, j));
        match swaps.iter_mut().find(|e| e.0 == j) {
            Some(e) => e.1 = vi,
            None => swaps.push((j, vi)),
        }
        out.push(vj);
    }
}

/// Byte offset of the last ` using ` in `text` (a plain backwards scan: for action-sized
/// text it beats setting up a substring searcher).
fn rfind_using(text: &str) -> Option<usize> {
    const PAT: &[u8; 7] = b" using ";
    let b = text.as_bytes();
    (0..=b.len().checked_sub(PAT.len())?)
        .rev()
        .find(|&p| b[p] == b' ' && &b[p..p + PAT.len()] == PAT)
}

/// `text.split(',')` with a plain byte scan (',' is ASCII, so every cut is a char boundary).
fn split_commas(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match t.bytes().position(|b| b == b',') {
            Some(p) => {
                rest = Some(&t[p + 1..]);
                Some(&t[..p])
            }
            None => {
                rest = None;
                Some(t)
            }
        }
    })
}

/// Moves the first `k` of a partial Fisher-Yates shuffle to the front of `arr`.
fn partial_shuffle(rng: &mut SplitMix64, arr: &mut [u32], k: usize) {
    for i in 0..k {
        let j = i + rng.below(arr.len() - i);
        arr.swap(i, j);
    }
}

/// Writes a failure message (the concatenation of `parts`): reward 0, not terminated.
fn fail(obs: &mut String, parts: &[&str]) -> (f32, bool) {
    for p in parts {
        obs.push_str(p);
    }
    (0.0, false)
}

/// Reward and `terminated` of an action that did (or did not) produce the goal.
fn outcome(done: bool) -> (f32, bool) {
    (f32::from(u8::from(done)), done)
}

impl TextCraft {
    pub fn new(max_distractors: usize, sanitize: bool) -> Self {
        Self {
            book: Book::shared(),
            max_distractors,
            goal: 0,
            inventory: Vec::new(),
            listed: Vec::new(),
            key: String::new(),
            sanitize,
            clean: String::new(),
        }
    }

    /// The goal item id, e.g. `minecraft:stick`.
    pub fn goal(&self) -> &str {
        &self.book.name(self.goal).id
    }

    fn lookup(&self, text: &str) -> Option<u32> {
        self.book.lookup_text(text)
    }

    fn held(&self, name: u32) -> u64 {
        self.inventory
            .iter()
            .find(|e| e.0 == name)
            .map_or(0, |e| e.1)
    }

    fn add(&mut self, name: u32, count: u64) {
        match self.inventory.iter_mut().find(|e| e.0 == name) {
            Some(e) => e.1 = e.1.saturating_add(count),
            None => self.inventory.push((name, count)),
        }
    }

    /// Draws the commands of an indexed task (or a spec without commands) into `listed`.
    fn draw_commands(&mut self, seed: u64) {
        let book = &*self.book;
        let plan = book.plan(self.goal);
        let mut rng = SplitMix64::new(seed ^ spec::fnv1a64(&book.name(self.goal).id));
        self.listed.clear();
        self.listed.extend_from_slice(&plan.needed);
        SCRATCH.with_borrow_mut(|(buf, pool, stamps, epoch, swaps)| {
            stamps.resize(book.recipes.len(), 0);
            *epoch = epoch.wrapping_add(1);
            if *epoch == 0 {
                stamps.fill(0);
                *epoch = 1;
            }
            for &c in &plan.needed_canonical {
                stamps[c as usize] = *epoch;
            }
            pool.clear();
            for &name in &plan.inputs {
                let uses = &book.name(name).uses;
                buf.clear();
                sample_sparse(&mut rng, uses, USES_PER_INPUT.min(uses.len()), buf, swaps);
                for &r in buf.iter() {
                    let c = book.canonical[r as usize] as usize;
                    if stamps[c] != *epoch {
                        stamps[c] = *epoch;
                        pool.push(r);
                    }
                }
            }
            let k = self.max_distractors.min(pool.len());
            if k < pool.len() {
                partial_shuffle(&mut rng, pool, k);
            }
            self.listed.extend_from_slice(&pool[..k]);
        });
        for i in (1..self.listed.len()).rev() {
            let j = rng.below(i + 1);
            self.listed.swap(i, j);
        }
    }

    fn observation(&self, commands: Option<&str>, obs: &mut String) {
        let book = &*self.book;
        let goal = &book.name(self.goal).display;
        obs.reserve(64 + self.listed.len() * 48);
        obs.push_str("Crafting commands:\n");
        match commands {
            Some(text) => obs.push_str(text),
            None => {
                for (k, &r) in self.listed.iter().enumerate() {
                    if k > 0 {
                        obs.push('\n');
                    }
                    obs.push_str(&book.recipe(r).text);
                }
            }
        }
        obs.push_str("\n\nGoal: craft ");
        obs.push_str(goal);
        obs.push('.');
    }

    fn get(&mut self, count: u64, text: &str, obs: &mut String) -> (f32, bool) {
        match self.lookup(text) {
            Some(name) if self.book.name(name).gettable() => {
                self.add(name, count);
                obs.push_str("Got ");
                push_decimal(obs, count);
                obs.push(' ');
                obs.push_str(text);
                outcome(name == self.goal)
            }
            _ => fail(obs, &["Could not find ", text]),
        }
    }

    fn inventory_text(&self, s: &mut String) {
        if self.inventory.is_empty() {
            s.push_str("Inventory: You are not carrying anything.");
            return;
        }
        s.reserve(12 + self.inventory.len() * 24);
        s.push_str("Inventory: ");
        for &(name, count) in &self.inventory {
            s.push('[');
            s.push_str(&self.book.name(name).display);
            s.push_str("] (");
            push_decimal(s, count);
            s.push_str(") ");
        }
    }

    fn craft(&mut self, out_text: &str, ins_text: &str, obs: &mut String) -> (f32, bool) {
        let (out_count, out_text) = split_count(out_text).unwrap_or((1, out_text));
        let out = self.lookup(out_text);
        let out_is_tag = out.is_some_and(|o| self.book.name(o).is_tag);
        PARTS.with_borrow_mut(|parts| {
            parts.clear();
            for piece in split_commas(ins_text) {
                let piece = spec::py_strip(piece);
                let Some((count, text)) = split_count(piece) else {
                    return fail(obs, &["Wrong item format: ", piece]);
                };
                let name = self.lookup(text);
                let is_tag = name.is_some_and(|n| self.book.name(n).is_tag);
                parts.push(Part {
                    name,
                    count,
                    is_tag,
                });
            }
            if !self.has_parts(parts) {
                const MSG: &str = "Could not find enough items to craft ";
                return match (out, out_is_tag) {
                    (_, true) => fail(obs, &[MSG, "None"]),
                    (Some(o), false) => fail(obs, &[MSG, &self.book.name(o).id]),
                    (None, false) => {
                        push_id(&mut self.key, out_text);
                        fail(obs, &[MSG, &self.key])
                    }
                };
            }
            let recipe = match out {
                Some(o) if !out_is_tag => self.find_recipe(o, parts),
                _ => None,
            };
            let Some(r) = recipe else {
                push_id(&mut self.key, out_text);
                let id = spec::py_repr(&self.key);
                let tag = if out_is_tag {
                    format!("ItemTag(tag={id}, item_id=None)")
                } else {
                    format!("ItemTag(tag=None, item_id={id})")
                };
                use std::fmt::Write;
                let _ = write!(
                    obs,
                    "Could not find a valid recipe for ItemTagWithCount(item_tag={tag}, \
                     count={out_count})"
                );
                return (0.0, false);
            };
            for p in parts.iter() {
                let name = p.name.expect("checked by has_parts");
                let pos = self
                    .inventory
                    .iter()
                    .position(|e| e.0 == name)
                    .expect("held");
                self.inventory[pos].1 -= p.count;
                if self.inventory[pos].1 == 0 {
                    self.inventory.remove(pos);
                }
            }
            let recipe: &Recipe = self.book.recipe(r);
            let (output, count) = (recipe.output, recipe.count);
            obs.push_str(&recipe.crafted);
            self.add(output, count);
            outcome(output == self.goal)
        })
    }

    /// One action under AgentGym's server rules: only the first `line` of `action` counts;
    /// `craft A using B` (split at the last " using "), `get N item`, `inventory...`.
    fn apply(&mut self, line: &str, action: &str, obs: &mut String) -> (f32, bool) {
        if let Some(rest) = line.strip_prefix("craft ") {
            // the last " using " (the regex's greedy first group)
            if let Some(p) = rfind_using(rest) {
                return self.craft(&rest[..p], &rest[p + 7..], obs);
            }
        }
        if let Some(rest) = line.strip_prefix("get ") {
            if let Some((count, item)) = split_count(rest) {
                return self.get(count, item, obs);
            }
        }
        if line.starts_with("inventory") {
            self.inventory_text(obs);
            return (0.0, false);
        }
        fail(obs, &["Could not execute ", action])
    }

    /// AgentGym's `has_items` (every part a held item with enough count), plus a check that
    /// repeated parts of one item fit together.
    fn has_parts(&self, parts: &[Part]) -> bool {
        for (k, p) in parts.iter().enumerate() {
            let Some(name) = p.name else { return false };
            if p.is_tag || !self.inventory.iter().any(|e| e.0 == name) {
                return false;
            }
            if parts[..k].iter().any(|q| q.name == p.name) {
                continue;
            }
            let total: u128 = parts
                .iter()
                .filter(|q| q.name == p.name)
                .map(|q| u128::from(q.count))
                .sum();
            if u128::from(self.held(name)) < total {
                return false;
            }
        }
        true
    }

    /// The first recipe of `out` whose inputs the parts match one to one with equal counts
    /// (a tag input takes any item of that tag).
    fn find_recipe(&self, out: u32, parts: &[Part]) -> Option<u32> {
        let book = &*self.book;
        'recipes: for &r in &book.name(out).item_recipes {
            let inputs = &book.recipe(r).inputs;
            if inputs.len() != parts.len() {
                continue;
            }
            let mut used = 0u64;
            for want in inputs {
                let hit = parts.iter().enumerate().position(|(k, p)| {
                    used & (1 << k) == 0
                        && match (want.is_tag, p.name) {
                            (false, name) => name == Some(want.name),
                            (true, Some(n)) => book.name(n).tag == Some(want.name),
                            (true, None) => false,
                        }
                });
                match hit {
                    Some(k) if parts[k].count == want.count => used |= 1 << k,
                    _ => continue 'recipes,
                }
            }
            return Some(r);
        }
        None
    }
}

impl Env for TextCraft {
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String> {
        let mut obs = String::new();
        self.reset_into(task, seed, &mut obs)?;
        Ok(obs)
    }

    fn reset_into(&mut self, task: &Task, seed: u64, obs: &mut String) -> Result<()> {
        let commands = match task {
            Task::Index(i) => {
                let goals = &self.book.goals;
                self.goal = goals[(*i % goals.len() as u64) as usize];
                None
            }
            Task::Spec(text) => {
                let (goal, commands) = spec::parse(&self.book, text)?;
                self.goal = goal;
                commands
            }
        };
        self.inventory.clear();
        match &commands {
            None => self.draw_commands(seed),
            Some(text) => {
                self.listed.clear();
                let book = &*self.book;
                self.listed
                    .extend(text.split('\n').filter_map(|l| book.recipe_by_text(l)));
            }
        }
        self.observation(commands.as_deref(), obs);
        Ok(())
    }

    fn step(&mut self, action: &str) -> Step {
        let mut obs = String::new();
        let (reward, terminated) = self.step_into(action, &mut obs);
        Step::new(obs, reward, terminated)
    }

    fn step_into(&mut self, action: &str, obs: &mut String) -> (f32, bool) {
        if !self.sanitize {
            let line = match action.bytes().position(|b| b == b'\n') {
                Some(p) => &action[..p],
                None => action,
            };
            return self.apply(line, action, obs);
        }
        let mut buf = std::mem::take(&mut self.clean);
        // A sanitized action is one line (only letters, digits, ',' and ' ' are left).
        let clean = spec::sanitize(action, &mut buf);
        let out = self.apply(clean, clean, obs);
        self.clean = buf;
        out
    }

    fn prefetch(&self) {
        crate::pool::prefetch(self.inventory.as_ptr());
        crate::pool::prefetch(self.listed.as_ptr());
    }

    fn valid_actions(&self) -> Vec<String> {
        solver::valid_actions(&self.book, &self.listed, &self.inventory)
    }

    fn oracle_action(&self) -> Option<String> {
        solver::plan(&self.book, self.goal, &self.inventory).and_then(|p| p.into_iter().next())
    }

    fn num_tasks(&self) -> u64 {
        self.book.goals.len() as u64
    }

    fn instructions(&self) -> String {
        INSTRUCTIONS.to_string()
    }
}

/// Constructor for the registry. Kwargs: `max_distractors` (default 10) and
/// `sanitize_actions` (default true: AgentGym's client cleanup of the action text).
pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let r = KwargsReader::new(
        "textcraft",
        kwargs,
        &["max_distractors", "sanitize_actions"],
    )?;
    let max_distractors = r.u64_or("max_distractors", 10)?;
    let max_distractors = usize::try_from(max_distractors).unwrap_or(usize::MAX);
    let sanitize = r.bool_or("sanitize_actions", true)?;
    Ok(Box::new(TextCraft::new(max_distractors, sanitize)))
}
