//! Multi-hop questions over the corpus: relations, question chains, splits and answer
//! scoring (exact match after normalisation, else token F1).

use super::corpus::{Corpus, Entity};
use crate::error::{CoreError, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Questions per hop level reserved for the test split (the first of a fixed shuffle).
pub const TEST_PER_HOP: usize = 500;
const QUESTION_SEED: u64 = 0x5155_4553_5449_4F4E;

/// A relation from an entity to another entity or to a year.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rel {
    BornIn,
    StudiedAt,
    BornYear,
    LocatedIn,
    Capital,
    FoundedBy,
    HeadquarteredIn,
    FoundedYear,
    InventedBy,
    MadeBy,
    InventedYear,
    UniversityIn,
}

/// What a relation leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Entity(Entity),
    Year(u32),
}

impl Rel {
    pub const ALL: [Rel; 12] = [
        Rel::BornIn,
        Rel::StudiedAt,
        Rel::BornYear,
        Rel::LocatedIn,
        Rel::Capital,
        Rel::FoundedBy,
        Rel::HeadquarteredIn,
        Rel::FoundedYear,
        Rel::InventedBy,
        Rel::MadeBy,
        Rel::InventedYear,
        Rel::UniversityIn,
    ];

    /// The relation's value for `e`, or `None` where it does not apply to `e`'s type.
    pub fn apply(self, c: &Corpus, e: Entity) -> Option<Value> {
        use Entity as E;
        let v = match (self, e) {
            (Rel::BornIn, E::Person(i)) => Value::Entity(E::City(c.people[i as usize].born_in)),
            (Rel::StudiedAt, E::Person(i)) => {
                Value::Entity(E::University(c.people[i as usize].studied_at))
            }
            (Rel::BornYear, E::Person(i)) => Value::Year(c.people[i as usize].born_year),
            (Rel::LocatedIn, E::City(i)) => Value::Entity(E::Country(c.cities[i as usize].country)),
            (Rel::Capital, E::Country(i)) => {
                Value::Entity(E::City(c.countries[i as usize].capital))
            }
            (Rel::FoundedBy, E::Company(i)) => {
                Value::Entity(E::Person(c.companies[i as usize].founder))
            }
            (Rel::HeadquarteredIn, E::Company(i)) => {
                Value::Entity(E::City(c.companies[i as usize].hq))
            }
            (Rel::FoundedYear, E::Company(i)) => Value::Year(c.companies[i as usize].founded),
            (Rel::InventedBy, E::Invention(i)) => {
                Value::Entity(E::Person(c.inventions[i as usize].inventor))
            }
            (Rel::MadeBy, E::Invention(i)) => {
                Value::Entity(E::Company(c.inventions[i as usize].maker))
            }
            (Rel::InventedYear, E::Invention(i)) => Value::Year(c.inventions[i as usize].year),
            (Rel::UniversityIn, E::University(i)) => {
                Value::Entity(E::City(c.universities[i as usize].city))
            }
            _ => return None,
        };
        Some(v)
    }

    /// The question asking for this relation of the thing described by `np`.
    pub fn question(self, np: &str) -> String {
        match self {
            Rel::BornIn => format!("In which city was {np} born?"),
            Rel::StudiedAt => format!("At which university did {np} study?"),
            Rel::BornYear => format!("In what year was {np} born?"),
            Rel::LocatedIn => format!("In which country is {np} located?"),
            Rel::Capital => format!("What is the capital of {np}?"),
            Rel::FoundedBy => format!("Who founded {np}?"),
            Rel::HeadquarteredIn => format!("In which city is {np} headquartered?"),
            Rel::FoundedYear => format!("In what year was {np} founded?"),
            Rel::InventedBy => format!("Who invented {np}?"),
            Rel::MadeBy => format!("Which company manufactures {np}?"),
            Rel::InventedYear => format!("In what year was {np} invented?"),
            Rel::UniversityIn => format!("In which city is {np} located?"),
        }
    }

    /// A noun phrase for this relation's value of `np` ("the founder of X").
    pub fn phrase(self, np: &str) -> String {
        match self {
            Rel::BornIn => format!("the birthplace of {np}"),
            Rel::StudiedAt => format!("the university where {np} studied"),
            Rel::LocatedIn => format!("the country where {np} is located"),
            Rel::Capital => format!("the capital of {np}"),
            Rel::FoundedBy => format!("the founder of {np}"),
            Rel::HeadquarteredIn => format!("the headquarters city of {np}"),
            Rel::InventedBy => format!("the inventor of {np}"),
            Rel::MadeBy => format!("the manufacturer of {np}"),
            Rel::UniversityIn => format!("the home city of {np}"),
            Rel::BornYear | Rel::FoundedYear | Rel::InventedYear => unreachable!("year"),
        }
    }
}

/// One question chain: a start entity and 1-3 relations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    pub start: Entity,
    pub rels: [Rel; 3],
    pub hops: u8,
}

/// A question with its answer and the entities whose documents hold each hop's fact.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub text: String,
    pub answer: String,
    /// `hops` entities: the document of `path[i]` states the fact of hop `i + 1`.
    pub path: Vec<Entity>,
}

impl Chain {
    pub fn question(&self, c: &Corpus) -> Question {
        let mut path = vec![self.start];
        let mut np = c.mention(self.start);
        let mut value = Value::Entity(self.start);
        let rels = &self.rels[..self.hops as usize];
        for (i, &r) in rels.iter().enumerate() {
            let Value::Entity(e) = value else {
                unreachable!("a year ends a chain")
            };
            value = r.apply(c, e).expect("chains are enumerated valid");
            if i + 1 < rels.len() {
                np = r.phrase(&np);
                if let Value::Entity(next) = value {
                    path.push(next);
                }
            }
        }
        let answer = match value {
            Value::Entity(e) => c.name(e).to_string(),
            Value::Year(y) => y.to_string(),
        };
        Question {
            text: rels.last().unwrap().question(&np),
            answer,
            path,
        }
    }
}

/// Every valid chain, by hop count, in a fixed shuffled order.
pub struct QuestionBank {
    pub by_hops: [Vec<Chain>; 3],
}

impl QuestionBank {
    pub fn generate(c: &Corpus) -> Self {
        let mut by_hops: [Vec<Chain>; 3] = Default::default();
        for start in c.entities() {
            extend(
                c,
                start,
                start,
                &mut Vec::new(),
                &mut vec![start],
                &mut by_hops,
            );
        }
        let mut rng = ChaCha8Rng::seed_from_u64(QUESTION_SEED);
        for level in by_hops.iter_mut() {
            level.shuffle(&mut rng);
        }
        Self { by_hops }
    }
}

/// Depth-first enumeration of chains from `start`; the current entity is `at`. Chains whose
/// value revisits an entity of the chain are skipped (no "capital of the country of X" = X).
fn extend(
    c: &Corpus,
    start: Entity,
    at: Entity,
    rels: &mut Vec<Rel>,
    seen: &mut Vec<Entity>,
    out: &mut [Vec<Chain>; 3],
) {
    for r in Rel::ALL {
        let Some(v) = r.apply(c, at) else { continue };
        if let Value::Entity(e) = v {
            if seen.contains(&e) {
                continue;
            }
        }
        rels.push(r);
        let mut arr = [r; 3];
        arr[..rels.len()].copy_from_slice(rels);
        out[rels.len() - 1].push(Chain {
            start,
            rels: arr,
            hops: rels.len() as u8,
        });
        if let (Value::Entity(e), true) = (v, rels.len() < 3) {
            seen.push(e);
            extend(c, start, e, rels, seen, out);
            seen.pop();
        }
        rels.pop();
    }
}

/// The process-wide question bank over [`super::corpus::corpus`].
pub fn bank() -> &'static QuestionBank {
    static BANK: OnceLock<QuestionBank> = OnceLock::new();
    BANK.get_or_init(|| QuestionBank::generate(super::corpus::corpus()))
}

/// Which questions an env draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

impl Split {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Split::Train),
            "test" => Ok(Split::Test),
            other => Err(CoreError::InvalidArgument(format!(
                "search: split must be 'train' or 'test', got {other:?}"
            ))),
        }
    }

    /// The chains of `hops` (1..=3) in this split.
    pub fn chains(self, bank: &QuestionBank, hops: u8) -> &[Chain] {
        let level = &bank.by_hops[hops as usize - 1];
        match self {
            Split::Test => &level[..TEST_PER_HOP],
            Split::Train => &level[TEST_PER_HOP..],
        }
    }
}

/// Lowercase, drop punctuation and articles, collapse spaces (SQuAD-style).
pub fn normalize(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .map(|ch| if ch.is_alphanumeric() { ch } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// 1.0 for an exact match after [`normalize`], else the token F1 of the two answers.
pub fn answer_score(prediction: &str, gold: &str) -> f32 {
    let (p, g) = (normalize(prediction), normalize(gold));
    if p == g {
        return 1.0;
    }
    let mut counts: HashMap<&str, i32> = HashMap::new();
    for t in g.split_whitespace() {
        *counts.entry(t).or_insert(0) += 1;
    }
    let mut common = 0;
    for t in p.split_whitespace() {
        if let Some(n) = counts.get_mut(t) {
            if *n > 0 {
                *n -= 1;
                common += 1;
            }
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f32 / p.split_whitespace().count() as f32;
    let recall = common as f32 / g.split_whitespace().count() as f32;
    2.0 * precision * recall / (precision + recall)
}
