//! Tests of the deep-search env: corpus, questions, scoring, oracle and random play.

use super::corpus::{Corpus, Entity};
use super::questions::{answer_score, normalize, QuestionBank, Rel, Value, TEST_PER_HOP};
use super::*;
use crate::envs::test_util::{self, play_random};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

fn env(split: Split, hops: Option<u8>, task: u64) -> SearchEnv {
    let mut e = SearchEnv::new(split, hops);
    e.reset(&Task::Index(task), 0).unwrap();
    e
}

fn play_oracle(e: &mut SearchEnv) -> (f32, usize) {
    test_util::play_oracle(e, 20)
}

#[test]
fn corpus_is_deterministic_with_unique_titles_and_consistent_facts() {
    let c = corpus();
    let again = Corpus::generate(0x5345_4152_4348_2101);
    assert_eq!(c.docs.len(), again.docs.len());
    assert!(c
        .docs
        .iter()
        .zip(&again.docs)
        .all(|(a, b)| a.text == b.text));
    assert!(c.docs.len() > 3000);
    let titles: HashSet<String> = c.docs.iter().map(|d| d.title.to_lowercase()).collect();
    assert_eq!(titles.len(), c.docs.len());
    for e in c.entities() {
        let d = c.doc_of(e);
        assert_eq!(c.docs[d as usize].title, c.name(e));
        assert_eq!(c.find_doc(&c.name(e).to_uppercase()), Some(d));
        assert_eq!(c.find_doc(&Corpus::doc_id(d)), Some(d));
        // Every fact a relation reads is written in the subject's document.
        for r in Rel::ALL {
            let text = &c.docs[d as usize].text;
            match r.apply(c, e) {
                Some(Value::Entity(x)) => assert!(text.contains(c.name(x)), "{text} / {r:?}"),
                Some(Value::Year(y)) => assert!(text.contains(&y.to_string())),
                None => {}
            }
        }
    }
    for (i, country) in c.countries.iter().enumerate() {
        assert_eq!(c.cities[country.capital as usize].country, i as u32);
    }
    assert_eq!(c.find_doc("no such title"), None);
    assert_eq!(c.find_doc("D99999"), None);
}

#[test]
fn question_bank_has_all_hop_levels_and_disjoint_splits() {
    let c = corpus();
    let b = bank();
    for h in 1..=3u8 {
        let level = &b.by_hops[h as usize - 1];
        assert!(
            level.len() > TEST_PER_HOP + 5000,
            "{h} hops: {}",
            level.len()
        );
        assert!(level.iter().all(|ch| ch.hops == h));
        let test: HashSet<_> = Split::Test.chains(b, h).iter().copied().map(key).collect();
        let train: HashSet<_> = Split::Train.chains(b, h).iter().copied().map(key).collect();
        assert!(test.is_disjoint(&train));
        assert_eq!(test.len(), TEST_PER_HOP);
        let q = level[0].question(c);
        assert_eq!(q.path.len(), h as usize);
        assert!(q.text.ends_with('?'));
    }
    let again = QuestionBank::generate(c);
    assert_eq!(again.by_hops[2][..50], b.by_hops[2][..50]);
}

fn key(ch: questions::Chain) -> (Entity, Vec<Rel>) {
    (ch.start, ch.rels[..ch.hops as usize].to_vec())
}

#[test]
fn hand_built_question_reads_as_expected() {
    let c = corpus();
    let chain = questions::Chain {
        start: Entity::Company(3),
        rels: [Rel::FoundedBy, Rel::BornIn, Rel::BornIn],
        hops: 2,
    };
    let q = chain.question(c);
    let company = &c.companies[3];
    let founder = &c.people[company.founder as usize];
    assert_eq!(
        q.text,
        format!("In which city was the founder of {} born?", company.name)
    );
    assert_eq!(q.answer, c.cities[founder.born_in as usize].name);
    assert_eq!(
        q.path,
        vec![Entity::Company(3), Entity::Person(company.founder)]
    );
}

#[test]
fn answers_score_exact_match_then_f1() {
    assert_eq!(normalize("  The Zentrix-Labs! "), "zentrix labs");
    assert_eq!(answer_score("the zentrix labs.", "Zentrix Labs"), 1.0);
    assert_eq!(
        answer_score("Zentrix", "Zentrix Labs"),
        2.0 * 1.0 * 0.5 / 1.5
    );
    assert_eq!(answer_score("Lorvik", "Zentrix Labs"), 0.0);
    assert_eq!(answer_score("", "1987"), 0.0);
    let mut e = env(Split::Test, Some(1), 0);
    let gold = e.question().unwrap().answer.clone();
    let s = e.step(&format!("answer[ {} ]", gold.to_uppercase()));
    assert!(s.terminated && s.reward == 1.0, "{}", s.observation);
    let mut e = env(Split::Test, Some(1), 0);
    let s = e.step("finish[something else]");
    assert!(s.terminated && s.reward < 1.0);
}

#[test]
fn search_ranks_an_entity_document_first_for_its_name() {
    let c = corpus();
    let mut found = 0;
    for e in c.entities().into_iter().step_by(37) {
        let hits = c.index.search(c.name(e), TOP_K);
        found += (hits.first().map(|h| h.0 as u32) == Some(c.doc_of(e))) as usize;
    }
    let n = c.entities().len().div_ceil(37);
    assert!(found * 100 >= n * 95, "{found}/{n}");
}

#[test]
fn oracle_answers_correctly_at_every_hop_level() {
    for hops in [Some(1), Some(2), Some(3), None] {
        for split in [Split::Test, Split::Train] {
            let mut right = 0;
            for task in 0..100 {
                let mut e = env(split, hops, task * 13);
                let (reward, steps) = play_oracle(&mut e);
                let h = e.question().unwrap().path.len();
                assert!(steps <= 3 * h + 1, "{steps} steps for {h} hops");
                right += (reward == 1.0) as usize;
            }
            assert_eq!(right, 100, "{hops:?} {split:?}");
        }
    }
}

#[test]
fn random_policy_rarely_succeeds() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut right = 0;
    let episodes = 300;
    for task in 0..episodes {
        let mut e = env(Split::Train, None, task);
        right += (play_random(&mut e, &mut rng, 20) == Some(1.0)) as usize;
    }
    assert!(
        right * 10 < episodes as usize,
        "random got {right}/{episodes}"
    );
}

#[test]
fn same_task_replays_identically() {
    let run = || {
        let mut e = env(Split::Train, None, 77);
        let mut trace = Vec::new();
        while let Some(a) = e.oracle_action() {
            trace.push(e.step(&a).observation);
        }
        trace
    };
    assert_eq!(run(), run());
}

#[test]
fn invalid_actions_give_messages_and_specs_work() {
    let mut e = env(Split::Test, Some(2), 4);
    for bad in [
        "hello",
        "search[]",
        "open[Nowhere At All]",
        "jump[x]",
        "search[x",
    ] {
        let s = e.step(bad);
        assert!(
            s.observation.starts_with("Invalid action"),
            "{bad}: {}",
            s.observation
        );
        assert!(!s.terminated && s.reward == 0.0);
    }
    let s = e.step("search[qqqq zzzz]");
    assert!(s.observation.starts_with("No documents match"));
    let s = e.step("OPEN[D0000]");
    assert!(s.observation.starts_with("[D0000]"));
    let mut e = SearchEnv::new(Split::Train, None);
    let spec = r#"{"question": "Who founded X?", "answer": "Mara Quell"}"#;
    let obs = e.reset(&Task::Spec(spec.into()), 0).unwrap();
    assert!(obs.contains("Who founded X?"));
    assert_eq!(e.oracle_action().unwrap(), "answer[Mara Quell]");
    assert!(e.reset(&Task::Spec("{}".into()), 0).is_err());
    assert!(e.reset(&Task::Spec("not json".into()), 0).is_err());
}

#[test]
fn make_reads_hops_difficulty_and_split() {
    let kw = |pairs: &[(&str, serde_json::Value)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<Kwargs>()
    };
    let test1 = make(&kw(&[("split", "test".into()), ("hops", 1.into())])).unwrap();
    assert_eq!(test1.num_tasks(), TEST_PER_HOP as u64);
    let mixed = make(&kw(&[("split", "test".into())])).unwrap();
    assert_eq!(mixed.num_tasks(), 3 * TEST_PER_HOP as u64);
    let hard = make(&kw(&[("difficulty", "hard".into())])).unwrap();
    let three = make(&kw(&[("hops", 3.into())])).unwrap();
    assert_eq!(hard.num_tasks(), three.num_tasks());
    assert!(make(&kw(&[("hops", 4.into())])).is_err());
    assert!(make(&kw(&[("difficulty", "insane".into())])).is_err());
    assert!(make(&kw(&[("hops", 1.into()), ("difficulty", "hard".into())])).is_err());
    assert!(make(&kw(&[("split", "dev".into())])).is_err());
}
