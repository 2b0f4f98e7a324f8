#![no_main]
//! Every size maps to a class that holds it, wastes at most a quarter, and is its own class.

use cuda_mem_cache::pinned::{MIN_BLOCK, NUM_CLASSES, class_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: usize| {
    let Some(class) = class_of(bytes) else {
        // Only sizes whose class would not fit in usize have none.
        assert!(bytes > usize::MAX / 4 * 3);
        return;
    };
    assert!(class.index() < NUM_CLASSES);
    assert!(class.bytes() >= bytes.max(1));
    if bytes > MIN_BLOCK {
        assert!(class.bytes() - bytes <= bytes / 4);
    }
    assert_eq!(class_of(class.bytes()), Some(class));
    if let Some(next) = class.bytes().checked_add(1).and_then(class_of) {
        assert!(next.index() > class.index());
    }
});
