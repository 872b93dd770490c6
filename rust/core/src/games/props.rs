//! Property tests shared by every native game. Whatever text arrives as a move (arbitrary
//! Unicode, empty, mutated from the game's own legal and oracle moves), a game never panics
//! and an unreadable or illegal move ends it with [`ILLEGAL_MOVE_REWARD`] for its seat and 0
//! for every other seat; a legal move never does. The same task, seed and moves replay the
//! same game, on a fresh game and on a reused one; a snapshot continues exactly as the game
//! and shares no state with it. Seats to move are ascending and in range, `over` is
//! `to_move` being empty, a game ends within `max_moves`, rewards are finite and, in a
//! zero-sum game that no illegal move ended, sum to 0, the oracle's move is always legal.
//! Privacy (no seat sees another's private information) is each game's own test: what is
//! private differs.

use crate::env::Task;
use crate::game::{Game, GameStep, ILLEGAL_MOVE_REWARD};
use crate::games::make_game;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// What is specific to one game configuration.
pub(super) struct GameProfile {
    pub id: &'static str,
    pub kwargs: &'static str,
    /// Most moves (steps) a game lasts, whatever is played.
    pub max_moves: usize,
    /// Most observation bytes.
    pub max_obs: usize,
    /// The rewards of a game that no illegal move ended sum to 0.
    pub zero_sum: bool,
}

impl GameProfile {
    pub fn make(&self) -> Box<dyn Game> {
        make_game(
            self.id,
            &serde_json::from_str(self.kwargs).expect("a JSON object"),
        )
        .expect("profile kwargs are valid")
    }
}

/// One seat's move, resolved against the state when it is made.
#[derive(Debug, Clone)]
pub(super) enum Move {
    /// The `i`-th legal move (modulo their number).
    Legal(usize),
    /// The oracle's move.
    Oracle,
    /// Arbitrary text.
    Text(String),
    /// A legal move with one character changed.
    Mutated(usize, usize, char),
}

fn moves() -> impl Strategy<Value = Move> {
    prop_oneof![
        6 => any::<usize>().prop_map(Move::Legal),
        3 => Just(Move::Oracle),
        1 => ".{0,24}".prop_map(Move::Text),
        1 => (any::<usize>(), any::<usize>(), any::<char>())
            .prop_map(|(i, j, c)| Move::Mutated(i, j, c)),
    ]
}

fn resolve(game: &dyn Game, seat: usize, m: &Move) -> String {
    let legal = game.valid_actions(seat);
    match m {
        Move::Legal(i) if !legal.is_empty() => legal[i % legal.len()].clone(),
        Move::Oracle => game.oracle_action(seat).unwrap_or_default(),
        Move::Mutated(i, j, c) if !legal.is_empty() => {
            let mut chars: Vec<char> = legal[i % legal.len()].chars().collect();
            if !chars.is_empty() {
                let k = j % chars.len();
                chars[k] = *c;
            }
            chars.into_iter().collect()
        }
        Move::Text(t) => t.clone(),
        _ => String::new(),
    }
}

/// Everything observable after each step: every seat's observation, the rewards, who moves.
type Trace = Vec<(Vec<String>, Vec<f32>, Vec<usize>, GameStep)>;

fn play(
    p: &GameProfile,
    game: &mut dyn Game,
    task: u64,
    seed: u64,
    script: &[Move],
) -> Result<Trace, TestCaseError> {
    game.reset(&Task::Index(task), seed)
        .map_err(|e| TestCaseError::fail(format!("reset failed: {e}")))?;
    let seats = game.seats();
    let mut trace = Trace::new();
    let start: Vec<String> = (0..seats).map(|s| game.observation(s)).collect();
    for o in &start {
        prop_assert!(
            !o.is_empty() && o.len() <= p.max_obs,
            "first observation {:?}",
            o
        );
    }
    let start_rewards = game.rewards();
    prop_assert!(start_rewards.iter().all(|&r| r == 0.0));
    trace.push((
        start,
        start_rewards,
        game.to_move(),
        GameStep {
            refused: vec![],
            over: false,
        },
    ));
    let mut k = 0;
    let mut refused_any = false;
    while !game.over() {
        prop_assert!(
            trace.len() <= p.max_moves,
            "{} lasted past {} moves",
            p.id,
            p.max_moves
        );
        let movers = game.to_move();
        prop_assert!(movers.windows(2).all(|w| w[0] < w[1]) && movers.iter().all(|&s| s < seats));
        let actions: Vec<String> = movers
            .iter()
            .map(|&s| {
                let m = &script[k % script.len()];
                k += 1;
                resolve(game, s, m)
            })
            .collect();
        let legal: Vec<bool> = movers
            .iter()
            .zip(&actions)
            .map(|(&s, a)| game.valid_actions(s).contains(a))
            .collect();
        let refs: Vec<&str> = actions.iter().map(String::as_str).collect();
        let step = game.step(&refs);
        prop_assert_eq!(step.refused.len(), movers.len());
        prop_assert_eq!(step.over, game.over());
        for (i, (&ok, &refused)) in legal.iter().zip(&step.refused).enumerate() {
            // a listed legal move is never refused; a refusal ends the game
            prop_assert!(
                !(ok && refused),
                "{}: legal move {:?} refused",
                p.id,
                actions[i]
            );
            if refused {
                prop_assert!(step.over);
            }
        }
        let rewards = game.rewards();
        if step.refused.iter().any(|&r| r) {
            refused_any = true;
            for (s, &got) in rewards.iter().enumerate() {
                let bad = movers.iter().zip(&step.refused).any(|(&m, &r)| m == s && r);
                let want = if bad { ILLEGAL_MOVE_REWARD } else { 0.0 };
                prop_assert_eq!(got, want, "seat {} after an illegal move", s);
            }
        }
        let obs: Vec<String> = (0..seats).map(|s| game.observation(s)).collect();
        for o in &obs {
            prop_assert!(!o.is_empty() && o.len() <= p.max_obs, "observation {:?}", o);
        }
        trace.push((obs, rewards, game.to_move(), step));
    }
    let rewards = game.rewards();
    prop_assert!(rewards.iter().all(|r| r.is_finite()));
    if p.zero_sum && !refused_any {
        prop_assert!(
            rewards.iter().sum::<f32>().abs() < 1e-5,
            "not zero-sum: {:?}",
            rewards
        );
    }
    for s in 0..seats {
        prop_assert!(game.valid_actions(s).is_empty() && game.oracle_action(s).is_none());
    }
    Ok(trace)
}

/// The generic properties of profile `p`.
pub(super) fn check(
    p: &GameProfile,
    task: u64,
    seed: u64,
    script: &[Move],
) -> Result<(), TestCaseError> {
    let mut game = p.make();
    prop_assert!(game.seats() >= 2);
    let first = play(p, game.as_mut(), task, seed, script)?;
    // the same episode again, on the reused game and on a fresh one
    prop_assert_eq!(&play(p, game.as_mut(), task, seed, script)?, &first);
    prop_assert_eq!(&play(p, p.make().as_mut(), task, seed, script)?, &first);
    // a snapshot mid-game continues exactly as the game does, and independently of it
    let mut game = p.make();
    game.reset(&Task::Index(task), seed).unwrap();
    let mut k = 0;
    let half = first.len() / 2;
    for _ in 0..half {
        let movers = game.to_move();
        let actions: Vec<String> = movers
            .iter()
            .map(|&s| {
                let m = &script[k % script.len()];
                k += 1;
                resolve(game.as_ref(), s, m)
            })
            .collect();
        game.step(&actions.iter().map(String::as_str).collect::<Vec<_>>());
    }
    if let Some(mut copy) = game.snapshot() {
        let seats = game.seats();
        let views: Vec<String> = (0..seats).map(|s| game.observation(s)).collect();
        prop_assert_eq!(
            &(0..seats).map(|s| copy.observation(s)).collect::<Vec<_>>(),
            &views
        );
        // moving the copy leaves the original as it was
        let before = continuation(copy.as_mut(), &script[k % script.len()..]);
        prop_assert_eq!(
            &(0..seats).map(|s| game.observation(s)).collect::<Vec<_>>(),
            &views
        );
        // and the original continues exactly as the copy did
        prop_assert_eq!(
            continuation(game.as_mut(), &script[k % script.len()..]),
            before
        );
    }
    Ok(())
}

/// Every seat's observations, the rewards and the seats to move after each step of playing
/// `script` (cycled) from `game`'s state to the end.
fn continuation(game: &mut dyn Game, script: &[Move]) -> Vec<(Vec<String>, Vec<f32>, Vec<usize>)> {
    let mut out = Vec::new();
    let mut k = 0;
    while !game.over() {
        let movers = game.to_move();
        let acts: Vec<String> = movers
            .iter()
            .map(|&s| {
                let m = if script.is_empty() {
                    &Move::Oracle
                } else {
                    &script[k % script.len()]
                };
                k += 1;
                resolve(game, s, m)
            })
            .collect();
        game.step(&acts.iter().map(String::as_str).collect::<Vec<_>>());
        let seats = game.seats();
        out.push((
            (0..seats).map(|s| game.observation(s)).collect(),
            game.rewards(),
            game.to_move(),
        ));
    }
    out
}

/// Property tests of one game profile.
macro_rules! game_props {
    ($name:ident, $profile:expr) => {
        mod $name {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(64))]
                #[test]
                fn plays_deterministically_and_refuses_cleanly(
                    task in 0u64..1000,
                    seed in any::<u64>(),
                    script in prop::collection::vec(moves(), 1..24),
                ) {
                    check(&$profile, task, seed, &script)?;
                }
            }

            #[test]
            fn oracles_play_every_seat_to_the_end() {
                let p = &$profile;
                let mut game = p.make();
                for task in 0..game.num_tasks().min(200) {
                    play(p, game.as_mut(), task, task * 7 + 1, &[Move::Oracle]).unwrap();
                }
            }
        }
    };
}

game_props!(
    tictactoe_props,
    GameProfile {
        id: "tictactoe",
        kwargs: "{}",
        max_moves: 9,
        max_obs: 600,
        zero_sum: true
    }
);
game_props!(
    kuhn_poker_props,
    GameProfile {
        id: "kuhn_poker",
        kwargs: "{}",
        max_moves: 3,
        max_obs: 600,
        zero_sum: true
    }
);
game_props!(
    negotiation_props,
    GameProfile {
        id: "negotiation",
        kwargs: "{}",
        max_moves: 10,
        max_obs: 16_000,
        zero_sum: false
    }
);
