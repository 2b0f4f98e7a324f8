#![no_main]
//! Random allocate/free sequences through limiting(statistics(tracking(host))): the cap is never
//! exceeded, statistics equal a model, and tracking lists exactly the live allocations.

use arbitrary::Arbitrary;
use cuda_mem::resource::{LimitingResource, MemoryResource, StatisticsResource, StreamRef, TrackingResource};
use cuda_mem::testing::HostResource;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc(u16),
    Free(u8),
}

fuzz_target!(|input: (u32, u8, Vec<Op>)| {
    let (limit, slots, ops) = input;
    let limit = limit as usize % (1 << 20);
    // Tables of 1 to 64 slots, so allocations spill into the overflow map and come back.
    let tracking = TrackingResource::with_slots(HostResource::default(), false, usize::from(slots % 64) + 1).unwrap();
    let stack = LimitingResource::new(StatisticsResource::new(tracking), limit);
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
    let mut outstanding: Vec<(usize, usize)> =
        stack.inner().inner().outstanding().iter().map(|r| (r.ptr, r.bytes)).collect();
    let mut expected: Vec<(usize, usize)> = live.iter().map(|&(p, b)| (p.as_ptr() as usize, b)).collect();
    outstanding.sort_unstable();
    expected.sort_unstable();
    assert_eq!(outstanding, expected);
    for (ptr, bytes) in live {
        // SAFETY: as above.
        unsafe { stack.deallocate(ptr, bytes, s) };
    }
    assert_eq!(stack.inner().inner().outstanding_bytes(), 0);
});
