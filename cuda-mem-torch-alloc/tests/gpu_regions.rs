//! Tagged regions through the exported C functions on a real device: a sleep gives the region's
//! memory back, a wake restores its bytes at the same addresses, and the refusals. Ignored where
//! no GPU exists. One test: the allocator's state is per process.

use cuda_mem::sys;
use cuda_mem_torch_alloc::*;
use std::ffi::{CStr, c_void};

const MIB: usize = 1 << 20;

fn last_error() -> String {
    let mut buffer = [0u8; 512];
    // SAFETY: the buffer holds 512 bytes.
    let len = unsafe { cuda_mem_torch_last_error(buffer.as_mut_ptr().cast(), buffer.len()) };
    String::from_utf8_lossy(&buffer[..len.min(511)]).into_owned()
}

fn device_used() -> usize {
    let (free, total) = cuda_mem::Device::new(0).unwrap().mem_get_info().unwrap();
    total - free
}

/// `bytes` on the legacy stream, allocated with `tag` current.
fn alloc_in(tag: &CStr, bytes: usize) -> *mut c_void {
    // SAFETY: NUL-terminated tag; the legacy stream (0) is built in.
    unsafe {
        let previous = cuda_mem_torch_enter_region(tag.as_ptr());
        assert!(previous >= 0, "{}", last_error());
        let ptr = cuda_mem_torch_try_alloc(bytes as isize, 0, std::ptr::null_mut());
        assert_eq!(cuda_mem_torch_leave_region(previous), 0);
        ptr
    }
}

fn fill(ptr: *mut c_void, seed: u8, bytes: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    // SAFETY: `ptr` holds `bytes` of device memory; `data` is `bytes` long.
    let code =
        unsafe { sys::cudaMemcpy(ptr, data.as_ptr().cast(), bytes, sys::cudaMemcpyKind::cudaMemcpyHostToDevice) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    data
}

fn read(ptr: *mut c_void, bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    // SAFETY: as in `fill`.
    let code =
        unsafe { sys::cudaMemcpy(data.as_mut_ptr().cast(), ptr, bytes, sys::cudaMemcpyKind::cudaMemcpyDeviceToHost) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    data
}

fn sleep(tag: &CStr, keep: bool) -> Result<u64, String> {
    let mut slept = 0u64;
    // SAFETY: NUL-terminated tag, a writable output; nothing uses the region's memory until the
    // wake.
    match unsafe { cuda_mem_torch_sleep(0, tag.as_ptr(), keep as i32, &mut slept) } {
        0 => Ok(slept),
        _ => Err(last_error()),
    }
}

fn wake(tag: &CStr) -> Result<u64, String> {
    let mut woke = 0u64;
    // SAFETY: NUL-terminated tag, a writable output.
    match unsafe { cuda_mem_torch_wake(0, tag.as_ptr(), &mut woke) } {
        0 => Ok(woke),
        _ => Err(last_error()),
    }
}

fn region_stats() -> String {
    let mut buffer = vec![0u8; 4096];
    // SAFETY: the buffer holds 4096 bytes.
    let len = unsafe { cuda_mem_torch_region_stats(0, buffer.as_mut_ptr().cast(), buffer.len()) };
    assert!(len >= 0, "{}", last_error());
    String::from_utf8_lossy(&buffer[..len as usize]).into_owned()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_region_sleeps_and_wakes_through_the_c_functions() {
    // SAFETY: a NUL-terminated (empty) tag.
    assert_eq!(unsafe { cuda_mem_torch_enter_region(c"".as_ptr()) }, -1);
    assert!(last_error().contains("1 to 64 bytes"), "{}", last_error());
    // SAFETY: the legacy stream; freed once below.
    let plain = unsafe { cuda_mem_torch_try_alloc((8 * MIB) as isize, 0, std::ptr::null_mut()) };
    let sizes = [MIB, 96 * MIB, 300 * 1024, 513 * MIB];
    let weights: Vec<_> = sizes.iter().map(|&bytes| (alloc_in(c"g-weights", bytes), bytes)).collect();
    let kv = alloc_in(c"g-kv", 256 * MIB);
    assert!(weights.iter().all(|(p, _)| !p.is_null()) && !kv.is_null(), "{}", last_error());
    let contents: Vec<_> = weights.iter().enumerate().map(|(i, &(p, bytes))| fill(p, i as u8, bytes)).collect();
    let plain_contents = fill(plain, 99, 8 * MIB);
    let before = device_used();
    let slept = sleep(c"g-weights", true).unwrap();
    let slept_kv = sleep(c"g-kv", false).unwrap();
    let tagged: usize = sizes.iter().sum();
    assert!(slept as usize >= tagged && slept_kv as usize >= 256 * MIB, "{slept} {slept_kv}");
    let given_back = before - device_used();
    assert!(given_back + 4 * MIB >= (slept + slept_kv) as usize, "{given_back} of {slept} + {slept_kv}");
    let stats = region_stats();
    assert!(stats.contains("g-weights ") && stats.contains(" kept ") && stats.contains(" dropped "), "{stats}");
    // Refusals: an allocation in a sleeping region, a double sleep, an unknown tag, a null tag.
    assert!(alloc_in(c"g-weights", MIB).is_null() && last_error().contains("sleeping region"), "{}", last_error());
    assert!(sleep(c"g-weights", true).unwrap_err().contains("sleep of a sleeping region"));
    assert!(sleep(c"g-never", true).unwrap_err().contains("no region has this tag"));
    // SAFETY: a null tag is refused before anything is read.
    assert_eq!(unsafe { cuda_mem_torch_sleep(0, std::ptr::null(), 1, std::ptr::null_mut()) }, -1);
    // A free of a sleeping block waits for the wake.
    let (last, last_bytes) = weights[2];
    // SAFETY: allocated on the legacy stream with this size; not used again.
    unsafe { cuda_mem_torch_free(last, last_bytes as isize, 0, std::ptr::null_mut()) };
    let blocks =
        region_stats().lines().find(|l| l.starts_with("g-weights ")).map(|l| l.split(' ').nth(2).unwrap().to_owned());
    assert_eq!(blocks.as_deref(), Some("3"), "the free counts at once: {}", region_stats());
    assert_eq!(read(plain, 8 * MIB), plain_contents, "untagged memory untouched");
    // Cycles: the bytes come back at the same addresses every time.
    for cycle in 0..5 {
        if cycle > 0 {
            sleep(c"g-weights", true).unwrap();
            sleep(c"g-kv", false).unwrap();
        }
        assert!(wake(c"g-weights").unwrap() >= slept - last_bytes.next_multiple_of(2 * MIB) as u64);
        wake(c"g-kv").unwrap();
        for (i, &(ptr, bytes)) in weights.iter().enumerate().filter(|&(i, _)| i != 2) {
            assert!(read(ptr, bytes) == contents[i], "cycle {cycle}: block {i} restored");
        }
    }
    assert!(wake(c"g-weights").unwrap_err().contains("wake of an awake region"));
    // SAFETY: each allocated with this size on the legacy stream, freed once.
    unsafe {
        for &(ptr, bytes) in weights.iter().filter(|&&(p, _)| p != last) {
            cuda_mem_torch_free(ptr, bytes as isize, 0, std::ptr::null_mut());
        }
        cuda_mem_torch_free(kv, (256 * MIB) as isize, 0, std::ptr::null_mut());
        cuda_mem_torch_free(plain, (8 * MIB) as isize, 0, std::ptr::null_mut());
    }
    // The pinned backups kept for the next sleep go back on request; cached device memory at
    // the empty cache.
    let kept = region_stats().lines().map(|l| l.split(' ').nth(6).unwrap().parse::<i64>().unwrap()).sum::<i64>();
    assert!(kept > 0, "an awake region keeps its last sleep's backups: {}", region_stats());
    assert_eq!(cuda_mem_torch_release_host_backups(0), kept, "{}", last_error());
    assert_eq!(cuda_mem_torch_release_host_backups(0), 0);
    assert!(region_stats().lines().all(|l| l.split(' ').nth(6) == Some("0")), "{}", region_stats());
    assert_eq!(cuda_mem_torch_empty_cache(0), 0);
    let mut out = [0u64; Stats::LEN];
    // SAFETY: `out` holds `Stats::LEN` values.
    assert_eq!(unsafe { cuda_mem_torch_stats(0, out.as_mut_ptr(), out.len()) }, 0);
    assert_eq!(out[0], 0, "nothing allocated: {out:?}");
    assert!(region_stats().lines().all(|l| l.split(' ').nth(2) == Some("0")), "{}", region_stats());
}
