//! WebShop goals (shopping instructions), task splits and the purchase reward.

use super::catalogue::{is_trailing, Catalogue, Product};
use crate::error::{CoreError, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Goal slots (positions in the catalogue's goal order) reserved for the test split; the
/// train split uses the rest, so train and test goals target disjoint products.
pub const TEST_SLOTS: u32 = 250;
/// Each target product yields this many goals (different attribute/constraint subsets).
pub const VARIANTS: u32 = 2;

/// Which task range an env draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
    All,
}

impl Split {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Split::Train),
            "test" => Ok(Split::Test),
            "all" => Ok(Split::All),
            other => Err(CoreError::InvalidArgument(format!(
                "webshop: split must be 'train', 'test' or 'all', got {other:?}"
            ))),
        }
    }

    /// The goal-slot range of the split.
    pub fn slots(self, num_products: u32) -> (u32, u32) {
        match self {
            Split::Train => (TEST_SLOTS, num_products),
            Split::Test => (0, TEST_SLOTS),
            Split::All => (0, num_products),
        }
    }

    pub fn num_tasks(self, num_products: u32) -> u64 {
        let (lo, hi) = self.slots(num_products);
        (hi - lo) as u64 * VARIANTS as u64
    }
}

/// A shopping instruction: the wanted product type, attributes, options and constraints.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// The product the goal was made from (one product that satisfies it fully).
    pub target: u32,
    pub category: u8,
    pub noun: u8,
    pub attributes: Vec<u8>,
    /// (option dimension, wanted value)
    pub options: Vec<(u8, u8)>,
    pub price_max_cents: u32,
    pub rating_min_tenths: Option<u8>,
    /// The instruction shown to the agent.
    pub text: String,
    /// The goal's words as a search query (type, attributes, option values).
    pub query: String,
}

impl Goal {
    /// The goal of task `index` of `split` (index taken modulo the split's task count).
    pub fn for_task(cat: &Catalogue, split: Split, index: u64) -> Goal {
        let (lo, hi) = split.slots(cat.products.len() as u32);
        let n = (hi - lo) as u64;
        let index = index % (n * VARIANTS as u64);
        let slot = lo + (index % n) as u32;
        let variant = (index / n) as u32;
        Self::from_slot(cat, slot, variant)
    }

    fn from_slot(cat: &Catalogue, slot: u32, variant: u32) -> Goal {
        let target = cat.goal_order[slot as usize];
        let p = &cat.products[target as usize];
        let def = p.category_def();
        let mut rng = ChaCha8Rng::seed_from_u64(0x60A1 ^ ((slot as u64) << 8) ^ variant as u64);
        let n_attr = (1 + variant as usize + rng.random_range(0..2usize)).min(p.attributes.len());
        let mut attributes: Vec<u8> =
            rand::seq::index::sample(&mut rng, p.attributes.len(), n_attr)
                .into_iter()
                .map(|i| p.attributes[i])
                .collect();
        attributes.sort_unstable();
        let options: Vec<(u8, u8)> = p
            .options
            .iter()
            .enumerate()
            .map(|(dim, vals)| (dim as u8, vals[rng.random_range(0..vals.len())]))
            .collect();
        let slack = rng.random_range(1.1f64..1.6);
        let price_max_dollars = ((p.price_cents as f64 / 100.0 * slack) / 10.0).ceil() as u32 * 10;
        let rating_min_tenths = (p.rating_tenths >= 35 && (variant == 1 || rng.random_bool(0.5)))
            .then(|| (p.rating_tenths / 5 * 5).max(30));
        let attr_text = |a: &u8| def.attributes[*a as usize];
        let lead: Vec<&str> = attributes
            .iter()
            .map(attr_text)
            .filter(|a| !is_trailing(a))
            .collect();
        let trail: Vec<&str> = attributes
            .iter()
            .map(attr_text)
            .filter(|a| is_trailing(a))
            .collect();
        let noun = def.nouns[p.noun as usize];
        let mut item = format!("{} {noun} {}", lead.join(", "), trail.join(" and "));
        item = item.split_whitespace().collect::<Vec<_>>().join(" ");
        let opts: Vec<String> = options
            .iter()
            .map(|&(d, v)| {
                format!(
                    "{}: {}",
                    def.options[d as usize].0, def.options[d as usize].1[v as usize]
                )
            })
            .collect();
        let mut text = format!("i am looking for {item}, with {}", opts.join(" and "));
        text.push_str(&format!(
            ", and price lower than {price_max_dollars}.00 dollars"
        ));
        if let Some(r) = rating_min_tenths {
            text.push_str(&format!(
                ", and rating at least {}.{} stars",
                r / 10,
                r % 10
            ));
        }
        let mut query = item.replace(',', "");
        for &(d, v) in &options {
            query.push(' ');
            query.push_str(def.options[d as usize].1[v as usize]);
        }
        Goal {
            target,
            category: p.category,
            noun: p.noun,
            attributes,
            options,
            price_max_cents: price_max_dollars * 100,
            rating_min_tenths,
            text,
            query,
        }
    }

    /// The options a buyer should pick on `product` to serve this goal.
    pub fn best_choice(&self, product: &Product) -> Vec<Option<u8>> {
        let mut chosen = vec![None; product.options.len()];
        if product.category != self.category {
            return chosen;
        }
        for &(dim, value) in &self.options {
            if product.options[dim as usize].contains(&value) {
                chosen[dim as usize] = Some(value);
            }
        }
        chosen
    }

    /// The reward of buying `product` with the `chosen` options (see [`Reward`]).
    pub fn score(&self, product: &Product, chosen: &[Option<u8>]) -> Reward {
        let r_type = if product.category != self.category {
            0.0
        } else if product.noun != self.noun {
            0.5
        } else {
            1.0
        };
        let attr_hits = self
            .attributes
            .iter()
            .filter(|a| product.category == self.category && product.attributes.contains(a))
            .count();
        let option_hits = if product.category == self.category {
            self.options
                .iter()
                .filter(|&&(d, v)| chosen.get(d as usize).copied().flatten() == Some(v))
                .count()
        } else {
            0
        };
        let price_ok = product.price_cents <= self.price_max_cents;
        let rating_ok = self.rating_min_tenths.map(|r| product.rating_tenths >= r);
        Reward {
            r_type,
            attr_hits,
            attr_total: self.attributes.len(),
            option_hits,
            option_total: self.options.len(),
            price_ok,
            rating_ok,
        }
    }

    /// The best reward buying `product` can give (with the best options picked).
    pub fn best_reward(&self, product: &Product) -> f32 {
        self.score(product, &self.best_choice(product)).total()
    }
}

/// WebShop-style reward breakdown of one purchase.
#[derive(Debug, Clone, PartialEq)]
pub struct Reward {
    /// 1 for the right product type, 0.5 for the right category but another type, else 0.
    pub r_type: f32,
    pub attr_hits: usize,
    pub attr_total: usize,
    pub option_hits: usize,
    pub option_total: usize,
    pub price_ok: bool,
    /// `None` when the goal sets no rating constraint.
    pub rating_ok: Option<bool>,
}

impl Reward {
    /// `r_type * (attribute hits + option hits + price ok + rating ok) / (number of each)`.
    pub fn total(&self) -> f32 {
        let hits = self.attr_hits
            + self.option_hits
            + self.price_ok as usize
            + self.rating_ok.unwrap_or(false) as usize;
        let total = self.attr_total + self.option_total + 1 + self.rating_ok.is_some() as usize;
        self.r_type * hits as f32 / total as f32
    }
}
