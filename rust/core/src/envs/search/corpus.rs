//! The deep-search knowledge corpus: fictional countries, cities, universities, people,
//! companies and inventions with linked facts, one short document per entity, and a BM25
//! index over the documents. Generated deterministically and built once per process.

use crate::util::bm25::{tokenize, Bm25Index};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

const CORPUS_SEED: u64 = 0x5345_4152_4348_2101;
pub const NUM_COUNTRIES: usize = 40;
pub const NUM_CITIES: usize = 400;
pub const NUM_UNIVERSITIES: usize = 150;
pub const NUM_PEOPLE: usize = 1500;
pub const NUM_COMPANIES: usize = 700;
pub const NUM_INVENTIONS: usize = 600;

/// A reference to one entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entity {
    Country(u32),
    City(u32),
    University(u32),
    Person(u32),
    Company(u32),
    Invention(u32),
}

pub struct Country {
    pub name: String,
    pub continent: &'static str,
    pub capital: u32,
}
pub struct City {
    pub name: String,
    pub country: u32,
    pub founded: u32,
    pub population: u32,
}
pub struct University {
    pub name: String,
    pub city: u32,
    pub founded: u32,
}
pub struct Person {
    pub name: String,
    pub born_in: u32,
    pub born_year: u32,
    pub studied_at: u32,
    pub profession: &'static str,
    pub female: bool,
}
pub struct Company {
    pub name: String,
    pub founder: u32,
    pub hq: u32,
    pub founded: u32,
    pub industry: &'static str,
}
pub struct Invention {
    pub name: String,
    pub inventor: u32,
    pub maker: u32,
    pub year: u32,
}

/// One document: a title, its text and the names and years it mentions.
pub struct Doc {
    pub title: String,
    pub text: String,
    /// Entity names and years mentioned in the text (answer candidates for random play).
    pub links: Vec<String>,
}

pub struct Corpus {
    pub countries: Vec<Country>,
    pub cities: Vec<City>,
    pub universities: Vec<University>,
    pub people: Vec<Person>,
    pub companies: Vec<Company>,
    pub inventions: Vec<Invention>,
    pub docs: Vec<Doc>,
    pub index: Bm25Index,
    doc_of: HashMap<Entity, u32>,
    by_title: HashMap<String, u32>,
}

const SYL: &[&str] = &[
    "ka", "lo", "ri", "ven", "mar", "tel", "zor", "qui", "bra", "nox", "sel", "dun", "fi", "gor",
    "ha", "jen", "lu", "mo", "pra", "sta", "tor", "vi", "wel", "yar", "zen", "cal", "dor", "el",
    "fen", "ith", "ros", "ban", "kel", "ny", "ost", "pel",
];
const CONTINENTS: &[&str] = &["Aurelia", "Borealis", "Cendra", "Dravos", "Estmere"];
const PROFESSIONS: &[&str] = &[
    "engineer",
    "chemist",
    "physicist",
    "architect",
    "economist",
    "entrepreneur",
    "mathematician",
    "designer",
    "biologist",
    "industrialist",
];
const INDUSTRIES: &[&str] = &[
    "robotics",
    "shipping",
    "textile",
    "software",
    "energy",
    "aviation",
    "pharmaceutical",
    "food",
    "telecommunications",
    "mining",
];

/// "a" or "an" for `word`.
fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn cap(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

fn word(rng: &mut ChaCha8Rng, syllables: usize, ends: &[&str]) -> String {
    let mut w: String = (0..syllables).map(|_| *SYL.choose(rng).unwrap()).collect();
    w.push_str(ends.choose(rng).unwrap());
    cap(&w)
}

/// Draw names from `gen` until `n` distinct ones (also distinct from `taken`) are found.
fn unique_names(
    n: usize,
    rng: &mut ChaCha8Rng,
    taken: &mut HashSet<String>,
    mut gen: impl FnMut(&mut ChaCha8Rng) -> String,
) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let name = gen(rng);
        if taken.insert(name.to_lowercase()) {
            out.push(name);
        }
    }
    out
}

impl Corpus {
    /// Generate the corpus from `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut taken = HashSet::new();
        let country_names = unique_names(NUM_COUNTRIES, &mut rng, &mut taken, |r| {
            word(r, 2, &["ia", "land", "ovia", "esh", "ara"])
        });
        let city_names = unique_names(NUM_CITIES, &mut rng, &mut taken, |r| {
            let n = r.random_range(1..=2);
            word(
                r,
                n,
                &[
                    "ville", "burg", "port", "haven", "ford", "ton", "mouth", "dale", "vik",
                ],
            )
        });
        // Every country gets at least one city; its first city is the capital.
        let cities: Vec<City> = city_names
            .into_iter()
            .enumerate()
            .map(|(i, name)| City {
                name,
                country: if i < NUM_COUNTRIES {
                    i as u32
                } else {
                    rng.random_range(0..NUM_COUNTRIES as u32)
                },
                founded: rng.random_range(900..1850),
                population: rng.random_range(5..2000) * 1000,
            })
            .collect();
        let countries: Vec<Country> = country_names
            .into_iter()
            .enumerate()
            .map(|(i, name)| Country {
                name,
                continent: CONTINENTS.choose(&mut rng).unwrap(),
                capital: i as u32,
            })
            .collect();
        let uni_names = unique_names(NUM_UNIVERSITIES, &mut rng, &mut taken, |r| {
            let root = word(r, 2, &["", "ton", "ley"]);
            match r.random_range(0..3) {
                0 => format!("{root} University"),
                1 => format!("University of {root}"),
                _ => format!("{root} Institute of Technology"),
            }
        });
        let universities: Vec<University> = uni_names
            .into_iter()
            .map(|name| University {
                name,
                city: rng.random_range(0..NUM_CITIES as u32),
                founded: rng.random_range(1500..1950),
            })
            .collect();
        let person_names = unique_names(NUM_PEOPLE, &mut rng, &mut taken, |r| {
            let first = word(r, 2, &["a", "o", "en", "", "ia"]);
            let last = word(r, 2, &["son", "er", "ley", "wick", "", "man"]);
            format!("{first} {last}")
        });
        let people: Vec<Person> = person_names
            .into_iter()
            .map(|name| Person {
                female: name.ends_with('a') || rng.random_bool(0.4),
                name,
                born_in: rng.random_range(0..NUM_CITIES as u32),
                born_year: rng.random_range(1850..1990),
                studied_at: rng.random_range(0..NUM_UNIVERSITIES as u32),
                profession: PROFESSIONS.choose(&mut rng).unwrap(),
            })
            .collect();
        let roots = unique_names(260, &mut rng, &mut HashSet::new(), |r| {
            word(r, 2, &["ix", "on", "ex", "ra", "ica"])
        });
        let company_names = unique_names(NUM_COMPANIES, &mut rng, &mut taken, |r| {
            let suffix = [
                "Labs",
                "Systems",
                "Industries",
                "Dynamics",
                "Works",
                "Group",
                "Motors",
            ]
            .choose(r)
            .unwrap();
            format!("{} {suffix}", roots.choose(r).unwrap())
        });
        let companies: Vec<Company> = company_names
            .into_iter()
            .map(|name| {
                let founder = rng.random_range(0..NUM_PEOPLE as u32);
                let born = people[founder as usize].born_year;
                Company {
                    name,
                    founder,
                    hq: rng.random_range(0..NUM_CITIES as u32),
                    founded: born + rng.random_range(22..50),
                    industry: INDUSTRIES.choose(&mut rng).unwrap(),
                }
            })
            .collect();
        let invention_names = unique_names(NUM_INVENTIONS, &mut rng, &mut taken, |r| {
            let prefix = [
                "Aero", "Helio", "Quantum", "Magneto", "Hydro", "Electro", "Thermo", "Chrono",
                "Sono", "Photo", "Gyro", "Nano",
            ]
            .choose(r)
            .unwrap();
            let kind = [
                "Compass",
                "Loom",
                "Engine",
                "Lens",
                "Pump",
                "Stabilizer",
                "Telegraph",
                "Battery",
                "Valve",
                "Turbine",
                "Scanner",
                "Press",
            ]
            .choose(r)
            .unwrap();
            format!("{prefix}{} {kind}", SYL.choose(r).unwrap())
        });
        let inventions: Vec<Invention> = invention_names
            .into_iter()
            .map(|name| {
                let inventor = rng.random_range(0..NUM_PEOPLE as u32);
                Invention {
                    name,
                    inventor,
                    maker: rng.random_range(0..NUM_COMPANIES as u32),
                    year: people[inventor as usize].born_year + rng.random_range(20..60),
                }
            })
            .collect();
        let mut corpus = Corpus {
            countries,
            cities,
            universities,
            people,
            companies,
            inventions,
            docs: Vec::new(),
            index: Bm25Index::new(std::iter::empty()),
            doc_of: HashMap::new(),
            by_title: HashMap::new(),
        };
        corpus.write_docs();
        // Titles are indexed twice: a document about an entity outranks mere mentions.
        let texts: Vec<String> = corpus
            .docs
            .iter()
            .map(|d| format!("{} {} {}", d.title, d.title, d.text))
            .collect();
        corpus.index = Bm25Index::new(texts.iter().map(String::as_str));
        corpus
    }

    /// Every entity, in document order.
    pub fn entities(&self) -> Vec<Entity> {
        let mut out = Vec::new();
        out.extend((0..self.countries.len() as u32).map(Entity::Country));
        out.extend((0..self.cities.len() as u32).map(Entity::City));
        out.extend((0..self.universities.len() as u32).map(Entity::University));
        out.extend((0..self.people.len() as u32).map(Entity::Person));
        out.extend((0..self.companies.len() as u32).map(Entity::Company));
        out.extend((0..self.inventions.len() as u32).map(Entity::Invention));
        out
    }

    /// The entity's name (its document title).
    pub fn name(&self, e: Entity) -> &str {
        match e {
            Entity::Country(i) => &self.countries[i as usize].name,
            Entity::City(i) => &self.cities[i as usize].name,
            Entity::University(i) => &self.universities[i as usize].name,
            Entity::Person(i) => &self.people[i as usize].name,
            Entity::Company(i) => &self.companies[i as usize].name,
            Entity::Invention(i) => &self.inventions[i as usize].name,
        }
    }

    /// How a question mentions the entity ("the Aerozen Compass" for inventions).
    pub fn mention(&self, e: Entity) -> String {
        match e {
            Entity::Invention(_) => format!("the {}", self.name(e)),
            _ => self.name(e).to_string(),
        }
    }

    /// The document about `e`.
    pub fn doc_of(&self, e: Entity) -> u32 {
        self.doc_of[&e]
    }

    /// A document by title (case- and space-insensitive) or by id ("D0042").
    pub fn find_doc(&self, key: &str) -> Option<u32> {
        let norm = key
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        if let Some(&d) = self.by_title.get(&norm) {
            return Some(d);
        }
        let digits = norm.strip_prefix('d')?;
        let d: u32 = digits.parse().ok()?;
        ((d as usize) < self.docs.len() && digits.len() == 4).then_some(d)
    }

    pub fn doc_id(d: u32) -> String {
        format!("D{d:04}")
    }

    /// The sentence of document `d` sharing most words with `query`, at most 140 chars.
    pub fn snippet(&self, d: u32, query: &str) -> String {
        let q: HashSet<String> = tokenize(query).into_iter().collect();
        let text = &self.docs[d as usize].text;
        let best = text
            .split_inclusive(". ")
            .map(str::trim)
            .enumerate()
            .max_by_key(|(i, s)| {
                let hits = tokenize(s).iter().filter(|t| q.contains(*t)).count();
                (hits, std::cmp::Reverse(*i))
            })
            .map_or("", |(_, s)| s);
        if best.chars().count() > 140 {
            format!("{}...", best.chars().take(137).collect::<String>())
        } else {
            best.to_string()
        }
    }

    fn push_doc(&mut self, e: Entity, text: String, links: Vec<String>) {
        let d = self.docs.len() as u32;
        let title = self.name(e).to_string();
        self.by_title.insert(title.to_lowercase(), d);
        self.doc_of.insert(e, d);
        self.docs.push(Doc { title, text, links });
    }

    fn write_docs(&mut self) {
        let mut cities_of: Vec<Vec<u32>> = vec![Vec::new(); self.countries.len()];
        for (i, c) in self.cities.iter().enumerate() {
            cities_of[c.country as usize].push(i as u32);
        }
        let mut founded_by: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, c) in self.companies.iter().enumerate() {
            founded_by.entry(c.founder).or_default().push(i as u32);
        }
        let mut invented_by: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut made_by: HashMap<u32, Vec<u32>> = HashMap::new();
        for (i, inv) in self.inventions.iter().enumerate() {
            invented_by.entry(inv.inventor).or_default().push(i as u32);
            made_by.entry(inv.maker).or_default().push(i as u32);
        }
        for (i, in_country) in cities_of.iter().enumerate() {
            let c = &self.countries[i];
            let capital = self.cities[c.capital as usize].name.clone();
            let others: Vec<String> = in_country
                .iter()
                .filter(|&&x| x != c.capital)
                .take(4)
                .map(|&x| self.cities[x as usize].name.clone())
                .collect();
            let mut text = format!(
                "{} is a country in {}. Its capital is {capital}.",
                c.name, c.continent
            );
            if !others.is_empty() {
                text.push_str(&format!(
                    " Other cities in {} include {}.",
                    c.name,
                    others.join(", ")
                ));
            }
            let mut links = vec![capital];
            links.extend(others);
            self.push_doc(Entity::Country(i as u32), text, links);
        }
        for i in 0..self.cities.len() {
            let c = &self.cities[i];
            let country = self.countries[c.country as usize].name.clone();
            let mut text = format!(
                "{} is a city in {country}. It was founded in {} and has a population of about {}.",
                c.name, c.founded, c.population
            );
            if self.countries[c.country as usize].capital == i as u32 {
                text.push_str(&format!(" It is the capital of {country}."));
            }
            let links = vec![country, c.founded.to_string()];
            self.push_doc(Entity::City(i as u32), text, links);
        }
        for i in 0..self.universities.len() {
            let u = &self.universities[i];
            let city = self.cities[u.city as usize].name.clone();
            let text = format!(
                "{} is a university located in {city}. It was founded in {}.",
                u.name, u.founded
            );
            let links = vec![city, u.founded.to_string()];
            self.push_doc(Entity::University(i as u32), text, links);
        }
        for i in 0..self.people.len() {
            let p = &self.people[i];
            let (she, her) = if p.female {
                ("She", "Her")
            } else {
                ("He", "His")
            };
            let city = self.cities[p.born_in as usize].name.clone();
            let uni = self.universities[p.studied_at as usize].name.clone();
            let mut text = format!(
                "{} is {} {} who was born in {city} in {}. {she} studied at {uni}.",
                p.name,
                article(p.profession),
                p.profession,
                p.born_year
            );
            let mut links = vec![city, p.born_year.to_string(), uni];
            let founded: Vec<String> = founded_by
                .get(&(i as u32))
                .map(|v| {
                    v.iter()
                        .map(|&c| self.companies[c as usize].name.clone())
                        .collect()
                })
                .unwrap_or_default();
            if !founded.is_empty() {
                text.push_str(&format!(" {she} founded {}.", founded.join(" and ")));
                links.extend(founded);
            }
            let invented: Vec<String> = invented_by
                .get(&(i as u32))
                .map(|v| {
                    v.iter()
                        .map(|&x| self.inventions[x as usize].name.clone())
                        .collect()
                })
                .unwrap_or_default();
            if !invented.is_empty() {
                text.push_str(&format!(
                    " {her} best known invention is the {}.",
                    invented[0]
                ));
                links.extend(invented);
            }
            self.push_doc(Entity::Person(i as u32), text, links);
        }
        for i in 0..self.companies.len() {
            let c = &self.companies[i];
            let founder = self.people[c.founder as usize].name.clone();
            let hq = self.cities[c.hq as usize].name.clone();
            let mut text = format!(
                "{} is {} {} company founded in {} by {founder}. It is headquartered in {hq}.",
                c.name,
                article(c.industry),
                c.industry,
                c.founded
            );
            let mut links = vec![founder, c.founded.to_string(), hq];
            if let Some(v) = made_by.get(&(i as u32)) {
                let names: Vec<String> = v
                    .iter()
                    .map(|&x| self.inventions[x as usize].name.clone())
                    .collect();
                text.push_str(&format!(
                    " It manufactures the {}.",
                    names.join(" and the ")
                ));
                links.extend(names);
            }
            self.push_doc(Entity::Company(i as u32), text, links);
        }
        for i in 0..self.inventions.len() {
            let inv = &self.inventions[i];
            let inventor = self.people[inv.inventor as usize].name.clone();
            let maker = self.companies[inv.maker as usize].name.clone();
            let text = format!(
                "The {} is a device invented by {inventor} in {}. It is manufactured by {maker}.",
                inv.name, inv.year
            );
            let links = vec![inventor, inv.year.to_string(), maker];
            self.push_doc(Entity::Invention(i as u32), text, links);
        }
    }
}

/// The process-wide corpus, generated on first use.
pub fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(|| Corpus::generate(CORPUS_SEED))
}
