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

use crate::env::{push_decimal, snapshot_of, vec_bytes, Env, Step, Task};
use crate::error::Result;
use crate::registry::{Kwargs, KwargsReader};
use book::{Book, Recipe};
use spec::{push_id, split_count, SplitMix64};
use std::cell::RefCell;
use std::sync::Arc;

/// Distinct uses sampled per input name when drawing distractor candidates (AgentGym: 10).
const USES_PER_INPUT: usize = 10;

const INSTRUCTIONS: &str = "You are crafting items in Minecraft from a few given crafting \
recipes. Each observation is the result of your last action.\n\
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
#[derive(Clone)]
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
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
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
            refused: false,
        }
    }

    /// The goal item id, e.g. `minecraft:stick`.
    pub fn goal(&self) -> &str {
        &self.book.name(self.goal).id
    }

    fn lookup(&self, text: &str) -> Option<u32> {
        self.book.lookup_text(text)
    }

    /// Draws the commands of an indexed task (or a spec without commands) into `listed`.
    fn draw_commands(&mut self, seed: u64) {
        let book = &*self.book;
        let plan = book.plan(self.goal);
        let mut rng = SplitMix64::new(seed ^ plan.id_hash);
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
                add(&mut self.inventory, name, count);
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
        let book = &*self.book;
        PARTS.with_borrow_mut(|parts| match parse_craft(book, out_text, ins_text, parts) {
            Ok((head, out_text)) => craft_parsed(
                book,
                &mut self.inventory,
                &mut self.key,
                self.goal,
                &head,
                out_text,
                parts,
                |book| head_recipe(book, &head, parts),
                obs,
            ),
            Err(piece) => fail(obs, &["Wrong item format: ", piece]),
        })
    }

    /// `craft` of a line that is exactly a recipe's command text, from its precomputed
    /// parse; None (nothing written) for any other line.
    fn listed_command(&mut self, line: &str, obs: &mut String) -> Option<(f32, bool)> {
        let book = &*self.book;
        let c = book.command(line)?;
        let out_text = &line[c.out_text.0 as usize..c.out_text.1 as usize];
        Some(craft_parsed(
            book,
            &mut self.inventory,
            &mut self.key,
            self.goal,
            &c.head,
            out_text,
            &c.parts,
            |_| c.recipe,
            obs,
        ))
    }

    /// One action under AgentGym's server rules: only the first `line` of `action` counts;
    /// `craft A using B` (split at the last " using "), `get N item`, `inventory...`.
    fn apply(&mut self, line: &str, action: &str, obs: &mut String) -> (f32, bool) {
        if let Some(rest) = line.strip_prefix("craft ") {
            // A listed command exactly: its parse is precomputed (the same parse as below).
            if let Some(out) = self.listed_command(line, obs) {
                return out;
            }
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
        self.refused = true;
        fail(obs, &["Could not execute ", action])
    }
}

/// What `craft` reads from its output text: `(count, name, name is a tag)`.
#[derive(Clone, Copy)]
struct CraftHead {
    out_count: u64,
    out: Option<u32>,
    out_is_tag: bool,
}

/// A `craft` command parsed once: the head, where the output text lies in the command
/// line, and the parts (what [`parse_craft`] gives for that line).
pub(crate) struct ParsedCommand {
    /// The command line itself.
    pub(crate) text: Box<str>,
    head: CraftHead,
    out_text: (u32, u32),
    parts: Box<[Part]>,
    /// What [`find_recipe`] gives for the head and parts (a function of the book only).
    recipe: Option<u32>,
}

/// Parses `craft OUT using INS` (the text after `craft `, split at the last ` using `):
/// the head and the output text after its count, with the parts in `parts`; `Err(piece)`
/// for a part that is no `N item`.
fn parse_craft<'a, 'b>(
    book: &Book,
    out_text: &'b str,
    ins_text: &'a str,
    parts: &mut Vec<Part>,
) -> std::result::Result<(CraftHead, &'b str), &'a str> {
    let (out_count, out_text) = split_count(out_text).unwrap_or((1, out_text));
    let out = book.lookup_text(out_text);
    let out_is_tag = out.is_some_and(|o| book.name(o).is_tag);
    parts.clear();
    for piece in split_commas(ins_text) {
        let piece = spec::py_strip(piece);
        let Some((count, text)) = split_count(piece) else {
            return Err(piece);
        };
        let name = book.lookup_text(text);
        let is_tag = name.is_some_and(|n| book.name(n).is_tag);
        parts.push(Part {
            name,
            count,
            is_tag,
        });
    }
    let head = CraftHead {
        out_count,
        out,
        out_is_tag,
    };
    Ok((head, out_text))
}

/// The parse of a whole `craft ...` line as [`TextCraft::apply`] reads it, if it parses
/// (for the book's table of listed commands).
pub(crate) fn parse_command(book: &Book, line: &str) -> Option<ParsedCommand> {
    let rest = line.strip_prefix("craft ")?;
    let p = rfind_using(rest)?;
    let (out_text, ins_text) = (&rest[..p], &rest[p + 7..]);
    let mut parts = Vec::new();
    let (head, bare) = parse_craft(book, out_text, ins_text, &mut parts).ok()?;
    let end = 6 + p;
    let start = end - bare.len();
    Some(ParsedCommand {
        text: line.into(),
        head,
        out_text: (start as u32, end as u32),
        recipe: head_recipe(book, &head, &parts),
        parts: parts.into_boxed_slice(),
    })
}

/// The recipe a craft of `head` from `parts` uses, if any.
fn head_recipe(book: &Book, head: &CraftHead, parts: &[Part]) -> Option<u32> {
    match head.out {
        Some(o) if !head.out_is_tag => find_recipe(book, o, parts),
        _ => None,
    }
}

/// `craft` after parsing: checks the parts against the inventory and the output's recipes,
/// then crafts (or writes AgentGym's failure message). `out_text` is the output text
/// after its count.
#[allow(clippy::too_many_arguments)]
fn craft_parsed(
    book: &Book,
    inventory: &mut Vec<(u32, u64)>,
    key: &mut String,
    goal: u32,
    head: &CraftHead,
    out_text: &str,
    parts: &[Part],
    recipe: impl FnOnce(&Book) -> Option<u32>,
    obs: &mut String,
) -> (f32, bool) {
    let CraftHead {
        out_count,
        out,
        out_is_tag,
    } = *head;
    if !has_parts(inventory, parts) {
        const MSG: &str = "Could not find enough items to craft ";
        return match (out, out_is_tag) {
            (_, true) => fail(obs, &[MSG, "None"]),
            (Some(o), false) => fail(obs, &[MSG, &book.name(o).id]),
            (None, false) => {
                push_id(key, out_text);
                fail(obs, &[MSG, key])
            }
        };
    }
    let Some(r) = recipe(book) else {
        push_id(key, out_text);
        let id = spec::py_repr(key);
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
    for p in parts {
        let name = p.name.expect("checked by has_parts");
        let pos = inventory.iter().position(|e| e.0 == name).expect("held");
        inventory[pos].1 -= p.count;
        if inventory[pos].1 == 0 {
            inventory.remove(pos);
        }
    }
    let recipe: &Recipe = book.recipe(r);
    let (output, count) = (recipe.output, recipe.count);
    obs.push_str(&recipe.crafted);
    add(inventory, output, count);
    outcome(output == goal)
}

fn held(inventory: &[(u32, u64)], name: u32) -> u64 {
    inventory.iter().find(|e| e.0 == name).map_or(0, |e| e.1)
}

fn add(inventory: &mut Vec<(u32, u64)>, name: u32, count: u64) {
    match inventory.iter_mut().find(|e| e.0 == name) {
        Some(e) => e.1 = e.1.saturating_add(count),
        None => inventory.push((name, count)),
    }
}

/// AgentGym's `has_items` (every part a held item with enough count), plus a check that
/// repeated parts of one item fit together.
fn has_parts(inventory: &[(u32, u64)], parts: &[Part]) -> bool {
    for (k, p) in parts.iter().enumerate() {
        let Some(name) = p.name else { return false };
        if p.is_tag || !inventory.iter().any(|e| e.0 == name) {
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
        if u128::from(held(inventory, name)) < total {
            return false;
        }
    }
    true
}

/// The first recipe of `out` whose inputs the parts match one to one with equal counts
/// (a tag input takes any item of that tag).
fn find_recipe(book: &Book, out: u32, parts: &[Part]) -> Option<u32> {
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
        self.refused = false;
        // A listed command as it is: one line that the cleanup keeps as it is (the book's
        // table holds only such lines), so both paths below would parse it so.
        if let Some(out) = self.listed_command(action, obs) {
            return out;
        }
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
        crate::util::prefetch(self.inventory.as_ptr());
        crate::util::prefetch(self.listed.as_ptr());
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        solver::valid_actions(&self.book, &self.listed, &self.inventory)
    }

    fn oracle_action(&self) -> Option<String> {
        solver::plan(&self.book, self.goal, &self.inventory).and_then(|p| p.into_iter().next())
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    fn heap_bytes(&self) -> usize {
        // The recipe book is shared and read-only: not counted.
        vec_bytes(&self.inventory)
            + vec_bytes(&self.listed)
            + self.key.capacity()
            + self.clean.capacity()
    }

    fn num_tasks(&self) -> u64 {
        self.book.goals.len() as u64
    }

    fn instructions(&self) -> String {
        INSTRUCTIONS.to_string() + &crate::env::action_line("get 1 lapis lazuli")
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
