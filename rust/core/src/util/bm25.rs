//! Okapi BM25 text retrieval with an inverted index, shared by the `webshop` and `search`
//! envs.
//!
//! Text is tokenized into lowercase alphanumeric words, stop words are dropped and a light
//! plural stemmer maps "headphones" and "headphone" to one term. The index is built once
//! (envs keep it in a `OnceLock`) and queried without allocation beyond one score vector.

use std::collections::HashMap;

/// Words that carry no retrieval signal.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "he", "her", "his", "i",
    "in", "is", "it", "its", "me", "my", "of", "on", "or", "she", "that", "the", "their", "this",
    "to", "was", "were", "what", "which", "who", "with", "need", "want", "looking",
];

/// Light plural stemming: "boots" -> "boot", "batteries" -> "battery", "glasses" -> "glass".
fn stem(mut word: String) -> String {
    let n = word.len();
    if n > 4 && word.ends_with("ies") {
        word.truncate(n - 3);
        word.push('y');
    } else if n > 3 && word.ends_with('s') && !word.ends_with("ss") && !word.ends_with("us") {
        word.truncate(n - 1);
    }
    word
}

/// Lowercase alphanumeric terms of `text`, stop words removed, plurals stemmed.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(stem)
        .collect()
}

/// An inverted index over a fixed set of documents, scored with Okapi BM25.
#[derive(Debug, Clone)]
pub struct Bm25Index {
    terms: HashMap<String, u32>,
    /// Per term: (document, term frequency), documents ascending.
    postings: Vec<Vec<(u32, u32)>>,
    doc_len: Vec<u32>,
    avg_len: f32,
    k1: f32,
    b: f32,
}

impl Bm25Index {
    /// Index `docs` (document `i` is the `i`-th text) with the usual k1 = 1.5, b = 0.75.
    pub fn new<'a>(docs: impl IntoIterator<Item = &'a str>) -> Self {
        Self::with_params(docs, 1.5, 0.75)
    }

    pub fn with_params<'a>(docs: impl IntoIterator<Item = &'a str>, k1: f32, b: f32) -> Self {
        let mut terms: HashMap<String, u32> = HashMap::new();
        let mut postings: Vec<Vec<(u32, u32)>> = Vec::new();
        let mut doc_len = Vec::new();
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for (doc, text) in docs.into_iter().enumerate() {
            counts.clear();
            let tokens = tokenize(text);
            doc_len.push(tokens.len() as u32);
            for tok in tokens {
                let next = terms.len() as u32;
                let id = *terms.entry(tok).or_insert(next);
                if id as usize == postings.len() {
                    postings.push(Vec::new());
                }
                *counts.entry(id).or_insert(0) += 1;
            }
            let mut doc_terms: Vec<_> = counts.iter().map(|(&t, &c)| (t, c)).collect();
            doc_terms.sort_unstable();
            for (t, c) in doc_terms {
                postings[t as usize].push((doc as u32, c));
            }
        }
        let total: u64 = doc_len.iter().map(|&l| l as u64).sum();
        let avg_len = if doc_len.is_empty() {
            1.0
        } else {
            (total as f32 / doc_len.len() as f32).max(1.0)
        };
        Self {
            terms,
            postings,
            doc_len,
            avg_len,
            k1,
            b,
        }
    }

    /// Number of indexed documents.
    pub fn len(&self) -> usize {
        self.doc_len.len()
    }

    pub fn is_empty(&self) -> bool {
        self.doc_len.is_empty()
    }

    /// Inverse document frequency of an (already tokenized) term; 0 for unknown terms.
    pub fn idf(&self, term: &str) -> f32 {
        match self.terms.get(term) {
            None => 0.0,
            Some(&t) => {
                let n = self.len() as f32;
                let df = self.postings[t as usize].len() as f32;
                (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
            }
        }
    }

    /// BM25 score of every document for `query` (repeated query terms count once).
    pub fn scores(&self, query: &str) -> Vec<f32> {
        let mut scores = vec![0.0f32; self.len()];
        let mut seen: Vec<u32> = Vec::new();
        for tok in tokenize(query) {
            let Some(&t) = self.terms.get(&tok) else {
                continue;
            };
            if seen.contains(&t) {
                continue;
            }
            seen.push(t);
            let idf = self.idf(&tok);
            for &(doc, tf) in &self.postings[t as usize] {
                let tf = tf as f32;
                let len_norm =
                    1.0 - self.b + self.b * self.doc_len[doc as usize] as f32 / self.avg_len;
                scores[doc as usize] += idf * tf * (self.k1 + 1.0) / (tf + self.k1 * len_norm);
            }
        }
        scores
    }

    /// The `k` best documents for `query` as (document, score), best first; documents with
    /// score 0 are left out and ties go to the lower document number.
    pub fn search(&self, query: &str, k: usize) -> Vec<(usize, f32)> {
        let mut hits: Vec<(usize, f32)> = self
            .scores(query)
            .into_iter()
            .enumerate()
            .filter(|&(_, s)| s > 0.0)
            .collect();
        let order = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if hits.len() > k && k > 0 {
            hits.select_nth_unstable_by(k - 1, order);
            hits.truncate(k);
        }
        hits.sort_unstable_by(order);
        hits.truncate(k);
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs() -> Vec<&'static str> {
        vec![
            "wireless bluetooth headphones black",
            "wired headphones with microphone",
            "running shoes for men, lightweight and breathable running shoe",
            "stainless steel coffee maker",
            "wireless mouse",
        ]
    }

    #[test]
    fn tokenize_lowercases_drops_stop_words_and_stems() {
        assert_eq!(
            tokenize("The Wireless HEADPHONES, with 2 batteries!"),
            vec!["wireless", "headphone", "2", "battery"]
        );
        assert_eq!(tokenize("glass bus"), vec!["glass", "bus"]);
        assert!(tokenize("  ,,  ").is_empty());
    }

    #[test]
    fn ranks_by_term_overlap_and_rarity() {
        let docs = docs();
        let idx = Bm25Index::new(docs.iter().copied());
        assert_eq!(idx.len(), 5);
        let hits = idx.search("wireless headphones", 5);
        // Doc 0 has both terms; doc 1 has the rarer-in-combination "headphones" only and
        // doc 4 has "wireless" only; both single-term docs score less than doc 0.
        assert_eq!(hits[0].0, 0);
        assert_eq!(hits.len(), 3);
        assert!(hits[0].1 > hits[1].1);
        // Repeated terms raise the score (tf saturation still > 1 occurrence).
        let shoes = idx.search("running shoe", 1);
        assert_eq!(shoes[0].0, 2);
        // Unknown words score nothing.
        assert!(idx.search("zzz qqq", 3).is_empty());
        assert_eq!(idx.idf("zzz"), 0.0);
    }

    #[test]
    fn shorter_documents_win_ties_on_matching_terms() {
        let idx = Bm25Index::new(["coffee maker red black white", "coffee maker"]);
        let hits = idx.search("coffee maker", 2);
        assert_eq!(hits[0].0, 1);
        assert!(hits[0].1 > hits[1].1);
    }

    #[test]
    fn ties_break_by_document_number_and_k_truncates() {
        let idx = Bm25Index::new(["alpha", "beta", "alpha", "alpha"]);
        let hits = idx.search("alpha", 2);
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(idx.search("alpha", 0).len(), 0);
        assert_eq!(idx.search("alpha alpha", 10).len(), 3);
    }

    #[test]
    fn idf_matches_the_bm25_formula() {
        let idx = Bm25Index::new(["x y", "x", "z"]);
        let expect = (1.0f32 + (3.0 - 2.0 + 0.5) / (2.0 + 0.5)).ln();
        assert!((idx.idf("x") - expect).abs() < 1e-6);
        assert!(idx.idf("z") > idx.idf("x"));
    }
}
