//! `_test_panic`: a test-only env, not shipped (registered by
//! [`crate::registry::register_test_envs`]). It counts steps and fails on demand, so that tests
//! can show one failing episode never takes its batch down:
//! - the action `panic` panics inside `step`;
//! - the task text `panic` panics inside `reset`;
//! - the task text `reject` is refused by `reset` (`InvalidTask`);
//! - the kwarg `fail_make=true` makes construction fail (`InvalidArgument`).

use crate::env::{Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};

#[derive(Default)]
pub struct PanicEnv {
    count: u64,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let kw = KwargsReader::new("_test_panic", kwargs, &["fail_make"])?;
    if kw.bool_or("fail_make", false)? {
        return Err(CoreError::InvalidArgument(
            "_test_panic: construction failed (fail_make=true)".into(),
        ));
    }
    Ok(Box::new(PanicEnv::default()))
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
        Ok(format!("reset task={task:?} seed={seed}"))
    }

    fn step(&mut self, action: &str) -> Step {
        if action == "panic" {
            panic!("test env asked to panic");
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

    fn instructions(&self) -> String {
        "Test env: `noop`, `stop` ends the episode, `panic` panics.".into()
    }
}
