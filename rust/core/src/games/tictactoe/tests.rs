//! Unit tests of tic-tac-toe: the openings, the solver against itself and against random
//! play, win detection, illegal moves, the observations and the README's transcripts.

use super::*;
use crate::error::CoreError;
use crate::games::test_util::{assert_illegal_ends, play, transcript};
use crate::util::splitmix::SplitMix64;
use serde_json::json;
use std::collections::HashSet;

const README: &str = include_str!("../../../../../envs/tictactoe/README.md");

fn game(task: u64, seed: u64) -> TicTacToe {
    let mut g = TicTacToe::new();
    g.reset(&Task::Index(task), seed).unwrap();
    g
}

/// Plain minimax (no memo, no depth): +1 X wins, -1 O wins, 0 draw with perfect play.
fn minimax_for_x(board: &mut Board) -> i32 {
    if let Some(w) = winner(board) {
        return if w == 0 { 1 } else { -1 };
    }
    if board.iter().all(|&m| m != EMPTY) {
        return 0;
    }
    let mover = side_to_move(board);
    let mut values = Vec::new();
    for c in 0..9 {
        if board[c] == EMPTY {
            board[c] = mover as u8 + 1;
            values.push(minimax_for_x(board));
            board[c] = EMPTY;
        }
    }
    if mover == 0 {
        *values.iter().max().unwrap()
    } else {
        *values.iter().min().unwrap()
    }
}

#[test]
fn openings_are_distinct_undecided_and_wrap() {
    let g = TicTacToe::new();
    assert_eq!(g.num_tasks(), 82);
    let mut seen = HashSet::new();
    for i in 0..82u64 {
        let b = opening(i);
        assert!(seen.insert(b), "opening {i} repeats");
        assert_eq!(winner(&b), None);
        let xs = b.iter().filter(|&&m| m == 1).count();
        let os = b.iter().filter(|&&m| m == 2).count();
        let want = match i {
            0 => (0, 0),
            1..=9 => (1, 0),
            _ => (1, 1),
        };
        assert_eq!((xs, os), want, "opening {i}");
        assert_eq!(opening(i + 82), b);
        assert_eq!(opening(i + 82 * 1_000_003), b);
        let g = game(i, 5);
        assert_eq!(g.to_move(), vec![xs - os], "opening {i}");
        assert_eq!(g.rewards(), vec![0.0, 0.0]);
    }
    assert_eq!(seen.len(), 82);
    // the enumeration: X in cell i for tasks 1-9, then X's cell major, O's ascending
    assert_eq!(opening(5), [0, 0, 0, 0, 1, 0, 0, 0, 0]);
    assert_eq!(opening(10), [1, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(opening(17), [1, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(opening(18), [2, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(opening(81), [0, 0, 0, 0, 0, 0, 0, 2, 1]);
    // the seed does not change the board
    assert_eq!(game(40, 1).board(), game(40, 999).board());
}

#[test]
fn tasks_are_indices_and_no_kwargs_are_taken() {
    let mut g = TicTacToe::new();
    assert!(matches!(
        g.reset(&Task::Spec("X........".into()), 0),
        Err(CoreError::InvalidTask { .. })
    ));
    assert!(make(json!({}).as_object().unwrap()).is_ok());
    assert!(make(json!({"size": 4}).as_object().unwrap()).is_err());
    let g = make(json!({}).as_object().unwrap()).unwrap();
    assert_eq!(
        (g.seats(), g.role(0), g.role(1)),
        (2, "X".into(), "O".into())
    );
}

#[test]
fn solver_against_itself_reaches_the_minimax_value() {
    let mut outcomes = [0usize; 3];
    for task in 0..82u64 {
        let want = minimax_for_x(&mut opening(task));
        outcomes[(want + 1) as usize] += 1;
        for seed in [0, 1, 2, 7, 12345, u64::MAX] {
            let mut g = game(task, seed);
            while let [seat] = g.to_move()[..] {
                let a = g.oracle_action(seat).unwrap();
                assert!(g.valid_actions(seat).contains(&a));
                play(&mut g, &[&a]);
            }
            let r = g.rewards();
            assert_eq!(r[0] as i32, want, "task {task} seed {seed}");
            assert_eq!(r[0] + r[1], 0.0);
            if task == 0 {
                assert_eq!(r, vec![0.0, 0.0], "the empty board is a draw");
            }
        }
    }
    // X's first move never loses; some of O's first replies do
    assert!((1..10).all(|t| minimax_for_x(&mut opening(t)) == 0));
    assert_eq!(outcomes[0], 0, "no opening is lost for X");
    assert!(outcomes[2] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

#[test]
fn solver_values_agree_with_plain_minimax() {
    for task in 0..82u64 {
        let b = opening(task);
        let v = value(&b);
        let for_x = if side_to_move(&b) == 0 { v } else { -v };
        assert_eq!(
            i32::from(for_x.signum()),
            minimax_for_x(&mut { b }),
            "task {task}"
        );
    }
    assert_eq!(value(&[EMPTY; 9]), 0);
    // every legal position, the empty board and the decided ones included
    assert_eq!(solved().iter().filter(|&&v| v != UNKNOWN).count(), 5_478);
    // every first move draws, so the seed picks any of the nine
    assert_eq!(best_moves(&[EMPTY; 9]), (0..9).collect::<Vec<_>>());
    // an immediate win is taken over a slower one: X to move with 1 2 _ / O O _ / ...
    assert_eq!(best_moves(&[1, 1, 0, 2, 2, 0, 0, 0, 0]), vec![2]);
}

#[test]
fn solver_is_deterministic_but_varies_across_seeds() {
    let firsts: HashSet<String> = (0..40u64)
        .map(|seed| {
            let a = game(0, seed).oracle_action(0).unwrap();
            assert_eq!(game(0, seed).oracle_action(0).unwrap(), a);
            a
        })
        .collect();
    assert!(firsts.len() >= 5, "{firsts:?}");
    let g = game(0, 3);
    assert_eq!(g.oracle_action(1), None);
    assert!(g.valid_actions(1).is_empty());
}

#[test]
fn solver_never_loses_to_a_random_opponent() {
    let values: Vec<i32> = (0..82).map(|t| minimax_for_x(&mut opening(t))).collect();
    let mut rng = SplitMix64::new(derive(&[SALT, 2024]));
    let (mut wins, mut not_lost) = (0, 0);
    for n in 0..2_000u64 {
        let task = (n / 2) % 82;
        let solver = (n % 2) as usize;
        let mut g = game(task, rng.next_u64());
        let value_for_solver = values[task as usize] * if solver == 0 { 1 } else { -1 };
        while let [seat] = g.to_move()[..] {
            let a = if seat == solver {
                g.oracle_action(seat).unwrap()
            } else {
                let legal = g.valid_actions(seat);
                legal[rng.below(legal.len() as u64) as usize].clone()
            };
            play(&mut g, &[&a]);
        }
        let got = g.rewards()[solver] as i32;
        assert!(
            got >= value_for_solver,
            "game {n}: task {task}, seat {solver}"
        );
        if value_for_solver >= 0 {
            not_lost += 1;
            assert!(
                got >= 0,
                "game {n}: the solver lost task {task} as seat {solver}"
            );
        }
        wins += usize::from(got == 1);
    }
    assert!(not_lost > 1_000, "{not_lost}");
    assert!(wins > 1_500, "the solver beats random play mostly: {wins}");
}

#[test]
fn every_line_wins_for_the_right_seat() {
    for line in LINES {
        let others: Vec<usize> = (0..9).filter(|c| !line.contains(c)).collect();
        let cell = |c: usize| (c + 1).to_string();
        // X takes the line; O takes two other cells
        let mut g = game(0, 0);
        let moves = [line[0], others[0], line[1], others[1], line[2]].map(cell);
        play(&mut g, &moves.each_ref().map(String::as_str));
        assert_eq!(g.rewards(), vec![1.0, -1.0], "X on {line:?}");
        assert!(g.over() && g.to_move().is_empty());
        assert!(g.observation(0).ends_with("You won."));
        assert!(g.observation(1).ends_with("You lost."));
        // O takes the line; X takes three other cells that are not a line
        let xs = (0..others.len())
            .flat_map(|i| {
                (i + 1..others.len()).flat_map(move |j| (j + 1..6).map(move |k| (i, j, k)))
            })
            .map(|(i, j, k)| [others[i], others[j], others[k]])
            .find(|x| !LINES.iter().any(|l| l.iter().all(|c| x.contains(c))))
            .unwrap();
        let mut g = game(0, 0);
        let moves = [xs[0], line[0], xs[1], line[1], xs[2], line[2]].map(cell);
        play(&mut g, &moves.each_ref().map(String::as_str));
        assert_eq!(g.rewards(), vec![-1.0, 1.0], "O on {line:?}");
        assert!(g.over() && g.valid_actions(0).is_empty() && g.valid_actions(1).is_empty());
        assert_eq!((g.oracle_action(0), g.oracle_action(1)), (None, None));
    }
}

#[test]
fn full_board_without_a_line_is_a_draw() {
    let mut g = game(0, 0);
    play(&mut g, &["1", "2", "3", "5", "4", "6", "8", "7", "9"]);
    assert!(g.over());
    assert_eq!(g.rewards(), vec![0.0, 0.0]);
    assert!(g.observation(0).ends_with("Draw.") && g.observation(1).ends_with("Draw."));
}

#[test]
fn unreadable_or_illegal_moves_end_the_game() {
    // task 10: X in cell 1, O in cell 2, X to move
    for bad in [
        "1", "2", "10", "0", "abc", "", "five", "5 5", "5..", "+5", "٥", "5\u{0}",
    ] {
        let mut g = game(10, 0);
        assert_illegal_ends(&mut g, bad, 0);
        assert!(g
            .observation(0)
            .ends_with("You made an illegal move; the game is over."));
        assert!(g
            .observation(1)
            .ends_with("X made an illegal move; the game is over."));
        assert_eq!(g.board(), &opening(10), "an illegal move places nothing");
    }
    // O's illegal move: O gets -1, X 0
    let mut g = game(3, 0);
    assert_eq!(g.step(&["3"]).refused, vec![true]);
    assert_eq!(g.rewards(), vec![0.0, ILLEGAL_MOVE_REWARD]);
    assert!(g
        .observation(0)
        .ends_with("O made an illegal move; the game is over."));
    // a step after the end changes nothing
    assert_eq!(
        g.step(&["5"]),
        GameStep {
            refused: vec![],
            over: true
        }
    );
    assert_eq!(g.rewards(), vec![0.0, ILLEGAL_MOVE_REWARD]);
}

#[test]
fn tolerated_forms_are_legal() {
    for ok in ["5", " 5 ", "5.", "\t5.\n", " 5. ", "5 ."] {
        let mut g = game(0, 0);
        let step = g.step(&[ok]);
        assert_eq!(
            step,
            GameStep {
                refused: vec![false],
                over: false
            },
            "{ok:?}"
        );
        assert_eq!(g.board()[4], 1, "{ok:?}");
        assert_eq!(g.to_move(), vec![1]);
    }
    assert_eq!(parse_cell("9"), Some(8));
    assert_eq!(parse_cell("1."), Some(0));
}

#[test]
fn both_seats_see_the_same_board_and_their_own_role() {
    let mut g = game(0, 0);
    play(&mut g, &["1", "5", "3"]);
    let (x, o) = (g.observation(0), g.observation(1));
    let board = " X | 2 | X\n 4 | O | 6\n 7 | 8 | 9\n";
    assert!(x.starts_with(board) && o.starts_with(board), "{x}\n{o}");
    assert_eq!(&x[board.len()..], "You are X.\nWaiting for O.");
    assert_eq!(
        &o[board.len()..],
        "You are O.\nX took cell 3.\nYour move: reply with a free cell number."
    );
    assert_eq!(g.valid_actions(1), ["2", "4", "6", "7", "8", "9"]);
    assert!(g.valid_actions(0).is_empty());
    // an opening's marks are not moves: nobody is told about them
    let g = game(14, 0);
    assert_eq!(
        g.observation(0),
        " X | 2 | 3\n 4 | 5 | O\n 7 | 8 | 9\nYou are X.\nYour move: reply with a free cell number."
    );
    for seat in 0..2 {
        let text = g.instructions(seat);
        assert!(text.contains(&format!("as {}", g.role(seat))));
        assert!(text.ends_with(&action_line("5")));
    }
}

#[test]
fn snapshot_continues_independently() {
    let mut g = game(0, 9);
    play(&mut g, &["5", "1"]);
    let mut copy = g.snapshot().unwrap();
    assert_eq!(copy.observation(0), g.observation(0));
    copy.step(&["9"]);
    assert_ne!(copy.observation(0), g.observation(0));
    assert_eq!(g.board()[8], EMPTY);
    g.step(&["9"]);
    assert_eq!(copy.observation(1), g.observation(1));
}

/// X plays the solver, O the lowest free cell.
fn solver_vs_lowest(g: &TicTacToe, seat: usize) -> String {
    match seat {
        0 => g.oracle_action(0).unwrap(),
        _ => g.valid_actions(1)[0].clone(),
    }
}

#[test]
fn readme_shows_what_the_code_prints() {
    let game_text = transcript(game(0, 1), solver_vs_lowest);
    assert!(
        README.contains(&format!("```\n{game_text}```")),
        "{game_text}"
    );
    let illegal = transcript(game(14, 0), |_, _| "the center".to_string());
    assert!(README.contains(&format!("```\n{illegal}```")), "{illegal}");
    let instructions = game(0, 0).instructions(1);
    assert!(
        README.contains(&format!("```\n{instructions}\n```")),
        "{instructions}"
    );
}
