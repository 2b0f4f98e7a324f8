#![no_main]
//! Sequences of allocations, frees with pending fences, fence completions and shrinks on the
//! pinned caching pool's bookkeeping, with a cap or without one (then freed blocks park in this
//! thread's front cache): a block is never handed out while a fence on it is pending, the cap
//! holds, the counters match a model, and every block is released exactly once in the end.

use arbitrary::Arbitrary;
use cuda_mem_cache::pinned::fake::{FakeBackend, FakeFence};
use cuda_mem_cache::pinned::{BlockCache, class_of};
use libfuzzer_sys::fuzz_target;
use std::sync::atomic::Ordering;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc { size: u16 },
    Free { index: u8, fenced: bool },
    Complete { index: u8 },
    Shrink { keep: u16 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// `None`: no cap, so front caches are used.
    cap: Option<u16>,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let cap = input.cap.map_or(usize::MAX, |cap| usize::from(cap) * 64);
    let cache = BlockCache::new(FakeBackend::default(), cap);
    let mut held = Vec::new(); // blocks handed out
    let mut fences: Vec<FakeFence> = Vec::new(); // every fence ever attached
    let mut in_use = 0usize;
    let mut made = 0usize; // bytes of blocks taken from the system
    for op in input.ops {
        match op {
            Op::Alloc { size } => {
                // Small blocks keep the system allocator cheap; the classes logic is size-independent.
                let class = class_of(usize::from(size % 4096) * 4).unwrap();
                let block = match cache.take(class) {
                    Some(block) => {
                        assert!(block.fences().iter().all(|f| f.load(Ordering::Acquire)), "reused with work pending");
                        block
                    }
                    None => {
                        made += class.bytes();
                        cache.allocate(class).expect("the fake allocates")
                    }
                };
                assert_eq!(block.class(), class);
                in_use += class.bytes();
                held.push(block);
            }
            Op::Free { index, fenced } if !held.is_empty() => {
                let mut block = held.swap_remove(usize::from(index) % held.len());
                if fenced {
                    let fence = FakeFence::default();
                    fences.push(fence.clone());
                    block.record(fence);
                }
                in_use -= block.class().bytes();
                cache.put(block).expect("a block of this pool");
                assert!(cache.stats().cached_bytes <= cap);
            }
            Op::Complete { index } if !fences.is_empty() => {
                fences[usize::from(index) % fences.len()].store(true, Ordering::Release);
            }
            Op::Shrink { keep } => {
                cache.shrink_to(usize::from(keep), None);
                assert!(cache.stats().cached_bytes <= usize::from(keep));
            }
            _ => {}
        }
        let stats = cache.stats();
        assert_eq!(stats.in_use_bytes, in_use);
        assert!(stats.peak_in_use_bytes >= in_use);
    }
    for block in held {
        cache.put(block).expect("a block of this pool");
    }
    cache.shrink_to(0, None);
    assert_eq!(cache.stats().cached_bytes, 0);
    assert_eq!(cache.backend().released.lock().unwrap().iter().sum::<usize>(), made, "released once, all of it");
});
