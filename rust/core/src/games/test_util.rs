//! Checks the games' unit tests share.

use crate::game::{Game, GameStep, ILLEGAL_MOVE_REWARD};

/// A game played to its end as a README prints it: what the seat to move sees and what it
/// replies (`policy`), then every seat's last observation and the rewards by role.
pub(super) fn transcript<G: Game>(mut g: G, policy: impl Fn(&G, usize) -> String) -> String {
    let mut out = String::new();
    while let [seat] = g.to_move()[..] {
        let role = g.role(seat);
        let a = policy(&g, seat);
        out.push_str(&format!("--- {role} sees ---\n{}\n", g.observation(seat)));
        out.push_str(&format!("--- {role} replies: Action: {a} ---\n"));
        g.step(&[&a]);
    }
    for seat in 0..g.seats() {
        out.push_str(&format!(
            "--- {} sees ---\n{}\n",
            g.role(seat),
            g.observation(seat)
        ));
    }
    let rewards: Vec<String> = g
        .rewards()
        .iter()
        .enumerate()
        .map(|(seat, r)| format!("{} {r}", g.role(seat)))
        .collect();
    out.push_str(&format!("--- rewards: {} ---\n", rewards.join(", ")));
    out
}

/// Plays `moves` in turn (each by the seat to move), asserting that each is accepted.
pub(super) fn play<G: Game>(g: &mut G, moves: &[&str]) {
    for m in moves {
        assert!(!g.over(), "{m:?} after the end");
        let step = g.step(&[m]);
        assert_eq!(step.refused, vec![false], "{m:?} refused");
    }
}

/// `bad`, by the seat to move (which must be `seat`), ends the game as the contract says:
/// refused, over, [`ILLEGAL_MOVE_REWARD`] for `seat` and 0 for every other seat, no legal
/// or oracle move left.
pub(super) fn assert_illegal_ends<G: Game>(g: &mut G, bad: &str, seat: usize) {
    assert_eq!(g.to_move(), vec![seat], "{bad:?}");
    let step = g.step(&[bad]);
    assert_eq!(
        step,
        GameStep {
            refused: vec![true],
            over: true
        },
        "{bad:?}"
    );
    let mut want = vec![0.0; g.seats()];
    want[seat] = ILLEGAL_MOVE_REWARD;
    assert_eq!(g.rewards(), want, "{bad:?}");
    assert!(g.over() && g.to_move().is_empty());
    for s in 0..g.seats() {
        assert!(g.valid_actions(s).is_empty() && g.oracle_action(s).is_none());
    }
}
