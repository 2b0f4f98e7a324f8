#![no_main]
//! The staged copier's plan covers every byte exactly once, with balanced lanes.

use cuda_mem::testing::deal;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u32, u16, u8)| {
    let bytes = input.0 as usize;
    // At most 2^12 chunks: enough to exercise the dealing, cheap enough for 10^6 runs.
    let chunk = (usize::from(input.1).max(1) * 64).max(bytes.div_ceil(1 << 12));
    let lanes = usize::from(input.2).max(1);
    let plan = deal(bytes, chunk, lanes);
    assert_eq!(plan.len(), lanes);
    let mut pieces: Vec<(usize, usize)> = plan.iter().flatten().copied().collect();
    pieces.sort_unstable();
    let mut next = 0;
    for (offset, len) in pieces {
        assert_eq!(offset, next);
        assert!(len > 0 && len <= chunk);
        next += len;
    }
    assert_eq!(next, bytes);
    let counts: Vec<usize> = plan.iter().map(Vec::len).collect();
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
});
