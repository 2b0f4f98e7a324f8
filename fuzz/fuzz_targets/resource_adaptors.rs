#![no_main]
//! Random allocate/free sequences through limiting(statistics(tracking(host))): the cap is never
//! exceeded, statistics equal a model, and tracking lists exactly the live allocations.

use arbitrary::Arbitrary;
use cuda_mem::fuzzing::HostResource;
use cuda_mem::resource::{LimitingResource, MemoryResource, StatisticsResource, StreamRef, TrackingResource};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc(u16),
    Free(u8),
}

fuzz_target!(|input: (u32, Vec<Op>)| {
    let (limit, ops) = input;
    let limit = limit as usize % (1 << 20);
    let stack = LimitingResource::new(StatisticsResource::new(TrackingResource::new(HostResource::default(), false)), limit);
    let s = StreamRef::LEGACY;
    let mut live: Vec<(std::ptr::NonNull<u8>, usize)> = Vec::new();
    let (mut current, mut peak, mut total) = (0usize, 0usize, 0u64);
    for op in ops {
        match op {
            Op::Alloc(size) => {
                let bytes = usize::from(size).max(1);
                match stack.allocate(bytes, s) {
                    Ok(ptr) => {
                        live.push((ptr, bytes));
                        current += bytes;
                        peak = peak.max(current);
                        total += 1;
                    }
                    Err(err) => {
                        assert!(err.is_out_of_memory());
                        assert!(current + bytes > limit);
                    }
                }
            }
            Op::Free(index) if !live.is_empty() => {
                let (ptr, bytes) = live.swap_remove(usize::from(index) % live.len());
                // SAFETY: allocated above from `stack`, freed once.
                unsafe { stack.deallocate(ptr, bytes, s) };
                current -= bytes;
            }
            Op::Free(_) => {}
        }
        assert!(current <= limit);
        assert_eq!(stack.in_use(), current);
        let stats = stack.inner().stats();
        assert_eq!((stats.current_bytes, stats.peak_bytes, stats.total_count), (current, peak, total));
    }
    assert_eq!(stack.inner().inner().outstanding().len(), live.len());
    for (ptr, bytes) in live {
        // SAFETY: as above.
        unsafe { stack.deallocate(ptr, bytes, s) };
    }
    assert_eq!(stack.inner().inner().outstanding_bytes(), 0);
});
