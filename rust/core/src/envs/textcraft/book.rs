//! The TextCraft recipe book: AgentGym's crafting-tree rules over the bundled recipe files,
//! with every item and tag name interned to a `u32`. Built once per process and shared.
//!
//! Loading rules (as in AgentGym's `CraftingTree`; files are read in sorted name order):
//! - only `crafting_shaped` (inputs counted from `pattern` x `key`, first alternative) and
//!   `crafting_shapeless` (repeated ingredients add up) recipes count;
//! - every input item and every result is an item; every input tag is a tag;
//! - a recipe whose only input ends in `_block` (uncrafting a block) is dropped;
//! - a recipe `group` names a tag (`minecraft:<group>`) that the result belongs to, unless
//!   the group equals the result's own id;
//! - a recipe whose result is already a transitive ingredient of one of its inputs is
//!   dropped (no cycles);
//! - afterwards, a tag input that no recipe can make (no member has a recipe) becomes a
//!   plain item, which can then be fetched with `get`.

use super::{parse_command, ParsedCommand};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock};

include!(concat!(env!("OUT_DIR"), "/textcraft_recipes.rs"));

pub const PREFIX: &str = "minecraft:";

/// FNV-1a, for the short name keys of the interning map.
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

pub type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// One input of a recipe: a name (item or tag) and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Input {
    pub name: u32,
    pub count: u64,
    pub is_tag: bool,
}

#[derive(Debug, Clone)]
pub struct Recipe {
    pub inputs: Vec<Input>,
    pub output: u32,
    pub count: u64,
    /// `craft 4 stick using 2 planks`: the command line shown to the agent.
    pub text: Box<str>,
    /// `Crafted 4 minecraft:stick`: the observation after a successful craft.
    pub crafted: Box<str>,
}

/// Everything known about one interned name.
#[derive(Debug, Clone, Default)]
pub struct Name {
    /// Full id, e.g. `minecraft:oak_planks`.
    pub id: Box<str>,
    /// As the agent sees it, e.g. `oak planks`.
    pub display: Box<str>,
    pub is_item: bool,
    pub is_tag: bool,
    /// The group tag of an item (`minecraft:planks` for oak planks).
    pub tag: Option<u32>,
    /// Recipes that make this item, in load order.
    pub item_recipes: Vec<u32>,
    /// Recipes whose result carries this name as its group tag.
    pub tag_recipes: Vec<u32>,
    /// Recipes that use this name as an input, in load order.
    pub uses: Vec<u32>,
    /// Items whose group tag is this name, in the order they were first tagged.
    pub members: Vec<u32>,
    /// Minimum crafting depth (0 for base items).
    pub depth: u64,
}

impl Name {
    pub fn craftable(&self) -> bool {
        !self.item_recipes.is_empty() || !self.tag_recipes.is_empty()
    }
    /// Can be fetched with `get`: a known item that is no tag and has no recipe.
    pub fn gettable(&self) -> bool {
        self.is_item && !self.is_tag && !self.craftable()
    }
    /// AgentGym's `itemid_recipes.get(name) or tag_recipes.get(name)`.
    pub fn recipes(&self) -> &[u32] {
        if self.item_recipes.is_empty() {
            &self.tag_recipes
        } else {
            &self.item_recipes
        }
    }
}

/// The recipes a goal needs (deduplicated by text) and their distinct input names.
#[derive(Debug, Default)]
pub struct Plan {
    pub needed: Vec<u32>,
    pub inputs: Vec<u32>,
    /// Canonical ids of the needed recipes, sorted (for distractor exclusion).
    pub needed_canonical: Vec<u32>,
    /// FNV-1a 64 of the goal's id (mixed into the seed of the commands' draws).
    pub id_hash: u64,
}

pub struct Book {
    pub names: Vec<Name>,
    pub recipes: Vec<Recipe>,
    index: FnvMap<Box<str>, u32>,
    /// Names by the hash of their id after `minecraft:` (for agent text, spaces as `_`).
    /// Open-addressing table (power-of-two size, linear probing) of (hash, name + 1; 0 =
    /// empty) for agent-text lookups, one cache line per probe.
    text_table: Vec<(u64, u32)>,
    /// Every id after `minecraft:`, back to back; `text_span[name]` = (start, len).
    text_arena: String,
    text_span: Vec<(u32, u32)>,
    /// The indexed tasks: items with recipes, stably sorted by depth.
    pub goals: Vec<u32>,
    /// For each recipe, the first recipe with the same text.
    pub canonical: Vec<u32>,
    by_text: FnvMap<Box<str>, u32>,
    plans: Vec<OnceLock<Plan>>,
    /// Listed command lines by [`line_hash`]: open-addressing table (as `text_table`) of
    /// (hash, index + 1 into `commands`; 0 = empty).
    command_table: Vec<(u64, u32)>,
    /// The parse of every distinct recipe text that parses.
    commands: Vec<ParsedCommand>,
}

/// Up to 8 bytes from `at` as a little-endian word (zero-padded), spaces read as
/// underscores (SWAR: bytes equal to 0x20 become 0x5f).
fn word(b: &[u8], at: usize) -> u64 {
    const LO7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let end = b.len().min(at + 8);
    let w = match b.get(at..at + 8) {
        Some(chunk) => u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
        None => {
            let mut buf = [0u8; 8];
            buf[..end - at.min(end)].copy_from_slice(&b[at.min(end)..end]);
            u64::from_le_bytes(buf)
        }
    };
    let x = w ^ 0x2020_2020_2020_2020;
    let zero_hi = !(((x & LO7).wrapping_add(LO7)) | x | LO7);
    let mask = (zero_hi >> 7).wrapping_mul(0xff);
    (w & !mask) | (0x5f5f_5f5f_5f5f_5f5f & mask)
}

/// A hash of text with spaces read as underscores, from its length and its first and last
/// 8 bytes (O(1) per lookup; candidates are verified byte by byte).
fn text_hash(text: &str) -> u64 {
    let b = text.as_bytes();
    let (head, tail) = (word(b, 0), word(b, b.len().saturating_sub(8)));
    let mut h = (b.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ head;
    h = (h ^ (h >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ tail;
    h = (h ^ (h >> 32)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 29)
}

/// Adds `index` under hash `h` to an open-addressing table of `(hash, index + 1)` entries
/// (0 = empty; power-of-two size with room to spare).
fn table_insert(table: &mut [(u64, u32)], h: u64, index: usize) {
    let mask = table.len() - 1;
    let mut slot = h as usize & mask;
    while table[slot].1 != 0 {
        slot = (slot + 1) & mask;
    }
    table[slot] = (h, index as u32 + 1);
}

/// The index under hash `h` for which `is(index)` holds, probing a table made by
/// [`table_insert`].
fn table_find(table: &[(u64, u32)], h: u64, mut is: impl FnMut(usize) -> bool) -> Option<usize> {
    let mask = table.len() - 1;
    let mut slot = h as usize & mask;
    loop {
        let (eh, entry) = table[slot];
        if entry == 0 {
            return None;
        }
        if eh == h && is(entry as usize - 1) {
            return Some(entry as usize - 1);
        }
        slot = (slot + 1) & mask;
    }
}

/// A hash of a whole line, eight bytes per step (the last word zero-padded).
fn line_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (b.len() as u64).wrapping_mul(K);
    let mut chunks = b.chunks_exact(8);
    for c in chunks.by_ref() {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(buf)).wrapping_mul(K);
    }
    h ^= h >> 32;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 29)
}

/// Human form of an id: `minecraft:oak_planks` -> `oak planks`.
pub fn display(id: &str) -> String {
    id.replace(PREFIX, "").replace('_', " ")
}

/// `key` of a shaped recipe, in file order.
struct OrderedKeys(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedKeys;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of pattern keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<OrderedKeys, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = m.next_entry::<String, Value>()? {
                    out.push(entry);
                }
                Ok(OrderedKeys(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct RecipeFile {
    #[serde(rename = "type")]
    kind: String,
    group: Option<String>,
    #[serde(default)]
    pattern: Vec<String>,
    key: Option<OrderedKeys>,
    #[serde(default)]
    ingredients: Vec<Value>,
    result: Option<Value>,
}

struct Loader {
    book: Book,
    deps: FnvMap<u32, HashSet<u32>>,
    tagged_order: Vec<u32>,
}

impl Loader {
    fn intern(&mut self, id: &str) -> u32 {
        if let Some(&i) = self.book.index.get(id) {
            return i;
        }
        let i = self.book.names.len() as u32;
        self.book.names.push(Name {
            id: id.into(),
            display: display(id).into(),
            ..Name::default()
        });
        self.book.index.insert(id.into(), i);
        i
    }

    fn ingredient(&mut self, v: &Value, file: &str) -> (u32, bool) {
        let v = match v {
            Value::Array(alts) => alts.first().unwrap_or(&Value::Null),
            other => other,
        };
        if let Some(item) = v.get("item").and_then(Value::as_str) {
            let i = self.intern(item);
            self.book.names[i as usize].is_item = true;
            (i, false)
        } else if let Some(tag) = v.get("tag").and_then(Value::as_str) {
            let i = self.intern(tag);
            self.book.names[i as usize].is_tag = true;
            (i, true)
        } else {
            panic!("recipe {file}: unknown ingredient {v}")
        }
    }

    fn load(&mut self, file: &str, text: &str) {
        let r: RecipeFile =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("recipe {file}: {e}"));
        let mut inputs: Vec<Input> = Vec::new();
        match r.kind.as_str() {
            "minecraft:crafting_shaped" => {
                for (key, v) in r.key.map(|k| k.0).unwrap_or_default() {
                    let (name, is_tag) = self.ingredient(&v, file);
                    let count: usize = r
                        .pattern
                        .iter()
                        .map(|l| l.matches(key.as_str()).count())
                        .sum();
                    inputs.push(Input {
                        name,
                        count: count as u64,
                        is_tag,
                    });
                }
            }
            "minecraft:crafting_shapeless" => {
                for v in &r.ingredients {
                    let (name, is_tag) = self.ingredient(v, file);
                    match inputs.iter_mut().find(|i| i.name == name) {
                        Some(i) => i.count += 1,
                        None => inputs.push(Input {
                            name,
                            count: 1,
                            is_tag,
                        }),
                    }
                }
            }
            _ => return,
        }
        let result = r
            .result
            .unwrap_or_else(|| panic!("recipe {file}: no result"));
        let (out_id, count) = match &result {
            Value::String(s) => (s.clone(), 1),
            v => {
                let item = v.get("item").and_then(Value::as_str);
                let item = item.unwrap_or_else(|| panic!("recipe {file}: bad result"));
                let count = v.get("count").and_then(Value::as_u64).filter(|&c| c > 0);
                (item.to_string(), count.unwrap_or(1))
            }
        };
        let output = self.intern(&out_id);
        self.book.names[output as usize].is_item = true;
        if inputs.len() == 1
            && self.book.names[inputs[0].name as usize]
                .id
                .ends_with("_block")
        {
            return;
        }
        let mut tag = None;
        if let Some(group) = &r.group {
            let tag_id = format!("{PREFIX}{group}");
            let t = self.intern(&tag_id);
            tag = Some(t);
            if tag_id != out_id {
                self.book.names[t as usize].is_tag = true;
                if self.book.names[output as usize].tag.is_none() {
                    self.tagged_order.push(output);
                }
                self.book.names[output as usize].tag = Some(t);
            }
        }
        self.deps.entry(output).or_default();
        let cyclic = inputs
            .iter()
            .any(|i| self.deps.get(&i.name).is_some_and(|d| d.contains(&output)));
        if cyclic {
            return;
        }
        let idx = self.book.recipes.len() as u32;
        for i in &inputs {
            let sub: Vec<u32> = self
                .deps
                .get(&i.name)
                .into_iter()
                .flatten()
                .copied()
                .collect();
            let d = self.deps.get_mut(&output).expect("deps entry");
            d.insert(i.name);
            d.extend(sub);
        }
        self.book.names[output as usize].item_recipes.push(idx);
        if let Some(t) = tag {
            self.book.names[t as usize].tag_recipes.push(idx);
        }
        self.book.recipes.push(Recipe {
            inputs,
            output,
            count,
            text: "".into(),
            crafted: "".into(),
        });
    }

    /// Tag inputs that no recipe can make become plain items.
    fn clean_up(&mut self) {
        let names = &mut self.book.names;
        for &item in &self.tagged_order {
            let t = names[item as usize].tag.expect("tagged item") as usize;
            names[t].members.push(item);
        }
        let mut converted = Vec::new();
        for r in &mut self.book.recipes {
            for i in r.inputs.iter_mut().filter(|i| i.is_tag) {
                let makeable = names[i.name as usize]
                    .members
                    .iter()
                    .any(|&m| !names[m as usize].item_recipes.is_empty());
                if !makeable {
                    i.is_tag = false;
                    converted.push(i.name);
                }
            }
        }
        for n in converted {
            names[n as usize].is_item = true;
            names[n as usize].is_tag = false;
        }
    }
}

impl Book {
    fn build() -> Book {
        let mut loader = Loader {
            book: Book {
                names: Vec::new(),
                recipes: Vec::new(),
                index: FnvMap::default(),
                text_table: Vec::new(),
                text_arena: String::new(),
                text_span: Vec::new(),
                goals: Vec::new(),
                canonical: Vec::new(),
                by_text: FnvMap::default(),
                plans: Vec::new(),
                command_table: Vec::new(),
                commands: Vec::new(),
            },
            deps: FnvMap::default(),
            tagged_order: Vec::new(),
        };
        let mut item_order = Vec::new();
        for (file, text) in RECIPE_FILES {
            let before = loader.book.recipes.len();
            loader.load(file, text);
            if loader.book.recipes.len() > before {
                let out = loader.book.recipes[before].output;
                if loader.book.names[out as usize].item_recipes.len() == 1 {
                    item_order.push(out);
                }
            }
        }
        loader.clean_up();
        let mut b = loader.book;
        for idx in 0..b.recipes.len() {
            let r = &b.recipes[idx];
            let ins: Vec<String> = r
                .inputs
                .iter()
                .map(|i| format!("{} {}", i.count, b.names[i.name as usize].display))
                .collect();
            let out = &b.names[r.output as usize];
            let text = format!("craft {} {} using {}", r.count, out.display, ins.join(", "));
            let crafted = format!("Crafted {} {}", r.count, out.id);
            let first = *b.by_text.entry(text.clone().into()).or_insert(idx as u32);
            b.canonical.push(first);
            for i in r.inputs.clone() {
                let uses = &mut b.names[i.name as usize].uses;
                if uses.last() != Some(&(idx as u32)) {
                    uses.push(idx as u32);
                }
            }
            let r = &mut b.recipes[idx];
            r.text = text.into();
            r.crafted = crafted.into();
        }
        let mut memo = vec![None; b.names.len()];
        for &item in &item_order {
            b.depth_of(item, &mut memo);
        }
        for (n, d) in b.names.iter_mut().zip(memo) {
            n.depth = d.unwrap_or(0);
        }
        let mut goals: Vec<u32> = item_order;
        goals.sort_by_key(|&g| b.names[g as usize].depth);
        goals.retain(|&g| b.names[g as usize].depth >= 1);
        b.goals = goals;
        b.plans = (0..b.names.len()).map(|_| OnceLock::new()).collect();
        b.text_table = vec![(0, 0); (b.names.len() * 2).next_power_of_two()];
        for i in 0..b.names.len() {
            let id = b.names[i].id.clone();
            let start = b.text_arena.len() as u32;
            match id.strip_prefix(PREFIX).filter(|r| !r.contains(' ')) {
                Some(rest) => {
                    b.text_arena.push_str(rest);
                    b.text_span.push((start, rest.len() as u32));
                    table_insert(&mut b.text_table, text_hash(rest), i);
                }
                None => b.text_span.push((start, 0)),
            }
        }
        // Only lines that the client cleanup keeps as they are (so one line, not `look`):
        // `step_into` looks the raw action up before cleaning it.
        let mut buf = String::new();
        for r in 0..b.recipes.len() as u32 {
            let text = &b.recipes[r as usize].text;
            if b.canonical[r as usize] == r && super::spec::sanitize(text, &mut buf) == &**text {
                if let Some(parsed) = parse_command(&b, text) {
                    b.commands.push(parsed);
                }
            }
        }
        b.command_table = vec![(0, 0); (b.commands.len() * 2).next_power_of_two()];
        for (k, c) in b.commands.iter().enumerate() {
            table_insert(&mut b.command_table, line_hash(c.text.as_bytes()), k);
        }
        b
    }

    fn depth_of(&self, name: u32, memo: &mut Vec<Option<u64>>) -> u64 {
        if let Some(d) = memo[name as usize] {
            return d;
        }
        memo[name as usize] = Some(1 << 30); // cycle guard
        let mut best: Option<u64> = None;
        for &r in self.names[name as usize].recipes() {
            let mut worst = 0;
            for i in &self.recipes[r as usize].inputs {
                worst = worst.max(self.depth_of(i.name, memo) + 1);
            }
            best = Some(best.map_or(worst, |b: u64| b.min(worst)));
        }
        let d = best.unwrap_or(0);
        memo[name as usize] = Some(d);
        d
    }

    /// The process-wide book (parsed from the bundled files on first use).
    pub fn shared() -> Arc<Book> {
        static BOOK: OnceLock<Arc<Book>> = OnceLock::new();
        BOOK.get_or_init(|| Arc::new(Book::build())).clone()
    }

    /// The id of a full name (`minecraft:oak_planks`), if known.
    pub fn lookup(&self, id: &str) -> Option<u32> {
        self.index.get(id).copied()
    }

    pub fn name(&self, i: u32) -> &Name {
        &self.names[i as usize]
    }

    pub fn recipe(&self, r: u32) -> &Recipe {
        &self.recipes[r as usize]
    }

    /// The name that agent text refers to: `minecraft:` + text with spaces as underscores
    /// (AgentGym's rule), found without building that string.
    pub fn lookup_text(&self, text: &str) -> Option<u32> {
        table_find(&self.text_table, text_hash(text), |name| {
            let (start, len) = self.text_span[name];
            let rest = &self.text_arena.as_bytes()[start as usize..(start + len) as usize];
            // `word` reads the arena as it is (it has no spaces) and the text with
            // spaces as underscores, zero-padded alike past the end.
            rest.len() == text.len()
                && (0..rest.len())
                    .step_by(8)
                    .all(|at| word(rest, at) == word(text.as_bytes(), at))
        })
        .map(|name| name as u32)
    }

    /// The parse of a line that is exactly a recipe's command text (any recipe with that
    /// text: they parse alike), if it parses.
    pub(crate) fn command(&self, line: &str) -> Option<&ParsedCommand> {
        table_find(&self.command_table, line_hash(line.as_bytes()), |k| {
            *self.commands[k].text == *line
        })
        .map(|k| &self.commands[k])
    }

    /// The recipe whose command text is exactly `text`, if any.
    pub fn recipe_by_text(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// Needed recipes (depth-first from the goal, first of each text) and their inputs.
    pub fn plan(&self, goal: u32) -> &Plan {
        self.plans[goal as usize].get_or_init(|| {
            let mut plan = Plan {
                id_hash: super::spec::fnv1a64(&self.names[goal as usize].id),
                ..Plan::default()
            };
            let mut seen = vec![false; self.names.len()];
            let mut texts = HashSet::new();
            self.visit(goal, &mut seen, &mut texts, &mut plan);
            plan.needed_canonical = texts.into_iter().collect();
            plan.needed_canonical.sort_unstable();
            plan
        })
    }

    fn visit(&self, name: u32, seen: &mut [bool], texts: &mut HashSet<u32>, plan: &mut Plan) {
        if std::mem::replace(&mut seen[name as usize], true) {
            return;
        }
        for &r in self.names[name as usize].recipes() {
            if texts.insert(self.canonical[r as usize]) {
                plan.needed.push(r);
            }
            for i in &self.recipes[r as usize].inputs {
                if !plan.inputs.contains(&i.name) {
                    plan.inputs.push(i.name);
                }
                self.visit(i.name, seen, texts, plan);
            }
        }
    }
}
