use super::*;
use crate::envs::test_util::assert_dialogue;
use crate::error::CoreError;

fn env() -> TextCraft {
    TextCraft::new(10, false)
}

fn idx(book: &Book, id: &str) -> u64 {
    let g = book.lookup(id).unwrap();
    book.goals.iter().position(|&x| x == g).unwrap() as u64
}

#[test]
fn book_matches_agentgym_counts() {
    let b = Book::shared();
    assert_eq!(b.goals.len(), 544);
    assert_eq!(b.recipes.len(), 613);
    let depths: Vec<u64> = b.goals.iter().map(|&g| b.name(g).depth).collect();
    assert!(depths.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!((depths[0], *depths.last().unwrap()), (1, 4));
    let planks = b.lookup("minecraft:planks").unwrap();
    assert!(b.name(planks).is_tag && !b.name(planks).gettable());
    let logs = b.lookup("minecraft:oak_logs").unwrap();
    assert!(
        b.name(logs).gettable(),
        "uncraftable tag becomes a base item"
    );
}

#[test]
fn reset_is_deterministic_and_seed_dependent() {
    let (mut a, mut b) = (env(), env());
    for task in [0u64, 17, 300, 543, 544 + 17] {
        let oa = a.reset(&Task::Index(task), 5).unwrap();
        assert_eq!(oa, b.reset(&Task::Index(task), 5).unwrap());
        assert!(oa.starts_with("Crafting commands:\n") && oa.ends_with('.'));
    }
    let x = a.reset(&Task::Index(400), 1).unwrap();
    let y = a.reset(&Task::Index(400), 2).unwrap();
    assert_ne!(x, y);
    assert_eq!(
        a.reset(&Task::Index(17), 9).unwrap(),
        a.reset(&Task::Index(561), 9).unwrap()
    );
}

#[test]
fn goal_choice_by_index_and_commands_contain_needed_recipes() {
    let mut e = env();
    let book = Book::shared();
    let obs = e
        .reset(&Task::Index(idx(&book, "minecraft:stick")), 0)
        .unwrap();
    assert_eq!(e.goal(), "minecraft:stick");
    assert!(obs.ends_with("\n\nGoal: craft stick."));
    assert!(
        obs.contains("craft 4 stick using 2 planks\n")
            || obs.contains("\ncraft 4 stick using 2 planks\n")
    );
    assert!(obs.contains("craft 4 oak planks using 1 oak logs"));
    let lines = obs.lines().filter(|l| l.starts_with("craft ")).count();
    let needed = book
        .plan(book.lookup("minecraft:stick").unwrap())
        .needed
        .len();
    assert!(lines <= needed + 10 && lines > needed);
    let mut zero = TextCraft::new(0, false);
    zero.reset(&Task::Index(idx(&book, "minecraft:stick")), 0)
        .unwrap();
    assert_eq!(zero.listed.len(), needed);
}

#[test]
fn get_craft_inventory_semantics_and_messages() {
    let mut e = env();
    let book = Book::shared();
    e.reset(&Task::Index(idx(&book, "minecraft:wooden_pickaxe")), 3)
        .unwrap();
    assert_dialogue(
        &mut e,
        &[
            ("inventory", "Inventory: You are not carrying anything."),
            ("get 2 oak logs", "Got 2 oak logs"),
            ("get 1 oak planks", "Could not find oak planks"),
            ("get 1 planks", "Could not find planks"),
            ("get 1 unobtainium", "Could not find unobtainium"),
            (
                "craft 4 oak planks using 1 oak logs",
                "Crafted 4 minecraft:oak_planks",
            ),
            ("inventory", "Inventory: [oak logs] (1) [oak planks] (4) "),
            (
                "craft 4 stick using 2 planks",
                "Could not find enough items to craft minecraft:stick",
            ),
            (
                "craft 8 stick using 4 oak planks",
                "Could not find a valid recipe for ItemTagWithCount(item_tag=ItemTag(tag=None, \
                 item_id='minecraft:stick'), count=8)",
            ),
            (
                "craft 4 stick using 2 oak planks",
                "Crafted 4 minecraft:stick",
            ),
            (
                "craft 1 planks using 1 oak logs",
                "Could not find a valid recipe for ItemTagWithCount(item_tag=ItemTag(\
                 tag='minecraft:planks', item_id=None), count=1)",
            ),
            ("craft 1 x using y", "Wrong item format: y"),
            ("dance", "Could not execute dance"),
            ("get oak logs", "Could not execute get oak logs"),
            (
                "inventory please\nmore",
                "Inventory: [oak logs] (1) [oak planks] (2) [stick] (4) ",
            ),
        ],
    );
    let s = |e: &mut TextCraft, a: &str| e.step(a);
    s(&mut e, "craft 4 oak planks using 1 oak logs");
    let last = s(&mut e, "craft 1 wooden pickaxe using 3 oak planks, 2 stick");
    assert_eq!(
        last,
        Step::new("Crafted 1 minecraft:wooden_pickaxe", 1.0, true)
    );
    assert_eq!(
        s(&mut e, "inventory").observation,
        "Inventory: [oak planks] (3) [stick] (2) [wooden pickaxe] (1) "
    );
}

#[test]
fn oracle_solves_every_task() {
    let mut e = env();
    let n = e.num_tasks();
    for task in 0..n {
        e.reset(&Task::Index(task), task).unwrap();
        let mut solved = false;
        for _ in 0..200 {
            let a = e
                .oracle_action()
                .unwrap_or_else(|| panic!("no plan for {}", e.goal()));
            let st = e.step(&a);
            assert!(
                !st.observation.starts_with("Could"),
                "{}: {a} -> {}",
                e.goal(),
                st.observation
            );
            if st.terminated {
                assert_eq!(st.reward, 1.0);
                solved = true;
                break;
            }
        }
        assert!(solved, "oracle did not craft {}", e.goal());
    }
}

#[test]
fn valid_actions_offer_gets_and_crafts() {
    let mut e = env();
    e.reset(&Task::Index(200), 1).unwrap();
    let va = e.valid_actions();
    assert_eq!(va[0], "inventory");
    assert!(va.iter().any(|a| a.starts_with("get ")));
    assert!(va.iter().any(|a| a.starts_with("craft ")));
    let book = Book::shared();
    for a in va.iter().filter(|a| a.starts_with("craft ")) {
        let inputs = &a[a.rfind(" using ").unwrap() + 7..];
        for part in inputs.split(", ") {
            let (_, name) = spec::split_count(part).unwrap();
            let n = book.lookup_text(name).unwrap_or_else(|| panic!("{a}"));
            assert!(!book.name(n).is_tag, "generic ingredient left in {a}");
        }
    }
    for a in va.iter().filter(|a| a.starts_with("get ")) {
        assert!(e.step(a).observation.starts_with("Got "), "{a}");
    }
}

#[test]
fn explicit_specs() {
    let mut e = env();
    let obs = e.reset(&Task::Index(42), 7).unwrap();
    let goal = e.goal().to_string();
    assert_eq!(e.reset(&Task::Spec(obs.clone()), 0).unwrap(), obs);
    assert_eq!(e.goal(), goal);
    let json = r#"{"goal": "stick", "commands": ["craft 4 stick using 2 planks", "craft 4 oak planks using 1 oak logs"]}"#;
    let o = e.reset(&Task::Spec(json.into()), 0).unwrap();
    assert_eq!(o, "Crafting commands:\ncraft 4 stick using 2 planks\ncraft 4 oak planks using 1 oak logs\n\nGoal: craft stick.");
    assert_eq!(e.listed.len(), 2);
    let generated = e
        .reset(&Task::Spec(r#"{"goal": "minecraft:stick"}"#.into()), 3)
        .unwrap();
    let book = Book::shared();
    assert_eq!(
        generated,
        e.reset(&Task::Index(idx(&book, "minecraft:stick")), 3)
            .unwrap()
    );
    e.reset(&Task::Spec(r#"{"goal": "oak logs"}"#.into()), 0)
        .unwrap();
    assert_eq!(
        e.step("get 1 oak logs"),
        Step::new("Got 1 oak logs", 1.0, true)
    );
    for bad in [
        "",
        "craft me a stick",
        "{",
        "[1]",
        r#"{"goal": 3}"#,
        r#"{"goal": "unobtainium"}"#,
        r#"{"goal": "planks"}"#,
        r#"{"goal": "stick", "extra": 1}"#,
        r#"{"goal": "stick", "commands": [1]}"#,
        "Crafting commands:\nfoo\n\nGoal: craft .",
        "Crafting commands:\nfoo\n\nGoal: craft nothing known.",
    ] {
        match e.reset(&Task::Spec(bad.into()), 0) {
            Err(CoreError::InvalidTask { env, message }) => {
                assert_eq!(env, "textcraft");
                assert!(!message.is_empty());
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
}

#[test]
fn rng_and_python_string_rules() {
    let mut r = SplitMix64::new(0);
    assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
    assert_eq!(spec::fnv1a64(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(spec::split_count("12 oak"), Some((12, "oak")));
    assert_eq!(
        spec::split_count("99999999999999999999999 a"),
        Some((u64::MAX, "a"))
    );
    assert_eq!(spec::split_count("12oak"), None);
    assert_eq!(spec::py_repr("it's"), "\"it's\"");
    assert_eq!(spec::py_repr("a\nb'\""), "'a\\nb\\'\"'");
    assert_eq!(spec::py_strip("\u{1c} x \t"), "x");
}

#[test]
fn sanitized_actions_follow_agentgym_client() {
    let mut buf = String::new();
    assert_eq!(spec::sanitize("get 1 oak logs", &mut buf), "get 1 oak logs");
    assert_eq!(
        spec::sanitize("  get 1  oak_logs.\n", &mut buf),
        "get 1 oaklogs"
    );
    assert_eq!(spec::sanitize("LOOK", &mut buf), "inventory");
    assert_eq!(
        spec::sanitize("craft 4 stick using 2 oak planks!", &mut buf),
        "craft 4 stick using 2 oak planks"
    );
    let mut e = TextCraft::new(10, true);
    e.reset(&Task::Index(0), 0).unwrap();
    assert_dialogue(
        &mut e,
        &[
            ("look", "Inventory: You are not carrying anything."),
            (" get 1 acacia logs.", "Got 1 acacia logs"),
            ("dance!", "Could not execute dance"),
        ],
    );
}

#[test]
fn make_reads_kwargs() {
    let mut kw = Kwargs::new();
    kw.insert("max_distractors".into(), 0.into());
    assert!(make(&kw).is_ok());
    kw.insert("colour".into(), 1.into());
    assert!(make(&kw).is_err());
}

/// Cost probe: `SPEED_OP=reset|<action> perf stat -e cycles:u cargo test --release -p
/// agentgym-core textcraft::tests::speed -- --ignored` (200k repetitions of one operation).
#[test]
#[ignore]
fn speed() {
    let op = std::env::var("SPEED_OP").unwrap_or_else(|_| "inventory".into());
    let mut e = env();
    let n = 200_000u64;
    e.reset(
        &Task::Index(idx(&Book::shared(), "minecraft:wooden_pickaxe")),
        0,
    )
    .unwrap();
    e.step("get 100000000 oak logs");
    e.step("craft 4 oak planks using 1 oak logs");
    if op == "mixed" {
        let mut envs: Vec<TextCraft> = (0..4096).map(|_| env()).collect();
        let mut acts = Vec::new();
        for (i, e) in envs.iter_mut().enumerate() {
            e.reset(&Task::Index(i as u64), i as u64).unwrap();
            acts.push(e.valid_actions());
        }
        for t in 0..(n as usize / 4096) * 10 {
            for (e, a) in envs.iter_mut().zip(&acts) {
                std::hint::black_box(e.step(&a[t % a.len()]));
            }
        }
        return;
    }
    for i in 0..n {
        if op == "reset" {
            std::hint::black_box(e.reset(&Task::Index(i % 544), i).unwrap());
        } else if op != "none" {
            std::hint::black_box(e.step(&op));
        }
    }
}

/// The client cleanup as plainly specified (filter, collapse spaces, trim, `look`).
fn sanitize_reference(action: &str) -> String {
    let kept: String = action
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == ',' || *c == ' ')
        .collect();
    let out = kept
        .split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if out.eq_ignore_ascii_case("look") {
        "inventory".into()
    } else {
        out
    }
}

proptest::proptest! {
    #[test]
    fn sanitize_matches_its_reference(action in "[ a-zA-Z0-9,._\n]{0,24}|\\PC{0,12}") {
        let mut buf = String::new();
        proptest::prop_assert_eq!(spec::sanitize(&action, &mut buf), sanitize_reference(&action));
    }
}

#[test]
fn step_into_writes_what_step_returns() {
    let mut a = TextCraft::new(10, true);
    let mut b = TextCraft::new(10, true);
    let mut obs = String::from("keep ");
    a.reset(&Task::Index(3), 9).unwrap();
    b.reset_into(&Task::Index(3), 9, &mut obs).unwrap();
    assert_eq!(
        obs,
        format!("keep {}", a.reset(&Task::Index(3), 9).unwrap())
    );
    for action in a.valid_actions().iter().chain(
        ["look", "craft 1 x using 2 y", "get"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter(),
    ) {
        let step = a.step(action);
        obs.clear();
        let (reward, terminated) = b.step_into(action, &mut obs);
        assert_eq!(
            (obs.as_str(), reward, terminated),
            (step.observation.as_str(), step.reward, step.terminated)
        );
    }
}

#[test]
fn byte_scans_match_the_std_searches() {
    for text in [
        "",
        ",",
        "a,,b",
        "a,",
        "2 oak planks, 1 stick",
        "x using y using z",
        " using ",
    ] {
        assert_eq!(
            split_commas(text).collect::<Vec<_>>(),
            text.split(',').collect::<Vec<_>>()
        );
        assert_eq!(rfind_using(text), text.rfind(" using "));
    }
    assert_eq!(rfind_using("using"), None);
}

/// Every recipe's command line, crafted through the precomputed parse (`step_into`), gives
/// what the plain parse (`craft` on the split text) gives, with and without the parts held.
#[test]
fn listed_commands_craft_as_parsed() {
    let book = Book::shared();
    let mut seen = 0;
    for (k, r) in book.recipes.iter().enumerate() {
        let line = &*r.text;
        assert!(book.command(line).is_some(), "{line}");
        let rest = line.strip_prefix("craft ").unwrap();
        let p = rfind_using(rest).unwrap();
        for stock in [0u64, 1, 64] {
            let mut fast = TextCraft::new(10, k % 2 == 0);
            fast.reset(&Task::Index(k as u64), 0).unwrap();
            if stock > 0 {
                for i in &r.inputs {
                    let mut name = i.name;
                    if i.is_tag {
                        match book.name(i.name).members.first() {
                            Some(&m) => name = m,
                            None => continue,
                        }
                    }
                    fast.inventory.push((name, stock));
                }
            }
            let mut slow = TextCraft::new(10, true);
            slow.reset(&Task::Index(k as u64), 0).unwrap();
            slow.inventory.clone_from(&fast.inventory);
            let (mut a, mut b) = (String::new(), String::new());
            let ra = fast.step_into(line, &mut a);
            let rb = slow.craft(&rest[..p], &rest[p + 7..], &mut b);
            assert_eq!((a.as_str(), ra), (b.as_str(), rb), "{line}");
            assert_eq!(fast.inventory, slow.inventory, "{line}");
            seen += usize::from(a.starts_with("Crafted"));
        }
    }
    assert!(seen > book.recipes.len() / 2, "{seen}");
    assert!(book.command("craft 4 stick using 2 planks ").is_none());
    assert!(book.command("craft 1 nothing using 1 air").is_none());
}

proptest::proptest! {
    #[test]
    fn py_strip_matches_the_char_rule(s in "[ \t\n\u{1c}\u{1f}\u{85}\u{a0}\u{3000}ab,é]{0,12}") {
        proptest::prop_assert_eq!(
            spec::py_strip(&s),
            s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
        );
    }
}
