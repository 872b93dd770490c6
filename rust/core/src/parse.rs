//! Extraction of the action from model text, in the formats AgentGym's environments use.
//!
//! Formats ([`ParseFormat`]):
//! - `react`: `Thought: ...\nAction: ...`; the action is the text after the LAST `Action:`
//!   (case-insensitive), up to a hallucinated `Observation:` line if there is one. `Action:`
//!   on its own line followed by the action on the next line works the same way. Text after
//!   `Action Input:` stays part of the action (AgentGym's tool envs read it).
//! - `tags`: the content of the last complete `<action>...</action>` pair (case-insensitive).
//! - `last_line`: the last non-empty line.
//! - `raw`: the whole text.
//! - `auto`: tags, then ReAct, then the last non-empty line.
//!
//! Every result is normalised: end-of-turn junk (`<|im_end|>`, `</s>`, `<|eot_id|>`, ...) and
//! surrounding whitespace, quotes, backticks (also a fenced code block) and markdown emphasis
//! (`**move north**`) are stripped, as is the sentence's full stop of a one-line action with
//! no other `.` (`move north.`; `U.S.` keeps its dots), and the length is capped at
//! `max_chars` characters. ReAct's marker may be set in bold (`**Action:** move north`). An
//! empty result is `None`. No input makes these functions panic; the work is linear in the
//! input length.

use rayon::prelude::*;
use std::fmt;
use std::str::FromStr;

/// Default cap on the length of an extracted action, in characters.
pub const DEFAULT_MAX_CHARS: usize = 4096;

/// Batches at least this long are parsed on rayon's pool.
const PAR_MIN_TEXTS: usize = 256;

/// End-of-turn markers of common chat templates, stripped from the end of model text.
const END_MARKERS: [&str; 9] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "<|eot|>",
    "</s>",
    "<eos>",
];

/// How to find the action in model text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ParseFormat {
    /// Tags, then ReAct, then the last non-empty line.
    #[default]
    Auto,
    /// The text after the last `Action:`.
    React,
    /// The content of the last `<action>...</action>` pair.
    Tags,
    /// The last non-empty line.
    LastLine,
    /// The whole text (normalised).
    Raw,
}

impl ParseFormat {
    pub const ALL: [ParseFormat; 5] = [
        ParseFormat::Auto,
        ParseFormat::React,
        ParseFormat::Tags,
        ParseFormat::LastLine,
        ParseFormat::Raw,
    ];

    /// Canonical name (what `from_str` accepts besides a few aliases).
    pub fn as_str(self) -> &'static str {
        match self {
            ParseFormat::Auto => "auto",
            ParseFormat::React => "react",
            ParseFormat::Tags => "tags",
            ParseFormat::LastLine => "last_line",
            ParseFormat::Raw => "raw",
        }
    }
}

impl fmt::Display for ParseFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`ParseFormat::from_str`]: the name is not a known format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown action format {:?}; expected one of auto, react, tags, last_line, raw",
            self.0
        )
    }
}

impl std::error::Error for UnknownFormat {}

impl FromStr for ParseFormat {
    type Err = UnknownFormat;

    /// Case-insensitive; aliases: `tag`/`xml` for tags, `line` for last_line, `none` for raw.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim_matches(is_blank).to_ascii_lowercase().as_str() {
            "auto" => Ok(ParseFormat::Auto),
            "react" => Ok(ParseFormat::React),
            "tags" | "tag" | "xml" => Ok(ParseFormat::Tags),
            "last_line" | "line" | "lastline" => Ok(ParseFormat::LastLine),
            "raw" | "none" => Ok(ParseFormat::Raw),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

/// A configured parser: one per env (format and length cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionParser {
    pub format: ParseFormat,
    pub max_chars: usize,
}

impl Default for ActionParser {
    fn default() -> Self {
        Self::new(ParseFormat::Auto)
    }
}

impl ActionParser {
    pub fn new(format: ParseFormat) -> Self {
        Self {
            format,
            max_chars: DEFAULT_MAX_CHARS,
        }
    }

    pub fn with_max_chars(mut self, max_chars: usize) -> Self {
        self.max_chars = max_chars;
        self
    }

    /// The action in `text`, normalised, or `None` when the format finds none.
    pub fn parse(&self, text: &str) -> Option<String> {
        let text = strip_end_markers(text);
        let raw = match self.format {
            ParseFormat::Auto => extract_tag(text)
                .or_else(|| extract_react(text))
                .or_else(|| extract_last_line(text)),
            ParseFormat::React => extract_react(text),
            ParseFormat::Tags => extract_tag(text),
            ParseFormat::LastLine => extract_last_line(text),
            ParseFormat::Raw => Some(text),
        }?;
        normalize(raw, self.max_chars)
    }

    /// Parse many texts; large batches run in parallel. Output order matches input order.
    pub fn parse_many<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Vec<Option<String>> {
        if texts.len() >= PAR_MIN_TEXTS {
            texts
                .par_iter()
                .with_min_len(PAR_MIN_TEXTS / 4)
                .map(|t| self.parse(t.as_ref()))
                .collect()
        } else {
            texts.iter().map(|t| self.parse(t.as_ref())).collect()
        }
    }
}

/// The action in `text` under `format`, with the default length cap.
pub fn parse_action(text: &str, format: ParseFormat) -> Option<String> {
    ActionParser::new(format).parse(text)
}

/// [`parse_action`] over a batch (parallel for large batches).
pub fn parse_actions<S: AsRef<str> + Sync>(
    texts: &[S],
    format: ParseFormat,
) -> Vec<Option<String>> {
    ActionParser::new(format).parse_many(texts)
}

/// Byte offset of the last case-insensitive occurrence of the ASCII `needle` in `hay[..end]`.
/// The offset is a char boundary because the needle starts with an ASCII byte.
fn rfind_ci(hay: &str, needle: &str, end: usize) -> Option<usize> {
    let h = &hay.as_bytes()[..end.min(hay.len())];
    let n = needle.as_bytes();
    if n.is_empty() || n.len() > h.len() {
        return None;
    }
    (0..=h.len() - n.len())
        .rev()
        .find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Byte offset of the first case-insensitive occurrence of `needle` in `hay[start..]`.
fn find_ci(hay: &str, needle: &str, start: usize) -> Option<usize> {
    let h = hay.as_bytes();
    let n = needle.as_bytes();
    if n.is_empty() || start > h.len() || n.len() > h.len() - start {
        return None;
    }
    (start..=h.len() - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Whitespace or a control character: stripped from the edges of an action.
fn is_blank(c: char) -> bool {
    c.is_whitespace() || c.is_control()
}

/// `text` without trailing whitespace and end-of-turn markers (repeatedly).
fn strip_end_markers(text: &str) -> &str {
    let mut t = text.trim_end_matches(is_blank);
    loop {
        let before = t.len();
        for m in END_MARKERS {
            if t.len() >= m.len()
                && t.as_bytes()[t.len() - m.len()..].eq_ignore_ascii_case(m.as_bytes())
            {
                // The marker is ASCII, so the cut is a char boundary.
                t = t[..t.len() - m.len()].trim_end_matches(is_blank);
            }
        }
        if t.len() == before {
            return t;
        }
    }
}

/// Content of the last complete `<action>...</action>` pair.
fn extract_tag(text: &str) -> Option<&str> {
    let close = rfind_ci(text, "</action>", text.len())?;
    let open = rfind_ci(text, "<action>", close)?;
    Some(&text[open + "<action>".len()..close])
}

/// Text after the last `Action:`, cut at a following `Observation:` line.
fn extract_react(text: &str) -> Option<&str> {
    let at = rfind_ci(text, "action:", text.len())?;
    // `**Action:** x`: the bold's closing stars belong to the marker
    let rest = text[at + "action:".len()..].trim_start_matches('*');
    let end = find_ci(rest, "\nobservation:", 0).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The last line that is not blank.
fn extract_last_line(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .find(|l| !l.trim_matches(is_blank).is_empty())
}

/// Trim, strip surrounding quotes/backticks/code fences and end markers, cap the length.
fn normalize(raw: &str, max_chars: usize) -> Option<String> {
    let mut s = strip_end_markers(raw).trim_matches(is_blank);
    loop {
        let before = s.len();
        s = strip_fence(s);
        for q in ['"', '\'', '`', '*'] {
            if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
                s = s[1..s.len() - 1].trim_matches(is_blank);
            }
        }
        s = strip_full_stop(s);
        s = strip_end_markers(s).trim_matches(is_blank);
        if s.len() == before {
            break;
        }
    }
    if s.is_empty() {
        return None;
    }
    let cut = s.char_indices().nth(max_chars).map_or(s.len(), |(i, _)| i);
    let capped = s[..cut].trim_end_matches(is_blank);
    (!capped.is_empty()).then(|| capped.to_string())
}

/// A one-line action without its sentence's full stop: `move north.` reads `move north`. Only
/// a single `.` after a letter, a digit, a closing quote or bracket goes, and only where the action has
/// no other `.` (`U.S.`, `3.5.` and code over several lines stay as they are).
fn strip_full_stop(s: &str) -> &str {
    let Some(body) = s.strip_suffix('.') else {
        return s;
    };
    let ends_in_word = body
        .chars()
        .last()
        .is_some_and(|c| c.is_alphanumeric() || matches!(c, '"' | '\'' | '`' | '*' | ']' | ')'));
    if ends_in_word && !body.contains(['.', '\n']) {
        body.trim_end_matches(is_blank)
    } else {
        s
    }
}

/// A fenced code block ```lang\n...\n``` reduced to its body.
fn strip_fence(s: &str) -> &str {
    if s.len() < 6 || !s.starts_with("```") || !s.ends_with("```") {
        return s;
    }
    let inner = &s[3..s.len() - 3];
    match inner.find('\n') {
        // The first line is a language tag when it is a single word (or empty).
        Some(nl)
            if !inner[..nl]
                .trim_matches(is_blank)
                .contains(char::is_whitespace) =>
        {
            inner[nl + 1..].trim_matches(is_blank)
        }
        _ => inner.trim_matches(is_blank),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(text: &str, fmt: &str) -> Option<String> {
        parse_action(text, fmt.parse().unwrap())
    }

    /// What a small instruct model writes around an action, read as the action; and what
    /// still is no action, or keeps its dots.
    #[test]
    fn tolerated_forms() {
        let cases: &[(&str, Option<&str>)] = &[
            ("move north", Some("move north")),
            ("Action: move north", Some("move north")),
            ("action: move north.", Some("move north")),
            ("**Action:** move north", Some("move north")),
            ("Action: **move north**", Some("move north")),
            ("Action: \"move north\".", Some("move north")),
            ("I will go.\nAction: `guess crane`", Some("guess crane")),
            ("guess crane.", Some("guess crane")),
            ("Action: search[red shoes].", Some("search[red shoes]")),
            (
                "Action: replace 4 for i in x:.",
                Some("replace 4 for i in x:."),
            ),
            ("answer[U.S.]", Some("answer[U.S.]")),
            ("answer: the U.S.", Some("answer: the U.S.")),
            ("set x to 3.5.", Some("set x to 3.5.")),
            ("move north..", Some("move north..")),
            ("...", Some("...")),
            (
                "Action: replace 2-2\nreturn y.",
                Some("replace 2-2\nreturn y."),
            ),
            ("Action: ****", None),
            ("  .  ", Some(".")),
        ];
        for &(text, want) in cases {
            assert_eq!(p(text, "auto").as_deref(), want, "auto parse of {text:?}");
        }
    }

    #[test]
    fn format_table() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("Thought: go.\nAction: go north", "react", Some("go north")),
            ("Thought: x\nAction:\ngo north\n", "react", Some("go north")),
            (
                "Action: a\nObservation: b\nThought: c\nAction: take key",
                "react",
                Some("take key"),
            ),
            ("Action: look\nObservation: you see", "react", Some("look")),
            ("action: LOOK", "react", Some("LOOK")),
            (
                "Thought: t\nAction: get_weather with Action Input: {\"city\": \"Paris\"}",
                "react",
                Some("get_weather with Action Input: {\"city\": \"Paris\"}"),
            ),
            (
                "Action: `craft 4 oak planks`<|im_end|>",
                "react",
                Some("craft 4 oak planks"),
            ),
            (
                "Action: \"search[shoes]\"</s>",
                "react",
                Some("search[shoes]"),
            ),
            ("Action:\n```\nSELECT 1;\n```", "react", Some("SELECT 1;")),
            (
                "Action:\n```sql\nSELECT 1;\n```",
                "react",
                Some("SELECT 1;"),
            ),
            ("no action here", "react", None),
            ("Action:   \n  ", "react", None),
            (
                "<action>a</action> then <action> b </action>",
                "tags",
                Some("b"),
            ),
            ("<ACTION>x</Action>", "tags", Some("x")),
            ("<action>a</action><action>unclosed", "tags", Some("a")),
            ("<action>unclosed", "tags", None),
            ("</action><action>", "tags", None),
            ("think\n\ngo west\n\n", "last_line", Some("go west")),
            ("go west<|eot_id|>\n", "last_line", Some("go west")),
            ("  \n\t\n", "last_line", None),
            ("  whole text  ", "raw", Some("whole text")),
            ("Thought\nAction: x\n<action>y</action>", "auto", Some("y")),
            ("Thought\nAction: x", "auto", Some("x")),
            ("I will\nmove left", "auto", Some("move left")),
            ("", "auto", None),
            ("<|im_end|>", "auto", None),
            ("''", "auto", None),
            ("\"", "auto", Some("\"")),
        ];
        for (text, fmt, want) in cases {
            assert_eq!(p(text, fmt).as_deref(), *want, "text {text:?} format {fmt}");
        }
    }

    #[test]
    fn format_names() {
        for f in ParseFormat::ALL {
            assert_eq!(f.as_str().parse::<ParseFormat>(), Ok(f));
        }
        assert_eq!("XML".parse::<ParseFormat>(), Ok(ParseFormat::Tags));
        assert_eq!("line".parse::<ParseFormat>(), Ok(ParseFormat::LastLine));
        let err = "json".parse::<ParseFormat>().unwrap_err();
        assert!(err.to_string().contains("json"));
    }

    #[test]
    fn caps_length_at_char_boundary() {
        let text = format!("Action: {}", "é".repeat(10));
        let out = ActionParser::new(ParseFormat::React)
            .with_max_chars(3)
            .parse(&text);
        assert_eq!(out.as_deref(), Some("ééé"));
        let out = ActionParser::new(ParseFormat::React)
            .with_max_chars(0)
            .parse(&text);
        assert_eq!(out, None);
    }

    #[test]
    fn batch_matches_single_and_keeps_order() {
        let texts: Vec<String> = (0..1000)
            .map(|i| format!("Thought: t\nAction: step {i}"))
            .collect();
        let out = parse_actions(&texts, ParseFormat::Auto);
        for (i, o) in out.iter().enumerate() {
            assert_eq!(o.as_deref(), Some(format!("step {i}").as_str()));
        }
    }

    #[test]
    fn huge_inputs() {
        let big = "Action: go\n".repeat(400_000); // 4.4 MB
        assert_eq!(p(&big, "auto").as_deref(), Some("go"));
        let one_line = "x".repeat(3_000_000);
        let out = p(&format!("Action: {one_line}"), "react").unwrap();
        assert_eq!(out.chars().count(), DEFAULT_MAX_CHARS);
        let tags = "<action>".repeat(500_000);
        assert_eq!(p(&tags, "tags"), None);
    }

    fn check_output(out: &Option<String>, max_chars: usize) {
        if let Some(s) = out {
            assert!(!s.is_empty());
            assert_eq!(s.trim_matches(is_blank), s);
            assert!(s.chars().count() <= max_chars);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn never_panics_on_strings(s in any::<String>(), max in 0usize..64) {
            for f in ParseFormat::ALL {
                let out = ActionParser::new(f).with_max_chars(max).parse(&s);
                check_output(&out, max);
            }
        }

        #[test]
        fn never_panics_on_lossy_bytes(b in proptest::collection::vec(any::<u8>(), 0..512)) {
            let s = String::from_utf8_lossy(&b);
            for f in ParseFormat::ALL {
                check_output(&parse_action(&s, f), DEFAULT_MAX_CHARS);
            }
        }

        #[test]
        fn never_panics_on_structured(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("Action:".to_string()), Just("<action>".to_string()),
                    Just("</action>".to_string()), Just("\n".to_string()),
                    Just("<|im_end|>".to_string()), Just("```".to_string()),
                    Just("\"".to_string()), Just("Observation:".to_string()),
                    "\\PC{0,6}",
                ],
                0..40,
            )
        ) {
            let s: String = parts.concat();
            for f in ParseFormat::ALL {
                check_output(&parse_action(&s, f), DEFAULT_MAX_CHARS);
            }
        }

        #[test]
        fn react_recovers_the_action(action in "[a-z][a-z0-9 \\[\\]]{0,30}[a-z0-9\\]]",
                                     thought in "[^\\n]{0,40}") {
            let text = format!("Thought: {thought}\nAction: {action}<|im_end|>");
            prop_assert_eq!(p(&text, "react"), Some(action.clone()));
            let tagged = format!("{thought}\n<action>{action}</action>");
            prop_assert_eq!(p(&tagged, "tags"), Some(action));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]

        #[test]
        fn never_panics_on_megabyte_strings(s in "\\PC{1,40}", reps in 20_000usize..60_000) {
            let big = s.repeat(reps);
            for f in ParseFormat::ALL {
                check_output(&parse_action(&big, f), DEFAULT_MAX_CHARS);
            }
        }
    }
}
