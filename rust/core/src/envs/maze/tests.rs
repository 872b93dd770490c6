//! Unit tests of the maze env.

use super::*;
use crate::envs::test_util::{
    assert_bad_kwargs, assert_parses, assert_text_mode_is_the_default, build, frame, pixel,
};
use serde_json::json;

fn env(kw: serde_json::Value) -> Box<dyn Env> {
    build(make, kw)
}

fn maze(kw: serde_json::Value) -> MazeEnv {
    let kw = kw.as_object().unwrap().clone();
    let w = kw.get("size").and_then(|v| v.as_u64()).unwrap_or(6) as usize;
    let loops = kw.get("loops").and_then(|v| v.as_u64()).unwrap_or(0);
    MazeEnv::new(MazeConfig {
        width: w,
        height: w,
        loops,
        goal_hint: false,
        signpost: false,
        show_position: true,
        shaping: 0.0,
        split: 0,
        obs: ObsMode::Text,
    })
}

#[test]
fn same_task_same_maze_and_seed_is_ignored() {
    let mut a = env(json!({}));
    let mut b = env(json!({}));
    for t in 0..50 {
        assert_eq!(
            a.reset(&Task::Index(t), 1).unwrap(),
            b.reset(&Task::Index(t), 999).unwrap()
        );
        for act in ["move north", "move east", "w", "go south", "jump"] {
            assert_eq!(a.step(act), b.step(act));
        }
    }
    let mut m = maze(json!({}));
    let mut layouts = std::collections::HashSet::new();
    for t in 0..50 {
        m.reset(&Task::Index(t), 0).unwrap();
        layouts.insert(m.layout().render());
    }
    assert!(layouts.len() >= 49, "tasks should give distinct mazes");
}

#[test]
fn splits_give_different_mazes() {
    let mut tr = env(json!({"split": "train"}));
    let mut te = env(json!({"split": "test"}));
    let same = (0..40)
        .filter(|&t| tr.reset(&Task::Index(t), 0).unwrap() == te.reset(&Task::Index(t), 0).unwrap())
        .count();
    assert!(same < 10);
}

#[test]
fn every_generated_maze_is_a_connected_perfect_maze() {
    for (w, h) in [
        (2, 1),
        (1, 2),
        (2, 2),
        (3, 5),
        (4, 4),
        (6, 6),
        (9, 9),
        (17, 3),
    ] {
        for t in 0..200 {
            let mut l = Layout::default();
            l.generate(w, h, 0, derive(&[t, w as u64, h as u64]));
            let passages: u32 = l.open.iter().map(|o| o.count_ones()).sum::<u32>() / 2;
            assert_eq!(
                passages as usize,
                w * h - 1,
                "a perfect maze is a spanning tree"
            );
            let mut dist = Vec::new();
            l.distances(l.start, &mut dist, &mut VecDeque::new());
            assert!(dist.iter().all(|&d| d != UNREACHED), "all cells reachable");
            assert_ne!(l.start, l.goal);
            let far = *dist.iter().max().unwrap();
            assert!(dist[l.goal] >= far.div_ceil(2).max(1));
            for c in 0..w * h {
                for d in 0..4 {
                    if l.open[c] & (1 << d) != 0 {
                        let n = l.neighbor(c, d).expect("no opening through the border");
                        assert!(l.open[n] & (1 << (d ^ 1)) != 0, "passages are symmetric");
                    }
                }
            }
        }
    }
}

#[test]
fn loops_add_openings() {
    let (mut a, mut b) = (Layout::default(), Layout::default());
    a.generate(8, 8, 0, 5);
    b.generate(8, 8, 20, 5);
    let count = |l: &Layout| l.open.iter().map(|o| o.count_ones()).sum::<u32>();
    assert!(count(&b) > count(&a));
}

#[test]
fn render_parse_round_trip() {
    for t in 0..30 {
        let mut l = Layout::default();
        l.generate(5, 3, t % 3, t);
        let text = l.render();
        assert_eq!(text.lines().count(), 7);
        assert_eq!(Layout::parse(&text).unwrap(), l);
    }
}

#[test]
fn spec_tasks_are_parsed_and_validated() {
    let mut e = env(json!({}));
    let obs = e
        .reset(&Task::Spec("#####\n#S  #\n### #\n#G  #\n#####".into()), 0)
        .unwrap();
    assert!(obs.starts_with("You are in a 2x2 maze."), "{obs}");
    assert!(obs.contains("East: open.") && obs.contains("South: wall."));
    assert_eq!(e.step("move east").reward, 0.0);
    assert_eq!(e.step("move south").reward, 0.0);
    let s = e.step("move west");
    assert!(s.terminated && s.reward == 1.0);
    for bad in [
        "#####\n#S#G#\n#####",
        "####\n#SG#\n####",
        "#####\n#S  #\n#####",
        "#####\n#S XG\n#####",
        "",
    ] {
        match e.reset(&Task::Spec(bad.into()), 0) {
            Err(CoreError::InvalidTask { env, .. }) => assert_eq!(env, "maze"),
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
}

#[test]
fn oracle_follows_a_shortest_path() {
    for size in [2u64, 4, 6, 9] {
        let mut m = maze(json!({"size": size, "loops": size}));
        for t in 0..100 {
            m.reset(&Task::Index(t), 0).unwrap();
            let shortest = m.to_goal[m.pos];
            let mut steps = 0;
            loop {
                let a = m.oracle_action().unwrap();
                assert!(m.valid_actions().contains(&a));
                let s = m.step(&a);
                steps += 1;
                if s.terminated {
                    assert_eq!(s.reward, 1.0);
                    assert!(s.observation.ends_with("You reached the goal!"));
                    break;
                }
                assert_eq!(s.reward, 0.0);
            }
            assert_eq!(steps, shortest);
            assert_eq!(m.oracle_action(), None);
            assert!(m.valid_actions().is_empty());
            assert_eq!(
                m.step("move north"),
                Step::new("The episode is over.", 0.0, true)
            );
        }
    }
}

#[test]
fn walls_and_unknown_text_cost_a_turn_but_do_not_move() {
    let mut m = maze(json!({}));
    m.reset(&Task::Index(3), 0).unwrap();
    let pos = m.pos;
    let closed = (0..4)
        .find(|&d| m.layout.open[pos] & (1 << d) == 0)
        .unwrap();
    let s = m.step(&format!("move {}", DIRS[closed]));
    assert!(s
        .observation
        .starts_with(&format!("Blocked: wall to the {}.", DIRS[closed])));
    assert_eq!((s.reward, s.terminated, m.pos), (0.0, false, pos));
    let s = m.step("dance");
    assert!(s.observation.starts_with("Invalid action."));
    assert!(s.observation.contains("Position: row"));
    assert_eq!((s.reward, s.terminated, m.pos), (0.0, false, pos));
}

#[test]
fn direction_parsing() {
    assert_parses(
        parse_direction,
        &[
            ("move north", Some(0)),
            ("  Move South.", Some(1)),
            ("go  east", Some(2)),
            ("W", Some(3)),
            ("west\n", Some(3)),
            ("MOVE N", Some(0)),
            ("move", None),
            ("movenorth", None),
            ("move north please", None),
            ("norths", None),
            ("", None),
            ("ｎorth", None),
        ],
    );
}

#[test]
fn observation_texts() {
    let mut e = env(json!({"difficulty": "easy", "goal_hint": true}));
    let obs = e.reset(&Task::Index(0), 0).unwrap();
    assert!(
        obs.starts_with("You are in a 4x4 maze. Find the goal. Position: row "),
        "{obs}"
    );
    assert!(obs.contains(" North: ") && obs.contains(" Goal: "), "{obs}");
    let mut e = env(json!({"size": 3, "show_position": false}));
    let obs = e.reset(&Task::Index(0), 0).unwrap();
    assert!(!obs.contains("Position") && !obs.contains("Goal:"), "{obs}");
    assert!(e.instructions().contains("move north"));
}

/// The four side words of a status sentence, in N, S, E, W order.
fn side_words(obs: &str) -> Vec<String> {
    ["North: ", "South: ", "East: ", "West: "]
        .iter()
        .map(|t| {
            let at = obs.rfind(t).unwrap_or_else(|| panic!("{t} in {obs}")) + t.len();
            obs[at..].split('.').next().unwrap().to_string()
        })
        .collect()
}

#[test]
fn signposts_mark_exactly_the_sides_one_step_closer() {
    let dirs = ["north", "south", "east", "west"];
    for task in 0..200 {
        let mut e = env(json!({"size": 4, "loops": 3, "signpost": true, "show_position": false}));
        let mut obs = e.reset(&Task::Index(task), 0).unwrap();
        for _ in 0..16 {
            let words = side_words(&obs);
            let oracle = e.oracle_action().unwrap();
            let valid = e.valid_actions();
            for (d, word) in words.iter().enumerate() {
                let action = format!("move {}", dirs[d]);
                if word == "closer" {
                    // A closer side is open and a shortest-path move (one step less to go).
                    assert!(valid.contains(&action), "{obs}");
                } else if word == "open" {
                    assert_ne!(action, oracle, "{obs}");
                }
            }
            // The oracle's move is signposted unless it enters the goal.
            let od = dirs.iter().position(|d| oracle.ends_with(d)).unwrap();
            assert!(matches!(words[od].as_str(), "closer" | "goal"), "{obs}");
            let s = e.step(&oracle);
            if s.terminated {
                break;
            }
            // Every oracle move is one step closer, and the move's text says so.
            assert!(
                s.observation
                    .starts_with(&format!("Moved {}, closer.", dirs[od])),
                "{}",
                s.observation
            );
            obs = s.observation;
        }
    }
    let mut plain = env(json!({"size": 4, "loops": 3, "show_position": false}));
    assert!(!plain.reset(&Task::Index(0), 0).unwrap().contains("closer"));
    assert!(env(json!({"signpost": true}))
        .instructions()
        .contains("closer"));
}

#[test]
fn shaping_rewards_progress_only_when_enabled() {
    let mut e = env(json!({"shaping": 0.1}));
    e.reset(&Task::Index(1), 0).unwrap();
    let a = e.oracle_action().unwrap();
    let s = e.step(&a);
    assert!(s.terminated || (s.reward - 0.1).abs() < 1e-6);
}

#[test]
fn bad_kwargs_are_named_errors() {
    assert_bad_kwargs(
        make,
        &[
            json!({"difficulty": "extreme"}),
            json!({"size": 0}),
            json!({"width": 65}),
            json!({"size": 1}),
            json!({"split": "dev"}),
            json!({"shaping": "lots"}),
            json!({"colour": 1}),
        ],
    );
    assert!(make(json!({"width": 1, "height": 2}).as_object().unwrap()).is_ok());
}

#[test]
fn text_mode_is_the_default_and_draws_nothing() {
    let (mut a, mut b) = (env(json!({})), env(json!({"obs": "text"})));
    assert_text_mode_is_the_default(
        a.as_mut(),
        b.as_mut(),
        &["move north", "move east", "w", "go south", "jump"],
    );
}

#[test]
fn image_mode_text_says_only_what_the_move_did() {
    for difficulty in ["easy", "medium", "hard"] {
        let mut text = env(json!({"difficulty": difficulty}));
        let mut image = env(json!({"difficulty": difficulty, "obs": "image"}));
        let mut both = env(json!({"difficulty": difficulty, "obs": "both"}));
        let mut rng = SplitMix64::new(9);
        for t in 0..40 {
            let full = text.reset(&Task::Index(t), 0).unwrap();
            let short = image.reset(&Task::Index(t), 0).unwrap();
            assert_eq!(both.reset(&Task::Index(t), 0).unwrap(), full);
            let side = match difficulty {
                "easy" => 4,
                "medium" => 6,
                _ => 9,
            };
            assert_eq!(
                short,
                format!("You are in a {side}x{side} maze. Find the goal.")
            );
            for k in 0..40 {
                // Mostly the oracle's moves (they reach the goal), some walls and junk.
                let a = match k % 4 {
                    3 => {
                        ["move north", "move west", "dance", "s"][rng.below(4) as usize].to_string()
                    }
                    _ => text.oracle_action().unwrap(),
                };
                let (f, s) = (text.step(&a), image.step(&a));
                assert_eq!(both.step(&a), f);
                assert_eq!((f.reward, f.terminated), (s.reward, s.terminated));
                // The image text is the text observation without its status sentence.
                assert!(f.observation.starts_with(&s.observation), "{s:?} / {f:?}");
                let o = &s.observation;
                assert!(
                    !o.chars().any(|c| c.is_ascii_digit())
                        && !o.contains("Position")
                        && !["North:", "South:", "East:", "West:", "Goal:"]
                            .iter()
                            .any(|side| o.contains(side))
                        && !o.contains("closer"),
                    "{o}"
                );
                let known = o.starts_with("Moved ")
                    || o.starts_with("Blocked: wall to the ")
                    || o == "Invalid action. Use move north, move south, move east or move west.";
                assert!(known, "{o}");
                if s.terminated {
                    assert!(o.ends_with(". You reached the goal!"), "{o}");
                    break;
                }
            }
        }
    }
}

#[test]
fn image_mode_instructions_explain_the_picture() {
    let text = env(json!({})).instructions();
    let image = env(json!({"obs": "image"})).instructions();
    let both = env(json!({"obs": "both"})).instructions();
    for s in [&image, &both] {
        assert!(
            s.contains("picture") && s.contains("red square is you"),
            "{s}"
        );
        assert!(s.contains("green square is the goal") && s.ends_with("Action: move north"));
    }
    assert!(!image.contains("position") && !image.contains("wall, open or goal"));
    assert!(both.contains("wall, open or goal") && !text.contains("picture"));
    assert!(text.ends_with(&crate::env::action_line("move north")));
}

#[test]
fn frames_have_patch_aligned_sizes() {
    for (kw, side) in [
        (json!({"difficulty": "easy"}), 28),
        (json!({"difficulty": "medium"}), 56),
        (json!({"difficulty": "hard"}), 84),
        (json!({"size": 2}), 28),
        (json!({"size": 64}), 392),
    ] {
        let mut kw = kw.as_object().unwrap().clone();
        kw.insert("obs".into(), json!("image"));
        let mut e = make(&kw).unwrap();
        assert_eq!(e.frame_shape(), Some((side, side)), "{kw:?}");
        assert_eq!(
            e.frame_into(&mut Vec::new()),
            None,
            "no frame before a reset"
        );
        e.reset(&Task::Index(1), 0).unwrap();
        let (h, w, px) = frame(&*e);
        assert_eq!((h as u32, w as u32), (side, side));
        assert_eq!(px.len(), h * w * 3);
    }
    // A rectangle: 7 x 2 cells are 5 x 15 blocks of 3 pixels.
    let mut e = env(json!({"width": 7, "height": 2, "obs": "both"}));
    assert_eq!(e.frame_shape(), Some((28, 56)));
    e.reset(&Task::Index(0), 0).unwrap();
    assert_eq!(frame(&*e).0, 28);
}

/// Every block of the frame has the colour of the maze's text rendering (`#` wall, ` `
/// floor, `G` goal), the agent's cell the agent's colour, the margin the wall colour.
fn assert_frame_matches_layout(e: &MazeEnv) {
    let l = e.layout();
    let f = frame(e);
    let (block, h, w) = MazeEnv::frame_pixels(l.width, l.height);
    assert_eq!((f.0, f.1), (h, w));
    let text = l.render();
    let rows: Vec<&[u8]> = text.lines().map(str::as_bytes).collect();
    let agent = (2 * (e.pos / l.width) + 1, 2 * (e.pos % l.width) + 1);
    for y in 0..h {
        for x in 0..w {
            let (by, bx) = (y / block, x / block);
            let want = match rows.get(by).and_then(|r| r.get(bx)) {
                None => WALL_RGB,
                Some(_) if (by, bx) == agent => AGENT_RGB,
                Some(b'#') => WALL_RGB,
                Some(b'G') => GOAL_RGB,
                Some(b' ' | b'S') => FLOOR_RGB,
                Some(c) => panic!("render wrote {c}"),
            };
            assert_eq!(pixel(&f, y, x), want, "pixel {y},{x} block {by},{bx}");
        }
    }
}

#[test]
fn frames_draw_walls_agent_and_goal_where_they_are() {
    let mut e = maze(json!({"size": 5, "loops": 2}));
    e.cfg.obs = ObsMode::Image;
    for t in 0..20 {
        e.reset(&Task::Index(t), 0).unwrap();
        assert_frame_matches_layout(&e);
        for _ in 0..3 {
            let a = e.oracle_action().unwrap();
            e.step(&a);
            assert_frame_matches_layout(&e);
        }
    }
    let spec = "#####\n#S  #\n### #\n#G  #\n#####";
    e.reset(&Task::Spec(spec.into()), 0).unwrap();
    assert_frame_matches_layout(&e);
    // 2x2 cells: 5x5 blocks of 5 pixels in a 28x28 frame; the start (agent) is block
    // (1, 1), the goal block (3, 1).
    let f = frame(&e);
    assert_eq!((f.0, f.1), (28, 28));
    assert_eq!(pixel(&f, 7, 7), AGENT_RGB);
    assert_eq!(pixel(&f, 17, 7), GOAL_RGB);
    assert_eq!(pixel(&f, 12, 12), WALL_RGB);
    assert_eq!(pixel(&f, 7, 12), FLOOR_RGB);
    assert_eq!(pixel(&f, 27, 27), WALL_RGB);
}

#[test]
fn frames_follow_the_state_and_snapshots_keep_the_mode() {
    let mut a = env(json!({"obs": "image"}));
    let mut b = env(json!({"obs": "image"}));
    for t in 0..20 {
        a.reset(&Task::Index(t), 0).unwrap();
        b.reset(&Task::Index(t), 3).unwrap();
        let start = frame(&*a);
        assert_eq!(frame(&*b), start, "identical states draw identical frames");
        let go = a.valid_actions()[0].clone();
        let back = match go.as_str() {
            "move north" => "move south",
            "move south" => "move north",
            "move east" => "move west",
            _ => "move east",
        };
        let s = a.step(&go);
        if s.terminated {
            continue;
        }
        let moved = frame(&*a);
        assert_ne!(moved, start, "the frame changes when the agent moves");
        let snap = a.snapshot().unwrap();
        assert_eq!(snap.frame_shape(), a.frame_shape());
        assert_eq!(frame(&*snap), moved, "a snapshot draws like its env");
        a.step(back);
        assert_eq!(frame(&*a), start, "back at the start, the start's frame");
        assert_eq!(frame(&*snap), moved, "the snapshot is independent");
        // A blocked move or junk changes nothing in the picture.
        a.step("dance");
        assert_eq!(frame(&*a), start);
    }
}

#[test]
fn bad_obs_kwargs_are_named_errors() {
    assert_bad_kwargs(
        make,
        &[
            json!({"obs": "video"}),
            json!({"obs": 1}),
            json!({"obs": "Image"}),
            json!({"obs": "image", "goal_hint": true}),
            json!({"obs": "image", "signpost": true}),
        ],
    );
    let err = make(json!({"obs": "rgb"}).as_object().unwrap())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("obs must be text, image or both"),
        "{err}"
    );
    assert!(make(
        json!({"obs": "both", "goal_hint": true, "signpost": true})
            .as_object()
            .unwrap()
    )
    .is_ok());
}
