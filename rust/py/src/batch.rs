//! Batch conversions of the pool bindings: slot ids and actions in, observations out, with
//! no per-element Python objects kept and no per-element Rust allocation.

use crate::errors::to_py;
use agentgym_core::pool::{runs_in_parallel, TextChunk};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyString};
use pyo3::{ffi, Borrowed};

/// Item `i` of `list`, borrowed: no reference-count traffic (under the stable ABI each
/// incref/decref is a function call, a noticeable share of a 4,096-row batch). The pointer
/// stays valid while the list holds the item, so callers use it only until Python code
/// could run again (anything that may call back into Python takes `to_owned()` first).
pub(crate) fn list_item<'a, 'py>(
    list: &'a Bound<'py, PyList>,
    i: usize,
) -> PyResult<Borrowed<'a, 'py, PyAny>> {
    // SAFETY: we are attached to the interpreter (we hold a `Bound`) and `list` is a list.
    // `PyList_GetItem` checks the index (NULL plus IndexError when out of range, which
    // `from_ptr_or_err` turns into the error) and returns a borrowed reference.
    unsafe {
        Borrowed::from_ptr_or_err(
            list.py(),
            ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t),
        )
    }
}

/// A slot id from a borrowed list item: exact ints are read in place; anything else
/// (numpy integer scalars, objects with `__index__`) goes through pyo3's conversion.
fn slot_id(item: Borrowed<'_, '_, PyAny>) -> PyResult<usize> {
    // SAFETY: `item` is a valid object pointer while borrowed (see `list_item`).
    if unsafe { ffi::PyLong_CheckExact(item.as_ptr()) } != 0 {
        // SAFETY: as above; `PyLong_AsSsize_t` runs no Python code. -1 is ambiguous,
        // so an error is checked for only then.
        let v = unsafe { ffi::PyLong_AsSsize_t(item.as_ptr()) };
        if v == -1 {
            if let Some(err) = PyErr::take(item.py()) {
                return Err(err);
            }
        }
        return to_slot(v);
    }
    item.to_owned().extract::<usize>()
}

/// Slot ids from a list of ints, a 1-D numpy integer array (read in place, no Python call
/// per element), or any other iterable of ints.
pub fn slot_ids(ids: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    if let Ok(list) = ids.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        let mut i = 0;
        while i < list.len() {
            out.push(slot_id(list_item(list, i)?)?);
            i += 1;
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
    // Any other iterable of ints (tuple, range, generator, ...).
    ids.try_iter()?
        .map(|item| item?.extract::<usize>())
        .collect()
}

fn to_slot<T: TryInto<usize> + Copy + std::fmt::Display>(v: T) -> PyResult<usize> {
    v.try_into()
        .map_err(|_| PyIndexError::new_err(format!("slot {v} out of range")))
}

/// Python's `int(x)` of each item of a list (`None` kept when `none_ok`), then converted to
/// `T` (OverflowError when out of range): what `[int(x) for x in items]` gives, without a
/// Python-level loop. Exact ints are read directly.
pub fn python_ints<'py, T: for<'a> FromPyObject<'a, 'py>>(
    list: &Bound<'py, PyList>,
    none_ok: bool,
) -> PyResult<Vec<Option<T>>> {
    let py = list.py();
    let mut out = Vec::with_capacity(list.len());
    let mut i = 0;
    while i < list.len() {
        let item = list_item(list, i)?;
        out.push(if none_ok && item.is_none() {
            None
        } else if item.is_exact_instance_of::<PyInt>() {
            Some(item.extract::<T>().map_err(Into::into)?)
        } else {
            // `int(x)`: may run Python code, so the item is owned first.
            let item = item.to_owned();
            // SAFETY: `item` is a valid object; `PyNumber_Long` returns a new reference or
            // NULL with an error set, which `from_owned_ptr_or_err` turns into the `Err`.
            let int =
                unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Long(item.as_ptr())) }?;
            Some(int.extract::<T>().map_err(Into::into)?)
        });
        i += 1;
    }
    Ok(out)
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
            // Two passes: the first only collects item pointers and starts loading each str
            // (thousands of them lie scattered over the heap), the second reads them. No
            // Python code runs in between, so the borrowed items stay valid.
            let mut items = Vec::with_capacity(list.len());
            let mut i = 0;
            while i < list.len() {
                let item = list_item(list, i)?;
                // The header and, for a short ASCII str, its text (which follows the header).
                agentgym_core::util::prefetch(item.as_ptr());
                agentgym_core::util::prefetch(item.as_ptr().cast::<u8>().wrapping_add(64));
                items.push(item);
                i += 1;
            }
            out.ends.reserve(items.len());
            out.text.reserve(items.len() * 24);
            for item in items {
                out.push(item)?;
            }
            return Ok(out);
        }
        if actions.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "actions must be a sequence of str (one per slot id), not a str",
            ));
        }
        for item in actions.try_iter()? {
            out.push(item?.as_borrowed())?;
        }
        Ok(out)
    }

    /// Copies one action's text (`PyUnicode_AsUTF8AndSize` runs no Python code, so the
    /// borrowed item stays valid throughout).
    fn push(&mut self, item: Borrowed<'_, '_, PyAny>) -> PyResult<()> {
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

/// A Python list of `n` str, filled chunk by chunk from the packed observation text while
/// the batch is still running: [`StrList::fill`] is called from the batch's sink on the
/// calling thread with the GIL released, takes the GIL back for one chunk, and lets go of it
/// again, so building the strings overlaps the other threads' stepping.
pub struct StrList {
    /// Created by `PyList_New(n)`: items start out NULL and are set exactly once each.
    list: Py<PyList>,
    filled: usize,
    err: Option<PyErr>,
}

impl StrList {
    pub fn new(py: Python<'_>, n: usize) -> PyResult<Self> {
        // SAFETY: attached (we hold `py`). `PyList_New` returns a new reference or NULL
        // with an error set. Its NULL items are legal for the list's own code (dealloc and
        // GC skip them), and the list reaches Python code only from `finish`, once every
        // item has been set.
        let list = unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyList_New(n as ffi::Py_ssize_t))?
                .cast_into_unchecked::<PyList>()
        };
        Ok(Self {
            list: list.unbind(),
            filled: 0,
            err: None,
        })
    }

    /// Sets items `first..first + chunk.len()` to the chunk's rows (attaching to the
    /// interpreter for the duration; cheap when the caller is attached already). After an
    /// error the rest of the batch is skipped and [`finish`](Self::finish) reports it.
    pub fn fill(&mut self, first: usize, chunk: &TextChunk) {
        if self.err.is_some() {
            return;
        }
        Python::attach(|py| {
            let list = self.list.as_ptr();
            for (i, row) in chunk.rows().enumerate() {
                // SAFETY: attached; `row` is valid UTF-8 of `row.len()` bytes.
                // `PyUnicode_FromStringAndSize` returns a new reference or NULL with an
                // error set.
                let s = unsafe {
                    ffi::PyUnicode_FromStringAndSize(
                        row.as_ptr().cast(),
                        row.len() as ffi::Py_ssize_t,
                    )
                };
                if s.is_null() {
                    self.err = Some(PyErr::fetch(py));
                    return;
                }
                // SAFETY: `list` is our list of `n` items and `first + i < n` (the pool
                // delivers each row of the batch once); `PyList_SetItem` steals `s` (and
                // releases the item's previous value, NULL here). It only fails for a bad
                // index or a non-list, neither of which can happen.
                unsafe { ffi::PyList_SetItem(list, (first + i) as ffi::Py_ssize_t, s) };
                self.filled += 1;
            }
        });
    }

    /// The list, once every item is set; else the error that stopped the filling.
    pub fn finish(self, py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
        if let Some(err) = self.err {
            return Err(err);
        }
        let list = self.list.into_bound(py);
        assert_eq!(
            self.filled,
            list.len(),
            "every observation row was delivered"
        );
        Ok(list)
    }
}

/// Runs a pool batch that hands its observations to a sink (`EpisodePool::step_with` /
/// `reset_with`) without the GIL, and returns its result with the observations as a list
/// of `n` str. A batch that runs in parallel gets its strings built chunk by chunk as the
/// chunks finish (the GIL taken back per chunk, while other threads keep stepping); a
/// one-thread batch gets them after it, without a GIL round trip.
pub fn with_str_list<'py, R: Send>(
    py: Python<'py>,
    n: usize,
    batch: impl FnOnce(&mut dyn FnMut(usize, TextChunk)) -> agentgym_core::Result<R> + Send,
) -> PyResult<(Bound<'py, PyList>, R)> {
    let mut list = StrList::new(py, n)?;
    let out = if runs_in_parallel(n) {
        py.detach(|| batch(&mut |first, chunk| list.fill(first, &chunk)))
    } else {
        let mut chunks = Vec::with_capacity(1);
        let out = py.detach(|| batch(&mut |first, chunk| chunks.push((first, chunk))));
        for (first, chunk) in &chunks {
            list.fill(*first, chunk);
        }
        out
    }
    .map_err(to_py)?;
    Ok((list.finish(py)?, out))
}
