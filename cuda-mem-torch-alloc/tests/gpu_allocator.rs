//! The exported C functions on a real device, over the default backend (cuda-mem's device caching
//! allocator). Ignored where no GPU exists. One test: the allocator's state (backend, limit,
//! counters) is per process.

use cuda_mem_torch_alloc::*;
use std::ffi::c_void;

fn stats() -> [u64; Stats::LEN] {
    let mut out = [0u64; Stats::LEN];
    // SAFETY: `out` holds `Stats::LEN` values.
    assert_eq!(unsafe { cuda_mem_torch_stats(0, out.as_mut_ptr(), out.len()) }, 0);
    out
}

fn last_error() -> String {
    let mut buffer = [0u8; 512];
    // SAFETY: the buffer holds 512 bytes.
    let len = unsafe { cuda_mem_torch_last_error(buffer.as_mut_ptr().cast(), buffer.len()) };
    String::from_utf8_lossy(&buffer[..len.min(511)]).into_owned()
}

fn select(name: &std::ffi::CStr) -> i32 {
    // SAFETY: a NUL-terminated string.
    unsafe { cuda_mem_torch_select_backend(name.as_ptr()) }
}

const PER_THREAD: *mut c_void = 2 as *mut c_void;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_allocations_limits_and_statistics_through_the_c_functions() {
    // "cache-compact" is the cache's old name for its one set of parameters, whose figures are
    // exact below.
    assert_eq!(select(c"cache-compact"), 0, "{}", last_error());
    assert_eq!(select(c"heap"), -1);
    assert!(last_error().contains("unknown backend"), "{}", last_error());
    // The allocator keeps the streams it is given: this one is never destroyed, as PyTorch's are
    // not.
    let stream: &'static cuda_mem::Stream = Box::leak(Box::new(cuda_mem::Stream::non_blocking().unwrap()));
    let raw = stream.as_raw().cast::<c_void>();
    // SAFETY: a stream of device 0 that lives as long as the process, or built-in handles; every
    // pointer is freed once, after its last use.
    unsafe {
        let a = cuda_mem_torch_try_alloc(3 << 20, 0, raw);
        let b = cuda_mem_torch_try_alloc(0, 0, std::ptr::null_mut());
        let c = cuda_mem_torch_try_alloc(0, 0, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null() && b != c, "{}", last_error());
        assert_eq!(select(c"pool"), -1, "the backend is fixed once a device's allocator exists");
        assert_eq!((select(c"cache"), select(c"cache-compact")), (0, 0), "the backend it has");
        let s = stats();
        assert_eq!((s[0], s[1], s[4], s[5], s[6], s[7]), (3 << 20, 3 << 20, 3, 0, 0, u64::MAX));
        assert!(s[2] >= 3 << 20 && s[3] >= s[2], "reserved {s:?}");
        // Where the cache maps pages, each stream grows one range: the two small blocks share
        // the legacy stream's first page (a hit). Else small segments grow with the pool, the
        // first sized to its request: each small block (and the large one) takes its own.
        let pages = cuda_mem::DeviceCache::new(cuda_mem::Device::new(0).unwrap()).unwrap().page_bytes();
        let expected = if pages.is_some() { (1, 2, 2) } else { (0, 3, 3) };
        assert_eq!((s[8], s[9], s[10]), expected, "hits, misses, segments: {s:?}");

        assert_eq!(cuda_mem_torch_set_limit(0, 4 << 20), 0);
        assert!(cuda_mem_torch_try_alloc(2 << 20, 0, raw).is_null());
        assert!(last_error().contains("the limit of 4194304 bytes would be exceeded"), "{}", last_error());
        assert_eq!(stats()[6], 1);
        assert_eq!(cuda_mem_torch_set_limit(0, u64::MAX), 0);

        // Freed on its stream, a block comes back on that stream at once.
        cuda_mem_torch_free(a, 3 << 20, 0, raw);
        let again = cuda_mem_torch_try_alloc(3 << 20, 0, raw);
        assert_eq!(again, a, "reused on its stream");
        cuda_mem_torch_free(again, 3 << 20, 0, raw);
        // A second free, or one with another size, is refused: nothing is freed or counted.
        cuda_mem_torch_free(again, 3 << 20, 0, raw);
        assert!(last_error().contains("did not hand out, or freed already"), "{}", last_error());
        cuda_mem_torch_free(b, 2, 0, std::ptr::null_mut());
        assert!(last_error().contains("a size other than the block was allocated with"), "{}", last_error());
        // The per-thread default stream: from the legacy stream, its free waits for the device.
        let p = cuda_mem_torch_try_alloc(1000, 0, PER_THREAD);
        assert!(!p.is_null(), "{}", last_error());
        cuda_mem_torch_free(p, 1000, 0, PER_THREAD);
        cuda_mem_torch_free(b, 0, 0, std::ptr::null_mut());
        cuda_mem_torch_free(c, 0, 0, std::ptr::null_mut());
        let s = stats();
        assert_eq!((s[0], s[4], s[5]), (0, 5, 5), "{s:?}");
        assert!(s[2] > 0, "the cache keeps its memory");
        // Every allocation is a hit or a miss; the reuse of `a` on its stream is a hit (the
        // per-thread one may take a new segment, releasing an idle one to stay at the peak).
        assert!(s[8] >= 1 && s[8] + s[9] == 5, "hits and misses {s:?}");
        assert_eq!(cuda_mem_torch_reset_peaks(0), 0);
        assert_eq!(stats()[1], 0);
        assert_eq!(cuda_mem_torch_empty_cache(0), 0);
        assert_eq!((stats()[2], stats()[10]), (0, 0), "every segment released");
        assert_eq!(cuda_mem_torch_stats(99, std::ptr::null_mut(), 0), -1);
        assert!(last_error().contains("device 99 does not exist"), "{}", last_error());

        // `Tensor.record_stream`: a block another stream uses is held back at its free until that
        // stream's work queued by then has completed.
        let user: &'static cuda_mem::Stream = Box::leak(Box::new(cuda_mem::Stream::non_blocking().unwrap()));
        let x = cuda_mem_torch_try_alloc(1 << 20, 0, raw);
        cuda_mem_torch_record_stream(x, user.as_raw().cast());
        hold(user, 300);
        cuda_mem_torch_free(x, 1 << 20, 0, raw);
        let y = cuda_mem_torch_try_alloc(1 << 20, 0, raw);
        assert_ne!(y, x, "reused while the recorded stream's work runs");
        user.synchronize().unwrap();
        cuda_mem_torch_free(y, 1 << 20, 0, raw);
        let z = cuda_mem_torch_try_alloc(1 << 20, 0, raw);
        assert!(z == x || z == y, "back on its stream once that work completed");
        cuda_mem_torch_free(z, 1 << 20, 0, raw);
        // Memory of another allocator is left alone.
        cuda_mem_torch_record_stream(0x1000 as *mut c_void, user.as_raw().cast());
        // `torch.cuda.empty_cache()` and `set_per_process_memory_fraction`.
        cuda_mem_torch_empty_all_caches();
        assert_eq!(stats()[2], 0, "every segment released");
        cuda_mem_torch_set_memory_fraction(0.5, 0);
        let (_, total) = cuda_mem::Device::new(0).unwrap().mem_get_info().unwrap();
        assert_eq!(stats()[7], (total / 2) as u64);
        cuda_mem_torch_set_memory_fraction(1.0, 0);
    }
}

/// Queues a host function that sleeps `millis` on `stream`: work queued after it waits.
fn hold(stream: &cuda_mem::Stream, millis: u64) {
    unsafe extern "C" fn sleep(data: *mut c_void) {
        std::thread::sleep(std::time::Duration::from_millis(data as u64));
    }
    // SAFETY: a valid stream, a callback that makes no CUDA call, and a plain number as data.
    let code = unsafe { cuda_mem::sys::cudaLaunchHostFunc(stream.as_raw(), Some(sleep), millis as *mut c_void) };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess, "cudaLaunchHostFunc");
}
