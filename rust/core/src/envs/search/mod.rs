//! `search`: deep search over a local knowledge corpus (multi-hop question answering).
//!
//! The agent gets a 1-3 hop question about fictional entities ("In which city was the
//! founder of Zentrix Labs born?"), searches a corpus of a few thousand short documents
//! (BM25, top 5 titles with snippets), opens documents and answers. The answer ends the
//! episode: reward 1.0 for an exact match after normalisation, else the token F1.
//!
//! Actions: `search[query]`, `open[title or id]`, `answer[text]` (`finish[text]` also
//! answers). Kwargs: `split` = `train` (default) | `test`; `hops` = 1 | 2 | 3 or
//! `difficulty` = `easy` | `medium` | `hard` (same thing); neither = a 1:1:1 mix.

pub mod corpus;
pub mod questions;

use crate::env::{snapshot_of, vec_bytes, Env, Step, Task};
use crate::error::{CoreError, Result};
use crate::registry::{Kwargs, KwargsReader};
use corpus::{corpus, Corpus};
use questions::{answer_score, bank, Question, QuestionBank, Split};

/// Search results shown per query.
pub const TOP_K: usize = 5;

const INSTRUCTIONS: &str = "Answer the question using a local knowledge base. Actions:\n- search[query]: list the 5 best matching documents (id, title, snippet)\n\
- open[title or id]: read a document in full, e.g. open[Zentrix Labs] or open[D0042]\n\
- answer[text]: give your final answer (ends the episode)\n\
Questions may need several hops: find the first entity, read its document, then search \
for the entity it mentions. Score: 1 for the exact answer, else the word-overlap F1.";

/// One deep-search episode.
#[derive(Clone)]
pub struct SearchEnv {
    corpus: &'static Corpus,
    bank: &'static QuestionBank,
    split: Split,
    hops: Option<u8>,
    question: Option<Question>,
    last_query: String,
    results: Vec<u32>,
    opened: Vec<u32>,
    current: Option<u32>,
    done: bool,
    /// The last step refused its action as unreadable ([`Env::refused`]).
    refused: bool,
}

pub fn make(kwargs: &Kwargs) -> Result<Box<dyn Env>> {
    let r = KwargsReader::new("search", kwargs, &["split", "hops", "difficulty"])?;
    let split = Split::parse(&r.str_or("split", "train")?)?;
    let hops = match r.u64_or("hops", 0)? {
        0 => None,
        h @ 1..=3 => Some(h as u8),
        h => {
            return Err(CoreError::InvalidArgument(format!(
                "search: hops must be 1, 2 or 3, got {h}"
            )))
        }
    };
    let by_difficulty = match r.str_or("difficulty", "")?.as_str() {
        "" | "mixed" => None,
        "easy" => Some(1),
        "medium" => Some(2),
        "hard" => Some(3),
        other => {
            return Err(CoreError::InvalidArgument(format!(
                "search: difficulty must be easy, medium, hard or mixed, got {other:?}"
            )))
        }
    };
    if let (Some(h), Some(d)) = (hops, by_difficulty) {
        if h != d {
            return Err(CoreError::InvalidArgument(format!(
                "search: hops={h} contradicts difficulty (= {d} hops)"
            )));
        }
    }
    Ok(Box::new(SearchEnv::new(split, hops.or(by_difficulty))))
}

#[derive(Debug, PartialEq)]
enum Action {
    Search(String),
    Open(String),
    Answer(String),
}

fn parse_action(action: &str) -> Option<Action> {
    let a = action.trim();
    let open = a.find('[')?;
    let inner = a[open + 1..].strip_suffix(']')?.trim().to_string();
    match a[..open].trim().to_lowercase().as_str() {
        "search" => Some(Action::Search(inner)),
        "open" | "click" | "read" => Some(Action::Open(inner)),
        "answer" | "finish" => Some(Action::Answer(inner)),
        _ => None,
    }
}

impl SearchEnv {
    pub fn new(split: Split, hops: Option<u8>) -> Self {
        Self {
            corpus: corpus(),
            bank: bank(),
            split,
            hops,
            question: None,
            last_query: String::new(),
            results: Vec::new(),
            opened: Vec::new(),
            current: None,
            done: false,
            refused: false,
        }
    }

    pub fn question(&self) -> Option<&Question> {
        self.question.as_ref()
    }

    fn question_for(&self, index: u64) -> Question {
        let n = self.num_tasks();
        let i = index % n;
        let (hops, j) = match self.hops {
            Some(h) => (h, i),
            None => (1 + (i % 3) as u8, i / 3),
        };
        let chains = self.split.chains(self.bank, hops);
        chains[j as usize % chains.len()].question(self.corpus)
    }

    fn question_text(&self) -> &str {
        self.question.as_ref().map_or("", |q| q.text.as_str())
    }

    fn invalid(&self, why: &str) -> Step {
        Step::new(
            format!("Invalid action: {why}\nQuestion: {}", self.question_text()),
            0.0,
            false,
        )
    }

    fn search(&mut self, query: &str) -> Step {
        if query.is_empty() {
            self.refused = true;
            return self.invalid("the search query is empty.");
        }
        self.last_query = query.to_string();
        self.results = self
            .corpus
            .index
            .search(query, TOP_K)
            .into_iter()
            .map(|(d, _)| d as u32)
            .collect();
        if self.results.is_empty() {
            return Step::new(format!("No documents match \"{query}\"."), 0.0, false);
        }
        let mut out = format!("Search results for \"{query}\":");
        for (i, &d) in self.results.iter().enumerate() {
            let doc = &self.corpus.docs[d as usize];
            out.push_str(&format!(
                "\n{}. [{}] {}: {}",
                i + 1,
                Corpus::doc_id(d),
                doc.title,
                self.corpus.snippet(d, query)
            ));
        }
        Step::new(out, 0.0, false)
    }

    fn open(&mut self, key: &str) -> Step {
        let Some(d) = self.corpus.find_doc(key) else {
            return self.invalid(&format!(
                "there is no document titled {key:?}; use search[...] to find titles."
            ));
        };
        if !self.opened.contains(&d) {
            self.opened.push(d);
        }
        self.current = Some(d);
        let doc = &self.corpus.docs[d as usize];
        Step::new(
            format!("[{}] {}\n{}", Corpus::doc_id(d), doc.title, doc.text),
            0.0,
            false,
        )
    }

    fn answer(&mut self, text: &str) -> Step {
        let gold = self.question.as_ref().map_or("", |q| q.answer.as_str());
        let score = answer_score(text, gold);
        self.done = true;
        Step::new(
            format!("You answered \"{text}\". The correct answer is \"{gold}\". Score: {score:.2}"),
            score,
            true,
        )
    }
}

impl Env for SearchEnv {
    fn reset(&mut self, task: &Task, _seed: u64) -> Result<String> {
        let question = match task {
            Task::Index(i) => self.question_for(*i),
            Task::Spec(s) => match s.trim().parse::<u64>() {
                Ok(i) => self.question_for(i),
                Err(_) => spec_question(s)?,
            },
        };
        self.question = Some(question);
        self.last_query.clear();
        self.results.clear();
        self.opened.clear();
        self.current = None;
        self.done = false;
        Ok(format!(
            "Question: {}\nSearch the knowledge base, read documents and answer. Actions: \
             search[query], open[title], answer[text].",
            self.question_text()
        ))
    }

    fn step(&mut self, action: &str) -> Step {
        self.refused = false;
        if self.question.is_none() {
            return Step::new(
                "Invalid action: the episode has not been reset.",
                0.0,
                false,
            );
        }
        if self.done {
            return Step::new("The episode is over.", 0.0, true);
        }
        match parse_action(action) {
            Some(Action::Search(q)) => self.search(&q),
            Some(Action::Open(t)) => self.open(&t),
            Some(Action::Answer(a)) => self.answer(&a),
            None => {
                self.refused = true;
                self.invalid(&format!(
                    "{action:?} is not an action; use search[query], open[title] or answer[text]."
                ))
            }
        }
    }

    fn refused(&self) -> bool {
        self.refused
    }

    fn valid_actions(&self) -> Vec<String> {
        let Some(q) = &self.question else {
            return Vec::new();
        };
        if self.done {
            return Vec::new();
        }
        let mut out = Vec::new();
        match q.path.first() {
            Some(&e) => out.push(format!("search[{}]", self.corpus.name(e))),
            None => out.push(format!("search[{}]", q.text)),
        }
        for &d in &self.results {
            out.push(format!("open[{}]", self.corpus.docs[d as usize].title));
        }
        if let Some(d) = self.current {
            for link in &self.corpus.docs[d as usize].links {
                if !link.chars().all(|c| c.is_ascii_digit()) {
                    out.push(format!("search[{link}]"));
                }
                out.push(format!("answer[{link}]"));
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|a| seen.insert(a.clone()));
        out
    }

    /// Follow the hop chain: search each entity on the path, open its document, and answer
    /// once every fact has been read.
    fn oracle_action(&self) -> Option<String> {
        let q = self.question.as_ref()?;
        if self.done {
            return None;
        }
        for &e in &q.path {
            let d = self.corpus.doc_of(e);
            if self.opened.contains(&d) {
                continue;
            }
            let name = self.corpus.name(e);
            if self.results.contains(&d) || self.last_query == name {
                return Some(format!("open[{name}]"));
            }
            return Some(format!("search[{name}]"));
        }
        Some(format!("answer[{}]", q.answer))
    }

    fn snapshot(&self) -> Option<Box<dyn Env>> {
        snapshot_of(self)
    }

    fn heap_bytes(&self) -> usize {
        let question = self.question.as_ref().map_or(0, |q| {
            q.text.capacity() + q.answer.capacity() + vec_bytes(&q.path)
        });
        question + self.last_query.capacity() + vec_bytes(&self.results) + vec_bytes(&self.opened)
    }

    fn num_tasks(&self) -> u64 {
        match self.hops {
            Some(h) => self.split.chains(self.bank, h).len() as u64,
            None => {
                let m = (1..=3)
                    .map(|h| self.split.chains(self.bank, h).len())
                    .min()
                    .unwrap_or(0);
                3 * m as u64
            }
        }
    }

    fn instructions(&self) -> String {
        INSTRUCTIONS.to_string() + &crate::env::action_line("search[Zentrix Labs founder]")
    }
}

/// A custom question given as JSON: `{"question": "...", "answer": "..."}`.
fn spec_question(spec: &str) -> Result<Question> {
    let bad = |message: String| CoreError::InvalidTask {
        env: "search".into(),
        message,
    };
    let v: serde_json::Value = serde_json::from_str(spec).map_err(|e| {
        bad(format!(
            "a task is an index or JSON {{\"question\": ..., \"answer\": ...}} ({e})"
        ))
    })?;
    let field = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .map(str::to_string)
            .ok_or_else(|| bad(format!("the JSON task needs a string {k:?}")))
    };
    Ok(Question {
        text: field("question")?,
        answer: field("answer")?,
        path: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
