//! Batch conversions of the pool bindings: slot ids and actions in, observations out, with
//! no per-element Python objects kept and no per-element Rust allocation.

use agentgym_core::pool::Observations;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

/// Slot ids from a list of ints, a 1-D numpy integer array (read in place, no Python call
/// per element), or any other sequence of ints.
pub fn slot_ids(ids: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    if let Ok(list) = ids.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for item in list.iter() {
            out.push(item.extract::<usize>()?);
        }
        return Ok(out);
    }
    macro_rules! from_array {
        ($($t:ty),*) => {$(
            if let Ok(arr) = ids.cast::<PyArray1<$t>>() {
                let arr = arr.readonly();
                return arr.as_array().iter().map(|&v| to_slot(v)).collect();
            }
        )*};
    }
    from_array!(i64, u64, i32, u32, i16, u16, i8, u8);
    if ids.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "slot ids must be a sequence of ints, not a str",
        ));
    }
    ids.extract::<Vec<usize>>()
}

fn to_slot<T: TryInto<usize> + Copy + std::fmt::Display>(v: T) -> PyResult<usize> {
    v.try_into()
        .map_err(|_| PyIndexError::new_err(format!("slot {v} out of range")))
}

/// The actions of a batch, copied into one text buffer (so no Python object has to stay
/// alive, or be touched again, while the batch runs without the GIL).
#[derive(Default)]
pub struct Actions {
    text: String,
    ends: Vec<usize>,
}

impl Actions {
    /// Reads a list (fast path) or other sequence of str; anything else is a `TypeError`.
    pub fn extract(actions: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut out = Actions::default();
        if let Ok(list) = actions.cast::<PyList>() {
            out.ends.reserve(list.len());
            out.text.reserve(list.len() * 24);
            for item in list.iter() {
                out.push(&item)?;
            }
            return Ok(out);
        }
        if actions.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "actions must be a sequence of str (one per slot id), not a str",
            ));
        }
        for item in actions.try_iter()? {
            out.push(&item?)?;
        }
        Ok(out)
    }

    fn push(&mut self, item: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = item.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "actions must be str, got {}",
                item.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })?;
        self.text.push_str(s.to_str()?);
        self.ends.push(self.text.len());
        Ok(())
    }

    /// One `&str` per action, borrowing the buffer.
    pub fn as_strs(&self) -> Vec<&str> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let s = &self.text[start..end];
                start = end;
                s
            })
            .collect()
    }
}

/// A Python list of str, one per row, each built straight from the packed text.
pub fn str_list<'py>(py: Python<'py>, obs: &Observations) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, obs.iter())
}
