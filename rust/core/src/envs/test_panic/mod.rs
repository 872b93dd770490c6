//! `_test_panic`: a test-only env, not shipped (registered by
//! [`crate::registry::register_test_envs`]). It counts steps and fails on demand, so that tests
//! can show one failing episode never takes its batch down:
//! - the action `panic` panics inside `step`;
//! - the task text `panic` panics inside `reset`;
//! - the task text `reject` is refused by `reset` (`InvalidTask`);
//! - the kwarg `fail_make=true` makes construction fail (`InvalidArgument`);
//! - with the kwarg `frames=true` it draws 28x28 frames ([`Env::frame_into`]: one grey level,
//!   the step count), and after the action `frame_panic` (`frame_malformed`) its next frames
//!   panic (append one byte too few) until the next reset.

use crate::env::{draw_frame, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};

#[derive(Default)]
pub struct PanicEnv {
    count: u64,
    frames: bool,
    /// Set by `frame_panic` / `frame_malformed`: how the next frames fail.
    frame_fault: Option<&'static str>,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let kw = KwargsReader::new("_test_panic", kwargs, &["fail_make", "frames"])?;
    if kw.bool_or("fail_make", false)? {
        return Err(CoreError::InvalidArgument(
            "_test_panic: construction failed (fail_make=true)".into(),
        ));
    }
    Ok(Box::new(PanicEnv {
        frames: kw.bool_or("frames", false)?,
        ..PanicEnv::default()
    }))
}

impl Env for PanicEnv {
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String> {
        match task {
            Task::Spec(s) if s == "panic" => panic!("test env asked to panic on reset"),
            Task::Spec(s) if s == "reject" => {
                return Err(CoreError::InvalidTask {
                    env: "_test_panic".into(),
                    message: "the task text \"reject\" is refused".into(),
                })
            }
            _ => {}
        }
        self.count = 0;
        self.frame_fault = None;
        Ok(format!("reset task={task:?} seed={seed}"))
    }

    fn step(&mut self, action: &str) -> Step {
        if action == "panic" {
            panic!("test env asked to panic");
        }
        if action == "frame_panic" || action == "frame_malformed" {
            self.frame_fault = Some(if action == "frame_panic" {
                "panic"
            } else {
                "malformed"
            });
        }
        self.count += 1;
        Step::new(
            format!("step {} {action}", self.count),
            1.0,
            action == "stop",
        )
    }

    fn valid_actions(&self) -> Vec<String> {
        vec!["noop".into(), "stop".into(), "panic".into()]
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn frame_into(&self, out: &mut Vec<u8>) -> Option<(u32, u32)> {
        if !self.frames {
            return None;
        }
        match self.frame_fault {
            Some("panic") => panic!("test env asked to panic while drawing"),
            Some(_) => {
                draw_frame(out, 28, 28, |_, _| [1, 2, 3]);
                out.pop();
                Some((28, 28))
            }
            None => draw_frame(out, 28, 28, |_, _| [self.count as u8; 3]),
        }
    }

    fn frame_shape(&self) -> Option<(u32, u32)> {
        self.frames.then_some((28, 28))
    }

    fn instructions(&self) -> String {
        "Test env: `noop`, `stop` ends the episode, `panic` panics.".into()
    }
}
