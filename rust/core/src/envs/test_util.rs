//! Checks shared by the envs' unit tests.

use crate::env::{Env, Task};
use crate::error::CoreError;
use crate::registry::MakeFn;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::Value;
use std::fmt::Debug;

/// The env that `make` builds from the JSON object `kwargs`.
pub fn build(make: MakeFn, kwargs: Value) -> Box<dyn Env> {
    make(kwargs.as_object().expect("kwargs are a JSON object")).unwrap()
}

/// `make` refuses each of `kwargs` with a named `InvalidArgument`.
pub fn assert_bad_kwargs(make: MakeFn, kwargs: &[Value]) {
    for kw in kwargs {
        assert!(
            matches!(
                make(kw.as_object().expect("kwargs are a JSON object")),
                Err(CoreError::InvalidArgument(_))
            ),
            "{kw}"
        );
    }
}

/// `env` refuses a task text with `InvalidTask` (an env that takes task indices only).
pub fn assert_refuses_task_text(env: &mut dyn Env) {
    assert!(matches!(
        env.reset(&Task::Spec("x".into()), 0),
        Err(CoreError::InvalidTask { .. })
    ));
}

/// `parse(text) == want` for every `(text, want)`.
pub fn assert_parses<T: PartialEq + Debug>(parse: impl Fn(&str) -> T, cases: &[(&str, T)]) {
    for (text, want) in cases {
        assert_eq!(&parse(text), want, "{text:?}");
    }
}

/// Each `(action, observation)` in turn: stepping `env` with `action` observes exactly
/// `observation`.
pub fn assert_dialogue(env: &mut dyn Env, steps: &[(&str, &str)]) {
    for (action, want) in steps {
        assert_eq!(env.step(action).observation, *want, "after {action:?}");
    }
}

/// Steps `env` with its oracle's actions until the episode terminates: `(reward of the last
/// step, steps taken)`. Panics if the oracle stops acting or `max_steps` pass first.
pub fn play_oracle(env: &mut dyn Env, max_steps: usize) -> (f32, usize) {
    for step in 1..=max_steps {
        let a = env
            .oracle_action()
            .expect("oracle has an action before the end");
        let s = env.step(&a);
        if s.terminated {
            return (s.reward, step);
        }
    }
    panic!("oracle did not finish in {max_steps} steps");
}

/// Steps `env` with uniformly random valid actions for at most `max_steps` steps: the reward
/// of the step that terminated the episode, or None if none did.
pub fn play_random(env: &mut dyn Env, rng: &mut impl Rng, max_steps: usize) -> Option<f32> {
    for _ in 0..max_steps {
        let actions = env.valid_actions();
        let s = env.step(actions.choose(rng).expect("a valid action"));
        if s.terminated {
            return Some(s.reward);
        }
    }
    None
}
