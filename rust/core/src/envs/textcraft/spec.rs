//! Small text helpers of TextCraft: the documented RNG, Python-compatible string rules, and
//! explicit task specs.

use super::book::{Book, PREFIX};
use crate::error::{CoreError, Result};
use serde_json::Value;

/// SplitMix64 (Steele, Lea, Flood 2014). `below(n)` maps a draw to `0..n` by multiply-shift
/// (`(x * n) >> 64`), so a Python port reproduces every draw exactly.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(state: u64) -> Self {
        Self(state)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// FNV-1a 64 of a string's UTF-8 bytes (mixes the goal id into the episode seed).
pub fn fnv1a64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `[0-9]+ ` at the start: (count saturated to u64, rest), as Python's `([0-9]+) (.*)`.
pub fn split_count(text: &str) -> Option<(u64, &str)> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || text.as_bytes().get(digits) != Some(&b' ') {
        return None;
    }
    let count = text[..digits].bytes().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    });
    Some((count, &text[digits + 1..]))
}

/// Python's `str.isspace()` (what `str.strip()` removes).
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`. ASCII ends are trimmed bytewise (the ASCII `isspace` bytes are
/// `\t`..`\r` and 0x1c..=0x20); a non-ASCII end falls back to the char rule.
pub fn py_strip(s: &str) -> &str {
    let ascii_space = |b: u8| matches!(b, b'\t'..=b'\r' | 0x1c..=b' ');
    let b = s.as_bytes();
    let start = b.iter().position(|&c| !ascii_space(c)).unwrap_or(b.len());
    let end = b[start..]
        .iter()
        .rposition(|&c| !ascii_space(c))
        .map_or(start, |p| start + p + 1);
    let kept = &s[start..end];
    let non_ascii = |c: Option<&u8>| c.is_some_and(|&c| c >= 0x80);
    if non_ascii(kept.as_bytes().first()) || non_ascii(kept.as_bytes().last()) {
        return kept.trim_matches(py_space);
    }
    kept
}

/// Python's `repr()` of a str (quotes and escapes of control characters).
pub fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) || c == '\u{ad}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `x` equal to `c` (exact: no false positives).
fn eq_bytes(x: u64, c: u8) -> u64 {
    let y = x ^ (LO * u64::from(c));
    !(((y & !HI).wrapping_add(!HI)) | y) & HI
}

/// The high bit of every byte `b` of `x` with `b >= c`, for bytes below 0x80 and `c <= 0x80`
/// (each byte is subtracted from with its high bit set, so no borrow crosses bytes).
fn ge_bytes(x: u64, c: u8) -> u64 {
    (x | HI).wrapping_sub(LO * u64::from(c)) & HI
}

/// The high bit of every byte of `x` that is `lo..=hi` (bytes below 0x80, `hi < 0x80`).
fn in_bytes(x: u64, lo: u8, hi: u8) -> u64 {
    ge_bytes(x, lo) & !ge_bytes(x, hi + 1)
}

/// Whether the client cleanup leaves `bytes` as they are: only ASCII letters, digits, ','
/// and ' ', no leading, trailing or doubled space. Eight bytes per step (SWAR): a byte is
/// bad when its high bit is set or it is none of the kept kinds; a space is doubled when
/// the byte before it (the previous word's last byte for the first one, and "a space"
/// before the start, which catches a leading space) is a space too.
fn is_clean(bytes: &[u8]) -> bool {
    let mut carry = 0x80; // a space "before" the first byte
    let mut check = |x: u64, valid: u64| {
        let letter = in_bytes(x | (LO * 0x20), b'a', b'z');
        let digit = in_bytes(x, b'0', b'9');
        let space = eq_bytes(x, b' ') & valid;
        let keep = letter | digit | eq_bytes(x, b',') | space;
        let bad = ((x & HI) | !keep) & valid;
        let doubled = space & ((space << 8) | carry);
        carry = space >> 56;
        bad | doubled == 0
    };
    let mut chunks = bytes.chunks_exact(8);
    for c in chunks.by_ref() {
        if !check(u64::from_le_bytes(c.try_into().expect("8 bytes")), HI) {
            return false;
        }
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        let valid = HI & ((1u64 << (8 * rest.len())) - 1);
        if !check(u64::from_le_bytes(buf), valid) {
            return false;
        }
    }
    bytes.last() != Some(&b' ')
}

/// AgentGym's TextCraft client cleanup of an action before it reaches the server: drop
/// every character but ASCII letters, digits, commas and spaces, collapse runs of spaces,
/// trim, and read `look` (any case) as `inventory`. Borrows `action` when it is already clean.
pub fn sanitize<'a>(action: &'a str, buf: &'a mut String) -> &'a str {
    /// Bytes the client keeps, as a table (one load per byte instead of range tests).
    static KEEP: [bool; 256] = {
        let mut t = [false; 256];
        let mut b = 0;
        while b < 256 {
            let c = b as u8;
            t[b] = c.is_ascii_alphanumeric() || c == b',' || c == b' ';
            b += 1;
        }
        t
    };
    let ok = |b: u8| KEEP[b as usize];
    let bytes = action.as_bytes();
    let out: &str = if is_clean(bytes) {
        action
    } else {
        buf.clear();
        for &b in bytes.iter().filter(|&&b| ok(b)) {
            if b != b' ' || !(buf.is_empty() || buf.ends_with(' ')) {
                buf.push(char::from(b));
            }
        }
        if buf.ends_with(' ') {
            buf.pop();
        }
        buf.as_str()
    };
    if out.eq_ignore_ascii_case("look") {
        "inventory"
    } else {
        out
    }
}

/// Appends `minecraft:` + text with spaces as underscores (AgentGym's item id rule).
pub fn push_id(buf: &mut String, text: &str) {
    buf.clear();
    buf.push_str(PREFIX);
    for (k, part) in text.split(' ').enumerate() {
        if k > 0 {
            buf.push('_');
        }
        buf.push_str(part);
    }
}

fn invalid(message: impl Into<String>) -> CoreError {
    CoreError::InvalidTask {
        env: "textcraft".into(),
        message: message.into(),
    }
}

/// An explicit task: (goal name id, commands text or None to generate them from the seed).
///
/// Accepted forms: a JSON object `{"goal": "stick", "commands": "..." | [...]}` (commands
/// optional) or the reset observation text itself,
/// `Crafting commands:\n<commands>\n\nGoal: craft <item>.`
pub fn parse(book: &Book, text: &str) -> Result<(u32, Option<String>)> {
    let (goal, commands) = if py_strip(text).starts_with('{') {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| invalid(format!("task spec is not valid JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| invalid("task spec must be a JSON object"))?;
        if let Some(bad) = obj.keys().find(|k| *k != "goal" && *k != "commands") {
            return Err(invalid(format!(
                "unknown task spec key {bad:?} (allowed: goal, commands)"
            )));
        }
        let goal = obj
            .get("goal")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("task spec needs \"goal\": an item name string"))?;
        let commands = match obj.get("commands") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(lines)) => {
                let lines: Option<Vec<&str>> = lines.iter().map(Value::as_str).collect();
                let lines = lines
                    .ok_or_else(|| invalid("\"commands\" must be a string or a list of strings"))?;
                Some(lines.join("\n"))
            }
            Some(_) => {
                return Err(invalid(
                    "\"commands\" must be a string or a list of strings",
                ))
            }
        };
        (goal.to_string(), commands)
    } else {
        const HEAD: &str = "Crafting commands:\n";
        const SEP: &str = "\n\nGoal: craft ";
        match (text.strip_prefix(HEAD), text.rfind(SEP)) {
            (Some(_), Some(cut)) if cut >= HEAD.len() - 1 && text.ends_with('.') => {
                let goal_start = cut + SEP.len();
                if goal_start > text.len() - 1 {
                    return Err(invalid("task spec has no goal item"));
                }
                let commands = text.get(HEAD.len()..cut).unwrap_or("").to_string();
                (text[goal_start..text.len() - 1].to_string(), Some(commands))
            }
            _ => {
                return Err(invalid(
                    "task spec must be a JSON object {\"goal\": ..., \"commands\": ...} or the \
                     text \"Crafting commands:\\n<commands>\\n\\nGoal: craft <item>.\"",
                ))
            }
        }
    };
    let goal = py_strip(&goal);
    let mut id = String::new();
    if goal.starts_with(PREFIX) {
        id.push_str(goal);
    } else {
        push_id(&mut id, goal);
    }
    match book.lookup(&id) {
        Some(g) if !goal.is_empty() && book.name(g).is_item => Ok((g, commands)),
        _ => Err(invalid(format!("unknown goal item {}", py_repr(goal)))),
    }
}
