//! `LoggingResource`: one line per allocation event, as CSV or JSON lines, to any writer.

use super::{MemoryResource, StreamRef};
use crate::error::Result;
use std::io::Write;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Instant;

/// The line format of a [`LoggingResource`]. Both carry the same fields:
/// `time_us, thread, stream, action, ptr, bytes` (`action` is `allocate`, `free` or
/// `allocate_failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Comma-separated, with a header line.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

/// Writes one line per event of the resource it wraps. Writing takes a lock and formats a line:
/// meant for diagnosis and for recording workloads to replay, not for every hot loop.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::resource::{DeviceResource, LogFormat, LoggingResource, ResourceBuffer};
/// use cuda_mem::{Device, Stream};
/// use std::sync::Arc;
/// let file = std::fs::File::create("alloc.csv").expect("a writable file");
/// let logged = Arc::new(LoggingResource::new(DeviceResource::new(Device::current()?), file, LogFormat::Csv));
/// let stream = Stream::new()?;
/// drop(ResourceBuffer::<u8>::zeroed(logged, &stream, 1 << 20)?); // two lines: allocate, free
/// # Ok(()) }
/// ```
pub struct LoggingResource<R> {
    inner: R,
    sink: Mutex<Box<dyn Write + Send>>,
    format: LogFormat,
    started: Instant,
}

impl<R: std::fmt::Debug> std::fmt::Debug for LoggingResource<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggingResource").field("inner", &self.inner).field("format", &self.format).finish()
    }
}

/// The CSV header line.
const CSV_HEADER: &str = "time_us,thread,stream,action,ptr,bytes";

impl<R: MemoryResource> LoggingResource<R> {
    /// Wraps `inner`, writing to `sink` (a CSV header first, for [`LogFormat::Csv`]).
    pub fn new(inner: R, sink: impl Write + Send + 'static, format: LogFormat) -> Self {
        let mut sink: Box<dyn Write + Send> = Box::new(sink);
        if format == LogFormat::Csv {
            let _ = writeln!(sink, "{CSV_HEADER}");
        }
        Self { inner, sink: Mutex::new(sink), format, started: Instant::now() }
    }

    /// Flushes the writer.
    pub fn flush(&self) -> std::io::Result<()> {
        self.sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner).flush()
    }

    /// The wrapped resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    fn log(&self, action: &str, ptr: usize, bytes: usize, stream: StreamRef<'_>) {
        let time_us = self.started.elapsed().as_micros();
        let thread = std::thread::current();
        let thread = thread.name().map_or_else(|| format!("{:?}", thread.id()), str::to_owned);
        let stream = stream.as_raw() as usize;
        let line = match self.format {
            LogFormat::Csv => {
                let thread = thread.replace([',', '\n', '"'], "_");
                format!("{time_us},{thread},{stream:#x},{action},{ptr:#x},{bytes}")
            }
            LogFormat::JsonLines => json_line(time_us, &thread, stream, action, ptr, bytes),
        };
        let mut sink = self.sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Logging must never turn a working allocation into a failure.
        let _ = writeln!(sink, "{line}");
    }
}

/// One JSON line of the log (without its newline).
fn json_line(time_us: u128, thread: &str, stream: usize, action: &str, ptr: usize, bytes: usize) -> String {
    let thread = thread.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    format!(
        "{{\"time_us\":{time_us},\"thread\":\"{thread}\",\"stream\":\"{stream:#x}\",\
         \"action\":\"{action}\",\"ptr\":\"{ptr:#x}\",\"bytes\":{bytes}}}"
    )
}

// SAFETY: see the contract on `MemoryResource`: forwards to `inner`, which upholds it.
unsafe impl<R: MemoryResource> MemoryResource for LoggingResource<R> {
    fn allocate(&self, bytes: usize, stream: StreamRef<'_>) -> Result<NonNull<u8>> {
        let result = self.inner.allocate(bytes, stream);
        match &result {
            Ok(ptr) => self.log("allocate", ptr.as_ptr() as usize, bytes, stream),
            Err(_) => self.log("allocate_failed", 0, bytes, stream),
        }
        result
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, bytes: usize, stream: StreamRef<'_>) {
        self.log("free", ptr.as_ptr() as usize, bytes, stream);
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.deallocate(ptr, bytes, stream) }
    }

    forward_metadata!();
}
