use super::*;
use crate::episode::StopReason;
use crate::pool::{EpisodePool, ResetSpec};
use crate::registry::Kwargs;
use crate::Task;

/// A hard maze with shaping 0.5 per step closer (exact in `f32`, so sums cancel exactly).
fn maze(n: usize, rules: Option<UndoRules>) -> EpisodePool {
    let mut kw = Kwargs::new();
    kw.insert("difficulty".into(), "hard".into());
    kw.insert("shaping".into(), 0.5.into());
    let mut pool = EpisodePool::new("maze", n, kw).unwrap();
    pool.set_undo(rules).unwrap();
    pool
}

fn rules(max_undos: u32, depth: usize) -> Option<UndoRules> {
    Some(UndoRules { max_undos, depth })
}

/// Resets `slots` on task 3 with horizon `max_turns`; their first observations.
fn reset(pool: &mut EpisodePool, slots: &[usize], max_turns: Option<u32>) -> Vec<String> {
    let specs: Vec<ResetSpec> = slots
        .iter()
        .map(|&slot| ResetSpec {
            slot,
            task: Task::Index(3),
            seed: 11,
            max_turns,
        })
        .collect();
    pool.reset(&specs).unwrap().to_vec()
}

/// One step of one slot: (observation, reward, terminated, truncated).
fn step(pool: &mut EpisodePool, slot: usize, action: &str) -> (String, f32, bool, bool) {
    let b = pool.step(&[slot], &[action]).unwrap();
    (
        b.observations[0].to_string(),
        b.rewards[0],
        b.terminated[0],
        b.truncated[0],
    )
}

fn oracle(pool: &mut EpisodePool, slot: usize) -> String {
    pool.oracle_action(slot).unwrap().unwrap()
}

#[test]
fn the_grammar_is_exact() {
    for (a, n) in [
        ("undo", Some(1)),
        ("UNDO", Some(1)),
        (" Undo ", Some(1)),
        ("undo 2", Some(2)),
        ("undo\t3", Some(3)),
        ("undo   12", Some(12)),
        ("undo 99999999999", Some(u32::MAX)),
        ("undo 0", None),
        ("undo -1", None),
        ("undo 2x", None),
        ("undo two", None),
        ("undo2", None),
        ("undone", None),
        ("und", None),
        ("move north", None),
        ("", None),
    ] {
        assert_eq!(parse_undo(a), n, "{a:?}");
    }
    let mut s = String::new();
    undone(&mut s, 2, "You are at (1, 1).");
    assert_eq!(s, "Undid the last 2 turn(s). You are at (1, 1).");
}

#[test]
fn undo_restores_exactly_the_earlier_observation_and_state() {
    let mut pool = maze(1, rules(3, 8));
    let obs0 = reset(&mut pool, &[0], None).remove(0);
    let a1 = oracle(&mut pool, 0);
    let (obs1, r1, ..) = step(&mut pool, 0, &a1);
    let (actions1, oracle1) = (pool.valid_actions(0).unwrap(), oracle(&mut pool, 0));
    let a2 = oracle1.clone();
    let (obs2, r2, ..) = step(&mut pool, 0, &a2);
    assert_eq!((r1, r2), (0.5, 0.5));

    // `undo 1`: back to after the first turn; the reply repeats that observation.
    let (o, r, te, tr) = step(&mut pool, 0, "Undo");
    assert_eq!(o, format!("Undid the last 1 turn(s). {obs1}"));
    assert_eq!((r, te, tr), (-r2, false, false));
    assert_eq!(pool.valid_actions(0).unwrap(), actions1);
    assert_eq!(oracle(&mut pool, 0), oracle1);
    // The same action gives the same observation and reward as before.
    assert_eq!(step(&mut pool, 0, &a2), (obs2.clone(), r2, false, false));

    // `undo 2`: back to the start; every undone reward is cancelled.
    let (o, r, ..) = step(&mut pool, 0, "undo 2");
    assert_eq!(o, format!("Undid the last 2 turn(s). {obs0}"));
    assert_eq!(r, -(r1 + r2));
    assert_eq!(step(&mut pool, 0, &a1), (obs1, r1, false, false));
    let ep = pool.episode(0).unwrap();
    // 2 + undo + 1 + undo + 1 turns; the return is the surviving path's (one step).
    assert_eq!((ep.turns, ep.undo_turns, ep.invalid_turns), (6, 2, 0));
    assert_eq!(ep.total_reward, r1);
    assert_eq!(pool.undo_turns_of(&[0]).unwrap(), vec![2]);
}

#[test]
fn undos_past_the_cap_or_the_history_are_refused_and_counted() {
    let mut pool = maze(1, rules(1, 8));
    reset(&mut pool, &[0], None);
    let a = oracle(&mut pool, 0);
    let (obs1, ..) = step(&mut pool, 0, &a);
    let (o, r, te, tr) = step(&mut pool, 0, "undo 2");
    assert_eq!(
        o,
        "Cannot undo 2 turn(s): only 1 turn(s) can be undone now. Nothing changed."
    );
    assert_eq!((r, te, tr), (0.0, false, false));
    // Nothing changed: the next action continues from where the episode was.
    let b = oracle(&mut pool, 0);
    let (obs2, r2, ..) = step(&mut pool, 0, &b);
    assert!(step(&mut pool, 0, "undo").0.ends_with(&obs1));
    let (o, r, ..) = step(&mut pool, 0, "undo");
    assert_eq!(
        o,
        "Cannot undo: this episode has used all 1 of its undos. Nothing changed."
    );
    assert_eq!(r, 0.0);
    assert_eq!(step(&mut pool, 0, &b), (obs2, r2, false, false));
    let ep = pool.episode(0).unwrap();
    assert_eq!((ep.turns, ep.undo_turns, ep.invalid_turns), (6, 1, 2));
    assert_eq!(pool.invalid_turns_of(&[0]).unwrap(), vec![2]);
}

#[test]
fn the_history_keeps_depth_turns() {
    let mut pool = maze(1, rules(5, 2));
    reset(&mut pool, &[0], None);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let a = oracle(&mut pool, 0);
        seen.push(step(&mut pool, 0, &a).0);
    }
    assert!(step(&mut pool, 0, "undo 3")
        .0
        .starts_with("Cannot undo 3 turn(s): only 2"));
    assert!(step(&mut pool, 0, "undo 2").0.ends_with(&seen[0]));
    // Nothing older is kept.
    assert!(step(&mut pool, 0, "undo")
        .0
        .starts_with("Cannot undo 1 turn(s): only 0"));
}

#[test]
fn an_undo_is_a_turn_and_the_horizon_still_ends_the_episode() {
    let mut pool = maze(1, rules(5, 8));
    reset(&mut pool, &[0], Some(3));
    let a = oracle(&mut pool, 0);
    step(&mut pool, 0, &a);
    assert!(!step(&mut pool, 0, "undo").3);
    let (_, r, te, tr) = step(&mut pool, 0, "undo");
    assert_eq!((r, te, tr), (0.0, false, true));
    assert_eq!(
        pool.stop_reasons_of(&[0]).unwrap(),
        vec![Some(StopReason::Horizon)]
    );
    assert_eq!(pool.episode(0).unwrap().turns, 3);
    // An undo that reaches the horizon ends the episode too (its reward still counts).
    reset(&mut pool, &[0], Some(2));
    let b = oracle(&mut pool, 0);
    step(&mut pool, 0, &b);
    let (_, r, _, tr) = step(&mut pool, 0, "undo");
    assert_eq!((r, tr), (-0.5, true));
    assert_eq!(pool.episode(0).unwrap().total_reward, 0.0);
}

#[test]
fn without_rules_undo_is_an_ordinary_action() {
    let mut pool = maze(1, None);
    reset(&mut pool, &[0], None);
    let (o, r, ..) = step(&mut pool, 0, "undo");
    assert!(o.starts_with("Invalid action"), "{o}");
    assert_eq!(r, 0.0);
    let ep = pool.episode(0).unwrap();
    assert_eq!((ep.invalid_turns, ep.undo_turns), (1, 0));
    // Rules set while an episode runs: it has no history, its undos are refused.
    pool.set_undo(rules(3, 4)).unwrap();
    assert!(step(&mut pool, 0, "undo")
        .0
        .starts_with("Cannot undo 1 turn(s): only 0"));
}

#[test]
fn an_env_that_cannot_snapshot_refuses_undo_rules() {
    crate::registry::register_test_envs();
    let mut pool = EpisodePool::new("_test_panic", 2, Kwargs::new()).unwrap();
    assert_eq!(
        pool.set_undo(rules(3, 8)),
        Err(CoreError::SnapshotUnsupported {
            env: "_test_panic".into()
        })
    );
    assert_eq!(pool.undo_rules(), None);
    let mut pool = maze(1, None);
    assert!(matches!(
        pool.set_undo(rules(3, 0)),
        Err(CoreError::InvalidArgument(_))
    ));
    assert_eq!(pool.undo_rules(), None);
}

#[test]
fn snapshots_and_forks_carry_the_history() {
    let mut pool = maze(3, rules(3, 8));
    reset(&mut pool, &[0], None);
    let a = oracle(&mut pool, 0);
    let (obs1, ..) = step(&mut pool, 0, &a);
    let b = oracle(&mut pool, 0);
    step(&mut pool, 0, &b);
    let h = pool.snapshot(&[0]).unwrap();
    pool.fork(0, &[1]).unwrap();
    let undo = step(&mut pool, 0, "undo");
    assert_eq!(step(&mut pool, 1, "undo"), undo);
    assert!(undo.0.ends_with(&obs1));
    pool.restore(&[2], &h).unwrap();
    assert_eq!(step(&mut pool, 2, "undo"), undo);
    // The restored copy is independent: undoing it again still works from the snapshot.
    pool.restore(&[0], &h).unwrap();
    assert_eq!(step(&mut pool, 0, "undo 2").1, -1.0);
}

#[test]
fn a_parallel_batch_undoes_every_row() {
    let n = 600;
    let mut pool = maze(n, rules(3, 4));
    let ids: Vec<usize> = (0..n).collect();
    let first = reset(&mut pool, &ids, None);
    let acts: Vec<String> = ids.iter().map(|&i| oracle(&mut pool, i)).collect();
    let acts: Vec<&str> = acts.iter().map(String::as_str).collect();
    let out = pool.step(&ids, &acts).unwrap();
    let undos = pool.step(&ids, &vec!["undo"; n]).unwrap();
    for (i, obs) in first.iter().enumerate() {
        assert_eq!(
            &undos.observations[i],
            format!("Undid the last 1 turn(s). {obs}")
        );
        assert_eq!(undos.rewards[i], -out.rewards[i]);
    }
    assert_eq!(pool.step(&ids, &acts).unwrap(), out);
}
