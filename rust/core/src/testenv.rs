//! `_test_panic`: a hidden test-only env. It counts steps and panics on the action `panic`,
//! so that tests can show one panicking episode never takes its batch down.

use crate::env::{Env, Step, Task};
use crate::error::Result;
use crate::registry::{Kwargs, KwargsReader};

#[derive(Default)]
pub struct PanicEnv {
    count: u64,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    KwargsReader::new("_test_panic", kwargs, &[])?;
    Ok(Box::new(PanicEnv::default()))
}

impl Env for PanicEnv {
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String> {
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
