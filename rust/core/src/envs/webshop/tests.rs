//! Tests of the webshop env: goals, rewards, actions, oracle and random play.

use super::goal::{Goal, Split, TEST_SLOTS, VARIANTS};
use super::*;
use crate::envs::test_util::{self, play_random};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

fn env(split: Split, task: u64) -> WebShopEnv {
    let mut e = WebShopEnv::new(split);
    e.reset(&Task::Index(task), 0).unwrap();
    e
}

/// Play the oracle to the end; returns (reward, steps).
fn play_oracle(e: &mut WebShopEnv) -> (f32, usize) {
    test_util::play_oracle(e, 40)
}

#[test]
fn splits_have_documented_sizes_and_disjoint_targets() {
    let cat = catalogue();
    let n = cat.products.len() as u32;
    assert_eq!(Split::Test.num_tasks(n), (TEST_SLOTS * VARIANTS) as u64);
    assert_eq!(Split::Test.num_tasks(n), 500);
    assert_eq!(Split::Train.num_tasks(n), 11_500);
    let test: HashSet<u32> = (0..500)
        .map(|i| Goal::for_task(cat, Split::Test, i).target)
        .collect();
    let train: HashSet<u32> = (0..11_500)
        .step_by(7)
        .map(|i| Goal::for_task(cat, Split::Train, i).target)
        .collect();
    assert!(test.is_disjoint(&train));
    assert_eq!(test.len(), TEST_SLOTS as usize);
    assert!(Split::parse("dev").is_err());
}

#[test]
fn goals_are_deterministic_and_their_target_scores_one() {
    let cat = catalogue();
    for i in 0..300 {
        let g = Goal::for_task(cat, Split::Train, i);
        assert_eq!(g, Goal::for_task(cat, Split::Train, i));
        let target = &cat.products[g.target as usize];
        assert_eq!(g.best_reward(target), 1.0, "goal {i}: {}", g.text);
        assert!(g.text.starts_with("i am looking for"));
        assert!(g.text.contains("price lower than"));
        assert!(!g.attributes.is_empty());
        assert_eq!(g.options.len(), target.options.len());
    }
    // Index wraps modulo the split size.
    assert_eq!(
        Goal::for_task(cat, Split::Test, 3),
        Goal::for_task(cat, Split::Test, 503)
    );
}

#[test]
fn reward_on_hand_built_purchases() {
    let cat = catalogue();
    let g = Goal::for_task(cat, Split::Test, 11);
    let target = &cat.products[g.target as usize];
    // Right product and options: 1.
    assert_eq!(g.score(target, &g.best_choice(target)).total(), 1.0);
    // Right product, no options picked: options score 0.
    let none = vec![None; target.options.len()];
    let r = g.score(target, &none);
    assert_eq!(r.option_hits, 0);
    let denom = g.attributes.len() + g.options.len() + 1 + g.rating_min_tenths.is_some() as usize;
    let hits = g.attributes.len() + 1 + g.rating_min_tenths.is_some() as usize;
    assert!((r.total() - hits as f32 / denom as f32).abs() < 1e-6);
    // A product of another category scores 0.
    let other = cat
        .products
        .iter()
        .find(|p| p.category != target.category)
        .unwrap();
    assert_eq!(g.best_reward(other), 0.0);
    // Same category, another type: at most 0.5.
    if let Some(p) = cat
        .products
        .iter()
        .find(|p| p.category == target.category && p.noun != target.noun)
    {
        assert!(g.best_reward(p) <= 0.5);
    }
    // Too expensive: loses the price point.
    let mut pricey = target.clone();
    pricey.price_cents = g.price_max_cents + 1;
    let r = g.score(&pricey, &g.best_choice(&pricey));
    assert!(!r.price_ok && r.total() < 1.0);
}

#[test]
fn oracle_buys_a_perfect_match_on_most_tasks() {
    for split in [Split::Test, Split::Train] {
        let mut total = 0.0;
        let mut perfect = 0;
        for task in 0..100 {
            let mut e = env(split, task * 37);
            let (reward, steps) = play_oracle(&mut e);
            assert!(steps <= 12, "task {task} took {steps} steps");
            total += reward;
            perfect += (reward == 1.0) as usize;
        }
        assert!(perfect >= 95, "{split:?}: only {perfect}/100 perfect");
        assert!(total / 100.0 > 0.97);
    }
}

#[test]
fn oracle_recovers_from_detours() {
    let mut e = env(Split::Test, 5);
    e.step("search[red shampoo]");
    let first = e
        .valid_actions()
        .into_iter()
        .find(|a| a.starts_with("click[B0"))
        .unwrap();
    e.step(&first);
    assert_eq!(e.page(), Page::Product);
    let (reward, _) = play_oracle(&mut e);
    assert!(reward > 0.99);
}

#[test]
fn random_policy_rarely_succeeds() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut perfect = 0;
    let episodes = 200;
    for task in 0..episodes {
        let mut e = env(Split::Train, task);
        perfect += (play_random(&mut e, &mut rng, 30) == Some(1.0)) as usize;
    }
    assert!(
        perfect * 10 < episodes as usize,
        "random got {perfect}/{episodes} perfect"
    );
}

#[test]
fn same_task_and_actions_replay_identically() {
    let run = || {
        let mut e = env(Split::Train, 42);
        let mut trace = vec![e.render()];
        while let Some(a) = e.oracle_action() {
            let s = e.step(&a);
            trace.push(format!("{a} -> {} {}", s.observation, s.reward));
        }
        trace
    };
    assert_eq!(run(), run());
}

#[test]
fn actions_accept_webshop_spellings_and_invalid_ones_get_messages() {
    let mut e = env(Split::Test, 0);
    let s = e.step("click[B0XXXXXXX]");
    assert!(s.observation.starts_with("Invalid action") && s.reward == 0.0 && !s.terminated);
    let s = e.step("dance");
    assert!(s.observation.contains("not an action"));
    let s = e.step("buy");
    assert!(s.observation.contains("only buy from a product page") && !s.terminated);
    let q = e.goal().unwrap().query.clone();
    let s = e.step(&format!("  Search[ {q} ] "));
    assert!(s.observation.contains("[Next >]"), "{}", s.observation);
    assert_eq!(e.page(), Page::Results);
    let s = e.step("search[again]");
    assert!(s.observation.contains("only available on the search page"));
    assert!(e
        .step("click[< Prev]")
        .observation
        .starts_with("Invalid action"));
    e.step("click[Next >]");
    assert!(e.valid_actions().contains(&"click[< prev]".to_string()));
    e.step("back");
    assert!(!e.valid_actions().contains(&"click[< prev]".to_string()));
    let item = e
        .valid_actions()
        .into_iter()
        .find(|a| a.starts_with("click[B0"))
        .unwrap();
    let s = e.step(&item.to_lowercase());
    assert_eq!(e.page(), Page::Product, "{}", s.observation);
    assert!(s.observation.contains("[Buy Now]") && s.observation.contains("Rating:"));
    assert!(e
        .step("click[not-an-option]")
        .observation
        .starts_with("Invalid action"));
    let s = e.step("click[Buy Now]");
    assert!(s.terminated && (0.0..=1.0).contains(&s.reward));
    assert!(s.observation.contains("Your score"));
    assert!(e.valid_actions().is_empty() && e.oracle_action().is_none());
    let s = e.step("buy");
    assert!(s.terminated && s.reward == 0.0);
}

#[test]
fn make_reads_split_and_rejects_bad_kwargs() {
    let mut kw = Kwargs::new();
    kw.insert("split".into(), "test".into());
    assert_eq!(make(&kw).unwrap().num_tasks(), 500);
    assert_eq!(make(&Kwargs::new()).unwrap().num_tasks(), 11_500);
    kw.insert("split".into(), "nope".into());
    assert!(make(&kw).is_err());
    let mut kw = Kwargs::new();
    kw.insert("colour".into(), "red".into());
    assert!(make(&kw).is_err());
    let mut e = WebShopEnv::new(Split::Test);
    assert!(e.reset(&Task::Spec("seven".into()), 0).is_err());
    assert!(e.reset(&Task::Spec("7".into()), 0).is_ok());
}
