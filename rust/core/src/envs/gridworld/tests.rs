//! Unit tests of the gridworld env.

use super::*;
use crate::envs::test_util::{assert_bad_kwargs, assert_parses, assert_refuses_task_text, build};
use serde_json::json;

fn env(kw: serde_json::Value) -> GridEnv {
    let b = make(kw.as_object().unwrap()).unwrap();
    // Rebuild a concrete env with the same config to reach private state in tests.
    drop(b);
    let kw = kw.as_object().unwrap();
    let get = |k: &str, d: u64| kw.get(k).and_then(|v| v.as_u64()).unwrap_or(d);
    GridEnv::new(GridConfig {
        size: get("size", 6) as usize,
        num_objects: get("num_objects", 4) as usize,
        num_doors: get("num_doors", 2) as usize,
        locked: kw.get("locked").and_then(|v| v.as_bool()).unwrap_or(false),
        view: 7,
        split: 0,
    })
}

fn run_oracle(e: &mut GridEnv, limit: usize) -> Option<usize> {
    for t in 1..=limit {
        let a = e.oracle_action()?;
        assert!(e.valid_actions().contains(&a), "oracle {a} not valid");
        let s = e.step(&a);
        if s.terminated {
            assert_eq!(s.reward, 1.0);
            assert!(s.observation.ends_with("You completed the mission!"));
            return Some(t);
        }
        assert_eq!(s.reward, 0.0);
    }
    None
}

#[test]
fn deterministic_by_task_and_seed_free() {
    let mut a = build(make, json!({}));
    let mut b = build(make, json!({}));
    let mut distinct = std::collections::HashSet::new();
    for t in 0..100 {
        let oa = a.reset(&Task::Index(t), 1).unwrap();
        assert_eq!(oa, b.reset(&Task::Index(t), 2).unwrap());
        distinct.insert(oa);
        for act in [
            "turn left",
            "move forward",
            "pick up",
            "toggle",
            "drop",
            "fly",
        ] {
            assert_eq!(a.step(act), b.step(act));
        }
    }
    assert!(distinct.len() > 90);
}

#[test]
fn oracle_completes_every_mission() {
    for (kw, limit) in [
        (json!({"size": 5, "num_objects": 2, "num_doors": 1}), 40),
        (json!({}), 60),
        (
            json!({"size": 8, "num_objects": 6, "num_doors": 3, "locked": true}),
            120,
        ),
        (
            json!({"size": 4, "num_objects": 8, "num_doors": 4, "locked": true}),
            120,
        ),
    ] {
        let mut e = env(kw.clone());
        let mut kinds = [0; 3];
        for t in 0..300 {
            e.reset(&Task::Index(t), 0).unwrap();
            kinds[match e.mission {
                Mission::GoTo(_) => 0,
                Mission::PickUp(_) => 1,
                Mission::Open(_) => 2,
            }] += 1;
            assert!(
                run_oracle(&mut e, limit).is_some(),
                "{kw} task {t} unsolved"
            );
            assert_eq!(e.oracle_action(), None);
        }
        assert!(kinds.iter().all(|&k| k > 30), "{kinds:?}");
    }
}

#[test]
fn oracle_recovers_after_random_actions() {
    // Random actions may move objects around; the oracle still finishes nearly every task.
    let mut e = env(json!({"size": 6, "num_objects": 5, "num_doors": 3, "locked": true}));
    let mut rng = SplitMix64::new(3);
    let mut failed = 0;
    for t in 0..1000 {
        e.reset(&Task::Index(t), 0).unwrap();
        let mut finished = false;
        for _ in 0..30 {
            let acts = e.valid_actions();
            if e.step(&acts[rng.below(acts.len() as u64) as usize])
                .terminated
            {
                finished = true;
                break;
            }
        }
        if !finished && run_oracle(&mut e, 150).is_none() {
            failed += 1;
        }
    }
    assert!(failed <= 10, "{failed} of 1000 not recovered");
}

#[test]
fn mechanics_and_texts() {
    let mut e = env(json!({"size": 3, "num_objects": 1, "num_doors": 0}));
    // Hand-built room: agent in the middle facing north, a red key north of it, a locked
    // blue door in the east wall.
    e.reset(&Task::Index(0), 0).unwrap();
    let s = e.side;
    e.tiles = vec![Tile::Wall; s * s];
    for y in 1..4 {
        for x in 1..4 {
            e.tiles[y * s + x] = Tile::Floor;
        }
    }
    let key = Obj {
        kind: Kind::Key,
        color: 0,
        state: 0,
    };
    let door = Obj {
        kind: Kind::Door,
        color: 2,
        state: LOCKED,
    };
    e.tiles[s + 2] = Tile::Thing(key);
    e.tiles[2 * s + 4] = Tile::Thing(door);
    e.pos = 2 * s + 2;
    e.dir = 0;
    e.carrying = None;
    e.mission = Mission::Open(door);
    let mut out = String::new();
    e.describe(&mut out);
    assert_eq!(
        out,
        " You face north and carry nothing. You see a wall 2 steps left, a locked blue door \
         2 steps right, a red key 1 step forward, a wall 2 steps forward."
    );
    assert_eq!(
        e.step("move forward").observation.split('.').next(),
        Some("You cannot move forward: something is in the way")
    );
    assert!(e
        .step("pick up")
        .observation
        .starts_with("You pick up a red key."));
    assert_eq!(e.carrying, Some(key));
    assert!(e
        .step("turn right")
        .observation
        .starts_with("You turn right. You face east"));
    let s1 = e.step("toggle");
    assert!(
        s1.observation.starts_with("Nothing happens."),
        "{}",
        s1.observation
    );
    e.step("move forward");
    let s2 = e.step("Toggle.");
    assert!(s2.observation.starts_with("The blue door is locked."));
    assert!(!s2.terminated);
    assert!(e.step("dance").observation.starts_with(HELP));
}

#[test]
fn action_parsing() {
    assert_parses(
        parse_action,
        &[
            ("turn left", Some(0)),
            ("LEFT", Some(0)),
            (" turn right.", Some(1)),
            ("move forward", Some(2)),
            ("forward", Some(2)),
            ("pick up", Some(3)),
            ("pickup", Some(3)),
            ("drop", Some(4)),
            ("toggle", Some(5)),
            ("open", Some(5)),
            ("jump", None),
            ("turn around", None),
        ],
    );
}

#[test]
fn bad_kwargs_are_named_errors() {
    assert_bad_kwargs(
        make,
        &[
            json!({"difficulty": "extreme"}),
            json!({"size": 2}),
            json!({"size": 13}),
            json!({"num_doors": 5}),
            json!({"num_objects": 0, "num_doors": 0}),
            json!({"size": 3, "num_objects": 8}),
            json!({"view": 4}),
            json!({"split": "dev"}),
            json!({"colour": 1}),
        ],
    );
    assert_refuses_task_text(&mut *make(&Kwargs::new()).unwrap());
}
