//! Unit and property tests of the trajectory store.

use super::*;
use proptest::prelude::*;

fn meta(g: u64) -> EpisodeMeta {
    EpisodeMeta {
        group_id: g,
        sample_index: (g % 7) as u32,
        policy_version: 3,
        task_id: g * 10,
    }
}

fn is_traj_err<T: std::fmt::Debug>(r: Result<T>, needle: &str) {
    match r {
        Err(CoreError::Trajectory(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected a trajectory error containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn one_episode_packs_exactly() {
    let mut s = TrajectoryStore::new();
    s.begin(5, meta(1)).unwrap();
    s.append(5, &[1, 2, 3], false, None).unwrap();
    s.append(5, &[4, 5], true, Some(&[-0.5, -0.25])).unwrap();
    s.add_turn(5, 0.5).unwrap();
    s.append(5, &[6], false, None).unwrap();
    s.append(5, &[7], true, Some(&[-1.0])).unwrap();
    s.add_turn(5, 1.0).unwrap();
    s.finish(5, StopReason::Done, None).unwrap();
    assert!(!s.is_live(5));
    let b = s.drain(None);
    assert_eq!(b.len(), 1);
    assert_eq!(b.keys, vec![5]);
    assert_eq!(b.token_ids, vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(b.offsets, vec![0, 7]);
    assert_eq!(b.loss_mask, vec![0, 0, 0, 1, 1, 0, 1]);
    assert_eq!(b.logprobs, vec![0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -1.0]);
    assert_eq!(b.turn_rewards, vec![0.5, 1.0]);
    assert_eq!(b.turn_offsets, vec![0, 2]);
    assert_eq!(b.num_turns, vec![2]);
    assert_eq!(b.rewards, vec![1.5]);
    assert_eq!(b.prompt_len, vec![3]);
    assert_eq!(b.stop_reason, vec![StopReason::Done as u8]);
    assert_eq!(
        (
            b.group_id[0],
            b.sample_index[0],
            b.policy_version[0],
            b.task_id[0]
        ),
        (1, 1, 3, 10)
    );
    assert!(s.drain(None).is_empty());
    assert_eq!(s.drain(None).offsets, vec![0]);
}

#[test]
fn failure_zeroes_mask_and_override_wins() {
    let mut s = TrajectoryStore::new();
    for k in 0..2 {
        s.begin(k, meta(k)).unwrap();
        s.append(k, &[9, 9], false, None).unwrap();
        s.append(k, &[1, 2], true, Some(&[-0.1, -0.2])).unwrap();
        s.add_turn(k, 2.0).unwrap();
    }
    s.finish(0, StopReason::BackendError, None).unwrap();
    s.finish(1, StopReason::Length, Some(-1.0)).unwrap();
    let b = s.drain(None);
    assert_eq!(b.loss_mask, vec![0, 0, 0, 0, 0, 0, 1, 1]);
    assert_eq!(b.logprobs[2..4], [-0.1, -0.2]);
    assert_eq!(b.rewards, vec![2.0, -1.0]);
    assert_eq!(b.prompt_len, vec![2, 2]);
    assert_eq!(b.stop_reason, vec![4, 2]);
}

#[test]
fn errors_are_typed_and_leave_no_trace() {
    let mut s = TrajectoryStore::new();
    is_traj_err(s.append(1, &[1], false, None), "unknown episode key 1");
    s.begin(1, meta(0)).unwrap();
    is_traj_err(s.begin(1, meta(0)), "already begun");
    is_traj_err(s.begin_batch(&[2, 2], &[meta(0), meta(0)]), "already begun");
    assert!(!s.is_live(2));
    is_traj_err(s.append(1, &[1, 2], true, Some(&[0.0])), "logprobs");
    is_traj_err(
        s.append_batch(&[1], &[1, 2], &[0, 1], &[false], &[]),
        "offsets",
    );
    is_traj_err(
        s.append_batch(&[1, 1], &[1, 2], &[0, 2, 1], &[false, false], &[]),
        "offsets",
    );
    is_traj_err(s.append_batch(&[1], &[1], &[0, 1], &[], &[]), "is_model");
    // A batch with one bad key changes nothing.
    is_traj_err(
        s.append_batch(&[1, 7], &[1, 2], &[0, 1, 2], &[false, false], &[]),
        "7",
    );
    assert_eq!(s.num_tokens(1).unwrap(), 0);
    is_traj_err(s.add_turns(&[1], &[]), "lengths");
    is_traj_err(s.finish_batch(&[1, 1], &[StopReason::Done], &[]), "twice");
    s.finish(1, StopReason::Done, None).unwrap();
    is_traj_err(s.append(1, &[1], false, None), "has finished");
    is_traj_err(s.finish(1, StopReason::Done, None), "has finished");
    is_traj_err(s.discard(1), "has finished");
    // The key is free again: a new episode under it is independent of the queued one.
    s.begin(1, meta(4)).unwrap();
    s.append(1, &[8], true, None).unwrap();
    s.discard(1).unwrap();
    let b = s.drain(None);
    assert_eq!(b.len(), 1);
    assert!(b.token_ids.is_empty());
}

#[test]
fn drain_respects_max_and_finish_order() {
    let mut s = TrajectoryStore::new();
    let keys: Vec<u64> = (0..10).collect();
    s.begin_batch(&keys, &keys.iter().map(|&k| meta(k)).collect::<Vec<_>>())
        .unwrap();
    s.finish_batch(&[7, 3], &[StopReason::Horizon], &[Some(1.0)])
        .unwrap();
    assert_eq!(s.finish_all(StopReason::Aborted), 8);
    assert_eq!(s.num_live(), 0);
    let first = s.drain(Some(3));
    assert_eq!(first.keys, vec![7, 3, 0]);
    assert_eq!(first.rewards, vec![1.0, 1.0, 0.0]);
    assert_eq!(s.num_completed(), 7);
    assert_eq!(s.drain(None).len(), 7);
}

#[test]
fn idle_episode_is_small() {
    assert!(TrajectoryStore::idle_bytes_per_episode() <= 160);
    let mut s = TrajectoryStore::new();
    let keys: Vec<u64> = (0..1000).collect();
    s.begin_batch(&keys, &vec![EpisodeMeta::default(); 1000])
        .unwrap();
    // No per-episode buffers are allocated before tokens arrive.
    assert!(s.heap_bytes() <= 1000 * 2 * TrajectoryStore::idle_bytes_per_episode());
}

/// One random operation on a random episode, for the round-trip property.
#[derive(Debug, Clone)]
enum Op {
    Segment {
        ep: usize,
        tokens: Vec<u32>,
        is_model: bool,
    },
    Turn {
        ep: usize,
        reward: i8,
    },
}

fn op(n_eps: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..n_eps, proptest::collection::vec(any::<u32>(), 0..20), any::<bool>())
            .prop_map(|(ep, tokens, is_model)| Op::Segment { ep, tokens, is_model }),
        1 => (0..n_eps, any::<i8>()).prop_map(|(ep, reward)| Op::Turn { ep, reward }),
    ]
}

#[derive(Default, Clone)]
struct Expect {
    tokens: Vec<u32>,
    mask: Vec<u8>,
    logprobs: Vec<f32>,
    turns: Vec<f32>,
    first_model: Option<usize>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn round_trip(
        n_eps in 1usize..8,
        ops in proptest::collection::vec(op(8), 0..60),
        batch_size in 1usize..6,
        reasons in proptest::collection::vec(0u8..7, 8),
    ) {
        let mut s = TrajectoryStore::new();
        let keys: Vec<u64> = (0..n_eps as u64).map(|k| k * 1000 + 17).collect();
        let metas: Vec<EpisodeMeta> = (0..n_eps as u64).map(meta).collect();
        s.begin_batch(&keys, &metas).unwrap();
        let mut want = vec![Expect::default(); n_eps];
        let ops: Vec<Op> = ops.into_iter().filter(|o| match o {
            Op::Segment { ep, .. } | Op::Turn { ep, .. } => *ep < n_eps,
        }).collect();
        let mut lp_counter = 0.0f32;
        // Apply segments in batches through append_batch, turns one by one in between.
        let mut pending: Vec<(usize, Vec<u32>, bool, Vec<f32>)> = Vec::new();
        let flush = |s: &mut TrajectoryStore, pending: &mut Vec<(usize, Vec<u32>, bool, Vec<f32>)>| {
            let mut flat = Vec::new();
            let mut lps = Vec::new();
            let mut offsets = vec![0i64];
            let mut ks = Vec::new();
            let mut flags = Vec::new();
            for (ep, t, m, l) in pending.drain(..) {
                flat.extend_from_slice(&t);
                lps.extend_from_slice(&l);
                offsets.push(flat.len() as i64);
                ks.push(keys[ep]);
                flags.push(m);
            }
            s.append_batch(&ks, &flat, &offsets, &flags, &lps).unwrap();
        };
        for o in ops {
            match o {
                Op::Segment { ep, tokens, is_model } => {
                    let lps: Vec<f32> = tokens.iter().map(|_| { lp_counter -= 0.5; lp_counter }).collect();
                    let w = &mut want[ep];
                    if is_model && !tokens.is_empty() && w.first_model.is_none() {
                        w.first_model = Some(w.tokens.len());
                    }
                    w.tokens.extend_from_slice(&tokens);
                    w.mask.extend(tokens.iter().map(|_| is_model as u8));
                    w.logprobs.extend(lps.iter().map(|&l| if is_model { l } else { 0.0 }));
                    pending.push((ep, tokens, is_model, lps));
                    if pending.len() >= batch_size {
                        flush(&mut s, &mut pending);
                    }
                }
                Op::Turn { ep, reward } => {
                    flush(&mut s, &mut pending);
                    s.add_turn(keys[ep], reward as f32).unwrap();
                    want[ep].turns.push(reward as f32);
                }
            }
        }
        flush(&mut s, &mut pending);
        // Finish in reverse order with assorted reasons.
        for ep in (0..n_eps).rev() {
            let reason = StopReason::ALL[reasons[ep] as usize];
            s.finish(keys[ep], reason, None).unwrap();
        }
        let b = s.drain(None);
        prop_assert_eq!(b.len(), n_eps);
        prop_assert_eq!(b.offsets.len(), n_eps + 1);
        prop_assert_eq!(*b.offsets.last().unwrap() as usize, b.token_ids.len());
        for (i, ep) in (0..n_eps).rev().enumerate() {
            let w = &want[ep];
            let reason = StopReason::ALL[reasons[ep] as usize];
            let (a, z) = (b.offsets[i] as usize, b.offsets[i + 1] as usize);
            let (ta, tz) = (b.turn_offsets[i] as usize, b.turn_offsets[i + 1] as usize);
            prop_assert_eq!(b.keys[i], keys[ep]);
            prop_assert_eq!(b.group_id[i], ep as u64);
            prop_assert_eq!(&b.token_ids[a..z], &w.tokens[..]);
            let mask: Vec<u8> = if is_failure(reason) { vec![0; w.mask.len()] } else { w.mask.clone() };
            prop_assert_eq!(&b.loss_mask[a..z], &mask[..]);
            prop_assert_eq!(&b.logprobs[a..z], &w.logprobs[..]);
            prop_assert_eq!(&b.turn_rewards[ta..tz], &w.turns[..]);
            prop_assert_eq!(b.num_turns[i] as usize, w.turns.len());
            prop_assert_eq!(b.rewards[i], w.turns.iter().sum::<f32>());
            prop_assert_eq!(b.stop_reason[i], reason as u8);
            prop_assert_eq!(b.prompt_len[i] as usize, w.first_model.unwrap_or(w.tokens.len()));
        }
    }
}

#[test]
fn append_turn_is_reply_close_reward_and_observation_in_one_call() {
    let mut a = TrajectoryStore::new();
    let mut b = TrajectoryStore::new();
    for s in [&mut a, &mut b] {
        s.begin(1, meta(1)).unwrap();
        s.append(1, &[9, 9], false, None).unwrap();
    }
    // The same turn through the segment API ...
    a.append(1, &[4, 5], true, Some(&[-0.5, -0.25])).unwrap();
    a.append(1, &[0], false, None).unwrap();
    a.add_turn(1, 0.5).unwrap();
    a.append(1, &[6, 7], false, None).unwrap();
    // ... and in one call.
    let fits = b
        .append_turn(1, &[4, 5], &[-0.5, -0.25], Some(0), 0.5, Some(&[6, 7]), 100)
        .unwrap();
    assert!(fits);
    // An observation that would reach the cap is not appended; the reply still is.
    assert!(!b
        .append_turn(1, &[8], &[], None, 1.0, Some(&[1, 2, 3]), 10)
        .unwrap());
    a.append(1, &[8], true, None).unwrap();
    a.add_turn(1, 1.0).unwrap();
    assert_eq!(a.num_tokens(1).unwrap(), 8);
    is_traj_err(
        b.append_turn(1, &[8], &[0.0, 0.0], None, 0.0, None, 10),
        "logprobs",
    );
    is_traj_err(
        b.append_turn(2, &[8], &[], None, 0.0, None, 10),
        "unknown episode",
    );
    a.finish(1, StopReason::Done, None).unwrap();
    b.finish(1, StopReason::Done, None).unwrap();
    let (pa, pb) = (a.drain(None), b.drain(None));
    assert_eq!(pa.token_ids, pb.token_ids);
    assert_eq!(pa.loss_mask, pb.loss_mask);
    assert_eq!(pa.logprobs, pb.logprobs);
    assert_eq!(pa.turn_rewards, pb.turn_rewards);
    assert_eq!(pa.prompt_len, pb.prompt_len);
}

#[test]
fn a_fork_copies_the_prefix_with_its_mask_off_and_records_the_branch() {
    let mut s = TrajectoryStore::new();
    s.begin(1, meta(7)).unwrap(); // sample 0
    s.append(1, &[1, 2], false, None).unwrap();
    s.append(1, &[3, 4], true, Some(&[-0.5, -0.25])).unwrap();
    s.add_turn(1, 0.5).unwrap();
    s.append(1, &[5], false, None).unwrap();
    s.fork(1, &[10, 11], &[1, 2]).unwrap();
    // the root and each child go on independently
    s.append(1, &[6], true, Some(&[-1.0])).unwrap();
    s.add_turn(1, 1.0).unwrap();
    s.append(10, &[8, 9], true, Some(&[-2.0, -3.0])).unwrap();
    s.add_turn(10, 0.0).unwrap();
    s.finish(1, StopReason::Done, None).unwrap();
    s.finish(10, StopReason::Horizon, None).unwrap();
    s.finish(11, StopReason::EnvError, None).unwrap();
    let b = s.drain(None);
    assert_eq!(b.keys, vec![1, 10, 11]);
    assert_eq!(b.sample_index, vec![0, 1, 2]);
    assert_eq!(b.group_id, vec![7, 7, 7]);
    assert_eq!(
        b.token_ids,
        vec![1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 8, 9, 1, 2, 3, 4, 5]
    );
    assert_eq!(b.offsets, vec![0, 6, 13, 18]);
    // the root keeps its prefix mask; the children train only what they generate
    assert_eq!(
        b.loss_mask,
        vec![0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        &b.logprobs[6..13],
        &[0.0, 0.0, -0.5, -0.25, 0.0, -2.0, -3.0]
    );
    assert_eq!(b.turn_rewards, vec![0.5, 1.0, 0.5, 0.0, 0.5]);
    assert_eq!(b.rewards, vec![1.5, 0.5, 0.5]);
    assert_eq!(b.prompt_len, vec![2, 5, 5]);
    assert_eq!(b.branch_parent, vec![0, 0, 0]);
    assert_eq!(b.branch_turn, vec![1, 1, 1]);
    assert_eq!(b.branch_pos, vec![5, 5, 5]);
}

#[test]
fn an_unbranched_episode_is_its_own_parent() {
    let mut s = TrajectoryStore::new();
    s.begin(3, meta(5)).unwrap(); // sample 5
    s.append(3, &[1], true, None).unwrap();
    s.finish(3, StopReason::Done, None).unwrap();
    let b = s.drain(None);
    assert_eq!(
        (b.branch_parent[0], b.branch_turn[0], b.branch_pos[0]),
        (5, 0, 0)
    );
}

#[test]
fn a_bad_fork_changes_nothing() {
    let mut s = TrajectoryStore::new();
    s.begin(1, meta(7)).unwrap();
    s.append(1, &[1, 2], false, None).unwrap();
    is_traj_err(s.fork(1, &[2], &[1]), "no model tokens");
    s.append(1, &[3], true, None).unwrap();
    s.begin(2, meta(8)).unwrap();
    is_traj_err(s.fork(1, &[2], &[1]), "already begun");
    is_traj_err(s.fork(1, &[3, 3], &[1, 2]), "already begun");
    is_traj_err(s.fork(1, &[1], &[1]), "already begun");
    is_traj_err(s.fork(1, &[3], &[1, 2]), "lengths must match");
    assert!(matches!(
        s.fork(9, &[3], &[1]),
        Err(CoreError::Trajectory(_))
    ));
    assert_eq!(s.num_live(), 2);
    s.fork(1, &[3], &[1]).unwrap();
    is_traj_err(s.fork(1, &[4], &[2]), "forks once");
    assert_eq!(s.num_live(), 3);
}

#[test]
fn credit_only_keeps_the_chosen_replies() {
    let mut s = TrajectoryStore::new();
    s.begin(1, meta(1)).unwrap();
    s.append(1, &[1, 2], false, None).unwrap();
    s.append(1, &[3, 4], true, None).unwrap(); // 2..4
    s.append(1, &[5], false, None).unwrap();
    s.append(1, &[6, 7, 8], true, None).unwrap(); // 5..8
    s.append(1, &[9], false, None).unwrap();
    s.append(1, &[10], true, None).unwrap(); // 9
    is_traj_err(s.credit_only(1, &[6]), "does not begin");
    is_traj_err(s.credit_only(1, &[0]), "does not begin");
    is_traj_err(s.credit_only(1, &[99]), "does not begin");
    s.credit_only(1, &[5, 9]).unwrap();
    s.finish(1, StopReason::Done, None).unwrap();
    assert_eq!(s.drain(None).loss_mask, vec![0, 0, 0, 0, 0, 1, 1, 1, 0, 1]);
}

#[test]
fn add_reward_changes_one_turn_and_the_sum() {
    let mut s = TrajectoryStore::new();
    s.begin(1, meta(1)).unwrap();
    s.append(1, &[1, 2], false, None).unwrap();
    s.add_turns(&[1, 1, 1], &[0.0, 0.25, 1.0]).unwrap();
    assert_eq!(s.reward(1).unwrap(), 1.25);
    s.add_reward(1, 0, 0.5).unwrap();
    is_traj_err(s.add_reward(1, 3, 0.5), "turn 3 does not exist");
    is_traj_err(s.reward(2), "");
    assert_eq!(s.reward(1).unwrap(), 1.75);
    s.finish(1, StopReason::Done, None).unwrap();
    let d = s.drain(None);
    assert_eq!(d.turn_rewards, vec![0.5, 0.25, 1.0]);
    assert_eq!(d.rewards, vec![1.75]);
}
