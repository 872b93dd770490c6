//! `_core.parse_action` / `_core.parse_actions`: action extraction from model text.

use agentgym_core::parse::{ActionParser, ParseFormat, DEFAULT_MAX_CHARS};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Texts longer than this are parsed with the GIL released.
const DETACH_MIN_BYTES: usize = 1 << 16;

pub(crate) fn parser(format: &str, max_chars: usize) -> PyResult<ActionParser> {
    let format: ParseFormat = format
        .parse()
        .map_err(|e: agentgym_core::parse::UnknownFormat| PyValueError::new_err(e.to_string()))?;
    Ok(ActionParser::new(format).with_max_chars(max_chars))
}

/// The action in `text` under `format` (auto, react, tags, last_line, raw), or None.
#[pyfunction]
#[pyo3(signature = (text, format = "auto", max_chars = DEFAULT_MAX_CHARS))]
fn parse_action(
    py: Python<'_>,
    text: &str,
    format: &str,
    max_chars: usize,
) -> PyResult<Option<String>> {
    let p = parser(format, max_chars)?;
    if text.len() >= DETACH_MIN_BYTES {
        Ok(py.detach(|| p.parse(text)))
    } else {
        Ok(p.parse(text))
    }
}

/// `parse_action` over a list of texts, in parallel with the GIL released.
#[pyfunction]
#[pyo3(signature = (texts, format = "auto", max_chars = DEFAULT_MAX_CHARS))]
fn parse_actions(
    py: Python<'_>,
    texts: Vec<String>,
    format: &str,
    max_chars: usize,
) -> PyResult<Vec<Option<String>>> {
    let p = parser(format, max_chars)?;
    Ok(py.detach(|| p.parse_many(&texts)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_action, m)?)?;
    m.add_function(wrap_pyfunction!(parse_actions, m)?)?;
    let formats: Vec<&str> = ParseFormat::ALL.iter().map(|f| f.as_str()).collect();
    m.add("PARSE_FORMATS", pyo3::types::PyTuple::new(m.py(), formats)?)?;
    m.add("DEFAULT_MAX_ACTION_CHARS", DEFAULT_MAX_CHARS)?;
    Ok(())
}
