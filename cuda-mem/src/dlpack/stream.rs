//! The stream contract of `__dlpack__(stream=…)`: the producer makes the consumer's stream wait
//! for the work pending on its own stream, with an event, without blocking the host.

use super::invalid;
use crate::device::CurrentDevice;
use crate::error::Result;
use crate::raw;
use crate::stream::Event;
use crate::stream::Stream;

/// The consumer's stream, as `__dlpack__`'s `stream` argument names it for CUDA memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerStream {
    /// `-1`: the consumer asks for no ordering.
    Unordered,
    /// `None` or `1`: the legacy default stream (of the memory's device).
    Legacy,
    /// `2`: the calling thread's per-thread default stream (of the memory's device).
    PerThread,
    /// Any other positive value: a `cudaStream_t`.
    Handle(raw::cudaStream_t),
}

impl ConsumerStream {
    /// Reads the `stream` argument. `0` is refused (the array API leaves it undefined for CUDA,
    /// as it could mean either default stream), as are values below `-1`: both are
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    ///
    /// # Safety
    /// A value above 2 must be a live stream handle for as long as the result is used.
    pub unsafe fn from_dlpack_arg(stream: Option<i64>) -> Result<Self> {
        match stream {
            None | Some(1) => Ok(Self::Legacy),
            Some(-1) => Ok(Self::Unordered),
            Some(2) => Ok(Self::PerThread),
            Some(handle) if handle > 2 => Ok(Self::Handle(handle as usize as raw::cudaStream_t)),
            Some(other) => Err(invalid(
                "stream 0 and values below -1 are not CUDA streams in the DLPack protocol",
                format!("__dlpack__(stream={other})"),
            )),
        }
    }

    fn handle(self) -> Option<raw::cudaStream_t> {
        match self {
            Self::Unordered => None,
            Self::Legacy => Some(std::ptr::null_mut()),
            // `cudaStreamPerThread` is `((cudaStream_t)0x2)` in the headers.
            Self::PerThread => Some(0x2 as raw::cudaStream_t),
            Self::Handle(handle) => Some(handle),
        }
    }
}

/// Makes `consumer` wait, on the device, for the work queued on `producer` so far: an event
/// recorded on `producer` and `cudaStreamWaitEvent` on `consumer`. The built-in streams are
/// resolved on `producer`'s device. Nothing happens for [`ConsumerStream::Unordered`] or when
/// `consumer` is `producer` itself.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::Stream;
/// use cuda_mem::dlpack::{ConsumerStream, order_consumer_after};
/// let producer = Stream::non_blocking()?;
/// let consumer = Stream::non_blocking()?;
/// // SAFETY: `consumer` outlives the use of the handle.
/// let wanted = unsafe { ConsumerStream::from_dlpack_arg(Some(consumer.as_raw() as i64))? };
/// order_consumer_after(&producer, &wanted)?;
/// # Ok(()) }
/// ```
pub fn order_consumer_after(producer: &Stream, consumer: &ConsumerStream) -> Result<()> {
    let Some(handle) = consumer.handle() else { return Ok(()) };
    if *consumer != ConsumerStream::Legacy && handle == producer.as_raw() {
        return Ok(());
    }
    let ready = Event::without_timing()?;
    ready.record(producer)?;
    let _device = CurrentDevice::set(producer.device())?;
    // SAFETY: the event is live; the handle is a built-in stream, resolved on the producer's
    // device made current above, or a live stream (the `from_dlpack_arg` contract).
    unsafe { raw::streams::wait_event(handle, ready.as_raw()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn the_stream_argument_is_read_as_the_array_api_defines_it() {
        // SAFETY: no handle above 2 is used (only compared).
        let read = |v| unsafe { ConsumerStream::from_dlpack_arg(v) };
        assert_eq!(read(None).unwrap(), ConsumerStream::Legacy);
        assert_eq!(read(Some(1)).unwrap(), ConsumerStream::Legacy);
        assert_eq!(read(Some(2)).unwrap(), ConsumerStream::PerThread);
        assert_eq!(read(Some(-1)).unwrap(), ConsumerStream::Unordered);
        assert_eq!(read(Some(0x7f00)).unwrap(), ConsumerStream::Handle(0x7f00 as raw::cudaStream_t));
        for bad in [0, -2, i64::MIN] {
            let err = read(Some(bad)).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn no_ordering_is_no_cuda_call() {
        // Would fail without a driver if it called the runtime.
        let handle = ConsumerStream::Unordered.handle();
        assert_eq!(handle, None);
        assert_eq!(ConsumerStream::PerThread.handle(), Some(0x2 as raw::cudaStream_t));
    }
}
