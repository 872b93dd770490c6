//! Tests of one batched rollout turn, on the `_test_panic` env and a small word-level
//! tokenizer (special tokens `<eot>`, `<user>`, `<asst>`).

use super::*;
use crate::env::Task;
use crate::parse::ParseFormat;
use crate::pool::ResetSpec;
use crate::registry::Kwargs;
use crate::trajectory::EpisodeMeta;

const EOT: u32 = 0;

fn tokenizer_json() -> String {
    let special = |id: u32, s: &str| {
        format!(
            r#"{{"id":{id},"content":"{s}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}"#
        )
    };
    let words = [
        "<eot>", "[UNK]", "Action:", "noop", "stop", "panic", "step", "1", "2", "3", "<user>",
        "<asst>",
    ];
    let vocab: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(i, w)| format!("\"{w}\":{i}"))
        .collect();
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[{},{},{}],
        "normalizer":null,"pre_tokenizer":{{"type":"WhitespaceSplit"}},"post_processor":null,
        "decoder":null,
        "model":{{"type":"WordLevel","vocab":{{{}}},"unk_token":"[UNK]"}}}}"#,
        special(0, "<eot>"),
        special(10, "<user>"),
        special(11, "<asst>"),
        vocab.join(",")
    )
}

fn codec() -> TurnCodec {
    TurnCodec::new(
        &tokenizer_json(),
        "<user>",
        "<eot><asst>",
        EOT,
        ActionParser::new(ParseFormat::React),
    )
    .unwrap()
}

/// A pool of `n` `_test_panic` episodes, reset, and a store with episode key `100 + slot`.
fn setup(n: usize) -> (EpisodePool, TrajectoryStore) {
    let mut pool = EpisodePool::new("_test_panic", n, Kwargs::new()).unwrap();
    let specs: Vec<ResetSpec> = (0..n)
        .map(|slot| ResetSpec {
            slot,
            task: Task::Index(0),
            seed: 7,
            max_turns: Some(3),
        })
        .collect();
    pool.reset(&specs).unwrap();
    let mut store = TrajectoryStore::new();
    for slot in 0..n {
        let meta = EpisodeMeta {
            group_id: slot as u64,
            sample_index: 0,
            policy_version: 0,
            task_id: 0,
        };
        store.begin(100 + slot as u64, meta).unwrap();
        store
            .append(100 + slot as u64, &[10, 6], false, None)
            .unwrap();
    }
    (pool, store)
}

fn reply(c: &TurnCodec, action: &str) -> Vec<u32> {
    let mut ids = c.encode(&format!("Action: {action}")).unwrap();
    ids.push(EOT);
    ids
}

fn input<'a>(slot: usize, tokens: &'a [u32], logprobs: &'a [f32], ended: bool) -> TurnInput<'a> {
    TurnInput {
        key: 100 + slot as u64,
        slot,
        tokens,
        logprobs,
        ended,
    }
}

#[test]
fn a_turn_appends_reply_reward_and_templated_observation() {
    let mut c = codec();
    let (mut pool, mut store) = setup(2);
    let r0 = reply(&c, "noop");
    let lp0: Vec<f32> = (0..r0.len()).map(|i| -(i as f32)).collect();
    let turns = [input(0, &r0, &lp0, true)];
    let out = c.step_turns(&mut pool, &mut store, &turns, 1000).unwrap();
    assert_eq!(out.stop, vec![None]);
    assert_eq!(out.rewards, vec![1.0]);
    // The observation of `_test_panic` is "step 1 noop"; wrapped and tokenized.
    let obs = c.encode("<user>step 1 noop<eot><asst>").unwrap();
    assert_eq!(obs, vec![10, 6, 7, 3, 0, 11]);
    let mut expect = r0.clone();
    expect.extend(&obs);
    assert_eq!(out.appended, vec![expect.clone()]);
    assert_eq!(out.tokenized, 1);

    store.finish(100, StopReason::Done, None).unwrap();
    let b = store.drain(None);
    let mut tokens = vec![10, 6];
    tokens.extend(&expect);
    assert_eq!(b.token_ids, tokens);
    let mut mask = vec![0u8, 0];
    mask.extend(std::iter::repeat_n(1u8, r0.len()));
    mask.extend(std::iter::repeat_n(0u8, obs.len()));
    assert_eq!(b.loss_mask, mask);
    assert_eq!(&b.logprobs[2..2 + r0.len()], lp0.as_slice());
    assert_eq!(b.turn_rewards, vec![1.0]);
}

#[test]
fn a_cut_reply_gets_an_end_of_turn_prompt_token_and_terminal_turns_no_observation() {
    let mut c = codec();
    let (mut pool, mut store) = setup(2);
    let cut = c.encode("Action: noop").unwrap(); // no end-of-turn token
    let stop = reply(&c, "stop");
    let turns = [input(0, &cut, &[], false), input(1, &stop, &[], true)];
    let out = c.step_turns(&mut pool, &mut store, &turns, 1000).unwrap();
    assert_eq!(out.stop, vec![None, Some(StopReason::Done)]);
    let mut a0 = cut.clone();
    a0.push(EOT);
    assert_eq!(&out.appended[0][..a0.len()], a0.as_slice());
    assert_eq!(
        out.appended[1], stop,
        "a finished episode gets no observation"
    );
    store.finish_all(StopReason::Done);
    let b = store.drain(None);
    let row = b.keys.iter().position(|&k| k == 100).unwrap();
    let (s, e) = (b.offsets[row] as usize, b.offsets[row + 1] as usize);
    // prompt 2, reply (model), eot (prompt), observation (prompt)
    let mask = &b.loss_mask[s..e];
    assert_eq!(
        mask[2 + cut.len()],
        0,
        "the appended end-of-turn token is not trained on"
    );
    assert!(mask[2..2 + cut.len()].iter().all(|&m| m == 1));
}

#[test]
fn horizon_length_abort_and_env_errors_end_only_their_episode() {
    let mut c = codec();
    let (mut pool, mut store) = setup(4);
    pool.finish(&[3], StopReason::Timeout).unwrap();
    let noop = reply(&c, "noop");
    let panic = reply(&c, "panic");
    // Slot 1 has a tiny context cap: the observation does not fit.
    let turns = [
        input(0, &noop, &[], true),
        input(1, &noop, &[], true),
        input(2, &panic, &[], true),
        input(3, &noop, &[], true),
    ];
    let out = c
        .step_turns(&mut pool, &mut store, &turns[..1], 1000)
        .unwrap();
    assert_eq!(out.stop, vec![None]);
    let out = c
        .step_turns(&mut pool, &mut store, &turns[1..2], 2 + noop.len() + 3)
        .unwrap();
    assert_eq!(out.stop, vec![Some(StopReason::Length)]);
    assert_eq!(out.appended, vec![noop.clone()]);
    let out = c
        .step_turns(&mut pool, &mut store, &turns[2..], 1000)
        .unwrap();
    assert_eq!(
        out.stop,
        vec![Some(StopReason::EnvError), Some(StopReason::Aborted)]
    );
    assert!(out.errors[0].as_deref().unwrap().contains("asked to panic"));
    assert_eq!(out.errors[1], None);
    // Horizon 3: slot 0 runs two more turns, then ends with `horizon`.
    let t = [input(0, &noop, &[], true)];
    c.step_turns(&mut pool, &mut store, &t, 1000).unwrap();
    let out = c.step_turns(&mut pool, &mut store, &t, 1000).unwrap();
    assert_eq!(out.stop, vec![Some(StopReason::Horizon)]);
    assert_eq!(store.num_turns(100).unwrap(), 3);
}

#[test]
fn bad_batches_fail_before_anything_changes() {
    let mut c = codec();
    let (mut pool, mut store) = setup(2);
    let noop = reply(&c, "noop");
    let before = store.num_tokens(100).unwrap();
    let twice = [input(0, &noop, &[], true), input(0, &noop, &[], true)];
    assert!(matches!(
        c.step_turns(&mut pool, &mut store, &twice, 1000),
        Err(CoreError::DuplicateSlot { slot: 0 })
    ));
    let far = [input(5, &noop, &[], true)];
    assert!(matches!(
        c.step_turns(&mut pool, &mut store, &far, 1000),
        Err(CoreError::SlotOutOfRange { slot: 5, .. })
    ));
    let mut unknown = input(0, &noop, &[], true);
    unknown.key = 999;
    assert!(matches!(
        c.step_turns(&mut pool, &mut store, &[unknown], 1000),
        Err(CoreError::Trajectory(_))
    ));
    let short_lp = [input(0, &noop, &[0.0], true)];
    assert!(matches!(
        c.step_turns(&mut pool, &mut store, &short_lp, 1000),
        Err(CoreError::InvalidArgument(_))
    ));
    assert_eq!(store.num_tokens(100).unwrap(), before);
    assert_eq!(pool.turns(), vec![0, 0], "no env was stepped");
}

#[test]
fn observations_are_tokenized_once_and_unparsable_replies_step_with_empty_action() {
    let mut c = codec();
    let (mut pool, mut store) = setup(3);
    let junk = vec![1u32, 1, 1]; // unknown words: no "Action:" line
    let turns: Vec<TurnInput> = (0..3).map(|s| input(s, &junk, &[], true)).collect();
    let out = c.step_turns(&mut pool, &mut store, &turns, 1000).unwrap();
    // All three see "step 1 " (empty action): one tokenization, shared.
    assert_eq!(out.tokenized, 1);
    assert_eq!(c.cached(), 1);
    assert!(out.appended.windows(2).all(|w| w[0] == w[1]));
    let out = c.step_turns(&mut pool, &mut store, &turns, 1000).unwrap();
    assert_eq!(out.tokenized, 1, "step 2 is a new observation");
    assert_eq!(c.cached(), 2);
    let (ids, misses) = c.observation_ids(&["step 2 "]).unwrap();
    assert_eq!(misses, 0);
    assert_eq!(&*ids[0], &out.appended[0][3..]);
}

#[test]
fn decode_drops_special_tokens_and_survives_unknown_ids() {
    let c = codec();
    assert_eq!(c.decode(&[2, 3, 0]).unwrap(), "Action: noop");
    let acts = c.actions(&[&[2, 3, 0], &[99_999, 5]]).unwrap();
    assert_eq!(acts[0], "noop");
    assert!(TurnCodec::new("{", "", "", 0, ActionParser::default()).is_err());
    assert!(TurnCodec::new(&tokenizer_json(), "", "", 77, ActionParser::default()).is_err());
}

#[test]
fn recorded_results_of_a_driver_stepped_env_append_like_a_native_step() {
    // Two stores fed the same turn: one by stepping the native env, one from the same step
    // results handed in by a driver. Both must hold the same tokens and return the same tail.
    let mut c = codec();
    let (mut pool, mut native) = setup(2);
    let (_, mut driven) = setup(2);
    let r0 = reply(&c, "noop");
    let r1 = reply(&c, "stop");
    let turns = [input(0, &r0, &[], true), input(1, &r1, &[], true)];
    let stepped = c.step_turns(&mut pool, &mut native, &turns, 1000).unwrap();
    let results = [
        StepResult {
            observation: "step 1 noop",
            reward: 1.0,
            ..StepResult::default()
        },
        StepResult {
            observation: "ignored once stopped",
            reward: 1.0,
            stop: Some(StopReason::Done),
            error: None,
        },
    ];
    let recorded = c.record_turns(&mut driven, &turns, &results, 1000).unwrap();
    assert_eq!(recorded.appended, stepped.appended);
    assert_eq!(recorded.stop, stepped.stop);
    assert_eq!(recorded.rewards, stepped.rewards);
    for key in [100, 101] {
        native.finish(key, StopReason::Done, None).unwrap();
        driven.finish(key, StopReason::Done, None).unwrap();
    }
    let (a, b) = (native.drain(None), driven.drain(None));
    assert_eq!(a.token_ids, b.token_ids);
    assert_eq!(a.loss_mask, b.loss_mask);
    assert_eq!(a.turn_rewards, b.turn_rewards);
}

#[test]
fn recorded_results_keep_env_errors_and_apply_the_length_cap() {
    let mut c = codec();
    let (_, mut store) = setup(2);
    let r = reply(&c, "noop");
    let turns = [input(0, &r, &[], true), input(1, &r, &[], false)];
    let results = [
        StepResult {
            observation: "Environment error: boom",
            stop: Some(StopReason::EnvError),
            error: Some("boom"),
            ..StepResult::default()
        },
        StepResult {
            observation: "step 1 noop",
            ..StepResult::default()
        },
    ];
    // Episode 101 holds 2 prompt tokens; the reply, its closing token and the observation
    // would reach the cap, so it stops with `length` and gets no observation.
    let cap = 2 + r.len() + 1 + 3;
    let out = c.record_turns(&mut store, &turns, &results, cap).unwrap();
    assert_eq!(
        out.stop,
        vec![Some(StopReason::EnvError), Some(StopReason::Length)]
    );
    assert_eq!(out.errors, vec![Some("boom".to_string()), None]);
    assert_eq!(out.appended[0], r);
    let mut closed = r.clone();
    closed.push(EOT);
    assert_eq!(out.appended[1], closed);
    // A result count that does not match, or an unknown key, changes nothing.
    assert!(c
        .record_turns(&mut store, &turns, &results[..1], cap)
        .is_err());
    let unknown = [TurnInput {
        key: 999,
        ..turns[0]
    }];
    assert!(c
        .record_turns(&mut store, &unknown, &results[..1], cap)
        .is_err());
}

#[test]
fn the_observation_cache_stays_within_its_byte_bound() {
    let mut c = codec();
    assert_eq!(c.cache_max_bytes(), DEFAULT_CACHE_MAX_BYTES);
    let bound = 2_000;
    c.set_cache_max_bytes(bound);
    let held = |c: &TurnCodec| -> usize { c.cache.iter().map(|(k, v)| entry_bytes(k, v)).sum() };
    let mut peak = 0;
    for call in 0..40 {
        // Each call brings 4 new observations of 2 to 12 words: the cache fills and restarts.
        let texts: Vec<String> = (0..4)
            .map(|k| format!("step {call} {k} ") + &"noop ".repeat(2 + (call + k) % 11))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (ids, misses) = c.observation_ids(&refs).unwrap();
        assert_eq!(misses, 4);
        assert_eq!(
            c.cache_bytes(),
            held(&c),
            "the byte count is what the entries hold"
        );
        assert!(
            c.cache_bytes() <= bound,
            "call {call}: {} > {bound}",
            c.cache_bytes()
        );
        peak = peak.max(c.cache_bytes());
        // What was just tokenized is served from the cache (until the next restart).
        let (again, misses) = c.observation_ids(&refs[3..]).unwrap();
        assert_eq!((misses, &again[0]), (0, &ids[3]));
    }
    assert!(
        peak > bound / 2,
        "the cache was used up to near its bound ({peak})"
    );
    // One entry bigger than the whole bound is tokenized but never cached.
    c.set_cache_max_bytes(100);
    assert_eq!(
        c.cache_bytes(),
        0,
        "lowering the bound below the content empties the cache"
    );
    let long = "noop ".repeat(30);
    let (_, misses) = c.observation_ids(&[long.as_str()]).unwrap();
    assert_eq!((misses, c.cached()), (1, 0));
}

#[test]
fn an_observation_the_tokenizer_refuses_ends_only_its_episode() {
    // A word-level vocabulary without "3" whose unknown token is missing too: encoding
    // "step 3 noop" fails, so the third observation of an episode cannot be tokenized.
    let json = tokenizer_json()
        .replace(r#""3":9,"#, "")
        .replace(r#""unk_token":"[UNK]""#, r#""unk_token":"[NONE]""#);
    let mut c = TurnCodec::new(
        &json,
        "<user>",
        "<eot><asst>",
        EOT,
        ActionParser::new(ParseFormat::React),
    )
    .unwrap();
    let (mut pool, mut store) = setup(2);
    let specs: Vec<ResetSpec> = (0..2)
        .map(|slot| ResetSpec {
            slot,
            task: Task::Index(0),
            seed: 7,
            max_turns: None,
        })
        .collect();
    pool.reset(&specs).unwrap();
    let noop = reply(&c, "noop");
    for _ in 0..2 {
        let out = c
            .step_turns(&mut pool, &mut store, &[input(0, &noop, &[], true)], 1000)
            .unwrap();
        assert_eq!(out.stop, vec![None]);
    }
    let before = store.num_tokens(101).unwrap();
    let both = [input(0, &noop, &[], true), input(1, &noop, &[], true)];
    let out = c.step_turns(&mut pool, &mut store, &both, 1000).unwrap();
    assert_eq!(out.stop, vec![Some(StopReason::EnvError), None]);
    let message = out.errors[0].as_deref().unwrap();
    assert!(message.contains("could not be tokenized"), "{message}");
    assert_eq!(out.errors[1], None);
    // slot 0's reply is recorded without an observation; slot 1 goes on as usual
    assert_eq!(out.appended[0], noop);
    let obs1 = c.observation_ids(&["step 1 noop"]).unwrap().0.remove(0);
    assert_eq!(out.appended[1], [noop.as_slice(), &obs1].concat());
    assert_eq!(
        store.num_tokens(101).unwrap(),
        before + noop.len() + obs1.len()
    );
    assert!(c.observation_ids(&["step 3 noop"]).is_err());
}
