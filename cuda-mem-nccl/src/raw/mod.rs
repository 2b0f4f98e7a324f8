//! The one layer that calls NCCL. Each function wraps one NCCL call and returns `Result` with the
//! operation's text and NCCL's own words; the types above never see an `ncclResult_t`. Functions
//! that take communicator handles or device addresses are `unsafe`: the caller vouches for them.
//! This layer makes no CUDA runtime call (the layers above use cuda-mem for those).

mod library;

pub use library::LIBRARY_ENV;
pub(crate) use library::decode_version;

use crate::status;
use cuda_mem::launch::cudaStream_t;
use cuda_mem::{CudaError, Result};
use library::{Nccl, nccl};
use std::ffi::{CStr, c_char, c_int, c_void};

/// `ncclComm_t`: a pointer to NCCL's opaque communicator.
pub(crate) type Comm = *mut c_void;
/// `ncclResult_t`.
pub(crate) type Status = c_int;
/// `NCCL_UNIQUE_ID_BYTES`.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawUniqueId {
    pub(crate) internal: [c_char; UNIQUE_ID_BYTES],
}

/// The loaded library, or [`ErrorKind::Library`](cuda_mem::ErrorKind::Library) with no code
/// saying why it could not be loaded.
fn lib(operation: &'static str) -> Result<&'static Nccl> {
    nccl().map_err(|why| status::unavailable(operation, why.to_string()))
}

/// Turns an NCCL return into `Result`, with NCCL's error string and last error.
fn check(nccl: &Nccl, code: Status, comm: Comm, operation: impl FnOnce() -> String) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    Err(failure(nccl, code, comm, operation()))
}

#[cold]
#[inline(never)]
fn failure(nccl: &Nccl, code: Status, comm: Comm, operation: String) -> CudaError {
    // SAFETY: both return NCCL's static strings (or null); `comm` is the handle of the failed
    // call or null, which ncclGetLastError accepts (it reports the thread's last error).
    let (words, last) = unsafe { (text((nccl.get_error_string)(code)), text((nccl.get_last_error)(comm))) };
    status::error(code, &words, &last, operation)
}

/// # Safety
/// `ptr` is null or a NUL-terminated string that lives as long as the library.
unsafe fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().trim().to_string()
}

/// The library's version code (`ncclGetVersion`, read when it was loaded) and its file.
pub(crate) fn version() -> Result<(c_int, &'static str)> {
    let nccl = lib("ncclGetVersion")?;
    Ok((nccl.version_code, nccl.file.as_str()))
}

/// `ncclGetUniqueId`.
pub(crate) fn get_unique_id() -> Result<RawUniqueId> {
    let nccl = lib("ncclGetUniqueId")?;
    let mut id = RawUniqueId { internal: [0; UNIQUE_ID_BYTES] };
    // SAFETY: `id` is a writable ncclUniqueId.
    let code = unsafe { (nccl.get_unique_id)(&mut id) };
    check(nccl, code, std::ptr::null_mut(), || "ncclGetUniqueId".into())?;
    Ok(id)
}

/// `ncclCommInitRank` on the current device.
///
/// # Safety
/// The device the communicator is for is current on this thread.
pub(crate) unsafe fn comm_init_rank(ranks: c_int, id: RawUniqueId, rank: c_int) -> Result<Comm> {
    let nccl = lib("ncclCommInitRank")?;
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: `comm` is writable; the id is passed by value.
    let code = unsafe { (nccl.comm_init_rank)(&mut comm, ranks, id, rank) };
    check(nccl, code, comm, || format!("ncclCommInitRank of rank {rank} of {ranks}"))?;
    Ok(comm)
}

/// `ncclCommInitAll`: one communicator per device, ranks in the order given.
pub(crate) fn comm_init_all(devices: &[c_int]) -> Result<Vec<Comm>> {
    let nccl = lib("ncclCommInitAll")?;
    let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
    let count = c_int::try_from(devices.len()).unwrap_or(c_int::MAX);
    // SAFETY: `comms` has room for `count` handles and `devices` holds `count` ordinals.
    let code = unsafe { (nccl.comm_init_all)(comms.as_mut_ptr(), count, devices.as_ptr()) };
    check(nccl, code, std::ptr::null_mut(), || format!("ncclCommInitAll over devices {devices:?}"))?;
    Ok(comms)
}

/// Defines a wrapper of an NCCL call that takes only a communicator.
macro_rules! comm_call {
    ($($(#[$doc:meta])* $name:ident => $field:ident, $c_name:literal;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// `comm` is a live communicator that no other thread uses meanwhile.
        pub(crate) unsafe fn $name(comm: Comm) -> Result<()> {
            let nccl = lib($c_name)?;
            // SAFETY: the caller's contract.
            let code = unsafe { (nccl.$field)(comm) };
            check(nccl, code, comm, || $c_name.into())
        }
    )*};
}

comm_call! {
    /// `ncclCommFinalize`: flushes the communicator's work (a blocking communicator returns when
    /// it is done) and synchronizes with the other ranks.
    comm_finalize => comm_finalize, "ncclCommFinalize";
    /// `ncclCommDestroy`: frees the communicator (finalizing it first if that was not done).
    comm_destroy => comm_destroy, "ncclCommDestroy";
    /// `ncclCommAbort`: frees the communicator without waiting for its work or its peers.
    comm_abort => comm_abort, "ncclCommAbort";
}

/// Defines a wrapper of an NCCL query that writes one `int`.
macro_rules! comm_query {
    ($($(#[$doc:meta])* $name:ident => $field:ident, $c_name:literal;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// `comm` is a live communicator.
        pub(crate) unsafe fn $name(comm: Comm) -> Result<c_int> {
            let nccl = lib($c_name)?;
            let mut value = 0;
            // SAFETY: the caller's contract; `value` is writable.
            let code = unsafe { (nccl.$field)(comm, &mut value) };
            check(nccl, code, comm, || $c_name.into())?;
            Ok(value)
        }
    )*};
}

comm_query! {
    /// `ncclCommCount`: the number of ranks.
    comm_count => comm_count, "ncclCommCount";
    /// `ncclCommCuDevice`: the communicator's device ordinal.
    comm_cu_device => comm_cu_device, "ncclCommCuDevice";
    /// `ncclCommUserRank`: this communicator's rank.
    comm_user_rank => comm_user_rank, "ncclCommUserRank";
}

/// `ncclCommGetAsyncError`: an error the communicator's work met after its call returned.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn comm_async_error(comm: Comm) -> Result<()> {
    let nccl = lib("ncclCommGetAsyncError")?;
    let mut pending: Status = 0;
    // SAFETY: the caller's contract; `pending` is writable.
    let code = unsafe { (nccl.comm_get_async_error)(comm, &mut pending) };
    check(nccl, code, comm, || "ncclCommGetAsyncError".into())?;
    check(nccl, pending, comm, || "the communicator's work (ncclCommGetAsyncError)".into())
}

/// `ncclAllReduce` of `count` elements.
///
/// # Safety
/// `send` and `recv` each address `count` elements of `datatype` that stay allocated, and are
/// not otherwise written, until `stream` passes the collective; `comm` is a live communicator no
/// other thread uses meanwhile, and `stream` means a stream of its device on this thread.
pub(crate) unsafe fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: Comm,
    stream: cudaStream_t,
) -> Result<()> {
    let nccl = lib("ncclAllReduce")?;
    // SAFETY: the caller's contract.
    let code = unsafe { (nccl.all_reduce)(send, recv, count, datatype, op, comm, stream) };
    check(nccl, code, comm, || format!("ncclAllReduce of {count} elements"))
}

/// `ncclGroupStart`: NCCL calls of this thread up to [`group_end`] are aggregated.
pub(crate) fn group_start() -> Result<()> {
    let nccl = lib("ncclGroupStart")?;
    // SAFETY: no arguments; the group state is this thread's.
    let code = unsafe { (nccl.group_start)() };
    check(nccl, code, std::ptr::null_mut(), || "ncclGroupStart".into())
}

/// `ncclGroupEnd`: launches (or initializes, or finalizes) what the group aggregated.
pub(crate) fn group_end() -> Result<()> {
    let nccl = lib("ncclGroupEnd")?;
    // SAFETY: no arguments; the group state is this thread's.
    let code = unsafe { (nccl.group_end)() };
    check(nccl, code, std::ptr::null_mut(), || "ncclGroupEnd".into())
}

/// Whether the library has `ncclCommRegister` and `ncclCommDeregister` (NCCL 2.19 and later).
pub(crate) fn can_register() -> bool {
    nccl().is_ok_and(|nccl| nccl.comm_register.is_some() && nccl.comm_deregister.is_some())
}

/// The error for a library without buffer registration.
fn no_registration(nccl: &Nccl, operation: &'static str) -> CudaError {
    let (major, minor, patch) = decode_version(nccl.version_code);
    status::unavailable(
        operation,
        format!("{} is NCCL {major}.{minor}.{patch}; buffer registration needs NCCL 2.19 or later", nccl.file),
    )
}

/// `ncclCommRegister` of `bytes` at `ptr`; returns the registration handle.
///
/// # Safety
/// `comm` is a live communicator no other thread uses meanwhile; `ptr` addresses `bytes` of
/// device memory that stays allocated until [`comm_deregister`] of the handle.
pub(crate) unsafe fn comm_register(comm: Comm, ptr: *mut c_void, bytes: usize) -> Result<*mut c_void> {
    let nccl = lib("ncclCommRegister")?;
    let register = nccl.comm_register.ok_or_else(|| no_registration(nccl, "ncclCommRegister"))?;
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: the caller's contract; `handle` is writable.
    let code = unsafe { register(comm, ptr, bytes, &mut handle) };
    check(nccl, code, comm, || format!("ncclCommRegister of {bytes} bytes at {ptr:p}"))?;
    Ok(handle)
}

/// `ncclCommDeregister`.
///
/// # Safety
/// `handle` came from [`comm_register`] on `comm`, a live communicator no other thread uses
/// meanwhile, and is deregistered once.
pub(crate) unsafe fn comm_deregister(comm: Comm, handle: *mut c_void) -> Result<()> {
    let nccl = lib("ncclCommDeregister")?;
    let deregister = nccl.comm_deregister.ok_or_else(|| no_registration(nccl, "ncclCommDeregister"))?;
    // SAFETY: the caller's contract.
    let code = unsafe { deregister(comm, handle) };
    check(nccl, code, comm, || "ncclCommDeregister".into())
}
