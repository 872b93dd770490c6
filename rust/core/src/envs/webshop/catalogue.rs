//! The synthetic WebShop catalogue: product categories, deterministic product generation
//! and the BM25 index over product text. Built once per process (see [`catalogue`]).

use super::categories::TAGLINES;
pub use super::categories::{CategoryDef, CATEGORIES};
use crate::util::bm25::Bm25Index;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Number of products in the catalogue.
pub const NUM_PRODUCTS: usize = 6000;
const CATALOGUE_SEED: u64 = 0x5745_4253_484F_5021;

/// One product. Attribute and option values are indices into its category's lists.
#[derive(Debug, Clone)]
pub struct Product {
    pub id: String,
    pub category: u8,
    pub noun: u8,
    pub brand: String,
    pub material: u8,
    pub attributes: Vec<u8>,
    /// Per option dimension of the category: the available values.
    pub options: Vec<Vec<u8>>,
    pub price_cents: u32,
    pub rating_tenths: u8,
    pub reviews: u32,
    pub title: String,
    pub description: String,
}

impl Product {
    pub fn category_def(&self) -> &'static CategoryDef {
        &CATEGORIES[self.category as usize]
    }

    pub fn noun_text(&self) -> &'static str {
        self.category_def().nouns[self.noun as usize]
    }

    pub fn attribute_text(&self, a: u8) -> &'static str {
        self.category_def().attributes[a as usize]
    }

    pub fn option_text(&self, dim: usize, value: u8) -> &'static str {
        self.category_def().options[dim].1[value as usize]
    }

    /// "$34.99"
    pub fn price_text(&self) -> String {
        format!("${}.{:02}", self.price_cents / 100, self.price_cents % 100)
    }

    /// "4.3"
    pub fn rating_text(&self) -> String {
        format!("{}.{}", self.rating_tenths / 10, self.rating_tenths % 10)
    }
}

/// The whole catalogue with its search index and an id lookup.
pub struct Catalogue {
    pub products: Vec<Product>,
    pub index: Bm25Index,
    by_id: HashMap<String, u32>,
    /// A fixed permutation of product numbers; goal slots index into it.
    pub goal_order: Vec<u32>,
}

impl Catalogue {
    /// Generate the catalogue of `n` products from `seed`.
    pub fn generate(n: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let products: Vec<Product> = (0..n).map(|i| make_product(i, &mut rng)).collect();
        let texts: Vec<String> = products.iter().map(search_text).collect();
        let index = Bm25Index::new(texts.iter().map(String::as_str));
        let by_id = products
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.clone(), i as u32))
            .collect();
        let mut goal_order: Vec<u32> = (0..n as u32).collect();
        goal_order.shuffle(&mut rng);
        Self {
            products,
            index,
            by_id,
            goal_order,
        }
    }

    /// Find a product by its id (case-insensitive).
    pub fn find(&self, id: &str) -> Option<u32> {
        self.by_id.get(&id.trim().to_uppercase()).copied()
    }

    /// Product numbers of the best `k` matches for `query`.
    pub fn search(&self, query: &str, k: usize) -> Vec<u32> {
        self.index
            .search(query, k)
            .into_iter()
            .map(|(d, _)| d as u32)
            .collect()
    }
}

/// The process-wide catalogue, generated on first use.
pub fn catalogue() -> &'static Catalogue {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    CATALOGUE.get_or_init(|| Catalogue::generate(NUM_PRODUCTS, CATALOGUE_SEED))
}

/// A product id in ASIN style: "B0" + 8 base-36 characters, a bijection of the index.
fn product_id(index: usize) -> String {
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let modulus: u64 = 36u64.pow(8);
    let mut x = (index as u64 * 2_654_435_761 + 1_234_567) % modulus;
    let mut out = [b'0'; 8];
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(x % 36) as usize];
        x /= 36;
    }
    format!("B0{}", std::str::from_utf8(&out).unwrap())
}

fn brand(rng: &mut ChaCha8Rng) -> String {
    const START: &[&str] = &[
        "Zor", "Vel", "Kan", "Lum", "Tra", "Nex", "Qui", "Bre", "Sol", "Mar", "Fen", "Oro",
    ];
    const END: &[&str] = &[
        "vex", "ora", "tek", "ix", "ano", "well", "io", "ara", "on", "ly",
    ];
    format!("{}{}", START.choose(rng).unwrap(), END.choose(rng).unwrap())
}

fn capitalize(words: &str) -> String {
    words
        .split(' ')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Attributes phrased as trailing modifiers ("with microphone", "for dry hair").
pub fn is_trailing(attr: &str) -> bool {
    attr.starts_with("with ") || attr.starts_with("for ")
}

fn make_product(index: usize, rng: &mut ChaCha8Rng) -> Product {
    let category = rng.random_range(0..CATEGORIES.len());
    let def = &CATEGORIES[category];
    let noun = rng.random_range(0..def.nouns.len());
    let n_attr = rng.random_range(2..=4usize).min(def.attributes.len());
    let mut attributes: Vec<u8> = rand::seq::index::sample(rng, def.attributes.len(), n_attr)
        .into_iter()
        .map(|a| a as u8)
        .collect();
    attributes.sort_unstable();
    let options: Vec<Vec<u8>> = def
        .options
        .iter()
        .map(|(_, values)| {
            let k = rng.random_range(2..=values.len().min(5));
            let mut v: Vec<u8> = rand::seq::index::sample(rng, values.len(), k)
                .into_iter()
                .map(|x| x as u8)
                .collect();
            v.sort_unstable();
            v
        })
        .collect();
    let dollars = rng.random_range(def.price.0..=def.price.1);
    let cents = *[99u32, 49, 95, 0].choose(rng).unwrap();
    let price_cents = (dollars * 100 + cents).max(99);
    let rating_tenths = 25 + rng.random_range(0..=25u8).max(rng.random_range(0..=25u8));
    let reviews = 3 + (rng.random_range(0.0f64..1.0).powi(3) * 20_000.0) as u32;
    let material = rng.random_range(0..def.materials.len()) as u8;
    let brand = brand(rng);
    let lead: Vec<&str> = attributes
        .iter()
        .map(|&a| def.attributes[a as usize])
        .filter(|a| !is_trailing(a))
        .collect();
    let trail: Vec<&str> = attributes
        .iter()
        .map(|&a| def.attributes[a as usize])
        .filter(|a| is_trailing(a))
        .collect();
    let mut title = format!(
        "{brand} {} {}",
        capitalize(&lead.join(" ")),
        capitalize(def.nouns[noun])
    );
    if !trail.is_empty() {
        title.push(' ');
        title.push_str(&trail.join(" and "));
    }
    title = title.split_whitespace().collect::<Vec<_>>().join(" ");
    let feature_list: Vec<&str> = attributes
        .iter()
        .map(|&a| def.attributes[a as usize])
        .collect();
    let description = format!(
        "This {} from {brand} is made of {}. Features: {}. {}",
        def.nouns[noun],
        def.materials[material as usize],
        feature_list.join(", "),
        TAGLINES.choose(rng).unwrap()
    );
    Product {
        id: product_id(index),
        category: category as u8,
        noun: noun as u8,
        brand,
        material,
        attributes,
        options,
        price_cents,
        rating_tenths,
        reviews,
        title,
        description,
    }
}

/// The text the search engine indexes for a product: title, description, category and
/// the option values on offer.
fn search_text(p: &Product) -> String {
    let def = p.category_def();
    let mut text = format!("{} {} {}", p.title, p.description, def.name);
    for (dim, values) in p.options.iter().enumerate() {
        for &v in values {
            text.push(' ');
            text.push_str(def.options[dim].1[v as usize]);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn generation_is_deterministic_and_ids_unique() {
        let a = Catalogue::generate(500, 7);
        let b = Catalogue::generate(500, 7);
        for (x, y) in a.products.iter().zip(&b.products) {
            assert_eq!(
                (&x.id, &x.title, x.price_cents),
                (&y.id, &y.title, y.price_cents)
            );
        }
        assert_eq!(a.goal_order, b.goal_order);
        let ids: HashSet<_> = a.products.iter().map(|p| p.id.clone()).collect();
        assert_eq!(ids.len(), 500);
        let c = Catalogue::generate(500, 8);
        assert_ne!(a.products[0].title, c.products[0].title);
    }

    #[test]
    fn products_respect_their_category() {
        let cat = catalogue();
        assert_eq!(cat.products.len(), NUM_PRODUCTS);
        let mut seen = HashSet::new();
        for p in &cat.products {
            let def = p.category_def();
            seen.insert(p.category);
            assert!((2..=4).contains(&p.attributes.len()));
            assert!(p.attributes.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(p.options.len(), def.options.len());
            for (dim, vals) in p.options.iter().enumerate() {
                assert!(vals.len() >= 2);
                assert!(vals
                    .iter()
                    .all(|&v| (v as usize) < def.options[dim].1.len()));
            }
            let (lo, hi) = def.price;
            assert!(p.price_cents >= lo * 100 && p.price_cents <= hi * 100 + 99);
            assert!((25..=50).contains(&p.rating_tenths));
            assert!(p
                .title
                .to_lowercase()
                .contains(&p.noun_text().to_lowercase()));
            assert!(p.id.len() == 10 && p.id.starts_with("B0"));
            assert_eq!(cat.find(&p.id.to_lowercase()), cat.find(&p.id));
        }
        assert_eq!(seen.len(), CATEGORIES.len());
    }

    #[test]
    fn option_values_are_unique_within_a_category() {
        for def in CATEGORIES {
            let mut all = HashSet::new();
            for (_, values) in def.options {
                for v in *values {
                    assert!(all.insert(*v), "{} repeats option {v}", def.name);
                }
            }
        }
    }

    #[test]
    fn search_finds_products_by_title_words() {
        let cat = catalogue();
        let p = &cat.products[17];
        let hits = cat.search(&p.title, 10);
        assert!(hits.contains(&17), "{} not in {hits:?}", p.title);
    }
}
