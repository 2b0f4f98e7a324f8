//! What each resource adaptor costs the CPU, without a GPU: alloc+free pairs through
//! `Arc<dyn MemoryResource>` over a resource that does nothing, so every nanosecond above the
//! `none` row is the adaptor's bookkeeping (atomics, thread index, tables). Runs anywhere:
//! `cargo bench -p cuda-mem-bench --bench adaptor_cpu`.
//!
//! It explains the `resource_*` rows of `paired` on a GPU host, where the same pair also pays for a
//! pool allocation: each adaptor adds its read-modify-write atomics, and a stack of adaptors adds
//! the sum (figures: docs/bench/2026-11-29-h200/README.md).

use criterion::{Criterion, criterion_group, criterion_main};
use cuda_mem::resource::{
    LimitingResource, MemoryKind, MemoryResource, StatisticsResource, StreamRef, TrackingResource,
};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Arc;

/// Hands out one fixed address and frees nothing: the cost floor of a call through the trait.
#[derive(Debug)]
struct NoMemory;

// SAFETY: this does NOT hand out real memory, so it breaks the trait's contract; that is sound
// only because this benchmark calls it through the adaptors' allocate/deallocate alone and never
// through `ResourceBuffer` or anything else that touches the address.
unsafe impl MemoryResource for NoMemory {
    fn allocate(&self, _bytes: usize, _stream: StreamRef<'_>) -> cuda_mem::Result<NonNull<u8>> {
        // Never dereferenced: the adaptors only record and compare pointers.
        Ok(NonNull::<u64>::dangling().cast())
    }

    unsafe fn deallocate(&self, _ptr: NonNull<u8>, _bytes: usize, _stream: StreamRef<'_>) {}

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }
}

type Stack = fn() -> Arc<dyn MemoryResource>;

/// The stacks of the `paired` resource rows, over `NoMemory` instead of a pool.
const STACKS: [(&str, Stack); 5] = [
    ("none", || Arc::new(NoMemory)),
    ("stats", || Arc::new(StatisticsResource::new(NoMemory))),
    ("limit", || Arc::new(LimitingResource::new(NoMemory, usize::MAX))),
    ("limit_stats", || Arc::new(LimitingResource::new(StatisticsResource::new(NoMemory), usize::MAX))),
    ("tracking", || Arc::new(TrackingResource::new(NoMemory, false))),
];

fn adaptor_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("adaptor_cpu");
    let stream = StreamRef::LEGACY;
    let bytes = 1 << 20;
    for (name, stack) in STACKS {
        let resource = stack();
        group.bench_function(name, |b| {
            b.iter(|| {
                // black_box: the resource must be called through its vtable every time.
                let resource = black_box(&resource);
                let ptr = resource.allocate(bytes, stream).expect("NoMemory never fails");
                // SAFETY: allocated just above from the same resource with the same size.
                unsafe { resource.deallocate(ptr, bytes, stream) };
            })
        });
    }
    group.finish();
}

criterion_group!(benches, adaptor_pairs);
criterion_main!(benches);
