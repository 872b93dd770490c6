//! Unit tests of the gridworld env.

use super::*;
use crate::envs::test_util::{
    assert_bad_kwargs, assert_parses, assert_refuses_task_text, assert_text_mode_is_the_default,
    build, frame, pixel,
};
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
        obs: ObsMode::Text,
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

fn image_env(kw: serde_json::Value) -> GridEnv {
    let mut e = env(kw);
    e.cfg.obs = ObsMode::Image;
    e
}

#[test]
fn text_mode_is_the_default_and_draws_nothing() {
    let mut a = build(make, json!({}));
    let mut b = build(make, json!({"obs": "text"}));
    assert_text_mode_is_the_default(
        a.as_mut(),
        b.as_mut(),
        &["turn left", "move forward", "pick up", "toggle", "fly"],
    );
}

#[test]
fn image_mode_text_is_the_mission_the_outcome_and_the_load() {
    for difficulty in ["easy", "medium", "hard"] {
        let mut text = build(make, json!({"difficulty": difficulty}));
        let mut image = build(make, json!({"difficulty": difficulty, "obs": "image"}));
        let mut both = build(make, json!({"difficulty": difficulty, "obs": "both"}));
        let mut rng = SplitMix64::new(4);
        for t in 0..60 {
            let full = text.reset(&Task::Index(t), 0).unwrap();
            let short = image.reset(&Task::Index(t), 0).unwrap();
            assert_eq!(both.reset(&Task::Index(t), 0).unwrap(), full);
            // "Mission: go to the red ball." then " You carry nothing."
            let mission = &full[..full.find(". ").unwrap() + 1];
            assert_eq!(short, format!("{mission} You carry nothing."));
            for k in 0..40 {
                let a = match k % 3 {
                    2 => {
                        let all = [
                            "turn left",
                            "move forward",
                            "pick up",
                            "drop",
                            "toggle",
                            "x",
                        ];
                        all[rng.below(6) as usize].to_string()
                    }
                    _ => text.oracle_action().unwrap(),
                };
                let (f, s) = (text.step(&a), image.step(&a));
                assert_eq!(both.step(&a), f);
                assert_eq!((f.reward, f.terminated), (s.reward, s.terminated));
                let o = &s.observation;
                // No view description: nothing counted in steps, no heading.
                assert!(
                    !o.contains("step") && !o.contains("You see") && !o.contains("You face"),
                    "{o}"
                );
                if s.terminated {
                    assert!(o.ends_with(" You completed the mission!"), "{o}");
                    assert_eq!(o, &f.observation);
                    break;
                }
                // The outcome sentence is the text mode's, then what the agent carries.
                let outcome = &f.observation[..f.observation.find(" You face").unwrap()];
                assert!(o.starts_with(outcome), "{o} / {}", f.observation);
                let carry = &o[outcome.len()..];
                assert!(
                    carry.starts_with(" You carry ") && carry.ends_with('.'),
                    "{o}"
                );
            }
        }
    }
}

#[test]
fn image_mode_instructions_explain_the_picture() {
    let text = build(make, json!({})).instructions();
    let image = build(make, json!({"obs": "image"})).instructions();
    let both = build(make, json!({"obs": "both"})).instructions();
    for s in [&image, &both] {
        assert!(s.contains("picture") && s.contains("white triangle"), "{s}");
        assert!(s.ends_with(&crate::env::action_line("move forward")));
    }
    assert!(!image.contains("counted in steps") && both.contains("counted in steps"));
    assert!(!text.contains("picture"));
}

#[test]
fn frames_are_56_pixels_square_for_every_preset() {
    for (kw, side) in [
        (json!({"difficulty": "easy"}), 56),
        (json!({"difficulty": "medium"}), 56),
        (json!({"difficulty": "hard"}), 56),
        (json!({"size": 3, "num_objects": 1}), 28),
        (json!({"size": 12}), 84),
    ] {
        let mut kw = kw.as_object().unwrap().clone();
        kw.insert("obs".into(), json!("both"));
        let mut e = make(&kw).unwrap();
        assert_eq!(e.frame_shape(), Some((side, side)), "{kw:?}");
        assert_eq!(
            e.frame_into(&mut Vec::new()),
            None,
            "no frame before a reset"
        );
        e.reset(&Task::Index(2), 0).unwrap();
        assert_eq!(frame(&*e).0, side as usize);
    }
}

/// Every tile's pixels are in its own colours (walls wall-grey, floor black, an object its
/// colour on black, with at least one pixel of it), the agent's tile also has white pixels
/// and no other tile has; the padding is wall-grey.
fn assert_tiles_drawn(e: &GridEnv) {
    let f = frame(e);
    let (tile, h, w) = GridEnv::frame_pixels(e.cfg.size);
    assert_eq!((f.0, f.1), (h, w));
    let side = e.side;
    for ty in 0..h.div_ceil(tile) {
        for tx in 0..w.div_ceil(tile) {
            let here = (ty < side && tx < side).then(|| e.tiles[ty * side + tx]);
            let mut seen = std::collections::HashSet::new();
            for y in ty * tile..((ty + 1) * tile).min(h) {
                for x in tx * tile..((tx + 1) * tile).min(w) {
                    seen.insert(pixel(&f, y, x));
                }
            }
            let agent = ty < side && tx < side && ty * side + tx == e.pos;
            assert_eq!(seen.contains(&AGENT_RGB), agent, "tile {ty},{tx}");
            seen.remove(&AGENT_RGB);
            let allowed = match here {
                None | Some(Tile::Wall) => vec![WALL_RGB],
                Some(Tile::Floor) => vec![FLOOR_RGB],
                Some(Tile::Thing(o)) => {
                    assert!(
                        seen.contains(&COLOR_RGB[o.color as usize]),
                        "{o:?} has no pixel of its colour"
                    );
                    vec![FLOOR_RGB, COLOR_RGB[o.color as usize]]
                }
            };
            assert!(
                seen.iter().all(|c| allowed.contains(c)),
                "tile {ty},{tx}: {seen:?}"
            );
        }
    }
}

#[test]
fn frames_draw_every_tile_and_the_agent() {
    for kw in [
        json!({}),
        json!({"size": 5, "num_objects": 2, "num_doors": 1}),
        json!({"size": 8, "num_objects": 6, "num_doors": 3, "locked": true}),
        json!({"size": 12, "num_objects": 12, "num_doors": 4, "locked": true}),
    ] {
        let mut e = image_env(kw);
        for t in 0..30 {
            e.reset(&Task::Index(t), 0).unwrap();
            assert_tiles_drawn(&e);
            while let Some(a) = e.oracle_action() {
                if e.step(&a).terminated {
                    break;
                }
                assert_tiles_drawn(&e);
            }
            assert_tiles_drawn(&e);
        }
    }
}

#[test]
fn shapes_tell_kinds_and_door_states_apart() {
    // Each kind and door state draws its own mask in a tile, at every tile size used.
    for t in [5, 6, 7, 8] {
        let mask = |kind, state| -> Vec<bool> {
            let tile = Tile::Thing(Obj {
                kind,
                color: 0,
                state,
            });
            (0..t * t)
                .map(|i| tile_pixel(tile, 2 * (i % t) + 1 - t, 2 * (i / t) + 1 - t, t) != FLOOR_RGB)
                .collect()
        };
        let masks = [
            mask(Kind::Ball, 0),
            mask(Kind::Box, 0),
            mask(Kind::Key, 0),
            mask(Kind::Door, OPEN),
            mask(Kind::Door, CLOSED),
            mask(Kind::Door, LOCKED),
        ];
        for (i, a) in masks.iter().enumerate() {
            assert!(
                a.iter().any(|&p| p) && a.iter().any(|&p| !p) || i == 5,
                "t={t} mask {i}"
            );
            for b in &masks[i + 1..] {
                assert_ne!(a, b, "t={t}: two shapes look the same");
            }
        }
        // The agent's arrow: more pixels on the side it points away from, at every heading.
        for dir in 0..4 {
            let (mut ahead, mut behind) = (0, 0);
            for i in 0..t * t {
                let (du, dv) = (2 * (i % t) + 1 - t, 2 * (i / t) + 1 - t);
                if in_arrow(dir, du, dv, t) {
                    let f = [-dv, du, dv, -du][dir];
                    if f > 0 {
                        ahead += 1;
                    } else if f < 0 {
                        behind += 1;
                    }
                }
            }
            assert!(
                ahead > 0 && behind > ahead,
                "t={t} dir={dir}: {ahead} / {behind}"
            );
        }
    }
}

#[test]
fn frames_follow_the_state_and_snapshots_keep_the_mode() {
    let mut a = build(make, json!({"obs": "image", "difficulty": "hard"}));
    let mut b = build(make, json!({"obs": "image", "difficulty": "hard"}));
    for t in 0..30 {
        a.reset(&Task::Index(t), 0).unwrap();
        b.reset(&Task::Index(t), 5).unwrap();
        let start = frame(&*a);
        assert_eq!(frame(&*b), start, "identical states draw identical frames");
        a.step("turn left");
        let turned = frame(&*a);
        assert_ne!(turned, start, "turning redraws the arrow");
        let snap = a.snapshot().unwrap();
        assert_eq!(snap.frame_shape(), a.frame_shape());
        assert_eq!(frame(&*snap), turned);
        a.step("turn right");
        assert_eq!(frame(&*a), start, "turned back: the start's frame");
        assert_eq!(frame(&*snap), turned, "the snapshot is independent");
        if a.valid_actions().contains(&"move forward".to_string()) {
            a.step("move forward");
            assert_ne!(frame(&*a), start, "moving redraws the agent");
        }
    }
}

#[test]
fn bad_obs_kwargs_are_named_errors() {
    assert_bad_kwargs(
        make,
        &[
            json!({"obs": "video"}),
            json!({"obs": true}),
            json!({"obs": "TEXT"}),
        ],
    );
    let err = make(json!({"obs": "rgb"}).as_object().unwrap())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("obs must be text, image or both"),
        "{err}"
    );
}

/// The picture drawn pixel by pixel from the tile rule: what `frame_into` must draw.
fn reference_frame(e: &GridEnv) -> Vec<u8> {
    let side = e.side;
    let (tile, height, width) = GridEnv::frame_pixels(e.cfg.size);
    let (ax, ay) = (e.pos % side, e.pos / side);
    let mut out = Vec::new();
    crate::env::draw_frame(&mut out, height, width, |y, x| {
        let (ty, tx) = (y / tile, x / tile);
        if ty >= side || tx >= side {
            return WALL_RGB;
        }
        let t = tile as i32;
        let du = 2 * (x % tile) as i32 + 1 - t;
        let dv = 2 * (y % tile) as i32 + 1 - t;
        if (tx, ty) == (ax, ay) && in_arrow(e.dir, du, dv, t) {
            return AGENT_RGB;
        }
        tile_pixel(e.tiles[ty * side + tx], du, dv, t)
    });
    out
}

#[test]
fn frames_equal_the_pixel_by_pixel_rule() {
    for kw in [
        json!({}),
        json!({"size": 3, "num_objects": 1}),
        json!({"size": 8, "num_doors": 3, "locked": true}),
        json!({"size": 12}),
    ] {
        for task in 0..6 {
            let mut e = image_env(kw.clone());
            e.reset(&Task::Index(task), 0).unwrap();
            for act in [
                "turn left",
                "move forward",
                "pick up",
                "turn right",
                "move forward",
            ] {
                assert_eq!(frame(&e).2, reference_frame(&e), "{kw} task {task}");
                e.step(act);
            }
        }
    }
}
