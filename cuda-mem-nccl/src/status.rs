//! NCCL's status codes as typed values, and the [`CudaError`]s made from them.

use cuda_mem::{CudaError, ErrorKind};
use std::fmt;

/// The name NCCL errors carry in [`ErrorKind::Library`].
pub const LIBRARY: &str = "NCCL";

/// A failed `ncclResult_t`.
///
/// ```
/// use cuda_mem::{CudaError, ErrorKind};
/// use cuda_mem_nccl::NcclStatus;
/// let kind = ErrorKind::Library { name: "NCCL", code: Some(5), message: "invalid usage".into() };
/// let err = CudaError::new(kind, "ncclAllReduce of 4 elements");
/// assert_eq!(NcclStatus::of(&err), Some(NcclStatus::InvalidUsage));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclStatus {
    /// `ncclUnhandledCudaError`: a CUDA call inside NCCL failed.
    UnhandledCudaError,
    /// `ncclSystemError`: a system call failed (sockets, shared memory, files).
    SystemError,
    /// `ncclInternalError`: NCCL's own bug or a broken invariant.
    InternalError,
    /// `ncclInvalidArgument`: a bad argument (null pointer, bad rank, bad count).
    InvalidArgument,
    /// `ncclInvalidUsage`: a wrong call sequence (e.g. mismatched collectives across ranks).
    InvalidUsage,
    /// `ncclRemoteError`: another rank or the network failed.
    RemoteError,
    /// `ncclInProgress`: a non-blocking operation is still running.
    InProgress,
    /// `ncclTimeout` (newer NCCL).
    Timeout,
    /// A code this crate does not know (a newer NCCL).
    Other(i32),
}

impl NcclStatus {
    /// The status of a non-zero `ncclResult_t`; `None` for `ncclSuccess`.
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            0 => return None,
            1 => Self::UnhandledCudaError,
            2 => Self::SystemError,
            3 => Self::InternalError,
            4 => Self::InvalidArgument,
            5 => Self::InvalidUsage,
            6 => Self::RemoteError,
            7 => Self::InProgress,
            8 => Self::Timeout,
            other => Self::Other(other),
        })
    }

    /// The `ncclResult_t` value.
    pub fn code(self) -> i32 {
        match self {
            Self::UnhandledCudaError => 1,
            Self::SystemError => 2,
            Self::InternalError => 3,
            Self::InvalidArgument => 4,
            Self::InvalidUsage => 5,
            Self::RemoteError => 6,
            Self::InProgress => 7,
            Self::Timeout => 8,
            Self::Other(code) => code,
        }
    }

    /// The name in nccl.h.
    pub fn name(self) -> &'static str {
        match self {
            Self::UnhandledCudaError => "ncclUnhandledCudaError",
            Self::SystemError => "ncclSystemError",
            Self::InternalError => "ncclInternalError",
            Self::InvalidArgument => "ncclInvalidArgument",
            Self::InvalidUsage => "ncclInvalidUsage",
            Self::RemoteError => "ncclRemoteError",
            Self::InProgress => "ncclInProgress",
            Self::Timeout => "ncclTimeout",
            Self::Other(_) => "an unknown ncclResult_t",
        }
    }

    /// The NCCL status an error carries, when NCCL returned it.
    pub fn of(err: &CudaError) -> Option<Self> {
        match err.kind() {
            ErrorKind::Library { name: LIBRARY, code: Some(code), .. } => Self::from_code(*code),
            _ => None,
        }
    }
}

impl fmt::Display for NcclStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// True when `err` says NCCL could not be loaded (no libnccl, or not a usable one).
pub fn is_unavailable(err: &CudaError) -> bool {
    matches!(err.kind(), ErrorKind::Library { name: LIBRARY, code: None, .. })
}

/// The error for a failed NCCL call: the status's name, NCCL's string for it, and NCCL's last
/// error when it adds something.
pub(crate) fn error(code: i32, words: &str, last_error: &str, operation: String) -> CudaError {
    let name = NcclStatus::from_code(code).map_or("ncclSuccess", NcclStatus::name);
    let mut message = if words.is_empty() { name.to_string() } else { format!("{name}: {words}") };
    if !last_error.is_empty() && last_error != words {
        message.push_str("; NCCL's last error: ");
        message.push_str(last_error);
    }
    CudaError::new(ErrorKind::Library { name: LIBRARY, code: Some(code), message }, operation)
}

/// The error for NCCL missing, or lacking what `operation` needs.
pub(crate) fn unavailable(operation: &'static str, why: String) -> CudaError {
    CudaError::new(ErrorKind::Library { name: LIBRARY, code: None, message: why }, operation)
}

/// Both outcomes of a call that does two things: the first failure, with a later one attached.
pub(crate) fn chain(first: cuda_mem::Result<()>, later: cuda_mem::Result<()>) -> cuda_mem::Result<()> {
    match (first, later) {
        (Err(first), Err(later)) => Err(first.with_later(later)),
        (Err(err), Ok(())) | (Ok(()), Err(err)) => Err(err),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// An argument refused before NCCL is called.
pub(crate) fn invalid(what: &'static str, operation: impl Into<std::borrow::Cow<'static, str>>) -> CudaError {
    CudaError::new(ErrorKind::InvalidArgument(what), operation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_success_is_no_status() {
        assert_eq!(NcclStatus::from_code(0), None);
        for code in 1..=9 {
            let status = NcclStatus::from_code(code).unwrap();
            assert_eq!(status.code(), code);
        }
        assert_eq!(NcclStatus::from_code(5), Some(NcclStatus::InvalidUsage));
        assert_eq!(NcclStatus::from_code(42), Some(NcclStatus::Other(42)));
        assert_eq!(NcclStatus::RemoteError.to_string(), "ncclRemoteError (6)");
    }

    #[test]
    fn a_failed_call_carries_the_status_and_nccls_words() {
        let err = error(
            5,
            "invalid usage (run with NCCL_DEBUG=WARN for details)",
            "ncclAllReduce: count mismatch",
            "ncclAllReduce of 4 elements".into(),
        );
        assert_eq!(NcclStatus::of(&err), Some(NcclStatus::InvalidUsage));
        assert!(!is_unavailable(&err));
        let words = "invalid usage (run with NCCL_DEBUG=WARN for details)";
        let last = "NCCL's last error: ncclAllReduce: count mismatch";
        let want = format!("ncclAllReduce of 4 elements failed: NCCL error 5: ncclInvalidUsage: {words}; {last}");
        assert_eq!(err.to_string(), want);
        // A last error equal to the string, or empty, is not repeated.
        let err = error(3, "internal error", "internal error", "ncclCommInitRank".into());
        assert_eq!(err.to_string(), "ncclCommInitRank failed: NCCL error 3: ncclInternalError: internal error");
        let err = error(2, "", "", "ncclGroupEnd".into());
        assert_eq!(err.to_string(), "ncclGroupEnd failed: NCCL error 2: ncclSystemError");
    }

    #[test]
    fn a_missing_library_is_no_status() {
        let err = unavailable("ncclGetUniqueId", "libnccl.so.2 could not be loaded".into());
        assert!(is_unavailable(&err));
        assert_eq!(NcclStatus::of(&err), None);
        assert_eq!(err.to_string(), "ncclGetUniqueId failed: NCCL unavailable: libnccl.so.2 could not be loaded");
        // Another library's error is neither.
        let other = CudaError::new(ErrorKind::Library { name: "cuBLAS", code: Some(5), message: "x".into() }, "y");
        assert!(!is_unavailable(&other) && NcclStatus::of(&other).is_none());
    }
}
