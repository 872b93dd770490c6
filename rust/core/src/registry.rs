//! Native environment ids and their constructors.
//!
//! Each shipped native env has one [`EnvSpec`] in [`shipped`]; constructor kwargs arrive as
//! a JSON object so that the bindings can pass Python keyword arguments through unchanged.
//! Test-only envs (`_test_panic`, and `_bench_cartpole` for benches) are not shipped: they exist only once
//! [`register_test_envs`] has run (and always in this crate's own unit tests).

use crate::env::Env;
use crate::error::{CoreError, Result};
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};

pub type Kwargs = Map<String, Value>;
pub type MakeFn = fn(&Kwargs) -> Result<Box<dyn Env>>;

pub struct EnvSpec {
    pub id: &'static str,
    pub description: &'static str,
    pub make: MakeFn,
    /// Values the `split` kwarg takes, its default first (empty: the env has no splits).
    pub splits: &'static [&'static str],
    /// The split held out for evaluation (None: the env has no held-out split).
    pub held_out: Option<&'static str>,
    /// How a task index maps to a task (what `num_tasks` counts, or, for envs with
    /// `u64::MAX` tasks, how any index becomes one).
    pub tasks: &'static str,
}

static SHIPPED: &[EnvSpec] = &[
    EnvSpec {
        id: "textcraft",
        description: "TextCraft: craft a Minecraft item from base items using recipes (AgentGym)",
        make: crate::envs::textcraft::make,
        splits: &[],
        held_out: None,
        tasks: "index i is goal i % 544 of the recipe book (indices wrap)",
    },
    EnvSpec {
        id: "maze",
        description: "Grid maze with text observations; reach the goal",
        make: crate::envs::maze::make,
        splits: &["train", "test"],
        held_out: Some("test"),
        tasks: "procedural: any index is a layout (a function of index, size and split); train and test layouts are disjoint",
    },
    EnvSpec {
        id: "wordle",
        description: "Wordle: guess the five-letter word from per-letter feedback",
        make: crate::envs::wordle::make,
        splits: &["all", "train", "test"],
        held_out: Some("test"),
        tasks: "index i is answer i % n of the split's answer list (indices wrap)",
    },
    EnvSpec {
        id: "gridworld",
        description:
            "BabyAI-style text grid world: go to, pick up, open (doors, keys, boxes, balls)",
        make: crate::envs::gridworld::make,
        splits: &["train", "test"],
        held_out: Some("test"),
        tasks: "procedural: any index is a layout (a function of index, preset and split); train and test layouts are disjoint",
    },
    EnvSpec {
        id: "game2048",
        description: "2048 on a 4x4 board as text: slide and merge tiles to reach the target",
        make: crate::envs::game2048::make,
        splits: &[],
        held_out: None,
        tasks: "procedural: any index seeds the tile spawns of one game",
    },
    EnvSpec {
        id: "webshop",
        description: "WebShop: search a synthetic store and buy what the instruction asks for",
        make: crate::envs::webshop::make,
        splits: &["train", "test", "all"],
        held_out: Some("test"),
        tasks: "index i is shopping goal i % n of the split (indices wrap)",
    },
    EnvSpec {
        id: "search",
        description:
            "Deep search: answer 1-3 hop questions by searching and reading a local corpus",
        make: crate::envs::search::make,
        splits: &["train", "test"],
        held_out: Some("test"),
        tasks: "index i is question i % n of the split at the given hops (indices wrap)",
    },
];

/// Test-only envs, added by [`register_test_envs`].
static TEST_SPECS: &[EnvSpec] = &[
    EnvSpec {
        id: "_test_panic",
        description: "Test-only env that panics or fails on demand (see envs/test_panic)",
        make: crate::envs::test_panic::make,
        splits: &[],
        held_out: None,
        tasks: "any index (test-only env)",
    },
    EnvSpec {
        id: "_bench_cartpole",
        description: "CartPole-v1's dynamics, for the EnvPool comparison (see envs/bench_cartpole)",
        make: crate::envs::bench_cartpole::make,
        splits: &[],
        held_out: None,
        tasks: "procedural: any index seeds a start state (bench-only env)",
    },
];

static TEST_ENVS_REGISTERED: AtomicBool = AtomicBool::new(false);

/// Adds the test-only envs (`_test_panic`, `_bench_cartpole`) and games (`_test_panic_game`) to this process's
/// registry, for tests of failure handling; calling it again changes nothing. Returns the
/// envs' ids.
pub fn register_test_envs() -> Vec<&'static str> {
    TEST_ENVS_REGISTERED.store(true, Ordering::Relaxed);
    TEST_SPECS.iter().map(|s| s.id).collect()
}

/// Whether the test-only envs and games are registered (always in this crate's unit tests).
pub fn test_envs_registered() -> bool {
    cfg!(test) || TEST_ENVS_REGISTERED.load(Ordering::Relaxed)
}

/// The shipped envs (test-only envs never among them).
pub fn shipped() -> impl Iterator<Item = &'static EnvSpec> {
    SHIPPED.iter()
}

/// Every registered env: the shipped ones, then the test-only ones once registered.
pub fn specs() -> impl Iterator<Item = &'static EnvSpec> {
    let tests: &'static [EnvSpec] = if test_envs_registered() {
        TEST_SPECS
    } else {
        &[]
    };
    SHIPPED.iter().chain(tests)
}

/// Registered native env ids, in registration order.
pub fn env_ids() -> Vec<&'static str> {
    specs().map(|s| s.id).collect()
}

pub fn spec(id: &str) -> Result<&'static EnvSpec> {
    specs()
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

    /// The string kwarg `key` (`default` when absent) mapped through `options`; any other
    /// string is an error that lists the option names in their order.
    pub fn choice<T: Clone>(&self, key: &str, default: &str, options: &[(&str, T)]) -> Result<T> {
        let name = self.str_or(key, default)?;
        if let Some((_, value)) = options.iter().find(|(n, _)| *n == name) {
            return Ok(value.clone());
        }
        let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
        let list = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        };
        Err(CoreError::InvalidArgument(format!(
            "{}: {key} must be {list}, got {name:?}",
            self.env
        )))
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
    }

    #[test]
    fn test_envs_are_not_shipped() {
        let shipped: Vec<&str> = shipped().map(|s| s.id).collect();
        let test_ids = register_test_envs();
        assert_eq!(test_ids, ["_test_panic", "_bench_cartpole"]);
        for id in &test_ids {
            assert!(!shipped.contains(id), "{id} is shipped");
            assert!(
                make_env(id, &Kwargs::new()).is_ok(),
                "{id} is not registered"
            );
        }
        assert_eq!(env_ids(), [shipped, test_ids].concat());
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

    #[test]
    fn kwargs_reader_choice_maps_names_and_lists_them_on_error() {
        let levels = [("easy", 4), ("medium", 6), ("hard", 9)];
        let choose = |value: Option<Value>, options: &[(&str, i32)]| {
            let mut kw = Kwargs::new();
            if let Some(v) = value {
                kw.insert("difficulty".into(), v);
            }
            let r = KwargsReader::new("maze", &kw, &["difficulty"]).unwrap();
            r.choice("difficulty", options[1].0, options)
        };
        assert_eq!(choose(None, &levels), Ok(6));
        assert_eq!(choose(Some(Value::from("hard")), &levels), Ok(9));
        let bad = |m: &str| Err(CoreError::InvalidArgument(m.into()));
        assert_eq!(
            choose(Some(Value::from("extreme")), &levels),
            bad("maze: difficulty must be easy, medium or hard, got \"extreme\"")
        );
        assert_eq!(
            choose(Some(Value::from("hard")), &[("train", 0), ("test", 1)]),
            bad("maze: difficulty must be train or test, got \"hard\"")
        );
        assert!(choose(Some(Value::from(3)), &levels).is_err());
    }
}
