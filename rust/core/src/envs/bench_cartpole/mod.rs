//! `_bench_cartpole`: CartPole-v1's dynamics (Gymnasium's `CartPoleEnv`, Euler integration)
//! as a native env, for benches only: it is not in the shipped registry (registered with the
//! test envs by [`crate::registry::register_test_envs`]). It lets `bench/peer_envpool.py`
//! compare the pool's machinery with EnvPool's C++ `CartPole-v1` on the same trivial
//! dynamics, so the env logic costs the same on both sides.
//!
//! - Actions: `left` or `0` pushes the cart left, `right` or `1` right; anything else is
//!   refused (the state does not change).
//! - Reward 1 for every step taken before the end, the step that ends it included (as
//!   Gymnasium); a step after the end answers `terminated` with reward 0.
//! - Ends when the cart leaves ±2.4 or the pole tilts past ±12 degrees; the 500-step limit
//!   of `CartPole-v1` is the pool's horizon (`max_turns`), not the env's.
//! - Start state: four numbers uniform in ±0.05 from (task index, seed), or given as task
//!   text `x x_dot theta theta_dot` (to replay another engine's episode).
//! - Observation: `x=<x> x_dot=<v> theta=<a> theta_dot=<w>` (four decimals, written without
//!   `format!`'s machinery, as the shipped envs' `step_into` do), or the empty
//!   string with the kwarg `text=false` (the observation formatting skipped).
//! - Oracle: push toward the side the pole falls to (`theta + theta_dot`), which keeps it up.

use crate::env::{action_line, push_decimal, snapshot_of, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use crate::util::splitmix::{derive, SplitMix64};

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_CART + MASS_POLE;
const HALF_LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * HALF_LENGTH;
const FORCE: f64 = 10.0;
const TAU: f64 = 0.02;
const X_LIMIT: f64 = 2.4;
const THETA_LIMIT: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const SALT: u64 = 0xCA27_201E;

/// Appends `v` with four decimals, rounded half away from zero (`-0.0000` for a negative
/// value that rounds to zero, as `format!("{:.4}")` writes it).
fn push_fixed4(s: &mut String, v: f64) {
    if v.is_sign_negative() {
        s.push('-');
    }
    let scaled = (v.abs() * 1e4).round() as u64;
    push_decimal(s, scaled / 10_000);
    s.push('.');
    let frac = scaled % 10_000;
    for digit in [frac / 1000, frac / 100 % 10, frac / 10 % 10, frac % 10] {
        s.push(char::from(b'0' + digit as u8));
    }
}

/// A start state given as task text: four numbers `x x_dot theta theta_dot`, finite, the
/// cart and the pole within their limits.
fn parse_state(text: &str) -> Result<[f64; 4]> {
    let invalid = |message: String| CoreError::InvalidTask {
        env: "_bench_cartpole".into(),
        message,
    };
    let nums: Vec<f64> = text
        .split_whitespace()
        .map(str::parse::<f64>)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| {
            invalid(format!(
                "a start state is four numbers x x_dot theta theta_dot ({e})"
            ))
        })?;
    let state: [f64; 4] = nums.try_into().map_err(|v: Vec<f64>| {
        invalid(format!(
            "a start state is four numbers x x_dot theta theta_dot, got {}",
            v.len()
        ))
    })?;
    let [x, _, theta, _] = state;
    if state.iter().any(|v| !v.is_finite()) || x.abs() > X_LIMIT || theta.abs() > THETA_LIMIT {
        return Err(invalid(format!(
            "a start state must be finite with |x| <= {X_LIMIT} and |theta| <= {THETA_LIMIT:.4}"
        )));
    }
    Ok(state)
}

#[derive(Clone, Default)]
pub struct CartPole {
    /// `[x, x_dot, theta, theta_dot]`.
    state: [f64; 4],
    done: bool,
    refused: bool,
    text: bool,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let kw = KwargsReader::new("_bench_cartpole", kwargs, &["text"])?;
    Ok(Box::new(CartPole {
        text: kw.bool_or("text", true)?,
        ..CartPole::default()
    }))
}

impl CartPole {
    fn observe(&self, obs: &mut String) {
        if self.text {
            for (label, v) in ["x=", " x_dot=", " theta=", " theta_dot="]
                .iter()
                .zip(self.state)
            {
                obs.push_str(label);
                push_fixed4(obs, v);
            }
        }
    }

    /// Gymnasium's `CartPoleEnv.step` with `kinematics_integrator="euler"`.
    fn push(&mut self, right: bool) {
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if right { FORCE } else { -FORCE };
        let (sin, cos) = theta.sin_cos();
        let temp = (force + POLE_MASS_LENGTH * theta_dot * theta_dot * sin) / TOTAL_MASS;
        let theta_acc = (GRAVITY * sin - cos * temp)
            / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
        let x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS;
        self.state = [
            x + TAU * x_dot,
            x_dot + TAU * x_acc,
            theta + TAU * theta_dot,
            theta_dot + TAU * theta_acc,
        ];
        let [x, _, theta, _] = self.state;
        self.done =
            !(-X_LIMIT..=X_LIMIT).contains(&x) || !(-THETA_LIMIT..=THETA_LIMIT).contains(&theta);
    }
}

impl Env for CartPole {
    fn reset(&mut self, task: &Task, seed: u64) -> Result<String> {
        let mut obs = String::new();
        self.reset_into(task, seed, &mut obs)?;
        Ok(obs)
    }

    fn reset_into(&mut self, task: &Task, seed: u64, obs: &mut String) -> Result<()> {
        match task {
            Task::Index(i) => {
                let mut rng = SplitMix64::new(derive(&[SALT, *i, seed]));
                for v in &mut self.state {
                    // 53 random bits -> [0, 1) -> [-0.05, 0.05)
                    *v = ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64) * 0.1 - 0.05;
                }
            }
            Task::Spec(text) => self.state = parse_state(text)?,
        }
        self.done = false;
        self.refused = false;
        self.observe(obs);
        Ok(())
    }

    fn step(&mut self, action: &str) -> Step {
        let mut obs = String::new();
        let (reward, terminated) = self.step_into(action, &mut obs);
        Step::new(obs, reward, terminated)
    }

    fn step_into(&mut self, action: &str, obs: &mut String) -> (f32, bool) {
        self.refused = false;
        if self.done {
            self.observe(obs);
            return (0.0, true);
        }
        match action {
            "right" | "1" => self.push(true),
            "left" | "0" => self.push(false),
            _ => {
                self.refused = true;
                if self.text {
                    obs.push_str("Invalid action: reply left or right. ");
                }
                self.observe(obs);
                return (0.0, false);
            }
        }
        self.observe(obs);
        (1.0, self.done)
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        vec!["left".into(), "right".into()]
    }

    fn oracle_action(&self) -> Option<String> {
        if self.done {
            return None;
        }
        let [_, _, theta, theta_dot] = self.state;
        Some(
            if theta + theta_dot > 0.0 {
                "right"
            } else {
                "left"
            }
            .into(),
        )
    }

    fn num_tasks(&self) -> u64 {
        u64::MAX
    }

    fn instructions(&self) -> String {
        "Balance a pole on a cart: each turn push the cart left or right. The episode ends when \
         the pole tilts past 12 degrees or the cart leaves the track."
            .to_string()
            + &action_line("right")
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(text: bool) -> CartPole {
        CartPole {
            text,
            ..CartPole::default()
        }
    }

    #[test]
    fn follows_gymnasium_cartpole_step() {
        // Gymnasium 1.x CartPoleEnv (euler) from state [0.01, 0.02, 0.03, 0.04], action 1.
        let mut e = env(true);
        e.state = [0.01, 0.02, 0.03, 0.04];
        assert_eq!(e.step_into("1", &mut String::new()), (1.0, false));
        let want = [0.0104, 0.214_679_2, 0.0308, -0.243_068_7];
        for (got, want) in e.state.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{:?} vs {want:?}", e.state);
        }
    }

    #[test]
    fn four_decimals_like_format() {
        for v in [
            0.0, -0.0, 0.012_34, -0.049_99, 1.5, -2.399_97, 0.000_04, -0.000_04, 12.0,
        ] {
            let mut s = String::new();
            push_fixed4(&mut s, v);
            assert_eq!(s, format!("{v:.4}"));
        }
    }

    #[test]
    fn random_pushes_end_the_episode_and_it_stays_done() {
        let mut e = env(true);
        let obs = e.reset(&Task::Index(3), 7).unwrap();
        assert!(
            obs.starts_with("x=") && obs.contains(" theta_dot="),
            "{obs}"
        );
        let mut steps = 0;
        while !e
            .step(if steps % 3 == 0 { "left" } else { "right" })
            .terminated
        {
            steps += 1;
            assert!(steps < 500, "never ended");
        }
        let after = e.step("left");
        assert!(after.terminated && after.reward == 0.0);
        assert!(e.valid_actions().is_empty() && e.oracle_action().is_none());
    }

    #[test]
    fn oracle_balances_for_the_whole_horizon() {
        let mut e = env(false);
        assert_eq!(e.reset(&Task::Index(0), 1).unwrap(), "");
        for _ in 0..500 {
            let a = e.oracle_action().unwrap();
            let s = e.step(&a);
            assert!(!s.terminated && s.observation.is_empty());
        }
    }

    #[test]
    fn refuses_other_text_and_task_texts() {
        let mut e = env(true);
        let start = e.reset(&Task::Index(0), 0).unwrap();
        let s = e.step("jump");
        assert!(e.refused() && !s.terminated && s.reward == 0.0);
        assert!(s.observation.ends_with(&start));
        for bad in [
            "x",
            "0 0 0",
            "0 0 0 0 0",
            "0 0 nan 0",
            "3 0 0 0",
            "0 0 0.3 0",
        ] {
            assert!(e.reset(&Task::Spec(bad.into()), 0).is_err(), "{bad}");
        }
        let obs = e
            .reset(&Task::Spec(" 0.01 0.02\t0.03 -0.04 ".into()), 9)
            .unwrap();
        assert_eq!(obs, "x=0.0100 x_dot=0.0200 theta=0.0300 theta_dot=-0.0400");
    }
}
