//! What a sleeping cache's pages keep: each evicted mapping's address and size and, when the
//! sleep kept contents, a pinned host copy of its bytes. The copies run on a few copy streams of
//! their own, in chunks spread over them, a batch of mappings at a time so that the driver calls
//! on one batch (a sleep's unmaps, a wake's maps) overlap the copies of another; the pinned
//! backups stay allocated across cycles and are reused by the next sleep of the same layout.

use super::pinned_arena::PinnedArena;
use crate::raw;
use crate::raw::memory::Direction;
use crate::{Device, Event, Result, Stream};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// Copy streams a sleep or wake spreads its copies over, so that transfers overlap on the copy
/// engines (not tuned: docs/sleep-wake.md has what this count measured).
const COPY_STREAMS: usize = 4;

/// The largest piece one copy call moves, so that a large mapping spreads over the streams.
const CHUNK_BYTES: usize = 64 << 20;

/// Bytes of mappings a batch gathers (at least one mapping): the copies of one batch run while
/// the host makes the driver calls of the batch before or after it.
const BATCH_BYTES: usize = 256 << 20;

/// Pinned host memory that backs up one mapping: a piece of an arena, which is freed with its
/// last piece.
#[derive(Debug)]
struct Backup {
    ptr: NonNull<c_void>,
    bytes: usize,
    arena: Arc<PinnedArena>,
}

// SAFETY: a piece of pinned host memory no other backup overlaps; any thread holding the store
// (behind its mutex) may copy into or out of it, and drop it (the arena goes with its last piece).
unsafe impl Send for Backup {}

/// Backups of the given sizes, cut from one new arena.
fn new_backups(sizes: &[usize]) -> Result<Vec<Backup>> {
    let total: usize = sizes.iter().sum();
    if total == 0 {
        return Ok(Vec::new());
    }
    let arena = Arc::new(PinnedArena::new(total)?);
    let mut offset = 0;
    Ok(sizes
        .iter()
        .map(|&bytes| {
            // SAFETY: `offset + bytes <= total`: the pieces tile the arena, none overlapping.
            let ptr = unsafe { arena.ptr().byte_add(offset) };
            offset += bytes;
            Backup { ptr, bytes, arena: arena.clone() }
        })
        .collect())
}

/// A mapping given back by a sleep.
#[derive(Debug)]
pub(super) struct Evicted {
    pub at: u64,
    pub bytes: usize,
    backup: Option<Backup>,
}

/// The evicted mappings of a sleeping cache, the spare backups of earlier cycles, and the copy
/// streams.
#[derive(Debug, Default)]
pub(super) struct Evictions {
    evicted: Vec<Evicted>,
    spare: Vec<Backup>,
    streams: Vec<Stream>,
    /// Two sets of an event per copy stream: the ends of the last two batches a sleep queued.
    batch_ends: Vec<Event>,
}

impl Evictions {
    /// Bytes of pinned host memory held: the arenas of the backups of evicted mappings and of
    /// the spare ones.
    pub fn host_bytes(&self) -> usize {
        let held = self.evicted.iter().filter_map(|e| e.backup.as_ref()).chain(&self.spare);
        let mut arenas: Vec<&Arc<PinnedArena>> = held.map(|b| &b.arena).collect();
        arenas.sort_unstable_by_key(|arena| Arc::as_ptr(arena));
        arenas.dedup_by(|a, b| Arc::ptr_eq(a, b));
        arenas.into_iter().map(|arena| arena.bytes()).sum()
    }

    /// Frees the spare backups (their arenas go with their last piece); returns the bytes of
    /// pinned host memory that went back. The backups of evicted mappings stay: they hold the
    /// bytes a wake restores.
    pub fn drop_spares(&mut self) -> usize {
        let before = self.host_bytes();
        self.spare.clear();
        before - self.host_bytes()
    }

    fn copy_streams(&mut self, device: Device) -> Result<&[Stream]> {
        while self.streams.len() < COPY_STREAMS {
            self.streams.push(Stream::on_device(device)?);
        }
        Ok(&self.streams)
    }

    /// A backup for each of `sizes`: spare ones of those sizes, and the rest from one new
    /// arena. The spares that fit none are dropped (their arena goes with its last piece).
    fn backups(&mut self, sizes: &[usize]) -> Result<Vec<Backup>> {
        let mut spare: std::collections::HashMap<usize, Vec<Backup>> = std::collections::HashMap::new();
        for backup in self.spare.drain(..) {
            spare.entry(backup.bytes).or_default().push(backup);
        }
        let taken: Vec<Option<Backup>> = sizes.iter().map(|bytes| spare.get_mut(bytes).and_then(Vec::pop)).collect();
        let missing: Vec<usize> = sizes.iter().zip(&taken).filter(|(_, t)| t.is_none()).map(|(&b, _)| b).collect();
        let mut fresh = match new_backups(&missing) {
            Ok(fresh) => fresh.into_iter(),
            Err(err) => {
                // Nothing lost: the spares stay for a later try.
                self.spare.extend(taken.into_iter().flatten().chain(spare.into_values().flatten()));
                return Err(err);
            }
        };
        Ok(taken.into_iter().map(|t| t.unwrap_or_else(|| fresh.next().expect("one per missing size"))).collect())
    }

    fn batch_ends(&mut self, device: Device) -> Result<()> {
        while self.batch_ends.len() < 2 * COPY_STREAMS {
            self.batch_ends.push(device.run_on(Event::without_timing)??);
        }
        Ok(())
    }

    /// Copies the bytes of the mappings `(at, bytes)` (in address order) into backups, from the
    /// spares where they fit, a batch at a time: once a batch's copies have completed, calls
    /// `done` with its runs (to unmap them) while the next batch's copies run. Records the runs as
    /// evicted with their backups; on error records nothing, puts the backups back among the
    /// spares and returns once no copy is pending (`done` may have been called on some batches).
    ///
    /// # Safety
    /// Each run is mapped and readable on `device`, and no work writes it until this returns; a
    /// run passed to `done` is not read by this call any more.
    pub unsafe fn save(
        &mut self,
        device: Device,
        runs: &[(u64, usize)],
        mut done: impl FnMut(&[(u64, usize)]),
    ) -> Result<()> {
        let sizes: Vec<usize> = runs.iter().map(|&(_, bytes)| bytes).collect();
        let backups = self.backups(&sizes)?;
        let copied = (|| {
            self.copy_streams(device)?;
            self.batch_ends(device)?;
            let mut copier = Copier { streams: &self.streams, next: 0 };
            let pieces: Vec<_> =
                runs.iter().zip(&backups).map(|(&(at, bytes), b)| (at, b.ptr.as_ptr(), bytes)).collect();
            let batches = batches(runs);
            let ends = &self.batch_ends;
            // Batch `b`'s end is recorded in set `b % 2`, which batch `b - 2` used and was
            // waited for before.
            let queue = |copier: &mut Copier<'_>, b: usize| -> Result<()> {
                for &piece in &pieces[batches[b].clone()] {
                    // SAFETY: mapped, unwritten runs (the caller's contract) and backups of their
                    // sizes, waited for before this call returns.
                    unsafe { copier.queue(piece, Direction::DeviceToHost) }?;
                }
                let set = &ends[(b % 2) * COPY_STREAMS..][..COPY_STREAMS];
                copier.streams.iter().zip(set).try_for_each(|(stream, end)| end.record(stream))
            };
            let result = (|| {
                if !batches.is_empty() {
                    queue(&mut copier, 0)?;
                }
                for b in 0..batches.len() {
                    if b + 1 < batches.len() {
                        queue(&mut copier, b + 1)?;
                    }
                    ends[(b % 2) * COPY_STREAMS..][..COPY_STREAMS].iter().try_for_each(Event::synchronize)?;
                    done(&runs[batches[b].clone()]);
                }
                Ok(())
            })();
            // Every stream is waited for, even after a failed call: copies queued before it still
            // run into the backups.
            result.and(copier.wait())
        })();
        match copied {
            Ok(()) => {
                let evicted = runs.iter().zip(backups).map(|(&(at, bytes), b)| Evicted { at, bytes, backup: Some(b) });
                self.evicted.extend(evicted);
                Ok(())
            }
            Err(err) => {
                self.spare.extend(backups);
                Err(err)
            }
        }
    }

    /// Makes the evicted list the runs `unmapped`, with the backups `save` made for them when
    /// `kept` (the backups of runs that stayed mapped go back to the spares).
    pub fn keep_only(&mut self, unmapped: &[(u64, usize)], kept: bool) {
        let mut saved: std::collections::HashMap<u64, Evicted> = self.evicted.drain(..).map(|e| (e.at, e)).collect();
        for &(at, bytes) in unmapped {
            let backup = if kept { saved.remove(&at).and_then(|e| e.backup) } else { None };
            self.evicted.push(Evicted { at, bytes, backup });
        }
        self.spare.extend(saved.into_values().filter_map(|e| e.backup));
    }

    /// The evicted mappings, in the order they were recorded.
    pub fn runs(&self) -> Vec<(u64, usize)> {
        self.evicted.iter().map(|e| (e.at, e.bytes)).collect()
    }

    /// Gives every evicted run memory again, a batch at a time through `map` (which maps a
    /// batch's runs, readable and writable), and copies its kept bytes back while the next batch
    /// is mapped; then empties the list, keeping the backups as spares. On error returns once no
    /// copy is pending, with the list as it was (the runs `map` mapped are the caller's to undo).
    ///
    /// # Safety
    /// A run `map` returns from is mapped, writable on `device`, and unused until this returns.
    pub unsafe fn restore(&mut self, device: Device, mut map: impl FnMut(&[(u64, usize)]) -> Result<()>) -> Result<()> {
        let runs = self.runs();
        let hosts: Vec<_> = self.evicted.iter().map(|e| e.backup.as_ref().map(|b| b.ptr.as_ptr())).collect();
        self.copy_streams(device)?;
        let mut copier = Copier { streams: &self.streams, next: 0 };
        let queued = (|| {
            for batch in batches(&runs) {
                map(&runs[batch.clone()])?;
                for (&(at, bytes), host) in runs[batch.clone()].iter().zip(&hosts[batch]) {
                    if let Some(host) = *host {
                        // SAFETY: mapped, writable, unused runs (the caller's contract) and their
                        // backups, waited for before this call returns.
                        unsafe { copier.queue((at, host, bytes), Direction::HostToDevice) }?;
                    }
                }
            }
            Ok(())
        })();
        queued.and(copier.wait())?;
        let backups = self.evicted.drain(..).filter_map(|e| e.backup);
        self.spare.extend(backups);
        Ok(())
    }
}

/// The runs cut into batches of about [`BATCH_BYTES`], as index ranges.
fn batches(runs: &[(u64, usize)]) -> Vec<std::ops::Range<usize>> {
    let mut batches = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (index, &(_, size)) in runs.iter().enumerate() {
        bytes += size;
        if bytes >= BATCH_BYTES {
            batches.push(start..index + 1);
            (start, bytes) = (index + 1, 0);
        }
    }
    if start < runs.len() {
        batches.push(start..runs.len());
    }
    batches
}

/// Copies dealt round the copy streams in chunks of at most [`CHUNK_BYTES`].
struct Copier<'a> {
    streams: &'a [Stream],
    next: usize,
}

impl Copier<'_> {
    /// Queues the copy of `(device address, host pointer, bytes)` in `direction`.
    ///
    /// # Safety
    /// Both sides are valid for `bytes` and untouched by other work until the copy is waited for.
    unsafe fn queue(&mut self, (at, host, bytes): (u64, *mut c_void, usize), direction: Direction) -> Result<()> {
        let mut offset = 0;
        while offset < bytes {
            let len = (bytes - offset).min(CHUNK_BYTES);
            let device = (at as usize + offset) as *mut c_void;
            // SAFETY: within the piece (the caller's contract).
            let host = unsafe { host.cast::<u8>().add(offset).cast::<c_void>() };
            let (dst, src) = match direction {
                Direction::DeviceToHost => (host, device.cast_const()),
                _ => (device, host.cast_const()),
            };
            let stream = &self.streams[self.next % self.streams.len()];
            self.next += 1;
            // SAFETY: as above; waited for before the ranges can go (the caller's contract).
            unsafe { raw::memory::copy_async(dst, src, len, direction, stream.as_raw()) }?;
            offset += len;
        }
        Ok(())
    }

    /// Waits for every stream; the first error.
    fn wait(&self) -> Result<()> {
        self.streams.iter().map(Stream::synchronize).fold(Ok(()), Result::and)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_gather_runs_up_to_the_batch_size_and_keep_every_run_once() {
        const MIB: usize = 1 << 20;
        let runs: Vec<(u64, usize)> =
            [2, 2, 300, 64, 64, 64, 64, 2].iter().enumerate().map(|(i, &m)| ((i as u64) << 40, m * MIB)).collect();
        assert_eq!(batches(&runs), vec![0..3, 3..7, 7..8]);
        assert_eq!(batches(&runs[..2]), vec![0..2], "a last batch under the size");
        assert!(batches(&[]).is_empty());
    }
}
