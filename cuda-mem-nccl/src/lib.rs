//! # cuda-mem-nccl
//!
//! NCCL collectives over cuda-mem memory: an all-reduce of pool buffers
//! ([`StreamBuffer`](cuda_mem::StreamBuffer)), caching-allocator buffers
//! ([`CachedBuffer`](cuda_mem::CachedBuffer)) or any device view, with the same guarantee as
//! cuda-mem's copies and kernels: the memory stays borrowed until the stream has passed the
//! collective.
//!
//! | need | API |
//! |---|---|
//! | one process (or thread) per GPU | [`UniqueId::new`] on one rank, sent to the others; [`Communicator::init_rank`] on each |
//! | one process, several GPUs | [`Communicator::init_all`] → [`Clique`] |
//! | an all-reduce on one rank's stream | [`Communicator::all_reduce`] / [`Communicator::all_reduce_in_place`] inside [`Stream::scope`](cuda_mem::Stream::scope) |
//! | all-reduces of several ranks from one thread | [`Group`] (`ncclGroupStart`/`ncclGroupEnd`), which waits for every stream |
//! | a buffer NCCL prepares once (NCCL 2.19+) | [`Communicator::register`] → [`Registered`] |
//! | the element type | [`NcclType`]: the NCCL data type follows from `T` ([`DataType`]) |
//!
//! ## Loading
//! libnccl is loaded at run time, on first use: `$CUDA_MEM_NCCL_LIB` when set, else
//! `libnccl.so.2`, else `libnccl.so`. Nothing links against it, so code using this crate builds
//! and runs where NCCL is missing; every call then fails with
//! [`ErrorKind::Library`](cuda_mem::ErrorKind::Library) without a code, whose message says what
//! was tried and what to install ([`is_unavailable`]). NCCL's own failures carry its
//! `ncclResult_t` ([`NcclStatus::of`]), its error string and its last error.
//!
//! ## Threads and lifetimes
//! A [`Communicator`] is `Send` but not `Sync`: NCCL lets one thread at a time use a
//! communicator. Buffers stay borrowed by the scope or group that queued a collective until its
//! streams are synchronized; a communicator stays borrowed as long, and is destroyed (finalized
//! first: its work done, its peers synchronized) only when dropped. A [`Registered`] buffer owns
//! its memory and deregisters it before freeing it; forgetting one leaks the memory rather than
//! freeing it under NCCL.
//!
//! Keep NCCL's NVLink multicast off on hosts whose notes ask for it (`NCCL_NVLS_ENABLE=0`).
#![warn(missing_docs)]

mod communicator;
mod dtype;
mod group;
mod raw;
mod register;
mod status;
mod unique_id;

pub use communicator::{Clique, Communicator};
pub use dtype::{DataType, NcclType, ReduceOp};
pub use group::Group;
pub use raw::LIBRARY_ENV;
#[allow(deprecated)]
pub use register::Registrable;
pub use register::{RegisterError, Registered};
pub use status::{LIBRARY, NcclStatus, is_unavailable};
pub use unique_id::UniqueId;

/// The loaded NCCL's version (major, minor, patch) and the file it came from; loads it on first
/// use. Fails with [`ErrorKind::Library`](cuda_mem::ErrorKind::Library) (no code) where NCCL is
/// missing.
///
/// ```no_run
/// match cuda_mem_nccl::version() {
///     Ok(((major, minor, patch), file)) => println!("NCCL {major}.{minor}.{patch} from {file}"),
///     Err(err) => eprintln!("{err}"), // says what was tried and what to install
/// }
/// ```
pub fn version() -> cuda_mem::Result<((u32, u32, u32), &'static str)> {
    let (code, file) = raw::version()?;
    Ok((raw::decode_version(code), file))
}

/// Compile-time proof of the Send claims.
#[cfg(test)]
mod auto_traits {
    use super::*;

    fn send<T: Send>() {}

    #[test]
    fn communicators_move_between_threads() {
        send::<Communicator>();
        send::<Clique>();
        send::<UniqueId>();
        send::<&mut Communicator>();
    }
}
