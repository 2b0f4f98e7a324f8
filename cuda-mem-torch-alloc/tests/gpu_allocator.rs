//! The exported C functions on a real device. Ignored where no GPU exists. One test: the
//! allocator's state (limit, counters) is per process.

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

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_allocations_limits_and_statistics_through_the_c_functions() {
    let stream = cuda_mem::Stream::non_blocking().unwrap();
    let raw = stream.as_raw().cast::<c_void>();
    // SAFETY: a live stream of device 0; every pointer is freed once, after its last use.
    unsafe {
        let a = cuda_mem_torch_try_alloc(3 << 20, 0, raw);
        let b = cuda_mem_torch_try_alloc(0, 0, std::ptr::null_mut());
        let c = cuda_mem_torch_try_alloc(0, 0, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null() && b != c, "{}", last_error());
        let s = stats();
        assert_eq!((s[0], s[1], s[4], s[5], s[6], s[7]), (3 << 20, 3 << 20, 3, 0, 0, u64::MAX));
        assert!(s[2] >= 3 << 20 && s[3] >= s[2], "reserved {s:?}");

        assert_eq!(cuda_mem_torch_set_limit(0, 4 << 20), 0);
        assert!(cuda_mem_torch_try_alloc(2 << 20, 0, raw).is_null());
        assert!(last_error().contains("the limit of 4194304 bytes would be exceeded"), "{}", last_error());
        assert_eq!(stats()[6], 1);
        assert_eq!(cuda_mem_torch_set_limit(0, u64::MAX), 0);

        cuda_mem_torch_free(a, 3 << 20, 0, raw);
        cuda_mem_torch_free(b, 0, 0, std::ptr::null_mut());
        cuda_mem_torch_free(c, 0, 0, std::ptr::null_mut());
        // The frees are queued on two streams; trimming releases only memory whose free ran.
        cuda_mem::Device::new(0).unwrap().synchronize().unwrap();
        let s = stats();
        assert_eq!((s[0], s[5]), (0, 3));
        assert!(s[2] > 0, "the pool retains its memory");
        assert_eq!(cuda_mem_torch_reset_peaks(0), 0);
        assert_eq!(stats()[1], 0);
        assert_eq!(cuda_mem_torch_empty_cache(0), 0);
        assert_eq!(stats()[2], 0, "trimmed to nothing");
        assert_eq!(cuda_mem_torch_stats(99, std::ptr::null_mut(), 0), -1);
        assert!(last_error().contains("device 99 does not exist"), "{}", last_error());
    }
}
