//! The C functions of tagged regions (`cuda_mem.torch.region`, `sleep`, `wake`); what they do is
//! in [`regions`](crate::regions). Each returns 0 (or a length, or a tag) on success and -1 on
//! failure, with the message kept for `cuda_mem_torch_last_error`.

use super::{copy_text, entry, guarded, remember, status};
use crate::regions::{self, Tag};
use cuda_mem::caching::Keep;
use cuda_mem::{CudaError, ErrorKind, Result};
use std::ffi::{CStr, c_char, c_int};

/// The text of `name`, or an error.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn name_of<'a>(name: *const c_char, what: &'static str) -> Result<&'a str> {
    if name.is_null() {
        return Err(CudaError::new(ErrorKind::InvalidArgument("a null tag"), what));
    }
    // SAFETY: NUL-terminated, per the caller.
    unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| CudaError::new(ErrorKind::InvalidArgument("a tag that is not UTF-8"), what))
}

/// Writes `value` to `out` unless it is null; an error for a misaligned one.
///
/// # Safety
/// `out` is null or points to writable memory for a `u64`.
unsafe fn write_out(out: *mut u64, value: usize, what: &'static str) -> Result<()> {
    if out.is_null() {
        return Ok(());
    }
    if !out.is_aligned() {
        return Err(CudaError::new(ErrorKind::InvalidArgument("a misaligned output"), what));
    }
    // SAFETY: non-null and aligned (checked), writable (the caller's promise).
    unsafe { out.write(value as u64) };
    Ok(())
}

/// Makes the tag `name` the calling thread's current tag: what the thread allocates (on any
/// device, outside CUDA graph captures) comes from the tag's region until
/// [`cuda_mem_torch_leave_region`]. Returns the tag it replaces (0: none), to pass to
/// [`cuda_mem_torch_leave_region`], or -1 for a null name, one that is not UTF-8, or one
/// [`regions::tag_named`] refuses (empty, longer than 64 bytes, whitespace).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_enter_region(name: *const c_char) -> i64 {
    const WHAT: &str = "cuda_mem_torch_enter_region";
    let entered = guarded(WHAT, || {
        // SAFETY: forwarded from the caller.
        let tag = regions::tag_named(unsafe { name_of(name, WHAT) }?)?;
        Ok(regions::enter(tag))
    });
    match entered {
        Ok(previous) => i64::from(previous),
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}

/// Puts back the tag [`cuda_mem_torch_enter_region`] returned. Returns 0, or -1 for a value no
/// tag has (the current tag is left as it is).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_leave_region(previous: i64) -> c_int {
    const WHAT: &str = "cuda_mem_torch_leave_region";
    status(guarded(WHAT, || {
        let tag = Tag::try_from(previous).map_err(|_| {
            CudaError::new(ErrorKind::InvalidArgument("a tag no region has"), format!("{WHAT}({previous})"))
        })?;
        regions::leave(tag)
    }))
}

/// Puts region `name` to sleep on `device`: waits for the work queued on its blocks' streams,
/// copies their bytes to pinned host memory when `keep_contents` is non-zero (else drops them),
/// and gives their device memory back, keeping their addresses. Writes the bytes given back to
/// `slept` (unless null). Refused: a tag no region used, a sleeping region, a sleep during a CUDA
/// graph capture; a failure leaves the region awake as it was.
///
/// # Safety
/// `name` is null or NUL-terminated; `slept` is null or writable. From this call until the
/// region wakes, no work uses the memory of its tensors on `device`, and work queued on other
/// streams than theirs that used them (without `Tensor.record_stream`) has completed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_sleep(
    device: c_int,
    name: *const c_char,
    keep_contents: c_int,
    slept: *mut u64,
) -> c_int {
    const WHAT: &str = "cuda_mem_torch_sleep";
    status(guarded(WHAT, || {
        // SAFETY: forwarded from the caller.
        let tag = regions::existing_tag(unsafe { name_of(name, WHAT) }?)?;
        let keep = if keep_contents != 0 { Keep::Contents } else { Keep::Nothing };
        // SAFETY: forwarded from the caller.
        let bytes = unsafe { entry(device)?.allocator.sleep_region(tag, keep) }?;
        // SAFETY: forwarded from the caller.
        unsafe { write_out(slept, bytes, WHAT) }
    }))
}

/// Wakes region `name` on `device`: new device memory at its tensors' addresses, with their bytes
/// when the sleep kept them; then the frees made while it slept. Writes the bytes mapped to
/// `woke` (unless null). Out of memory (after releasing what the other caches hold) leaves it
/// asleep with everything kept: call again once memory is free. Refused: a tag no region used,
/// an awake region.
///
/// # Safety
/// `name` is null or NUL-terminated; `woke` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_wake(device: c_int, name: *const c_char, woke: *mut u64) -> c_int {
    const WHAT: &str = "cuda_mem_torch_wake";
    status(guarded(WHAT, || {
        // SAFETY: forwarded from the caller.
        let tag = regions::existing_tag(unsafe { name_of(name, WHAT) }?)?;
        let bytes = entry(device)?.allocator.wake_region(tag)?;
        // SAFETY: forwarded from the caller.
        unsafe { write_out(woke, bytes, WHAT) }
    }))
}

/// Frees the pinned host memory the regions on `device` keep for their next sleeps (each awake
/// region keeps the backups of its last sleep, so that the next allocates none; a sleeping one
/// keeps those that hold its bytes). Returns the bytes freed, or -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_mem_torch_release_host_backups(device: c_int) -> i64 {
    match guarded("cuda_mem_torch_release_host_backups", || Ok(entry(device)?.allocator.release_host_backups())) {
        Ok(bytes) => i64::try_from(bytes).unwrap_or(i64::MAX),
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}

/// Writes the regions' figures on `device` into `buffer`, a line each:
/// `tag allocated blocks reserved state slept host_backup` (bytes; `state` is `awake`, `kept` or
/// `dropped`), at most `len` bytes, NUL-terminated when room is left (nothing when `buffer` is
/// null). Returns the text's full length, or -1 on failure.
///
/// # Safety
/// `buffer` is null or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_mem_torch_region_stats(device: c_int, buffer: *mut c_char, len: usize) -> isize {
    let text = guarded("cuda_mem_torch_region_stats", || {
        let mut text = String::new();
        for stats in entry(device)?.allocator.region_stats() {
            let state = match stats.asleep {
                None => "awake",
                Some(Keep::Contents) => "kept",
                Some(Keep::Nothing) => "dropped",
            };
            let name = regions::name_of(stats.tag).unwrap_or_default();
            text.push_str(&format!(
                "{name} {} {} {} {state} {} {}\n",
                stats.allocated, stats.blocks, stats.reserved, stats.slept, stats.host_backup
            ));
        }
        Ok(text)
    });
    match text {
        Ok(text) => {
            // SAFETY: the caller's promise about `buffer` and `len`.
            unsafe { copy_text(&text, buffer, len) };
            isize::try_from(text.len()).unwrap_or(isize::MAX)
        }
        Err(err) => {
            remember(err.to_string());
            -1
        }
    }
}
