//! Checks the games' unit tests share.

use crate::game::Game;

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
