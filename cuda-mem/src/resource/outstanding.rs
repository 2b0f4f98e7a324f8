//! The table behind `TrackingResource`: outstanding allocations keyed by address, with no lock on
//! the allocation and free paths.
//!
//! A fixed array of slots, open addressing with a bounded linear probe. Inserting claims a free
//! slot with one compare-and-swap; removing is one release store (only the owner of a live
//! address frees it, so nothing races for its slot). Addresses that find no slot within the probe
//! bound go to a locked overflow map, which costs nothing while it is empty. A mutex-guarded hash
//! map costs two lock round trips and two hash operations per allocation, which measured over the
//! 5% of a pool allocation that an adaptor may cost.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, PoisonError};

/// Never used: probes stop here, so a used slot never becomes empty again.
const EMPTY: usize = 0;
/// Used once, free now.
const FREED: usize = 1;
/// Being filled by an insert; its fields are not ready.
const FILLING: usize = 2;
/// Slots looked at before an address goes to the overflow map.
const PROBE_LIMIT: usize = 32;

/// What the table keeps per allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) bytes: usize,
    pub(crate) sequence: u64,
    /// Index of the allocating thread in `tracking`'s thread registry.
    pub(crate) thread: u64,
}

#[derive(Debug, Default)]
struct Slot {
    /// `EMPTY`, `FREED`, `FILLING` or the address.
    key: AtomicUsize,
    bytes: AtomicUsize,
    sequence: AtomicU64,
    thread: AtomicU64,
}

pub(crate) struct OutstandingTable {
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (a power of two minus one).
    mask: usize,
    overflow: Mutex<FxHashMap<usize, Entry>>,
    /// Entries in `overflow`, read without the lock.
    overflow_len: AtomicUsize,
}

impl std::fmt::Debug for OutstandingTable {
    // A summary: the slots themselves are thousands of atomics.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutstandingTable")
            .field("slots", &self.slots.len())
            .field("outstanding", &self.snapshot().len())
            .finish()
    }
}

impl OutstandingTable {
    /// A table of at least `slots` slots (rounded up to a power of two, at least 1).
    pub(crate) fn new(slots: usize) -> Self {
        let len = slots.max(1).next_power_of_two();
        Self {
            slots: (0..len).map(|_| Slot::default()).collect(),
            mask: len - 1,
            overflow: Mutex::default(),
            overflow_len: AtomicUsize::new(0),
        }
    }

    /// Slot indices of `address`'s probe sequence.
    fn probe(&self, address: usize) -> impl Iterator<Item = usize> + use<> {
        // Fibonacci hashing: device addresses share their low bits (256-byte or 2 MiB alignment),
        // the multiply spreads the high ones.
        let start = (address as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32) as usize;
        let mask = self.mask;
        (0..PROBE_LIMIT.min(mask + 1)).map(move |i| start.wrapping_add(i) & mask)
    }

    /// Records a live allocation at `address` (not already in the table).
    pub(crate) fn insert(&self, address: usize, entry: Entry) {
        if address > FILLING {
            for index in self.probe(address) {
                let slot = &self.slots[index];
                let key = slot.key.load(Ordering::Relaxed);
                if (key == EMPTY || key == FREED)
                    && slot.key.compare_exchange(key, FILLING, Ordering::Acquire, Ordering::Relaxed).is_ok()
                {
                    slot.bytes.store(entry.bytes, Ordering::Relaxed);
                    slot.sequence.store(entry.sequence, Ordering::Relaxed);
                    slot.thread.store(entry.thread, Ordering::Relaxed);
                    // Publishes the fields to `snapshot`, which reads the key with Acquire.
                    slot.key.store(address, Ordering::Release);
                    return;
                }
            }
        }
        let mut overflow = self.overflow();
        overflow.insert(address, entry);
        self.overflow_len.store(overflow.len(), Ordering::Relaxed);
    }

    /// Forgets `address`; false when it was not in the table.
    pub(crate) fn remove(&self, address: usize) -> bool {
        if address > FILLING {
            for index in self.probe(address) {
                let slot = &self.slots[index];
                match slot.key.load(Ordering::Relaxed) {
                    key if key == address => {
                        // Only the owner of a live address frees it: no other thread writes this
                        // slot until it reads FREED.
                        slot.key.store(FREED, Ordering::Release);
                        return true;
                    }
                    EMPTY => break,
                    _ => {}
                }
            }
        }
        // Relaxed is enough: an insert that this thread's caller saw complete happened before.
        if self.overflow_len.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut overflow = self.overflow();
        let removed = overflow.remove(&address).is_some();
        self.overflow_len.store(overflow.len(), Ordering::Relaxed);
        removed
    }

    /// The outstanding allocations as (address, entry), in no order. Exact when no insert or
    /// remove runs at the same time; otherwise each entry is still one whole allocation.
    pub(crate) fn snapshot(&self) -> Vec<(usize, Entry)> {
        let mut out = Vec::new();
        for slot in self.slots.iter() {
            let key = slot.key.load(Ordering::Acquire);
            if key <= FILLING {
                continue;
            }
            let entry = Entry {
                bytes: slot.bytes.load(Ordering::Relaxed),
                sequence: slot.sequence.load(Ordering::Relaxed),
                thread: slot.thread.load(Ordering::Relaxed),
            };
            // Seqlock-style check: the fields belong to `key` only if the slot did not change
            // while they were read.
            fence(Ordering::Acquire);
            if slot.key.load(Ordering::Relaxed) == key {
                out.push((key, entry));
            }
        }
        out.extend(self.overflow().iter().map(|(&address, &entry)| (address, entry)));
        out
    }

    fn overflow(&self) -> std::sync::MutexGuard<'_, FxHashMap<usize, Entry>> {
        // The map stays consistent even if a thread panicked while holding the lock.
        self.overflow.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn entry(n: u64) -> Entry {
        Entry { bytes: n as usize * 10, sequence: n, thread: n % 3 }
    }

    fn sorted(table: &OutstandingTable) -> BTreeMap<usize, Entry> {
        table.snapshot().into_iter().collect()
    }

    #[test]
    fn a_small_table_spills_to_the_overflow_map_and_stays_exact() {
        // 4 slots, 40 live addresses: most go to the overflow map.
        let table = OutstandingTable::new(4);
        let mut model = BTreeMap::new();
        for n in 0..40u64 {
            let address = 0x7000_0000 + n as usize * 256;
            table.insert(address, entry(n));
            model.insert(address, entry(n));
        }
        assert_eq!(sorted(&table), model);
        for (i, address) in model.clone().keys().enumerate() {
            if i % 3 != 0 {
                assert!(table.remove(*address));
                model.remove(address);
            }
        }
        assert!(!table.remove(0x1234_5600), "an unknown address is reported");
        assert_eq!(sorted(&table), model);
        // Freed slots are reused.
        table.insert(0x9000_0000, entry(99));
        model.insert(0x9000_0000, entry(99));
        assert_eq!(sorted(&table), model);
    }

    #[test]
    fn reserved_key_values_are_tracked_in_the_overflow_map() {
        let table = OutstandingTable::new(8);
        for address in [EMPTY, FREED, FILLING] {
            table.insert(address, entry(address as u64));
        }
        assert_eq!(table.snapshot().len(), 3);
        for address in [EMPTY, FREED, FILLING] {
            assert!(table.remove(address));
        }
        assert!(table.snapshot().is_empty());
    }

    #[test]
    fn a_removed_address_is_found_past_freed_slots() {
        let table = OutstandingTable::new(64);
        // Same-probe neighbours: fill, free the first, check the later ones are still found.
        let addresses: Vec<usize> = (1..=20).map(|n| n << 21).collect();
        for (n, &a) in addresses.iter().enumerate() {
            table.insert(a, entry(n as u64));
        }
        for &a in addresses.iter().step_by(2) {
            assert!(table.remove(a));
        }
        for &a in addresses.iter().skip(1).step_by(2) {
            assert!(table.remove(a), "{a:#x} found past freed slots");
        }
        assert!(table.snapshot().is_empty());
    }
}
