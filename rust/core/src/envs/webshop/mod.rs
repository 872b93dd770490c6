//! `webshop`: a simulated shopping website in the style of WebShop (Yao et al., 2022).
//!
//! The agent reads a shopping instruction, searches a synthetic catalogue of
//! [`catalogue::NUM_PRODUCTS`] products (BM25 over titles, descriptions, attributes and
//! options), browses paged results, opens products, picks options and buys. Buying ends the
//! episode with a WebShop-style reward in [0, 1] (see [`goal::Reward`]). The catalogue and
//! its index are built once per process and shared by every env.
//!
//! Actions: `search[query]` (search page), `click[item id | option value | next > | < prev |
//! back to search | buy now]`, `back` (previous page) and `buy` (same as `click[buy now]`).
//! Kwargs: `split` = `train` (11,500 goals, default) | `test` (500 goals) | `all`.

pub mod catalogue;
pub mod categories;
pub mod goal;
mod pages;

use crate::env::{snapshot_of, vec_bytes, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use catalogue::{catalogue, Catalogue};
use goal::{Goal, Split};

/// Results the search engine returns per query (WebShop shows 50, ten per page).
pub const MAX_RESULTS: usize = 50;
pub const PER_PAGE: usize = 10;

/// Which page the browser shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Search,
    Results,
    Product,
    Done,
}

/// One WebShop episode.
#[derive(Clone)]
pub struct WebShopEnv {
    cat: &'static Catalogue,
    split: Split,
    goal: Option<Goal>,
    page: Page,
    query: String,
    results: Vec<u32>,
    results_page: usize,
    product: u32,
    chosen: Vec<Option<u8>>,
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let reader = KwargsReader::new("webshop", kwargs, &["split"])?;
    let split = Split::parse(&reader.str_or("split", "train")?)?;
    Ok(Box::new(WebShopEnv::new(split)))
}

/// A parsed action.
#[derive(Debug, PartialEq)]
enum Action {
    Search(String),
    Click(String),
    Back,
    Buy,
}

fn parse_action(action: &str) -> Option<Action> {
    let a = action.trim();
    let lower = a.to_lowercase();
    let lower = lower.trim_end_matches('.');
    match lower {
        "back" | "go back" => return Some(Action::Back),
        "buy" | "buy now" => return Some(Action::Buy),
        _ => {}
    }
    let bracket = |verb: &str| -> Option<String> {
        let rest = lower.strip_prefix(verb)?.trim_start();
        let inner = rest.strip_prefix('[')?.strip_suffix(']')?;
        Some(inner.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    if let Some(q) = bracket("search") {
        return Some(Action::Search(q));
    }
    bracket("click").map(Action::Click)
}

impl WebShopEnv {
    pub fn new(split: Split) -> Self {
        Self {
            cat: catalogue(),
            split,
            goal: None,
            page: Page::Search,
            query: String::new(),
            results: Vec::new(),
            results_page: 0,
            product: 0,
            chosen: Vec::new(),
            refused: false,
        }
    }

    pub fn goal(&self) -> Option<&Goal> {
        self.goal.as_ref()
    }

    pub fn page(&self) -> Page {
        self.page
    }

    fn num_result_pages(&self) -> usize {
        self.results.len().div_ceil(PER_PAGE)
    }

    fn page_items(&self) -> &[u32] {
        let lo = (self.results_page * PER_PAGE).min(self.results.len());
        let hi = (lo + PER_PAGE).min(self.results.len());
        &self.results[lo..hi]
    }

    fn render(&self) -> String {
        let goal = self.goal.as_ref().map(|g| g.text.as_str()).unwrap_or("");
        match self.page {
            Page::Search => pages::search_page(goal),
            Page::Results => pages::results_page(
                goal,
                self.cat,
                &self.query,
                self.page_items(),
                self.results_page,
                self.results.len(),
            ),
            Page::Product => pages::product_page(
                goal,
                &self.cat.products[self.product as usize],
                &self.chosen,
            ),
            Page::Done => "The purchase is complete; the episode is over.".into(),
        }
    }

    fn invalid(&self, why: &str) -> Step {
        Step::new(
            format!("Invalid action: {why}\n\n{}", self.render()),
            0.0,
            false,
        )
    }

    fn open_product(&mut self, p: u32) -> Step {
        self.page = Page::Product;
        self.product = p;
        self.chosen = vec![None; self.cat.products[p as usize].options.len()];
        Step::new(self.render(), 0.0, false)
    }

    fn buy(&mut self) -> Step {
        if self.page != Page::Product {
            return self.invalid("you can only buy from a product page; open a product first.");
        }
        let goal = self.goal.as_ref().expect("reset before step");
        let p = &self.cat.products[self.product as usize];
        let reward = goal.score(p, &self.chosen);
        let total = reward.total();
        self.page = Page::Done;
        Step::new(pages::done_page(p, &self.chosen, &reward), total, true)
    }

    fn back(&mut self) -> Step {
        match self.page {
            Page::Product => self.page = Page::Results,
            Page::Results if self.results_page > 0 => self.results_page -= 1,
            Page::Results => self.page = Page::Search,
            _ => return self.invalid("there is no previous page."),
        }
        Step::new(self.render(), 0.0, false)
    }

    fn click(&mut self, target: &str) -> Step {
        let target = target.trim_matches(|c| c == '[' || c == ']' || c == ' ');
        match target {
            "back to search" | "search" => {
                self.page = Page::Search;
                return Step::new(self.render(), 0.0, false);
            }
            "< prev" | "<prev" | "prev" | "< previous" | "previous" => {
                if self.page == Page::Results && self.results_page == 0 {
                    return self.invalid("this is the first page of results.");
                }
                return self.back();
            }
            "buy now" | "buy" => return self.buy(),
            _ => {}
        }
        match self.page {
            Page::Results => {
                if matches!(target, "next >" | "next>" | "next") {
                    if self.results_page + 1 >= self.num_result_pages() {
                        return self.invalid("this is the last page of results.");
                    }
                    self.results_page += 1;
                    return Step::new(self.render(), 0.0, false);
                }
                match self.cat.find(target) {
                    Some(p) if self.page_items().contains(&p) => self.open_product(p),
                    Some(_) => self.invalid(&format!("item {target} is not on this page.")),
                    None => {
                        self.invalid(&format!("there is no clickable {target:?} on this page."))
                    }
                }
            }
            Page::Product => {
                let p = &self.cat.products[self.product as usize];
                let def = p.category_def();
                for (dim, values) in p.options.iter().enumerate() {
                    for &v in values {
                        if def.options[dim].1[v as usize] == target {
                            self.chosen[dim] = Some(v);
                            return Step::new(self.render(), 0.0, false);
                        }
                    }
                }
                self.invalid(&format!("there is no clickable {target:?} on this page."))
            }
            _ => self.invalid(&format!("there is no clickable {target:?} on this page.")),
        }
    }

    fn search(&mut self, query: &str) -> Step {
        if self.page != Page::Search {
            return self.invalid(
                "search is only available on the search page; use click[back to search].",
            );
        }
        if query.trim().is_empty() {
            return self.invalid("the search query is empty.");
        }
        self.query = query.to_string();
        self.results = self.cat.search(query, MAX_RESULTS);
        self.results_page = 0;
        self.page = Page::Results;
        Step::new(self.render(), 0.0, false)
    }

    /// The position in the current results of the best product for the goal, and its reward.
    fn best_result(&self, goal: &Goal) -> Option<(usize, f32)> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &p) in self.results.iter().enumerate() {
            let r = goal.best_reward(&self.cat.products[p as usize]);
            if best.is_none_or(|(_, b)| r > b + 1e-6) {
                best = Some((i, r));
            }
        }
        best
    }
}

impl Env for WebShopEnv {
    fn reset(&mut self, task: &Task, _seed: u64) -> Result<String> {
        let index = match task {
            Task::Index(i) => *i,
            Task::Spec(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|_| CoreError::InvalidTask {
                    env: "webshop".into(),
                    message: format!("webshop tasks are goal indices, got {s:?}"),
                })?,
        };
        self.goal = Some(Goal::for_task(self.cat, self.split, index));
        self.page = Page::Search;
        self.query.clear();
        self.results.clear();
        self.results_page = 0;
        self.chosen.clear();
        Ok(self.render())
    }

    fn step(&mut self, action: &str) -> Step {
        self.refused = false;
        if self.goal.is_none() {
            return Step::new(
                "Invalid action: the episode has not been reset.",
                0.0,
                false,
            );
        }
        if self.page == Page::Done {
            return Step::new("The purchase is complete; the episode is over.", 0.0, true);
        }
        match parse_action(action) {
            Some(Action::Search(q)) => self.search(&q),
            Some(Action::Click(t)) => self.click(&t),
            Some(Action::Back) => self.back(),
            Some(Action::Buy) => self.buy(),
            None => {
                self.refused = true;
                self.invalid(&format!(
                    "{action:?} is not an action; use search[query], click[target], back or buy."
                ))
            }
        }
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        let Some(goal) = &self.goal else {
            return Vec::new();
        };
        match self.page {
            Page::Search => vec![format!("search[{}]", goal.query)],
            Page::Results => {
                let mut out = vec!["click[back to search]".to_string()];
                if self.results_page > 0 {
                    out.push("click[< prev]".into());
                }
                if self.results_page + 1 < self.num_result_pages() {
                    out.push("click[next >]".into());
                }
                for &p in self.page_items() {
                    out.push(format!("click[{}]", self.cat.products[p as usize].id));
                }
                out
            }
            Page::Product => {
                let p = &self.cat.products[self.product as usize];
                let def = p.category_def();
                let mut out = vec!["click[back to search]".to_string(), "click[< prev]".into()];
                for (dim, values) in p.options.iter().enumerate() {
                    for &v in values {
                        out.push(format!("click[{}]", def.options[dim].1[v as usize]));
                    }
                }
                out.push("click[buy now]".into());
                out
            }
            Page::Done => Vec::new(),
        }
    }

    /// Search the goal words, walk to the best-matching result, pick the goal's options and
    /// buy. From any other state it first returns to where that plan can continue.
    fn oracle_action(&self) -> Option<String> {
        let goal = self.goal.as_ref()?;
        match self.page {
            Page::Search => Some(format!("search[{}]", goal.query)),
            Page::Results => {
                let best = self.best_result(goal);
                let Some((pos, reward)) = best else {
                    return Some("click[back to search]".into());
                };
                if reward < 1.0 - 1e-6 && self.query != goal.query {
                    return Some("click[back to search]".into());
                }
                let want_page = pos / PER_PAGE;
                Some(match want_page.cmp(&self.results_page) {
                    std::cmp::Ordering::Greater => "click[next >]".into(),
                    std::cmp::Ordering::Less => "click[< prev]".into(),
                    std::cmp::Ordering::Equal => {
                        format!(
                            "click[{}]",
                            self.cat.products[self.results[pos] as usize].id
                        )
                    }
                })
            }
            Page::Product => {
                let p = &self.cat.products[self.product as usize];
                let here = goal.best_reward(p);
                let elsewhere = self.best_result(goal).map_or(0.0, |(_, r)| r);
                if here + 1e-6 < elsewhere || (here < 1.0 - 1e-6 && self.query != goal.query) {
                    return Some("click[< prev]".into());
                }
                let want = goal.best_choice(p);
                for (dim, w) in want.iter().enumerate() {
                    if let Some(v) = *w {
                        if self.chosen[dim] != Some(v) {
                            return Some(format!("click[{}]", p.option_text(dim, v)));
                        }
                    }
                }
                Some("click[buy now]".into())
            }
            Page::Done => None,
        }
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    fn heap_bytes(&self) -> usize {
        let goal = self.goal.as_ref().map_or(0, |g| {
            vec_bytes(&g.attributes)
                + vec_bytes(&g.options)
                + g.text.capacity()
                + g.query.capacity()
        });
        goal + self.query.capacity() + vec_bytes(&self.results) + vec_bytes(&self.chosen)
    }

    fn num_tasks(&self) -> u64 {
        self.split.num_tasks(self.cat.products.len() as u32)
    }

    fn instructions(&self) -> String {
        pages::INSTRUCTIONS.to_string() + &crate::env::action_line("search[red running shoes]")
    }
}

#[cfg(test)]
mod tests;
