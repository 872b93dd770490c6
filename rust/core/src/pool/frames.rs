//! [`EpisodePool::frames`]: the pictures ([`Env::frame_into`]) of many slots in one batch,
//! drawn on demand; [`EpisodePool::frame_shape`]: their size for this pool's env.
//!
//! A frame is read, not a step: it changes nothing in a healthy slot. An env that panics
//! while drawing, or draws a malformed frame (a byte count other than `height * width * 3`,
//! zero pixels, or bytes appended under a `None`), fails that row only
//! ([`Frame::Failed`], [`CoreError::EnvFailure`]); if the slot's episode was running it ends
//! with stop reason `env_error`, as a panic in `step` ends it, and the rest of the batch is
//! drawn. A panic also drops the slot's env (its state may be half-changed; the next reset
//! builds a new one), so later frames of that slot are [`Frame::Missing`]; after a malformed
//! frame the env is kept.

use super::{chunk_rows, panic_message, EpisodePool, Slot, PAR_MIN_ROWS};
use crate::episode::{EpisodeStatus, StopReason};
use crate::error::{CoreError, Result};
use rayon::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// One row of [`Frames`].
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// No picture: the env draws none (text mode, or an env without pictures), or the slot
    /// has no env any more (it was dropped after a panic).
    Missing,
    /// A `height` x `width` RGB picture: `height * width * 3` bytes of [`Frames::bytes`]
    /// from `offset` ([`Frames::pixels`]), and its [`frame_digest`].
    Image {
        height: u32,
        width: u32,
        offset: usize,
        digest: [u8; 16],
    },
    /// The env panicked while drawing or drew a malformed frame: an
    /// [`CoreError::EnvFailure`] naming the slot and what went wrong.
    Failed(CoreError),
}

/// The pictures of a batch of slots, in the order of the slot ids given: every row's bytes
/// in one buffer.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Frames {
    pub bytes: Vec<u8>,
    pub rows: Vec<Frame>,
}

impl Frames {
    /// The RGB bytes of row `row` (row-major, `height * width * 3`), if it is an image.
    pub fn pixels(&self, row: usize) -> Option<&[u8]> {
        match self.rows.get(row)? {
            Frame::Image {
                height,
                width,
                offset,
                ..
            } => Some(&self.bytes[*offset..*offset + *height as usize * *width as usize * 3]),
            _ => None,
        }
    }

    /// The rows that failed, with their errors, in row order.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &CoreError)> {
        self.rows.iter().enumerate().filter_map(|(i, f)| match f {
            Frame::Failed(e) => Some((i, e)),
            _ => None,
        })
    }
}

/// The content id of a frame: BLAKE3 of the RGB bytes followed by `height` and `width`
/// (little-endian u32), its first 16 bytes. Python's `agentgym._core.frame_digest` is this
/// function, so a frame drawn in Rust and one made in Python have the same id. (The pixels
/// go first: BLAKE3 hashes whole 1 KiB chunks of an input in parallel, SIMD, only while the
/// input is chunk-aligned.)
pub fn frame_digest(height: u32, width: u32, rgb: &[u8]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(rgb);
    h.update(&height.to_le_bytes());
    h.update(&width.to_le_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// Draws slot `slot`'s picture at the end of `out` (see the module docs for failures).
fn frame_slot(slot: usize, s: &mut Slot, out: &mut Vec<u8>) -> Frame {
    let Some(env) = s.env.as_deref() else {
        return Frame::Missing;
    };
    let start = out.len();
    let drawn = catch_unwind(AssertUnwindSafe(|| env.frame_into(out)));
    let appended = out.len() - start;
    let message = match drawn {
        Ok(None) if appended == 0 => return Frame::Missing,
        Ok(None) => format!("malformed frame: {appended} bytes appended without a frame size"),
        Ok(Some((height, width))) => {
            let want = (height as usize)
                .checked_mul(width as usize)
                .and_then(|n| n.checked_mul(3));
            if height > 0 && width > 0 && want == Some(appended) {
                return Frame::Image {
                    height,
                    width,
                    offset: start,
                    digest: frame_digest(height, width, &out[start..]),
                };
            }
            format!(
                "malformed frame: {appended} bytes for {height}x{width} pixels (want \
                 height * width * 3 bytes, at least one pixel)"
            )
        }
        Err(payload) => {
            s.env = None;
            format!("panic while drawing a frame: {}", panic_message(payload))
        }
    };
    out.truncate(start);
    if s.episode.status == EpisodeStatus::Running {
        s.episode.finish(StopReason::EnvError);
        if let Some(h) = s.undo.as_mut() {
            h.clear();
        }
    }
    Frame::Failed(CoreError::EnvFailure { slot, message })
}

impl EpisodePool {
    /// `(height, width)` of this pool's frames ([`crate::env::Env::frame_shape`] of the env
    /// built at construction): fixed for the pool's kwargs; `None` when the env draws no
    /// frames (text mode). A task text may draw another size where the env's README says so
    /// (a `maze` layout of another size).
    pub fn frame_shape(&self) -> Option<(u32, u32)> {
        self.frame_shape
    }

    /// The current picture of each of slots `ids` (a running or finished episode each), in
    /// one batch: rows of [`Frame`] in the order given, their bytes in one buffer. Checked
    /// first, with nothing drawn on an error: ids in range and each once
    /// (`SlotOutOfRange`, `DuplicateSlot`), every slot reset at least once
    /// (`EpisodeNotStarted`). Large batches are drawn in parallel. A failing env fails only
    /// its own row (module docs).
    pub fn frames(&mut self, ids: &[usize]) -> Result<Frames> {
        self.check_ids(ids.iter().copied())?;
        for &slot in ids {
            if self.slots[slot].get_mut().episode.status == EpisodeStatus::Empty {
                return Err(CoreError::EpisodeNotStarted { slot });
            }
        }
        if ids.len() < PAR_MIN_ROWS {
            let mut out = Frames::default();
            for &slot in ids {
                let row = frame_slot(slot, self.slots[slot].get_mut(), &mut out.bytes);
                out.rows.push(row);
            }
            return Ok(out);
        }
        let slots = &self.slots;
        let chunks: Vec<Frames> = ids
            .par_chunks(chunk_rows(ids.len()))
            .map(|ids| {
                let mut out = Frames::default();
                for &slot in ids {
                    let row = frame_slot(slot, &mut slots[slot].lock(), &mut out.bytes);
                    out.rows.push(row);
                }
                out
            })
            .collect();
        let mut out = Frames {
            bytes: Vec::with_capacity(chunks.iter().map(|c| c.bytes.len()).sum()),
            rows: Vec::with_capacity(ids.len()),
        };
        for chunk in chunks {
            let base = out.bytes.len();
            out.bytes.extend_from_slice(&chunk.bytes);
            out.rows.extend(chunk.rows.into_iter().map(|f| match f {
                Frame::Image {
                    height,
                    width,
                    offset,
                    digest,
                } => Frame::Image {
                    height,
                    width,
                    offset: base + offset,
                    digest,
                },
                other => other,
            }));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Task;
    use crate::pool::ResetSpec;
    use crate::registry::Kwargs;

    fn pool(id: &str, n: usize, kwargs: serde_json::Value) -> EpisodePool {
        let kwargs: Kwargs = kwargs.as_object().unwrap().clone();
        let mut pool = EpisodePool::new(id, n, kwargs).unwrap();
        let specs: Vec<ResetSpec> = (0..n)
            .map(|slot| ResetSpec {
                slot,
                task: Task::Index(slot as u64),
                seed: 0,
                max_turns: None,
            })
            .collect();
        pool.reset(&specs).unwrap();
        pool
    }

    #[test]
    fn frames_are_the_envs_own_and_checked_first() {
        for (id, kw) in [
            ("maze", serde_json::json!({"obs": "image"})),
            (
                "gridworld",
                serde_json::json!({"obs": "both", "difficulty": "hard"}),
            ),
        ] {
            let n = 6;
            let mut p = pool(id, n, kw.clone());
            let (h, w) = p.frame_shape().expect("image mode has a frame shape");
            let ids: Vec<usize> = (0..n).rev().collect();
            let frames = p.frames(&ids).unwrap();
            assert_eq!(frames.rows.len(), n);
            assert_eq!(frames.bytes.len(), n * (h * w * 3) as usize);
            for (row, &slot) in ids.iter().enumerate() {
                let mut env = crate::registry::make_env(id, kw.as_object().unwrap()).unwrap();
                env.reset(&Task::Index(slot as u64), 0).unwrap();
                let mut want = Vec::new();
                assert_eq!(env.frame_into(&mut want), Some((h, w)));
                assert_eq!(frames.pixels(row), Some(&want[..]), "{id} slot {slot}");
            }
            // Bad batches are refused before anything is drawn.
            assert!(matches!(
                p.frames(&[0, 99]),
                Err(CoreError::SlotOutOfRange { slot: 99, .. })
            ));
            assert!(matches!(
                p.frames(&[1, 1]),
                Err(CoreError::DuplicateSlot { slot: 1 })
            ));
            let mut fresh = EpisodePool::new(id, 2, kw.as_object().unwrap().clone()).unwrap();
            assert!(matches!(
                fresh.frames(&[1]),
                Err(CoreError::EpisodeNotStarted { slot: 1 })
            ));
        }
        // Text mode: no shape, every row missing, and a finished episode still draws.
        let mut p = pool("maze", 2, serde_json::json!({}));
        assert_eq!(p.frame_shape(), None);
        assert_eq!(p.frames(&[0, 1]).unwrap().rows, vec![Frame::Missing; 2]);
    }

    #[test]
    fn a_failing_frame_ends_only_its_episode() {
        // Over PAR_MIN_ROWS rows: the parallel path.
        for n in [8, 600] {
            let mut p = pool("_test_panic", n, serde_json::json!({"frames": true}));
            assert_eq!(p.frame_shape(), Some((28, 28)));
            let (bad_panic, bad_size) = (3, n - 2);
            let ids: Vec<usize> = (0..n).collect();
            let actions: Vec<&str> = ids
                .iter()
                .map(|&i| match i {
                    _ if i == bad_panic => "frame_panic",
                    _ if i == bad_size => "frame_malformed",
                    _ => "noop",
                })
                .collect();
            p.step(&ids, &actions).unwrap();
            let frames = p.frames(&ids).unwrap();
            let failed: Vec<usize> = frames.failures().map(|(i, _)| i).collect();
            assert_eq!(failed, vec![bad_panic, bad_size]);
            for (row, e) in frames.failures() {
                let CoreError::EnvFailure { slot, message } = e else {
                    panic!("{e:?}")
                };
                assert_eq!(*slot, row);
                assert!(
                    message.contains(if row == bad_panic {
                        "panic"
                    } else {
                        "malformed"
                    }),
                    "{message}"
                );
            }
            assert_eq!(frames.bytes.len(), (n - 2) * 28 * 28 * 3);
            for i in (0..n).filter(|i| !failed.contains(i)) {
                assert_eq!(frames.pixels(i).unwrap().len(), 28 * 28 * 3);
            }
            let reasons = p.stop_reasons();
            for (i, r) in reasons.iter().enumerate() {
                let want = failed.contains(&i).then_some(StopReason::EnvError);
                assert_eq!(*r, want, "slot {i}");
            }
            // The panicked env was dropped (no picture any more, no new failure); the
            // malformed one was kept and fails again; the others step on.
            let again = p.frames(&[bad_panic, bad_size, 0]).unwrap();
            assert_eq!(again.rows[0], Frame::Missing);
            assert!(matches!(again.rows[1], Frame::Failed(_)));
            assert!(matches!(again.rows[2], Frame::Image { .. }));
            assert_eq!(p.stop_reasons()[bad_size], Some(StopReason::EnvError));
            let others: Vec<usize> = ids
                .iter()
                .copied()
                .filter(|i| !failed.contains(i))
                .collect();
            p.step(&others, &vec!["noop"; others.len()]).unwrap();
        }
    }

    #[test]
    fn each_image_row_carries_the_digest_of_its_pixels() {
        let mut p = pool("maze", 3, serde_json::json!({"obs": "image"}));
        let frames = p.frames(&[2, 0, 1]).unwrap();
        for (row, f) in frames.rows.iter().enumerate() {
            let Frame::Image {
                height,
                width,
                digest,
                ..
            } = f
            else {
                panic!("row {row} is not an image: {f:?}");
            };
            let pixels = frames.pixels(row).unwrap();
            assert_eq!(*digest, frame_digest(*height, *width, pixels));
            // the shape is part of the id: the same bytes as another shape differ
            assert_ne!(*digest, frame_digest(*width * 3, *height / 3, pixels));
        }
    }
}
