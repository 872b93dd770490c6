//! [`Observations`]: the observation texts of one batch, packed into a few shared buffers.

use std::ops::Index;

/// The observation texts of a batch, in row order, packed: consecutive rows share one text
/// buffer (one per parallel chunk of the batch), so thousands of observations cost a few
/// allocations, envs write straight into the buffer (`Env::step_into`) and the bindings
/// copy each row from it into its Python `str` in one pass.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Observations {
    /// Rows per chunk; every chunk but the last holds exactly this many.
    rows_per_chunk: usize,
    chunks: Vec<TextChunk>,
    len: usize,
}

/// Consecutive rows of a batch: their texts back to back, and where each one ends.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TextChunk {
    pub(crate) text: String,
    ends: Vec<usize>,
}

impl TextChunk {
    pub(crate) fn with_capacity(rows: usize, bytes: usize) -> Self {
        Self {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(rows),
        }
    }

    /// Closes the current row: the text pushed since the previous row's end.
    pub(crate) fn end_row(&mut self) {
        self.ends.push(self.text.len());
    }

    /// The text of the row being written so far starts here.
    pub(crate) fn row_start(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    fn row(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total bytes of text over all rows.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }

    /// The rows' texts in order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let s = &self.text[start..end];
            start = end;
            s
        })
    }
}

impl Observations {
    /// Packs `chunks` (all but the last holding `rows_per_chunk` rows).
    pub(crate) fn from_chunks(rows_per_chunk: usize, chunks: Vec<TextChunk>) -> Self {
        debug_assert!(chunks
            .iter()
            .rev()
            .skip(1)
            .all(|c| c.ends.len() == rows_per_chunk));
        let len = chunks.iter().map(|c| c.ends.len()).sum();
        Self {
            rows_per_chunk,
            chunks,
            len,
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total bytes of text over all rows.
    pub fn text_len(&self) -> usize {
        self.chunks.iter().map(|c| c.text.len()).sum()
    }

    /// Row `i`'s text.
    pub fn get(&self, i: usize) -> Option<&str> {
        (i < self.len).then(|| self.chunks[i / self.rows_per_chunk].row(i % self.rows_per_chunk))
    }

    /// All rows in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            obs: self,
            chunk: 0,
            row: 0,
            left: self.len,
        }
    }

    /// All rows as owned strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(String::from).collect()
    }
}

impl Index<usize> for Observations {
    type Output = str;
    fn index(&self, i: usize) -> &str {
        match self.get(i) {
            Some(s) => s,
            None => panic!("row {i} out of range for {} observations", self.len),
        }
    }
}

impl<'a> IntoIterator for &'a Observations {
    type Item = &'a str;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// Iterator over the rows of [`Observations`].
pub struct Iter<'a> {
    obs: &'a Observations,
    chunk: usize,
    row: usize,
    left: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        loop {
            let chunk = self.obs.chunks.get(self.chunk)?;
            if self.row < chunk.ends.len() {
                self.row += 1;
                self.left -= 1;
                return Some(chunk.row(self.row - 1));
            }
            self.chunk += 1;
            self.row = 0;
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(rows: &[&str]) -> TextChunk {
        let mut c = TextChunk::with_capacity(rows.len(), 0);
        for r in rows {
            assert_eq!(c.row_start(), c.text.len());
            c.text.push_str(r);
            c.end_row();
        }
        c
    }

    #[test]
    fn rows_come_back_in_order_across_chunks() {
        let obs = Observations::from_chunks(
            2,
            vec![chunk(&["a", ""]), chunk(&["héllo", "x"]), chunk(&["last"])],
        );
        assert_eq!(obs.len(), 5);
        assert_eq!(obs.text_len(), 12);
        assert_eq!(obs.to_vec(), vec!["a", "", "héllo", "x", "last"]);
        assert_eq!(obs.iter().len(), 5);
        assert_eq!(&obs[2], "héllo");
        assert_eq!(obs.get(4), Some("last"));
        assert_eq!(obs.get(5), None);
        assert!(Observations::default().is_empty());
        let c = chunk(&["héllo", "", "x"]);
        assert_eq!(c.rows().collect::<Vec<_>>(), vec!["héllo", "", "x"]);
        assert_eq!((c.len(), c.text_len(), c.is_empty()), (3, 7, false));
        assert_eq!(Observations::default().iter().next(), None);
    }
}
