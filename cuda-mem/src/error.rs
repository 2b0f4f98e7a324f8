//! `CudaError`: every failure of this crate, with what was attempted and why it failed.

use crate::caching::{self, CachingStats};
use crate::pool_stats::PoolStats;
use std::borrow::Cow;
use std::fmt;

/// A `cudaError_t` value from the runtime. Unknown values (from a newer runtime) are kept as is.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{DeviceBuffer, ErrorCode};
/// if let Err(err) = DeviceBuffer::<u8>::zeroed(1 << 50) {
///     assert_eq!(err.code(), Some(ErrorCode::MEMORY_ALLOCATION));
///     println!("{} / {}", err.code().unwrap().name(), err.code().unwrap().description());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.description(), self.name())
    }
}

/// What went wrong, beyond the operation's name.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::{DeviceBuffer, ErrorKind};
/// let mut device = DeviceBuffer::<u32>::zeroed(4)?;
/// let err = device.as_mut_slice().copy_from_host(&[1, 2, 3]).unwrap_err();
/// assert_eq!(err.kind(), &ErrorKind::LengthMismatch { src: 3, dst: 4 });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The runtime returned this code.
    Runtime(ErrorCode),
    /// An allocation failed: the runtime ran out of memory (`code` is its error), or a
    /// [`LimitingResource`](crate::resource::LimitingResource) refused it (`code` is `None`). The report
    /// carries the figures that explain it.
    OutOfMemory {
        /// The runtime's code, when the runtime refused.
        code: Option<ErrorCode>,
        /// What was asked for and what was available.
        report: Box<OomReport>,
    },
    /// `len * size_of::<T>()` does not fit in `usize`.
    SizeOverflow {
        /// Elements asked for.
        len: usize,
        /// Size of one element.
        elem_size: usize,
    },
    /// Source and destination of a copy differ in length.
    LengthMismatch {
        /// Elements in the source.
        src: usize,
        /// Elements in the destination.
        dst: usize,
    },
    /// A device pointer was asked of host memory that was not allocated or registered MAPPED.
    NotMapped,
    /// The runtime reported no usable driver (`code`: `cudaErrorInsufficientDriver` or
    /// `cudaErrorNoDevice`) and the NVIDIA driver's library, `libcuda.so.1`, cannot be loaded:
    /// the machine has no NVIDIA driver. A driver that loads but is older than the runtime stays
    /// [`ErrorKind::Runtime`] with `cudaErrorInsufficientDriver`.
    NoDriver(ErrorCode),
    /// A device ordinal outside `0..count`.
    InvalidDevice {
        /// The ordinal given.
        ordinal: i32,
        /// Devices present.
        count: i32,
    },
    /// The device lacks a capability the operation needs (e.g. memory pools).
    Unsupported(&'static str),
    /// An argument the runtime would reject or misinterpret (e.g. flags wrong for the operation).
    InvalidArgument(&'static str),
    /// The runtime refused to update an executable graph (`cudaGraphExecUpdate`), for this reason.
    GraphUpdateRefused(UpdateRefusal),
    /// A sleep, wake or allocation that a cache's sleep state refuses: a sleep of a sleeping
    /// cache, a wake of an awake one, an allocation from a sleeping one (which, it says).
    SleepState(&'static str),
    /// A library reached at run time (NCCL, through `cuda-mem-nccl`) returned an error, or could
    /// not be loaded.
    Library {
        /// The library, e.g. "NCCL".
        name: &'static str,
        /// Its status code (for NCCL an `ncclResult_t`); `None` when the library or one of its
        /// functions could not be loaded.
        code: Option<i32>,
        /// The library's own words (for NCCL its error string and last error), or the loader's
        /// and what to do about it.
        message: String,
    },
}

/// The figures of an out-of-memory error, each present when it could be read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OomReport {
    /// Bytes asked for.
    pub requested: usize,
    /// Free bytes on the device (`cudaMemGetInfo`) after the failure.
    pub free: Option<usize>,
    /// Total bytes on the device.
    pub total: Option<usize>,
    /// The pool's figures, for stream-ordered allocations. `reserved_current - used_current` is
    /// memory the pool holds but could not use for this request (fragmentation, or memory freed
    /// in stream order that is not yet reusable); the runtime does not report the largest free
    /// block, so that figure is not available.
    pub pool: Option<PoolStats>,
    /// The cap of the limiting adaptor that refused, and what was in use under it.
    pub limit: Option<(usize, usize)>,
    /// The caching allocator's figures after it released every free segment and tried again.
    pub cache: Option<CachingStats>,
}

impl OomReport {
    /// A report with only the requested size.
    pub fn requested(requested: usize) -> Self {
        Self { requested, ..Self::default() }
    }

    /// Reserved but unused pool memory, when the pool is known.
    pub fn pool_slack(&self) -> Option<usize> {
        self.pool.map(|p| p.reserved_current.saturating_sub(p.used_current))
    }
}

/// The error type of every fallible operation in cuda-mem.
///
/// Its message says what was attempted, why it failed and what to try. For a 2 TiB `cudaMalloc` on
/// a device with 80 GiB, 70 of them free:
///
/// ```
/// # use cuda_mem::{CudaError, ErrorCode, ErrorKind, OomReport};
/// let report = OomReport { requested: 1 << 41, free: Some(70 << 30), total: Some(80 << 30), ..Default::default() };
/// let kind = ErrorKind::OutOfMemory { code: Some(ErrorCode::MEMORY_ALLOCATION), report: Box::new(report) };
/// let err = CudaError::new(kind, "cudaMalloc of 2199023255552 bytes on device 0");
/// assert_eq!(
///     err.to_string(),
///     "cudaMalloc of 2199023255552 bytes on device 0 failed: out of memory (cudaErrorMemoryAllocation); \
///      2199023255552 bytes requested, device has 70.00 GiB free of 80.00 GiB; free buffers, trim \
///      memory pools (MemPool::trim_to, PinnedPool::trim), or allocate less"
/// );
/// ```
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::DeviceBuffer;
/// match DeviceBuffer::<f32>::zeroed(1 << 45) {
///     Err(err) if err.is_out_of_memory() => eprintln!("{err}"), // says requested and free bytes
///     Err(err) if err.is_sticky() => std::process::exit(1),       // the context is gone
///     other => drop(other?),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    kind: ErrorKind,
    operation: Cow<'static, str>,
    /// A failure that followed this one in the same operation (see [`CudaError::later`]).
    later: Option<Box<CudaError>>,
}

/// The words of [`ErrorKind::NoDriver`]'s message, for callers that look for them.
pub const NO_DRIVER_MESSAGE: &str = "no NVIDIA driver found (libcuda.so.1 could not be loaded)";

/// `Result` with [`CudaError`].
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

impl CudaError {
    /// An error of `kind` while doing `operation` (a phrase like "cudaMalloc of 64 bytes").
    pub fn new(kind: ErrorKind, operation: impl Into<Cow<'static, str>>) -> Self {
        Self { kind, operation: operation.into(), later: None }
    }

    /// A failure that came after this one within the same call, which the call could not return
    /// on its own: e.g. the synchronize at the end of [`Stream::try_scope`](crate::Stream::try_scope)
    /// when the closure had already failed. The `Display` text shows it after `; then `.
    ///
    /// ```
    /// # use cuda_mem::{CudaError, ErrorCode, ErrorKind};
    /// let closure = CudaError::new(ErrorKind::LengthMismatch { src: 3, dst: 4 }, "cudaMemcpyAsync host to device");
    /// let sync = CudaError::new(ErrorKind::Runtime(ErrorCode::ILLEGAL_ADDRESS), "cudaStreamSynchronize");
    /// let both = closure.with_later(sync.clone());
    /// assert_eq!(both.later(), Some(&sync));
    /// assert_eq!(both.kind(), &ErrorKind::LengthMismatch { src: 3, dst: 4 });
    /// assert_eq!(
    ///     both.to_string(),
    ///     "cudaMemcpyAsync host to device failed: source has 3 elements, destination 4; then \
    ///      cudaStreamSynchronize failed: an illegal memory access was encountered \
    ///      (cudaErrorIllegalAddress) [sticky: the CUDA context is unusable; the process must restart]"
    /// );
    /// ```
    pub fn later(&self) -> Option<&CudaError> {
        self.later.as_deref()
    }

    /// This error with `later` attached after any failure already attached (see
    /// [`CudaError::later`]). The kind, code and operation stay this error's.
    pub fn with_later(mut self, later: CudaError) -> Self {
        let mut slot = &mut self.later;
        while let Some(next) = slot {
            slot = &mut next.later;
        }
        *slot = Some(Box::new(later));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// Adds a pool's figures to an out-of-memory error (other errors pass through).
    pub(crate) fn with_pool_stats(mut self, stats: impl FnOnce() -> Option<PoolStats>) -> Self {
        if let ErrorKind::OutOfMemory { report, .. } = &mut self.kind {
            report.pool = stats();
        }
        self
    }

    /// Adds a caching allocator's figures to an out-of-memory error (other errors pass through).
    fn with_cache_stats(mut self, stats: CachingStats) -> Self {
        if let ErrorKind::OutOfMemory { report, .. } = &mut self.kind {
            report.cache = Some(stats);
        }
        self
    }

    /// What was attempted.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The runtime's code, when the runtime reported the error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self.kind {
            ErrorKind::Runtime(code) | ErrorKind::NoDriver(code) => Some(code),
            ErrorKind::OutOfMemory { code, .. } => code,
            _ => None,
        }
    }

    /// True when the context is unusable after this error (see [`ErrorCode::is_sticky`]).
    pub fn is_sticky(&self) -> bool {
        self.code().is_some_and(ErrorCode::is_sticky)
    }

    /// True when the machine has no NVIDIA driver ([`ErrorKind::NoDriver`]).
    pub fn is_no_driver(&self) -> bool {
        matches!(self.kind, ErrorKind::NoDriver(_))
    }

    /// True for allocation failures.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self.kind, ErrorKind::OutOfMemory { .. })
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: ", self.operation)?;
        match &self.kind {
            ErrorKind::Runtime(code) => write!(f, "{code}")?,
            ErrorKind::NoDriver(code) => write!(
                f,
                "{NO_DRIVER_MESSAGE} (the runtime reported {}); install the NVIDIA driver (for CUDA 13: 580 or newer) \
                 or run on a machine with an NVIDIA GPU",
                code.name()
            )?,
            ErrorKind::OutOfMemory { code, report } => write_oom(f, *code, report)?,
            ErrorKind::SizeOverflow { len, elem_size } => {
                write!(f, "{len} elements of {elem_size} bytes overflow usize")?
            }
            ErrorKind::LengthMismatch { src, dst } => write!(f, "source has {src} elements, destination {dst}")?,
            ErrorKind::NotMapped => f.write_str(
                "the host memory is not mapped into the device address space (allocate it with \
                 HostAllocFlags::MAPPED or register it with HostRegisterFlags::MAPPED)",
            )?,
            ErrorKind::InvalidDevice { ordinal, count } => {
                write!(f, "device {ordinal} does not exist ({count} device(s) present)")?
            }
            ErrorKind::Unsupported(what) => write!(f, "not supported: {what}")?,
            ErrorKind::InvalidArgument(what) => write!(f, "invalid argument: {what}")?,
            ErrorKind::SleepState(what) => write!(f, "refused by the cache's sleep state: {what}")?,
            ErrorKind::GraphUpdateRefused(why) => write!(f, "the runtime refused the update: {why}")?,
            ErrorKind::Library { name, code: Some(code), message } => write!(f, "{name} error {code}: {message}")?,
            ErrorKind::Library { name, code: None, message } => write!(f, "{name} unavailable: {message}")?,
        }
        if self.is_sticky() {
            f.write_str(" [sticky: the CUDA context is unusable; the process must restart]")?;
        }
        if let Some(later) = &self.later {
            write!(f, "; then {later}")?;
        }
        Ok(())
    }
}

fn write_oom(f: &mut fmt::Formatter<'_>, code: Option<ErrorCode>, report: &OomReport) -> fmt::Result {
    match code {
        Some(code) => write!(f, "{code}; {} bytes requested", report.requested)?,
        None => write!(f, "out of memory; {} bytes requested", report.requested)?,
    }
    if let (Some(free), Some(total)) = (report.free, report.total) {
        write!(f, ", device has {} free of {}", gib(free), gib(total))?;
    }
    if let Some(pool) = report.pool {
        write!(
            f,
            "; pool reserved {} bytes, used {} bytes ({} reserved but unused)",
            pool.reserved_current,
            pool.used_current,
            pool.reserved_current.saturating_sub(pool.used_current)
        )?;
    }
    if let Some((cap, in_use)) = report.limit {
        write!(f, "; the limit of {cap} bytes would be exceeded ({in_use} bytes in use under it)")?;
    }
    if let Some(cache) = &report.cache {
        write!(
            f,
            "; the caching allocator still reserves {} bytes ({} allocated, {} free in segments in use, \
             largest free block {} bytes)",
            cache.reserved.current, cache.allocated.current, cache.free_bytes, cache.largest_free_block
        )?;
    }
    let hint = if report.limit.is_some() {
        "raise the limit or free buffers first"
    } else if report.pool.is_some() {
        "try MemPool::trim_to to hand cached memory back, a lower release threshold, a pool \
         max_size, or smaller requests"
    } else {
        "free buffers, trim memory pools (MemPool::trim_to, PinnedPool::trim), or allocate less"
    };
    write!(f, "; {hint}")
}

fn gib(bytes: usize) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl std::error::Error for CudaError {}

impl caching::BackendError for CudaError {
    fn is_out_of_memory(&self) -> bool {
        CudaError::is_out_of_memory(self)
    }
}

/// The cache's errors as the rest of the crate reports them: out of memory keeps the runtime's
/// report and adds the cache's figures; the cache's own refusals name what refused.
impl From<caching::Error<CudaError>> for CudaError {
    fn from(err: caching::Error<CudaError>) -> Self {
        match err {
            caching::Error::Backend(err) => err,
            caching::Error::OutOfMemory { source, stats } => source.with_cache_stats(*stats),
            caching::Error::SizeOverflow { bytes } => {
                CudaError::new(ErrorKind::SizeOverflow { len: bytes, elem_size: 1 }, "CachingAllocator::alloc")
            }
            caching::Error::InvalidConfig(why) => {
                CudaError::new(ErrorKind::InvalidArgument(why), "CachingAllocator::new")
            }
            caching::Error::Refused(why) => CudaError::new(ErrorKind::InvalidArgument(why), "CachingAllocator"),
            caching::Error::SleepState(why) => CudaError::new(ErrorKind::SleepState(why), "DeviceCache"),
        }
    }
}

/// Why the runtime refused [`GraphExec::update`](crate::GraphExec::update) (`cudaGraphExecUpdateResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UpdateRefusal {
    /// The graphs' topologies differ.
    TopologyChanged,
    /// A node changed type.
    NodeTypeChanged,
    /// A kernel node's function changed in a way that cannot be updated.
    FunctionChanged,
    /// Node parameters changed in a way that cannot be updated.
    ParametersChanged,
    /// Something about the nodes cannot be updated at all (memory nodes, for one).
    NotSupported,
    /// A kernel node's function changed to one of another kind (device-side launches).
    UnsupportedFunctionChange,
    /// Node attributes changed in a way that cannot be updated.
    AttributesChanged,
    /// Another refusal: `cudaGraphExecUpdateError`, or a value newer than these bindings.
    Other(u32),
}

impl fmt::Display for UpdateRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TopologyChanged => f.write_str("the topology changed"),
            Self::NodeTypeChanged => f.write_str("a node changed type"),
            Self::FunctionChanged => f.write_str("a kernel node's function changed"),
            Self::ParametersChanged => f.write_str("node parameters changed in a way that cannot be updated"),
            Self::NotSupported => f.write_str("the nodes cannot be updated"),
            Self::UnsupportedFunctionChange => f.write_str("a kernel node's function changed kind"),
            Self::AttributesChanged => f.write_str("node attributes changed in a way that cannot be updated"),
            Self::Other(code) => write!(f, "cudaGraphExecUpdateResult {code}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_say_which_library_and_what_it_said() {
        let kind = ErrorKind::Library { name: "NCCL", code: Some(5), message: "invalid usage".into() };
        let err = CudaError::new(kind, "ncclAllReduce of 4 elements");
        assert_eq!(err.to_string(), "ncclAllReduce of 4 elements failed: NCCL error 5: invalid usage");
        assert_eq!(err.code(), None, "not a runtime code");
        assert!(!err.is_sticky());
        let kind = ErrorKind::Library { name: "NCCL", code: None, message: "libnccl.so.2 not found".into() };
        let err = CudaError::new(kind, "loading NCCL");
        assert_eq!(err.to_string(), "loading NCCL failed: NCCL unavailable: libnccl.so.2 not found");
    }
}
