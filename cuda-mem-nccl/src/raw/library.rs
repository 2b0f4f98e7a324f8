//! Finding libnccl at run time and resolving its functions, once per process.
//!
//! The signatures are nccl.h's (stable since NCCL 2.14; `ncclCommRegister`/`ncclCommDeregister`
//! since 2.19). C enums (`ncclResult_t`, `ncclDataType_t`, `ncclRedOp_t`) cross as `c_int`: a
//! value this crate does not know (from a newer NCCL) stays a number, never an invalid Rust enum.

use super::{Comm, RawUniqueId, Status};
use cuda_mem::launch::cudaStream_t;
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// The environment variable that names the library file to load instead of `libnccl.so.2` (e.g.
/// the one in PyTorch's `nvidia/nccl/lib`).
pub const LIBRARY_ENV: &str = "CUDA_MEM_NCCL_LIB";

type GetVersion = unsafe extern "C" fn(*mut c_int) -> Status;
type GetUniqueId = unsafe extern "C" fn(*mut RawUniqueId) -> Status;
type CommInitRank = unsafe extern "C" fn(*mut Comm, c_int, RawUniqueId, c_int) -> Status;
type CommInitAll = unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Status;
type CommCall = unsafe extern "C" fn(Comm) -> Status;
type CommQuery = unsafe extern "C" fn(Comm, *mut c_int) -> Status;
type CommAsyncError = unsafe extern "C" fn(Comm, *mut Status) -> Status;
type GetErrorString = unsafe extern "C" fn(Status) -> *const c_char;
type GetLastError = unsafe extern "C" fn(Comm) -> *const c_char;
type AllReduce = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, cudaStream_t) -> Status;
type Group = unsafe extern "C" fn() -> Status;
type CommRegister = unsafe extern "C" fn(Comm, *mut c_void, usize, *mut *mut c_void) -> Status;
type CommDeregister = unsafe extern "C" fn(Comm, *mut c_void) -> Status;

/// A loaded libnccl: the file it came from, its version code and its functions, valid while
/// `_library` lives (the process's copy is in a static and never unloaded).
pub(crate) struct Nccl {
    _library: libloading::Library,
    pub(crate) file: String,
    pub(crate) version_code: c_int,
    pub(crate) get_unique_id: GetUniqueId,
    pub(crate) comm_init_rank: CommInitRank,
    pub(crate) comm_init_all: CommInitAll,
    pub(crate) comm_finalize: CommCall,
    pub(crate) comm_destroy: CommCall,
    pub(crate) comm_abort: CommCall,
    pub(crate) comm_get_async_error: CommAsyncError,
    pub(crate) comm_count: CommQuery,
    pub(crate) comm_cu_device: CommQuery,
    pub(crate) comm_user_rank: CommQuery,
    pub(crate) get_error_string: GetErrorString,
    pub(crate) get_last_error: GetLastError,
    pub(crate) all_reduce: AllReduce,
    pub(crate) group_start: Group,
    pub(crate) group_end: Group,
    /// NCCL 2.19 and later.
    pub(crate) comm_register: Option<CommRegister>,
    /// NCCL 2.19 and later.
    pub(crate) comm_deregister: Option<CommDeregister>,
}

/// The process's libnccl, loaded on first use; the reason it could not be, from then on.
pub(crate) fn nccl() -> Result<&'static Nccl, &'static str> {
    static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(|| Nccl::open(&candidates())).as_ref().map_err(String::as_str)
}

/// The files to try: `$CUDA_MEM_NCCL_LIB` alone when set, else the soname, then the development
/// link name.
fn candidates() -> Vec<String> {
    match std::env::var(LIBRARY_ENV) {
        Ok(file) if !file.is_empty() => vec![file],
        _ => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    }
}

impl Nccl {
    /// Loads the first of `candidates` that the dynamic loader finds, or says what was tried and
    /// what to do.
    pub(crate) fn open(candidates: &[String]) -> Result<Self, String> {
        let mut tried = Vec::new();
        for file in candidates {
            // SAFETY: loading runs the library's initialisers. The file is NCCL's soname, or the
            // one the process environment names (as LD_LIBRARY_PATH would choose it): the
            // environment's choice, like any shared library the process links.
            match unsafe { libloading::Library::new(file.as_str()) } {
                Ok(library) => return Self::resolve(library, file),
                Err(err) => tried.push(loader_words(file, &err)),
            }
        }
        Err(format!(
            "{} could not be loaded ({}); install NCCL (the libnccl2 package, or pip's \
             nvidia-nccl-cu12 / nvidia-nccl-cu13) where the dynamic loader finds it, or set {LIBRARY_ENV} \
             to the library's path",
            candidates.join(" or "),
            tried.join("; ")
        ))
    }

    fn resolve(library: libloading::Library, file: &str) -> Result<Self, String> {
        let lib = &library;
        // SAFETY: each type below is the function's C signature in nccl.h (see the module docs).
        let nccl = unsafe {
            let get_version: GetVersion = symbol(lib, file, "ncclGetVersion")?;
            let mut version_code = 0;
            if get_version(&mut version_code) != 0 {
                return Err(format!("{file}: ncclGetVersion failed"));
            }
            Nccl {
                file: file.to_string(),
                version_code,
                get_unique_id: symbol(lib, file, "ncclGetUniqueId")?,
                comm_init_rank: symbol(lib, file, "ncclCommInitRank")?,
                comm_init_all: symbol(lib, file, "ncclCommInitAll")?,
                comm_finalize: symbol(lib, file, "ncclCommFinalize")?,
                comm_destroy: symbol(lib, file, "ncclCommDestroy")?,
                comm_abort: symbol(lib, file, "ncclCommAbort")?,
                comm_get_async_error: symbol(lib, file, "ncclCommGetAsyncError")?,
                comm_count: symbol(lib, file, "ncclCommCount")?,
                comm_cu_device: symbol(lib, file, "ncclCommCuDevice")?,
                comm_user_rank: symbol(lib, file, "ncclCommUserRank")?,
                get_error_string: symbol(lib, file, "ncclGetErrorString")?,
                get_last_error: symbol(lib, file, "ncclGetLastError")?,
                all_reduce: symbol(lib, file, "ncclAllReduce")?,
                group_start: symbol(lib, file, "ncclGroupStart")?,
                group_end: symbol(lib, file, "ncclGroupEnd")?,
                comm_register: symbol(lib, file, "ncclCommRegister").ok(),
                comm_deregister: symbol(lib, file, "ncclCommDeregister").ok(),
                _library: library,
            }
        };
        Ok(nccl)
    }
}

/// The dynamic loader's own message (libloading's text wraps it as the error's source), naming
/// the file.
fn loader_words(file: &str, err: &libloading::Error) -> String {
    let words = std::error::Error::source(err).map_or_else(|| err.to_string(), ToString::to_string);
    if words.contains(file) { words } else { format!("{file}: {words}") }
}

/// The function `name` of `library`, or why not.
///
/// # Safety
/// `F` is the function's C signature.
unsafe fn symbol<F: Copy>(library: &libloading::Library, file: &str, name: &str) -> Result<F, String> {
    // SAFETY: the caller's contract; the pointer is copied out and used only while the library
    // stays loaded (it moves into the same `Nccl`).
    match unsafe { library.get::<F>(name) } {
        Ok(function) => Ok(*function),
        Err(err) => {
            Err(format!("{file} has no {name}: not NCCL, or NCCL older than 2.14 ({})", loader_words(file, &err)))
        }
    }
}

/// `major.minor.patch` from NCCL's version code (`major*10000 + minor*100 + patch` since 2.9,
/// `major*1000 + minor*100 + patch` before).
pub(crate) fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 20900 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_what_was_tried_and_what_to_do() {
        let err = Nccl::open(&["libcuda-mem-no-such-nccl.so.2".into()]).err().expect("loaded a missing file");
        assert!(err.starts_with("libcuda-mem-no-such-nccl.so.2 could not be loaded ("), "{err}");
        assert!(err.contains("install NCCL") && err.contains(LIBRARY_ENV), "{err}");
    }

    #[test]
    fn a_library_without_nccl_is_refused_by_name() {
        // libc is loaded already; it has no NCCL function.
        let err = Nccl::open(&["libc.so.6".into()]).err().expect("libc taken for NCCL");
        assert!(err.starts_with("libc.so.6 has no ncclGetVersion: not NCCL"), "{err}");
    }

    #[test]
    fn every_candidate_is_tried_in_order() {
        let err = Nccl::open(&["libcuda-mem-no-a.so".into(), "libcuda-mem-no-b.so".into()]).err().unwrap();
        assert!(err.starts_with("libcuda-mem-no-a.so or libcuda-mem-no-b.so could not be loaded"), "{err}");
        let (a, b) = (err.find("libcuda-mem-no-a.so:"), err.find("libcuda-mem-no-b.so:"));
        assert!(a.is_some() && b.is_some() && a < b, "each loader message, in order: {err}");
    }

    #[test]
    fn version_codes_decode_both_ways() {
        assert_eq!(decode_version(22803), (2, 28, 3));
        assert_eq!(decode_version(21903), (2, 19, 3));
        assert_eq!(decode_version(2804), (2, 8, 4));
        assert_eq!(decode_version(-1), (0, 0, 0));
    }
}
