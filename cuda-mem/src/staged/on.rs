//! The stream-ordered forms of [`StagedCopier`]: buffers passed by value, the copy ordered after
//! the work queued on a stream, the lanes fenced by events, and the caller free at once.

use super::{Addr, LaneEnd, Lanes, StagedCopier};
use crate::error::{CudaError, ErrorKind, Result};
use crate::memory::{DeviceMemory, HostMemory};
use crate::pending::Pending;
use crate::pending::job::Job;
use crate::raw::same_len;
use crate::stream::Event;
use crate::stream::Stream;
use bytemuck::Pod;
use std::sync::Arc;

impl StagedCopier {
    /// Copies `src` into `dst` (host to device) through the lanes, ordered after the work queued
    /// on `stream` so far, and returns at once with a [`Pending`] that owns both buffers.
    ///
    /// The lanes copy from a pageable `src` into their pinned slots on their own threads while
    /// the caller goes on (the calling thread does no copying); each lane's stream waits (on the
    /// device) for an event recorded on `stream` now, and for the stream `dst` is ordered on, if
    /// another. The lanes end by recording events, not by synchronizing: the `Pending` completes
    /// when the lanes are done and those events have completed. Work that uses the buffers again
    /// is ordered after the copy: they come back only through the `Pending`, and
    /// [`Pending::then`] makes `stream` wait for the lanes' events first.
    ///
    /// Copies below `small_copy_bytes`, and pinned sources (which need no staging), take
    /// [`Stream::upload`]. Arguments are (destination, source); lengths must match.
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{DeviceBuffer, StagedCopier, Stream};
    /// let copier = StagedCopier::new(Default::default())?;
    /// let stream = Stream::non_blocking()?;
    /// let piece = vec![1u32; 64 << 20]; // pageable, 256 MiB
    /// let device = DeviceBuffer::<u32>::zeroed(piece.len())?;
    /// let pending = copier.copy_from_host_on(&stream, device, piece)?;
    /// // ... the CPU prepares the next piece while the lanes copy this one ...
    /// let (device, piece) = pending.wait()?;
    /// # drop((device, piece)); Ok(()) }
    /// ```
    pub fn copy_from_host_on<T, D, H>(&self, stream: &Stream, dst: D, src: H) -> Result<Pending<(D, H)>>
    where
        T: Pod,
        D: DeviceMemory<Elem = T> + Send + 'static,
        H: HostMemory<Elem = T> + Send + 'static,
    {
        same_len(src.host().len(), dst.as_slice().len(), "staged copy host to device")?;
        let bytes = size_of_val(src.host());
        if H::PINNED || bytes < self.inner.config.small_copy_bytes {
            return stream.upload(dst, src);
        }
        let waits = ready_events(stream, dst.as_slice().owner())?;
        let host = Addr(src.host().as_ptr().cast::<u8>().cast_mut());
        let device = Addr(dst.as_slice().as_device_ptr().cast::<u8>().cast_mut());
        // The lanes read `src` and write `dst` through these addresses; the `Pending` owns both
        // and joins the job before handing them back or dropping them (and leaks them if
        // forgotten), so the addresses stay valid for as long as the job and its DMAs run.
        let job = self.spawn(bytes, waits, move |lane, chunks| lane.upload(chunks, host, device));
        Ok(Pending::new((dst, src), stream.clone(), Vec::new(), vec![job]))
    }

    /// Copies `src` into `dst` (device to host) through the lanes, ordered after the work queued
    /// on `stream` so far, and returns at once with a [`Pending`] that owns both buffers; see
    /// [`StagedCopier::copy_from_host_on`]. The lanes copy out of their slots into a pageable
    /// `dst` on their own threads. Small copies and pinned destinations take
    /// [`Stream::download`].
    pub fn copy_to_host_on<T, H, D>(&self, stream: &Stream, mut dst: H, src: D) -> Result<Pending<(H, D)>>
    where
        T: Pod,
        H: HostMemory<Elem = T> + Send + 'static,
        D: DeviceMemory<Elem = T> + Send + 'static,
    {
        same_len(src.as_slice().len(), dst.host().len(), "staged copy device to host")?;
        let bytes = size_of_val(dst.host());
        if H::PINNED || bytes < self.inner.config.small_copy_bytes {
            return stream.download(dst, src);
        }
        let waits = ready_events(stream, src.as_slice().owner())?;
        let host = Addr(dst.host_mut().as_mut_ptr().cast::<u8>());
        let device = Addr(src.as_slice().as_device_ptr().cast::<u8>().cast_mut());
        // As in `copy_from_host_on`: the `Pending` owns both buffers until the job is joined.
        let job = self.spawn(bytes, waits, move |lane, chunks| lane.download(chunks, host, device));
        Ok(Pending::new((dst, src), stream.clone(), Vec::new(), vec![job]))
    }

    /// Runs one copy on the lanes from a worker thread; the job's outcome is the lanes' events.
    fn spawn(
        &self,
        bytes: usize,
        waits: Vec<Event>,
        work: impl Fn(&mut super::Lane, &[(usize, usize)]) -> Result<()> + Send + Sync + 'static,
    ) -> Arc<Job> {
        let job = Arc::new(Job::default());
        let (lanes, done) = (Arc::clone(&self.inner), Arc::clone(&job));
        self.inner.workers.spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Lanes::run(&lanes, bytes, &waits, LaneEnd::Record, work)
            }))
            .unwrap_or_else(|_| {
                Err(CudaError::new(ErrorKind::Unsupported("a staging lane panicked"), "stream-ordered staged copy"))
            });
            done.finish(outcome);
        });
        job
    }
}

/// Events the lanes wait for before their DMAs: the end of the work queued so far on `stream`,
/// and on `owner` (the stream stream-ordered memory is allocated and zeroed on), if another.
fn ready_events(stream: &Stream, owner: Option<&Stream>) -> Result<Vec<Event>> {
    let mut waits = vec![stream.record_event_untimed()?];
    if let Some(owner) = owner.filter(|owner| !owner.is_same_stream(stream)) {
        waits.push(owner.record_event_untimed()?);
    }
    Ok(waits)
}
