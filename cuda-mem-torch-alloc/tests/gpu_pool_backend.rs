//! The exported C functions over the retaining-pool backend, chosen before the first allocation.
//! Ignored where no GPU exists; one test, as the backend is chosen once per process.

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
fn gpu_the_pool_backend_serves_and_trims() {
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { cuda_mem_torch_select_backend(c"pool".as_ptr()) }, 0);
    let stream: &'static cuda_mem::Stream = Box::leak(Box::new(cuda_mem::Stream::non_blocking().unwrap()));
    let raw = stream.as_raw().cast::<c_void>();
    // SAFETY: a stream of device 0 that lives as long as the process, or the legacy handle; every
    // pointer is freed once, after its last use.
    unsafe {
        let a = cuda_mem_torch_try_alloc(3 << 20, 0, raw);
        let b = cuda_mem_torch_try_alloc(1000, 0, std::ptr::null_mut());
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(cuda_mem_torch_select_backend(c"cache".as_ptr()), -1, "fixed once allocating");
        let s = stats();
        assert_eq!((s[0], s[4]), ((3 << 20) + 1000, 2));
        assert!(s[2] >= s[0], "reserved {s:?}");
        assert_eq!((s[8], s[9], s[10]), (0, 0, 0), "a pool counts no hits or segments");
        // A free with another size, and a second free, never reach `cudaFreeAsync`.
        cuda_mem_torch_free(b, 999, 0, std::ptr::null_mut());
        assert!(last_error().contains("a size other than the block was allocated with"), "{}", last_error());
        cuda_mem_torch_free(a, 3 << 20, 0, raw);
        cuda_mem_torch_free(a, 3 << 20, 0, raw);
        assert!(last_error().contains("did not hand out, or freed already"), "{}", last_error());
        cuda_mem_torch_free(b, 1000, 0, std::ptr::null_mut());
        cuda_mem::Device::new(0).unwrap().synchronize().unwrap();
        assert_eq!(cuda_mem_torch_empty_cache(0), 0);
        assert_eq!((stats()[0], stats()[2]), (0, 0), "trimmed to nothing");
    }
}
