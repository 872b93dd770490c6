//! Unit tests of the maze env.

use super::*;
use crate::envs::test_util::{assert_bad_kwargs, assert_parses, build};
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
