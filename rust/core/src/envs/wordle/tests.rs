//! Unit tests of the wordle env.

use super::*;
use crate::envs::test_util::{assert_bad_kwargs, assert_dialogue, assert_parses, build};
use serde_json::json;

fn w(s: &str) -> Word {
    s.as_bytes().try_into().unwrap()
}

fn fb(guess: &str, answer: &str) -> String {
    let mut s = String::new();
    write_feedback(&mut s, &w(guess), feedback(&w(guess), &w(answer)));
    s.split(' ').map(|p| &p[2..]).collect()
}

fn env(kw: serde_json::Value) -> Box<dyn Env> {
    build(make, kw)
}

#[test]
fn word_lists_are_clean() {
    let l = lists();
    assert!(l.answers.len() > 2000 && l.allowed.len() > l.answers.len());
    assert!(l.answers.iter().all(is_allowed));
    assert!(
        l.allowed.windows(2).all(|p| p[0] < p[1]),
        "no duplicate guesses"
    );
    let all = l.answers.iter().chain(&l.allowed);
    assert!(all.clone().all(|w| w.iter().all(u8::is_ascii_lowercase)));
    assert!(is_allowed(&OPENER));
}

#[test]
fn feedback_follows_wordle_duplicate_rules() {
    assert_eq!(fb("crane", "crane"), "GGGGG");
    assert_eq!(fb("crane", "trace"), "YGGBG");
    assert_eq!(fb("xyzzy", "crane"), "BBBBB");
    // Two guessed E's, one E in the answer: the green one takes it, the other is B.
    assert_eq!(fb("geese", "those"), "BBBGG");
    // The extra copy is B even when it comes first and the answer's copy is matched later.
    assert_eq!(fb("speed", "abide"), "BBYBY");
    assert_eq!(fb("eerie", "theme"), "YBBBG");
    assert_eq!(fb("error", "robot"), "BYBGB");
    assert_eq!(fb("allee", "eagle"), "YYBYG");
    assert_eq!(fb("sassy", "assay"), "YYGBG");
    assert_eq!(fb("mamma", "maxim"), "GGYBB");
    assert_eq!(feedback(&w("crane"), &w("crane")), SOLVED);
    let mut s = String::new();
    write_feedback(&mut s, &w("crane"), feedback(&w("crane"), &w("trace")));
    assert_eq!(s, "c=Y r=G a=G n=B e=G");
}

#[test]
fn guess_parsing() {
    assert_parses(
        parse_guess,
        &[
            ("guess crane", Parsed::Word(w("crane"))),
            ("Guess: CRANE.", Parsed::Word(w("crane"))),
            ("  crane\n", Parsed::Word(w("crane"))),
            ("GUESS   Slate", Parsed::Word(w("slate"))),
            ("xyzzq", Parsed::Word(w("xyzzq"))),
            ("guess", Parsed::Word(w("guess"))),
            ("guess ", Parsed::Word(w("guess"))),
            ("guess cranes", Parsed::Invalid),
            ("guesscrane", Parsed::Invalid),
            ("cr4ne", Parsed::Invalid),
            ("crâne", Parsed::Invalid),
            ("", Parsed::Invalid),
        ],
    );
}

#[test]
fn episode_flow_and_messages() {
    let mut e = env(json!({"max_guesses": 3}));
    let obs = e.reset(&Task::Spec("trace".into()), 0).unwrap();
    assert_eq!(
        obs,
        "Guess the secret five-letter word. You have 3 guesses. Reply: guess <word>."
    );
    assert_dialogue(
        &mut *e,
        &[
            (
                "hello there",
                "Invalid action. Reply: guess <five-letter word>. 3 left.",
            ),
            ("guess xyzzq", "Not in the word list: xyzzq. 3 left."),
        ],
    );
    let s = e.step("guess crane");
    assert_eq!(
        s.observation,
        "Guess 1/3: crane -> c=Y r=G a=G n=B e=G. 2 left."
    );
    assert_eq!((s.reward, s.terminated), (0.0, false));
    e.step("slate");
    let s = e.step("guess crate");
    assert!(
        s.observation
            .ends_with("Out of guesses; the word was trace."),
        "{}",
        s.observation
    );
    assert_eq!((s.reward, s.terminated), (0.0, true));
    assert_eq!(
        e.step("guess trace"),
        Step::new("The episode is over.", 0.0, true)
    );
    assert!(e.valid_actions().is_empty() && e.oracle_action().is_none());

    e.reset(&Task::Spec("trace".into()), 0).unwrap();
    let s = e.step("TRACE");
    assert_eq!(
        s.observation,
        "Guess 1/3: trace -> t=G r=G a=G c=G e=G. Solved!"
    );
    assert_eq!((s.reward, s.terminated), (1.0, true));
    for bad in ["zzzzz", "toolong", ""] {
        assert!(matches!(
            e.reset(&Task::Spec(bad.into()), 0),
            Err(CoreError::InvalidTask { .. })
        ));
    }
}

#[test]
fn tasks_index_the_answer_list_and_splits_partition_it() {
    let n = lists().answers.len() as u64;
    let (all, train, test) = (
        env(json!({})),
        env(json!({"split": "train"})),
        env(json!({"split": "test"})),
    );
    assert_eq!(all.num_tasks(), n);
    assert_eq!(train.num_tasks() + test.num_tasks(), n);
    assert!(test.num_tasks() >= n / 10);
    let mut e = env(json!({"max_guesses": 1}));
    let mut last = |task| {
        e.reset(&Task::Index(task), 0).unwrap();
        e.step("guess crate").observation
    };
    assert_eq!(last(n + 4), last(4));
    let want = std::str::from_utf8(&lists().answers[4]).unwrap();
    let obs = last(4);
    assert!(obs.ends_with(&format!("the word was {want}.")) || want == "crate");
    let mut t = env(json!({"split": "test", "max_guesses": 1}));
    t.reset(&Task::Index(0), 0).unwrap();
    let first_test = lists().answers[(n - test.num_tasks()) as usize];
    let first_test = std::str::from_utf8(&first_test).unwrap();
    assert!(t.step("guess crate").observation.contains(first_test) || first_test == "crate");
}

#[test]
fn oracle_solves_nearly_every_answer_within_six() {
    let mut e = env(json!({}));
    let n = lists().answers.len() as u64;
    let mut solved = 0;
    let mut total_guesses = 0;
    for t in (0..n).step_by(9) {
        e.reset(&Task::Index(t), 0).unwrap();
        for _ in 0..6 {
            let a = e.oracle_action().unwrap();
            total_guesses += 1;
            let s = e.step(&a);
            if s.reward == 1.0 {
                solved += 1;
            }
            if s.terminated {
                break;
            }
        }
    }
    let played = n.div_ceil(9);
    assert!(solved as f64 >= 0.97 * played as f64, "{solved}/{played}");
    assert!((total_guesses as f64 / played as f64) < 4.5);
}

#[test]
fn valid_actions_modes() {
    let mut e = env(json!({}));
    e.reset(&Task::Index(0), 7).unwrap();
    let a = e.valid_actions();
    assert_eq!(a.len(), 20);
    assert!(a.iter().all(|x| x.starts_with("guess ") && x.len() == 11));
    let uniq: std::collections::HashSet<_> = a.iter().collect();
    assert_eq!(uniq.len(), 20);
    assert_eq!(a, e.valid_actions(), "deterministic");
    e.reset(&Task::Index(0), 8).unwrap();
    assert_ne!(a, e.valid_actions(), "seeded");

    let mut c = env(json!({"valid_actions": "consistent", "num_valid_actions": 200}));
    c.reset(&Task::Spec("trace".into()), 0).unwrap();
    c.step("guess crane");
    let cands = c.valid_actions();
    assert!(cands.contains(&"guess trace".to_string()) && cands.len() < 200);
    for cand in &cands {
        assert_eq!(fb("crane", &cand[6..]), "YGGBG");
    }
}

#[test]
fn bad_kwargs_are_named_errors() {
    assert_bad_kwargs(
        make,
        &[
            json!({"max_guesses": 0}),
            json!({"max_guesses": 21}),
            json!({"split": "dev"}),
            json!({"valid_actions": "all"}),
            json!({"num_valid_actions": 201}),
            json!({"size": 5}),
        ],
    );
}
