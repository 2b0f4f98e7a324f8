//! What a sleeping cache's pages keep: each evicted mapping's address and size and, when the
//! sleep kept contents, a pinned host copy of its bytes. The copies run on a few copy streams of
//! their own, in chunks spread over them; the pinned backups stay allocated across cycles and are
//! reused by the next sleep of the same layout.

use crate::raw;
use crate::raw::memory::Direction;
use crate::{Device, HostAllocFlags, Result, Stream};
use std::ffi::c_void;
use std::ptr::NonNull;

/// Copy streams a sleep or wake spreads its copies over, so that transfers overlap on the copy
/// engines (not tuned: docs/sleep-wake.md has what this count measured).
const COPY_STREAMS: usize = 4;

/// The largest piece one copy call moves, so that a large mapping spreads over the streams.
const CHUNK_BYTES: usize = 64 << 20;

/// Pinned host memory that backs up one mapping.
#[derive(Debug)]
struct Backup {
    ptr: NonNull<c_void>,
    bytes: usize,
}

// SAFETY: pinned host memory this store alone owns and frees; any thread holding the store
// (behind its mutex) may copy into or out of it and free it.
unsafe impl Send for Backup {}

impl Backup {
    fn new(bytes: usize) -> Result<Self> {
        let ptr = raw::host::alloc(bytes, HostAllocFlags::empty())?;
        Ok(Self { ptr: NonNull::new(ptr).expect("cudaMallocHost returned memory"), bytes })
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        // SAFETY: from `raw::host::alloc`, freed once; no copy is pending on it (every copy is
        // synchronized before the store lets a backup go).
        raw::quiet(unsafe { raw::host::free(self.ptr.as_ptr(), self.bytes) });
    }
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
}

impl Evictions {
    /// Bytes of pinned host memory held: backups of evicted mappings and spare ones.
    pub fn host_bytes(&self) -> usize {
        let held = self.evicted.iter().filter_map(|e| e.backup.as_ref()).chain(&self.spare);
        held.map(|b| b.bytes).sum()
    }

    fn copy_streams(&mut self, device: Device) -> Result<&[Stream]> {
        while self.streams.len() < COPY_STREAMS {
            self.streams.push(Stream::on_device(device)?);
        }
        Ok(&self.streams)
    }

    /// A backup of `bytes`: a spare one of that size, else a new one.
    fn backup(&mut self, bytes: usize) -> Result<Backup> {
        match self.spare.iter().position(|b| b.bytes == bytes) {
            Some(index) => Ok(self.spare.swap_remove(index)),
            None => Backup::new(bytes),
        }
    }

    /// Copies the bytes of the mappings `(at, bytes)` into backups (from the spares where they
    /// fit) and records them as evicted, without unmapping anything; on error nothing is
    /// recorded and the backups go back to the spares.
    ///
    /// # Safety
    /// Each run is mapped and readable on `device`, and no work writes it until this returns.
    pub unsafe fn save(&mut self, device: Device, runs: &[(u64, usize)]) -> Result<()> {
        let mut backups = Vec::with_capacity(runs.len());
        let copied = (|| {
            for &(_, bytes) in runs {
                backups.push(self.backup(bytes)?);
            }
            let streams = self.copy_streams(device)?;
            let pieces = runs.iter().zip(&backups).map(|(&(at, bytes), b)| (at, b.ptr.as_ptr(), bytes));
            // SAFETY: device runs mapped and unwritten (the caller's contract) and backups of their
            // sizes, all synchronized before `copy` returns.
            unsafe { copy(streams, pieces, Direction::DeviceToHost) }
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

    /// Copies the kept bytes back into the evicted mappings (mapped again by the caller) and
    /// empties the list, keeping the backups as spares; on error the list stays as it was.
    ///
    /// # Safety
    /// Every evicted run is mapped again, writable on `device`, and unused until this returns.
    pub unsafe fn restore_contents(&mut self, device: Device) -> Result<()> {
        let pieces: Vec<(u64, *mut c_void, usize)> =
            (self.evicted.iter()).filter_map(|e| e.backup.as_ref().map(|b| (e.at, b.ptr.as_ptr(), e.bytes))).collect();
        let streams = self.copy_streams(device)?;
        // SAFETY: mapped, writable, unused runs (the caller's contract) and their backups, all
        // synchronized before `copy` returns.
        unsafe { copy(streams, pieces.into_iter(), Direction::HostToDevice)? };
        let backups = self.evicted.drain(..).filter_map(|e| e.backup);
        self.spare.extend(backups);
        Ok(())
    }
}

/// Copies each `(device address, host pointer, bytes)` in the given direction, in chunks of at
/// most [`CHUNK_BYTES`] dealt round the streams, then waits for every stream; the first error.
///
/// # Safety
/// Both sides of each piece are valid for `bytes` and untouched by other work until this returns.
unsafe fn copy(
    streams: &[Stream],
    pieces: impl Iterator<Item = (u64, *mut c_void, usize)>,
    direction: Direction,
) -> Result<()> {
    let mut next = 0;
    let mut queued = Ok(());
    'pieces: for (at, host, bytes) in pieces {
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
            let stream = &streams[next % streams.len()];
            next += 1;
            // SAFETY: as above; the copy is waited for below, before the ranges can go.
            if let Err(err) = unsafe { raw::memory::copy_async(dst, src, len, direction, stream.as_raw()) } {
                queued = Err(err);
                break 'pieces;
            }
            offset += len;
        }
    }
    // Every stream is waited for, even after a failed call: copies queued before it still run.
    let waited = streams.iter().map(Stream::synchronize).fold(Ok(()), Result::and);
    queued.and(waited)
}
