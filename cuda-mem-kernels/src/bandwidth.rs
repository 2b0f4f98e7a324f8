//! Bandwidth probes: stream every element through 16-byte loads or stores. Timed with events,
//! they give the memory's read or write bandwidth (device memory, or host memory over the bus for
//! a mapped pinned buffer's device view).

use crate::ffi;
use crate::launch::{queue_pattern, queue_reduce};
use cuda_mem::{DeviceSliceMut, DeviceSource, Result, StreamScope};

/// Queues a kernel that reads every element of `data` with 16-byte loads and writes the XOR of all
/// elements to `sink` (exactly one element, else
/// [`InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument)). The result depends on every load,
/// so none is optimised away, and it is checkable:
/// `data.iter().fold(0, |acc, x| acc ^ x)`. `sink` is zeroed on the stream first.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Event, Stream};
/// let stream = Stream::non_blocking()?;
/// let data = DeviceBuffer::<u32>::zeroed(1 << 28)?; // 1 GiB
/// let mut sink = DeviceBuffer::<u32>::zeroed(1)?;
/// let mut sink_view = sink.as_mut_slice();
/// let (start, end) = (Event::new()?, Event::new()?);
/// stream.scope(|s| -> cuda_mem::Result<()> {
///     start.record(s.stream())?;
///     cuda_mem_kernels::stream_read_u32(s, data.as_slice(), &mut sink_view)?;
///     end.record(s.stream())
/// })??;
/// let seconds = end.elapsed_since(&start)?.as_secs_f64();
/// println!("{:.0} GB/s", (1u64 << 30) as f64 / seconds / 1e9);
/// # Ok(()) }
/// ```
pub fn stream_read_u32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    data: impl DeviceSource<'scope, u32>,
    sink: &mut DeviceSliceMut<'v, u32>,
) -> Result<()> {
    // SAFETY: the read probe reads only [0, n) of the data, with 16-byte loads only inside its
    // 16-byte-aligned part, and writes only the sink.
    unsafe { queue_reduce(scope, (ffi::cmk_stream_read_u32, "stream_read_u32"), data, 4, sink) }
}

/// Queues a kernel that writes `value` to every element of `dst` with 16-byte stores.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut buffer = DeviceBuffer::<u32>::zeroed(1 << 28)?;
/// let mut view = buffer.as_mut_slice();
/// stream.scope(|s| cuda_mem_kernels::stream_write_u32(s, &mut view, 0xabcd))??;
/// # Ok(()) }
/// ```
pub fn stream_write_u32<'scope, 'v: 'scope>(
    scope: &StreamScope<'scope, '_>,
    dst: &mut DeviceSliceMut<'v, u32>,
    value: u32,
) -> Result<()> {
    let ptr = scope.device_ptr_mut(dst)?;
    // SAFETY: `ptr` addresses the view's u32 (4-byte aligned), lent to the scope; the write probe
    // writes exactly them, with 16-byte stores only inside its aligned part.
    unsafe { queue_pattern(scope, (ffi::cmk_stream_write_u32, "stream_write_u32"), ptr, dst.len(), 4, value) }
}
