//! Bandwidth probes: stream every element through 16-byte loads or stores. Timed with events,
//! they give the memory's read or write bandwidth (device memory, or host memory over the bus for
//! a mapped pinned buffer's device view).

use crate::ffi;
use crate::launch::{Launch, check, one_element};
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
    one_element("stream_read_u32", sink.len())?;
    let (data_ptr, n) = scope.device_ptr(data)?;
    let sink_ptr = scope.device_ptr_mut(sink)?;
    let launch = Launch::grid_stride(scope, n.div_ceil(4))?;
    // SAFETY: `data_ptr` addresses `n` u32 (4-byte aligned, as every u32 view is) and `sink_ptr`
    // one u32 of device-accessible memory lent to the scope; the kernel reads only [0, n) of
    // `data`, using 16-byte loads only inside its 16-byte-aligned part.
    let code = unsafe { ffi::cmk_stream_read_u32(data_ptr, n, sink_ptr, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching stream_read_u32 on {n} elements"))
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
    let n = dst.len();
    if n == 0 {
        return Ok(());
    }
    let ptr = scope.device_ptr_mut(dst)?;
    let launch = Launch::grid_stride(scope, n.div_ceil(4))?;
    // SAFETY: `ptr` addresses `n` u32 (4-byte aligned) of device-accessible memory lent to the
    // scope; the kernel writes exactly [0, n), with 16-byte stores only inside its aligned part.
    let code = unsafe { ffi::cmk_stream_write_u32(ptr, n, value, launch.grid, launch.block, launch.stream) };
    check(code, || format!("launching stream_write_u32 on {n} elements"))
}
