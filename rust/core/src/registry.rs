//! Native environment ids and their constructors.
//!
//! Each native env registers one [`EnvSpec`]; constructor kwargs arrive as a JSON object so
//! that the bindings can pass Python keyword arguments through unchanged.

use crate::env::Env;
use crate::error::{CoreError, Result};
use serde_json::{Map, Value};

pub type Kwargs = Map<String, Value>;
pub type MakeFn = fn(&Kwargs) -> Result<Box<dyn Env>>;

pub struct EnvSpec {
    pub id: &'static str,
    pub description: &'static str,
    /// Hidden ids (test-only envs) are constructible but not listed.
    pub hidden: bool,
    pub make: MakeFn,
    /// Values the `split` kwarg takes, its default first (empty: the env has no splits).
    pub splits: &'static [&'static str],
    /// The split held out for evaluation (None: the env has no held-out split).
    pub held_out: Option<&'static str>,
    /// How a task index maps to a task (what `num_tasks` counts, or, for envs with
    /// `u64::MAX` tasks, how any index becomes one).
    pub tasks: &'static str,
}

static SPECS: &[EnvSpec] = &[
    EnvSpec {
        id: "textcraft",
        description: "TextCraft: craft a Minecraft item from base items using recipes (AgentGym)",
        hidden: false,
        make: crate::textcraft::make,
        splits: &[],
        held_out: None,
        tasks: "index i is goal i % 544 of the recipe book (indices wrap)",
    },
    EnvSpec {
        id: "maze",
        description: "Grid maze with text observations; reach the goal",
        hidden: false,
        make: crate::maze::make,
        splits: &["train", "test"],
        held_out: Some("test"),
        tasks: "procedural: any index is a layout (a function of index, size and split); train and test layouts are disjoint",
    },
    EnvSpec {
        id: "wordle",
        description: "Wordle: guess the five-letter word from per-letter feedback",
        hidden: false,
        make: crate::wordle::make,
        splits: &["all", "train", "test"],
        held_out: Some("test"),
        tasks: "index i is answer i % n of the split's answer list (indices wrap)",
    },
    EnvSpec {
        id: "gridworld",
        description:
            "BabyAI-style text grid world: go to, pick up, open (doors, keys, boxes, balls)",
        hidden: false,
        make: crate::gridworld::make,
        splits: &["train", "test"],
        held_out: Some("test"),
        tasks: "procedural: any index is a layout (a function of index, preset and split); train and test layouts are disjoint",
    },
    EnvSpec {
        id: "game2048",
        description: "2048 on a 4x4 board as text: slide and merge tiles to reach the target",
        hidden: false,
        make: crate::game2048::make,
        splits: &[],
        held_out: None,
        tasks: "procedural: any index seeds the tile spawns of one game",
    },
    EnvSpec {
        id: "webshop",
        description: "WebShop: search a synthetic store and buy what the instruction asks for",
        hidden: false,
        make: crate::webshop::make,
        splits: &["train", "test", "all"],
        held_out: Some("test"),
        tasks: "index i is shopping goal i % n of the split (indices wrap)",
    },
    EnvSpec {
        id: "search",
        description:
            "Deep search: answer 1-3 hop questions by searching and reading a local corpus",
        hidden: false,
        make: crate::search::make,
        splits: &["train", "test"],
        held_out: Some("test"),
        tasks: "index i is question i % n of the split at the given hops (indices wrap)",
    },
    EnvSpec {
        id: "_test_panic",
        description: "Test-only env that panics or fails on demand (see testenv.rs)",
        hidden: true,
        make: crate::testenv::make,
        splits: &[],
        held_out: None,
        tasks: "any index (test-only env)",
    },
];

pub fn specs() -> impl Iterator<Item = &'static EnvSpec> {
    SPECS.iter()
}

/// Listed (non-hidden) native env ids.
pub fn env_ids() -> Vec<&'static str> {
    SPECS.iter().filter(|s| !s.hidden).map(|s| s.id).collect()
}

pub fn spec(id: &str) -> Result<&'static EnvSpec> {
    SPECS
        .iter()
        .find(|s| s.id == id)
        .ok_or_else(|| CoreError::UnknownEnv {
            id: id.to_string(),
            known: env_ids().join(", "),
        })
}

pub fn make_env(id: &str, kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    (spec(id)?.make)(kwargs)
}

/// Typed kwargs access for env constructors: clear errors for wrong types and unknown keys.
pub struct KwargsReader<'a> {
    env: &'static str,
    kwargs: &'a Kwargs,
}

impl<'a> KwargsReader<'a> {
    pub fn new(env: &'static str, kwargs: &'a Kwargs, allowed: &[&str]) -> Result<Self> {
        if let Some(bad) = kwargs.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(CoreError::InvalidArgument(format!(
                "{env} got an unexpected keyword argument {bad:?} (allowed: {})",
                allowed.join(", ")
            )));
        }
        Ok(Self { env, kwargs })
    }

    fn type_error(&self, key: &str, want: &str) -> CoreError {
        CoreError::InvalidArgument(format!("{}: {key} must be {want}", self.env))
    }

    pub fn u64_or(&self, key: &str, default: u64) -> Result<u64> {
        match self.kwargs.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| self.type_error(key, "a non-negative integer")),
        }
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.kwargs.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.type_error(key, "a bool")),
        }
    }

    pub fn str_or(&self, key: &str, default: &str) -> Result<String> {
        match self.kwargs.get(key) {
            None | Some(Value::Null) => Ok(default.to_string()),
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| self.type_error(key, "a string")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_id_lists_known_ids() {
        let err = make_env("nope", &Kwargs::new()).err().unwrap();
        let msg = err.to_string();
        assert!(msg.contains("nope") && msg.contains("textcraft") && msg.contains("maze"));
        assert!(!msg.contains("_test_panic"));
    }

    #[test]
    fn every_spec_constructs_with_defaults() {
        for s in specs() {
            assert!((s.make)(&Kwargs::new()).is_ok(), "{} failed", s.id);
        }
    }

    #[test]
    fn every_split_constructs_and_others_are_rejected() {
        for s in specs() {
            for split in s.splits {
                let mut kw = Kwargs::new();
                kw.insert("split".into(), Value::from(*split));
                assert!((s.make)(&kw).is_ok(), "{} split {split}", s.id);
            }
            if let Some(held) = s.held_out {
                assert!(s.splits.contains(&held), "{}: held-out split {held}", s.id);
                assert!(s.splits.contains(&"train"), "{}: no train split", s.id);
            }
            if let Some(default) = s.splits.first() {
                let mut kw = Kwargs::new();
                kw.insert("split".into(), Value::from(*default));
                let named = (s.make)(&kw).unwrap().num_tasks();
                let plain = (s.make)(&Kwargs::new()).unwrap().num_tasks();
                assert_eq!(named, plain, "{}: {default} is not the default split", s.id);
            }
            let mut kw = Kwargs::new();
            kw.insert("split".into(), Value::from("no-such-split"));
            assert!((s.make)(&kw).is_err(), "{} accepted a bogus split", s.id);
            assert!(!s.tasks.is_empty());
        }
    }

    #[test]
    fn kwargs_reader_rejects_unknown_and_mistyped() {
        let mut kw = Kwargs::new();
        kw.insert("size".into(), Value::from("big"));
        let r = KwargsReader::new("maze", &kw, &["size"]).unwrap();
        assert!(r.u64_or("size", 5).is_err());
        kw.insert("colour".into(), Value::from(1));
        assert!(KwargsReader::new("maze", &kw, &["size"]).is_err());
    }
}
