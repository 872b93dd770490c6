//! Unit tests of Kuhn poker: deals, payoffs, the equilibrium strategy, privacy, illegal
//! moves and the README's example transcripts.

use super::*;
use crate::error::CoreError;
use crate::games::test_util::{assert_illegal_ends, play};
use serde_json::json;

const README: &str = include_str!("../../../../../envs/kuhn_poker/README.md");

fn game(task: u64, seed: u64) -> KuhnPoker {
    let mut g = KuhnPoker::new();
    g.reset(&Task::Index(task), seed).unwrap();
    g
}

/// Every complete betting sequence and seat 0's chips when seat 0 holds the higher card
/// (`None`: a fold, same whoever holds what).
const SEQUENCES: [(&[&str], Option<f32>, f32); 5] = [
    (&["check", "check"], Some(1.0), 0.0),
    (&["check", "bet", "call"], Some(2.0), 0.0),
    (&["check", "bet", "fold"], None, -1.0),
    (&["bet", "call"], Some(2.0), 0.0),
    (&["bet", "fold"], None, 1.0),
];

#[test]
fn the_six_deals_are_distinct_and_wrap() {
    let g = make(&Kwargs::new()).unwrap();
    assert_eq!(g.num_tasks(), 6);
    assert_eq!(
        (g.seats(), g.role(0), g.role(1)),
        (2, "first".into(), "second".into())
    );
    let deals: Vec<(u8, u8)> = (0..6).map(|i| game(i, 0).cards()).collect();
    for (i, d) in deals.iter().enumerate() {
        assert!(d.0 != d.1 && d.0 < 3 && d.1 < 3, "deal {i}: {d:?}");
        assert!(!deals[..i].contains(d), "deal {i} repeats");
        for k in 1..4 {
            assert_eq!(
                game(i as u64 + 6 * k, 0).cards(),
                *d,
                "task {} wraps",
                i as u64 + 6 * k
            );
        }
    }
    assert_eq!(game(u64::MAX, 0).cards(), deals[(u64::MAX % 6) as usize]);
    let mut g = KuhnPoker::new();
    let err = g.reset(&Task::Spec("King Queen".into()), 0).unwrap_err();
    assert!(matches!(err, CoreError::InvalidTask { .. }), "{err}");
    assert!(make(json!({"deck": 4}).as_object().unwrap()).is_err());
}

#[test]
fn before_reset_and_while_playing_nothing_is_paid() {
    let g = KuhnPoker::new();
    assert!(g.over() && g.valid_actions(0).is_empty() && g.oracle_action(0).is_none());
    assert!(!g.observation(0).is_empty());
    let mut g = game(1, 0);
    assert_eq!((g.to_move(), g.rewards()), (vec![0], vec![0.0, 0.0]));
    assert_eq!(g.valid_actions(0), vec!["check", "bet"]);
    assert!(g.valid_actions(1).is_empty() && g.oracle_action(1).is_none());
    play(&mut g, &["check"]);
    assert_eq!((g.to_move(), g.rewards()), (vec![1], vec![0.0, 0.0]));
    assert_eq!(g.valid_actions(1), vec!["check", "bet"]);
    play(&mut g, &["bet"]);
    assert_eq!((g.to_move(), g.rewards()), (vec![0], vec![0.0, 0.0]));
    assert_eq!(g.valid_actions(0), vec!["call", "fold"]);
    let mut g = game(1, 0);
    play(&mut g, &["bet"]);
    assert_eq!(g.valid_actions(1), vec!["call", "fold"]);
}

#[test]
fn every_betting_sequence_pays_its_chips() {
    for task in 0..6 {
        for (moves, showdown, fold) in SEQUENCES {
            let mut g = game(task, 3);
            for (k, m) in moves.iter().enumerate() {
                assert!(!g.over());
                assert_eq!(g.rewards(), vec![0.0, 0.0]);
                let step = g.step(&[m]);
                assert_eq!(step.refused, vec![false]);
                assert_eq!(step.over, k + 1 == moves.len(), "{moves:?}");
            }
            let (a, b) = g.cards();
            let want = match showdown {
                Some(stake) if a > b => stake,
                Some(stake) => -stake,
                None => fold,
            };
            assert_eq!(g.rewards(), vec![want, -want], "deal {task} {moves:?}");
            assert!(g.over() && g.to_move().is_empty());
            for seat in 0..2 {
                assert!(g.valid_actions(seat).is_empty() && g.oracle_action(seat).is_none());
            }
            // a step after the end changes nothing
            assert!(g.step(&["check"]).over);
            assert_eq!(g.rewards(), vec![want, -want]);
        }
    }
    // the rules spelled out on one deal: seat 0 the Queen, seat 1 the King
    let mut g = game(3, 0);
    assert_eq!(g.cards(), (1, 2));
    play(&mut g, &["check", "bet", "call"]);
    assert_eq!(g.rewards(), vec![-2.0, 2.0]);
}

/// The expected chips of seat 0 over the 6 deals when both seats follow
/// [`bet_or_call_thirds`], summed exactly over the betting tree.
fn exact_value() -> f64 {
    fn walk(cards: (u8, u8), history: &mut Vec<Act>) -> f64 {
        let Some(seat) = mover(history) else {
            return payoff(cards, history) as f64;
        };
        let card = if seat == 0 { cards.0 } else { cards.1 };
        let p = bet_or_call_thirds(card, history) as f64 / 3.0;
        let mut value = 0.0;
        for &act in legal(history) {
            let weight = if act.aggressive() { p } else { 1.0 - p };
            history.push(act);
            value += weight * walk(cards, history);
            history.pop();
        }
        value
    }
    DEALS.iter().map(|&d| walk(d, &mut Vec::new())).sum::<f64>() / 6.0
}

#[test]
fn the_strategy_is_kuhns_equilibrium_worth_minus_one_eighteenth() {
    assert!(
        (exact_value() + 1.0 / 18.0).abs() < 1e-12,
        "{}",
        exact_value()
    );
    // the probabilities, in thirds: first seat opening, second after a check, second facing
    // a bet, first after check-bet; Jack, Queen, King
    let rows: [&[Act]; 4] = [&[], &[Act::Check], &[Act::Bet], &[Act::Check, Act::Bet]];
    let table: Vec<[u64; 3]> = rows
        .iter()
        .map(|h| [0, 1, 2].map(|c| bet_or_call_thirds(c, h)))
        .collect();
    assert_eq!(table, vec![[1, 0, 3], [1, 0, 3], [0, 1, 3], [0, 2, 3]]);

    // equilibrium against equilibrium, played through the oracle
    let seeds = 20_000u64;
    let mut total = 0.0f64;
    let mut jack_bets = 0u64;
    let mut queen_calls = 0u64;
    for task in 0..6 {
        for seed in 0..seeds {
            let mut g = game(task, seed);
            while let Some(&seat) = g.to_move().first() {
                let action = g.oracle_action(seat).unwrap();
                assert!(g.valid_actions(seat).contains(&action));
                if task < 2 && g.history().is_empty() && action == "bet" {
                    jack_bets += 1;
                }
                if task == 3 && g.history().len() == 2 && action == "call" {
                    queen_calls += 1;
                }
                assert_eq!(g.step(&[&action]).refused, vec![false]);
            }
            total += g.rewards()[0] as f64;
        }
    }
    let average = total / (6 * seeds) as f64;
    assert!(
        (average + 1.0 / 18.0).abs() < 0.01,
        "seat 0 averages {average}"
    );
    // the first seat's Jack bets 1/3 of the time; its Queen calls check-bet 2/3
    let jack = jack_bets as f64 / (2 * seeds) as f64;
    assert!((jack - 1.0 / 3.0).abs() < 0.01, "Jack bets {jack}");
    let queen = queen_calls as f64 / seeds as f64;
    assert!((queen - 2.0 / 3.0).abs() < 0.015, "Queen calls {queen}");
}

#[test]
fn the_oracle_is_a_function_of_task_seed_and_history() {
    for task in 0..12 {
        for seed in [0, 1, 99, u64::MAX] {
            let (mut a, mut b) = (game(task, seed), game(task, seed));
            while let Some(&seat) = a.to_move().first() {
                let action = a.oracle_action(seat).unwrap();
                assert_eq!(b.oracle_action(seat), Some(action.clone()));
                assert_eq!(
                    a.oracle_action(seat),
                    Some(action.clone()),
                    "reading changes nothing"
                );
                assert!(a.oracle_action(1 - seat).is_none());
                a.step(&[&action]);
                b.step(&[&action]);
            }
            assert_eq!(a.rewards(), b.rewards());
        }
    }
    // the seed matters where the strategy mixes: seat 0's Jack bets for some seeds only
    let opens: std::collections::HashSet<String> = (0..64)
        .map(|s| game(0, s).oracle_action(0).unwrap())
        .collect();
    assert_eq!(opens.len(), 2);
    // and not where it is pure: the Queen always checks, the King always bets
    assert!((0..64).all(|s| game(2, s).oracle_action(0).as_deref() == Some("check")));
    assert!((0..64).all(|s| game(4, s).oracle_action(0).as_deref() == Some("bet")));
}

/// Every betting prefix, including the complete sequences.
fn prefixes() -> Vec<Vec<&'static str>> {
    let mut out: Vec<Vec<&str>> = Vec::new();
    for (moves, _, _) in SEQUENCES {
        for k in 0..=moves.len() {
            let p = moves[..k].to_vec();
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_seat_never_sees_the_opponents_card_before_a_showdown() {
    for seat in 0..2 {
        for mine in 0..3u8 {
            // the two deals where `seat` holds `mine`: they differ only in the other card
            let tasks: Vec<u64> = (0..6)
                .filter(|&i| {
                    let d = DEALS[i as usize];
                    (if seat == 0 { d.0 } else { d.1 }) == mine
                })
                .collect();
            assert_eq!(tasks.len(), 2);
            for moves in prefixes() {
                // then, unless over, also an illegal move by whoever is to move
                for tail in [None, Some("raise")] {
                    let (mut a, mut b) = (game(tasks[0], 5), game(tasks[1], 5));
                    assert_eq!(a.observation(seat), b.observation(seat));
                    for m in &moves {
                        a.step(&[m]);
                        b.step(&[m]);
                    }
                    if let Some(t) = tail {
                        if a.over() {
                            continue;
                        }
                        a.step(&[t]);
                        b.step(&[t]);
                    }
                    let showdown =
                        a.over() && tail.is_none() && moves.last().is_some_and(|m| *m != "fold");
                    let (oa, ob) = (a.observation(seat), b.observation(seat));
                    if showdown {
                        // the opponent's card is public now
                        let theirs = |g: &KuhnPoker| {
                            CARDS[if seat == 0 { g.cards().1 } else { g.cards().0 } as usize]
                        };
                        assert!(oa.contains(&format!("the opponent the {}.", theirs(&a))));
                        assert!(ob.contains(&format!("the opponent the {}.", theirs(&b))));
                    } else {
                        assert_eq!(oa, ob, "seat {seat} after {moves:?} {tail:?}");
                        assert!(
                            oa.starts_with(&format!("Your card: the {}.", CARDS[mine as usize]))
                        );
                        let others = CARDS
                            .iter()
                            .enumerate()
                            .filter(|&(c, _)| c != mine as usize);
                        for (_, name) in others {
                            assert!(!oa.contains(name), "{oa:?} names the {name}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn observations_tell_the_betting_and_the_result() {
    let mut g = game(3, 0); // seat 0 the Queen, seat 1 the King
    assert_eq!(
        g.observation(0),
        "Your card: the Queen. Pot: 2 chips. Your move: check or bet."
    );
    assert_eq!(
        g.observation(1),
        "Your card: the King. Pot: 2 chips. Waiting for the opponent."
    );
    play(&mut g, &["check", "bet"]);
    assert_eq!(
        g.observation(0),
        "Your card: the Queen. You checked. The opponent bet. Pot: 3 chips. Your move: call or fold."
    );
    play(&mut g, &["call"]);
    assert_eq!(
        g.observation(1),
        "Your card: the King. The opponent checked. You bet. The opponent called. Showdown: you \
         had the King, the opponent the Queen. You win 2 chips."
    );
    let mut g = game(3, 0);
    play(&mut g, &["check", "check"]);
    assert!(g
        .observation(0)
        .ends_with("the opponent the King. You lose 1 chip."));
    let mut g = game(3, 0);
    play(&mut g, &["bet", "fold"]);
    assert_eq!(
        g.observation(0),
        "Your card: the Queen. You bet. The opponent folded. You win 1 chip."
    );
    assert_eq!(
        g.observation(1),
        "Your card: the King. The opponent bet. You folded. You lose 1 chip."
    );
}

#[test]
fn an_illegal_or_unreadable_move_ends_the_game_against_its_seat() {
    // (moves before, the bad move, the seat that makes it)
    let cases: [(&[&str], &str, usize); 7] = [
        (&[], "call", 0),
        (&[], "raise", 0),
        (&[], "", 0),
        (&["check"], "fold", 1),
        (&["check"], "call", 1),
        (&["bet"], "check", 1),
        (&["check", "bet"], "bet bet", 0),
    ];
    for task in 0..6 {
        for (before, bad, seat) in cases {
            let mut g = game(task, 1);
            play(&mut g, before);
            assert_illegal_ends(&mut g, bad, seat);
            assert!(g.observation(seat).ends_with("your reward is -1."));
            assert!(g.observation(1 - seat).ends_with("your reward is 0."));
        }
    }
}

#[test]
fn case_spaces_and_a_trailing_period_are_tolerated() {
    let mut g = game(0, 0);
    play(&mut g, &[" Bet.", "CALL"]);
    assert_eq!(g.history(), &[Act::Bet, Act::Call]);
    let mut g = game(0, 0);
    play(&mut g, &["CHECK", "\tcheck. \n"]);
    assert_eq!(g.history(), &[Act::Check, Act::Check]);
    let mut g = game(0, 0);
    play(&mut g, &["check", "bet", " Fold ."]);
    assert_eq!(g.rewards(), vec![-1.0, 1.0]);
    for bad in ["bet..", "b", "bets", "check bet", ".bet", "Action: bet"] {
        assert_eq!(Act::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn a_snapshot_continues_on_its_own() {
    let mut g = game(5, 7);
    play(&mut g, &["check"]);
    let mut copy = g.snapshot().unwrap();
    assert_eq!(copy.observation(1), g.observation(1));
    assert_eq!(copy.oracle_action(1), g.oracle_action(1));
    copy.step(&["bet"]);
    copy.step(&["fold"]);
    assert!(copy.over() && !g.over());
    assert_eq!(g.history(), &[Act::Check]);
}

#[test]
fn instructions_state_the_rules_the_role_and_the_format() {
    let g = KuhnPoker::new();
    for seat in 0..2 {
        let s = g.instructions(seat);
        assert!(s.ends_with(&action_line("check")));
        assert!(s.contains("Jack") && s.contains("fold"));
    }
    assert!(g.instructions(0).contains("You are the first player"));
    assert!(g.instructions(1).contains("You are the second player"));
}

/// Both seats playing the oracle on `task` with `seed`: what the seat to move sees and
/// plays, then what each seat sees at the end.
fn transcript(task: u64, seed: u64) -> String {
    let mut g = game(task, seed);
    let mut out = String::new();
    while let Some(&seat) = g.to_move().first() {
        let role = g.role(seat);
        let action = g.oracle_action(seat).unwrap();
        out.push_str(&format!("{role:<6} sees:  {}\n", g.observation(seat)));
        out.push_str(&format!("{role:<6} plays: {action}\n"));
        g.step(&[&action]);
    }
    for seat in 0..2 {
        out.push_str(&format!(
            "{:<6} sees:  {}\n",
            g.role(seat),
            g.observation(seat)
        ));
    }
    let r = g.rewards();
    out.push_str(&format!("rewards: {}, {}\n", r[0], r[1]));
    out
}

#[test]
fn the_readme_transcripts_are_what_the_game_prints() {
    for (task, seed) in README_EXAMPLES {
        let t = transcript(task, seed);
        assert!(
            README.contains(&t),
            "README lacks the transcript of task {task}, seed {seed}:\n{t}"
        );
    }
}

/// The (task, seed) of the README's example transcripts.
const README_EXAMPLES: [(u64, u64); 2] = [(3, 0), (0, 0)];
