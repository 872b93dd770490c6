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

/// A frame of an env in image mode: `(height, width, rgb bytes)`, checked to be appended
/// after what the buffer held (nothing before it changed), `h * w * 3` bytes, and sides a
/// multiple of 28 pixels.
pub fn frame(e: &dyn Env) -> (usize, usize, Vec<u8>) {
    let mut buf = vec![7u8; 5];
    let (h, w) = e.frame_into(&mut buf).expect("image mode draws a frame");
    assert_eq!(&buf[..5], &[7; 5], "frame_into changed the bytes before it");
    let (h, w) = (h as usize, w as usize);
    assert_eq!(buf.len() - 5, h * w * 3);
    assert!(h % 28 == 0 && w % 28 == 0 && h > 0 && w > 0, "{h}x{w}");
    (h, w, buf.split_off(5))
}

/// The RGB value of pixel `(y, x)` of a [`frame`].
pub fn pixel(f: &(usize, usize, Vec<u8>), y: usize, x: usize) -> [u8; 3] {
    let i = (y * f.1 + x) * 3;
    [f.2[i], f.2[i + 1], f.2[i + 2]]
}

/// `a` (built without `obs`) and `b` (built with `obs="text"`) say the same over 30 tasks
/// and `actions` from each reset, and neither draws a frame.
pub fn assert_text_mode_is_the_default(a: &mut dyn Env, b: &mut dyn Env, actions: &[&str]) {
    assert_eq!(a.instructions(), b.instructions());
    assert_eq!((a.frame_shape(), b.frame_shape()), (None, None));
    for t in 0..30 {
        assert_eq!(
            a.reset(&Task::Index(t), 0).unwrap(),
            b.reset(&Task::Index(t), 0).unwrap()
        );
        for act in actions {
            assert_eq!(a.step(act), b.step(act));
        }
        assert_eq!(b.frame_into(&mut Vec::new()), None);
    }
}
