//! The ownership-passing operations of a stream: [`Stream::queue`] (any work on owned buffers),
//! [`Stream::upload`] and [`Stream::download`].

use super::Pending;
use crate::error::Result;
use crate::memory::{DeviceMemory, HostMemory};
use crate::pinned_pool::{PinnedPool, PooledPinned};
use crate::raw::same_len;
use crate::scope::StreamScope;
use crate::stream::Stream;
use bytemuck::Pod;

impl Stream {
    /// Queues work on `value`, which the returned [`Pending`] owns until the work has completed;
    /// returns without waiting for the GPU. `f` gets a scope on this stream (copies, memsets,
    /// cuda-mem-kernels launchers) and `&mut value`; only memory reachable from `value` can be
    /// lent to the scope (memory from outside would stay borrowed only until `queue` returns).
    /// Shared read-only data goes into `value` too, e.g. as an `Arc<DeviceBuffer<T>>`.
    ///
    /// `value` is `'static` (it owns what it holds): forgetting the `Pending` must leak it, which
    /// a borrow could not guarantee. If `f` fails, the work it queued is waited for, `value` is
    /// dropped and the error returned.
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{PinnedBuffer, Stream, StreamBuffer};
    /// let stream = Stream::non_blocking()?;
    /// let buffers = (
    ///     StreamBuffer::<u32>::zeroed(stream.clone(), 1 << 20)?,
    ///     PinnedBuffer::from_slice(&vec![9u32; 1 << 20], Default::default())?,
    ///     PinnedBuffer::<u32>::zeroed(1 << 20)?,
    /// );
    /// let pending = stream.queue(buffers, |s, (device, input, output)| {
    ///     let mut view = device.as_mut_slice();
    ///     s.copy_from_host(&mut view, input)?;
    ///     // cuda_mem_kernels::scale_in_place_f32(s, &mut view, 2.0)?; and other launchers
    ///     s.copy_to_host(&mut output[..], &view)
    /// })?;
    /// let (_device, _input, output) = pending.wait()?;
    /// assert!(output.iter().all(|&x| x == 9));
    /// # Ok(()) }
    /// ```
    pub fn queue<T, F>(&self, mut value: T, f: F) -> Result<Pending<T>>
    where
        T: 'static,
        F: for<'s> FnOnce(&'s StreamScope<'s, 's>, &'s mut T) -> Result<()>,
    {
        // Refused before any work: its fence could not be recorded in a capture.
        self.require_outside_capture("Stream::queue")?;
        let queued = StreamScope::run_owned(self, &mut value, f);
        let fence = queued.and_then(|()| self.record_event_untimed());
        match fence {
            Ok(fence) => Ok(Pending::new(value, self.clone(), vec![fence], Vec::new())),
            Err(err) => Err(self.abandon(value, err)),
        }
    }

    /// After a failure with work possibly queued on `value`: waits for the stream, then drops
    /// `value`; if even that fails, leaks it. Returns the error (with the synchronize's failure
    /// attached).
    pub(crate) fn abandon<T>(&self, value: T, err: crate::CudaError) -> crate::CudaError {
        match self.synchronize() {
            Ok(()) => {
                drop(value);
                err
            }
            Err(later) => {
                std::mem::forget(value);
                err.with_later(later)
            }
        }
    }

    /// Copies `host` into `dst` (host to device) and returns at once with a [`Pending`] that owns
    /// both; `wait`, `try_take` or `.await` give them back once the copy has completed.
    ///
    /// Pinned buffers ([`PinnedBuffer`](crate::PinnedBuffer), [`PooledPinned`]) are the DMA's
    /// source directly. A pageable `Vec` is first copied, on the calling thread, into a block of
    /// the shared staging pool ([`PinnedPool::staging`]), which the DMA reads: the runtime's own
    /// path for pageable memory would synchronize the stream before the copy and block the host.
    /// For large pageable copies off the calling thread, see
    /// [`StagedCopier::copy_from_host_on`](crate::StagedCopier::copy_from_host_on).
    ///
    /// Arguments are (destination, source), like every copy in cuda-mem. Lengths must match
    /// ([`LengthMismatch`](crate::ErrorKind::LengthMismatch), and both buffers are dropped).
    pub fn upload<T, D, H>(&self, dst: D, host: H) -> Result<Pending<(D, H)>>
    where
        T: Pod,
        D: DeviceMemory<Elem = T> + Send + 'static,
        H: HostMemory<Elem = T> + Send + 'static,
    {
        same_len(host.host().len(), dst.as_slice().len(), "Stream::upload")?;
        if H::PINNED {
            return self.queue((dst, host), |s, (dst, host)| s.copy_from_host(&mut dst.as_mut_slice(), host.host()));
        }
        let mut block = PinnedPool::staging().alloc::<T>(host.host().len())?;
        block.copy_from_slice(host.host());
        let pending =
            self.queue((dst, host, block), |s, (dst, _, block)| s.copy_from_host(&mut dst.as_mut_slice(), &block[..]))?;
        Ok(pending.keep_apart(|(dst, host, block)| ((dst, host), block), None))
    }

    /// Copies `src` into `host` (device to host) and returns at once with a [`Pending`] that owns
    /// both. Into a pageable `Vec`, the DMA lands in a block of the shared staging pool, which is
    /// copied into the `Vec` when the `Pending` completes (on the thread that takes it back).
    /// Arguments are (destination, source).
    pub fn download<T, H, D>(&self, host: H, src: D) -> Result<Pending<(H, D)>>
    where
        T: Pod,
        H: HostMemory<Elem = T> + Send + 'static,
        D: DeviceMemory<Elem = T> + Send + 'static,
    {
        same_len(src.as_slice().len(), host.host().len(), "Stream::download")?;
        if H::PINNED {
            return self.queue((host, src), |s, (host, src)| s.copy_to_host(host.host_mut(), src.as_slice()));
        }
        let block = PinnedPool::staging().alloc::<T>(src.as_slice().len())?;
        let pending =
            self.queue((host, src, block), |s, (_, src, block)| s.copy_to_host(&mut block[..], src.as_slice()))?;
        Ok(pending.keep_apart(|(host, src, block)| ((host, src), block), Some(copy_back::<T, H, D>)))
    }
}

/// The host step of a staged download: the landed block into the pageable buffer.
fn copy_back<T: Pod, H: HostMemory<Elem = T> + Send + 'static, D>(block: &PooledPinned<T>, (host, _): &mut (H, D)) {
    host.host_mut().copy_from_slice(block);
}
