//! The caching allocator's public API under hostile input: every configuration that
//! [`Config::check`] accepts, with requests of any size (up to `usize::MAX`), frees and
//! `empty_cache` in any order, over the fake backend with and without pages. Nothing may panic,
//! and every block handed out lies apart from every other one out.

use super::fake::FakeBackend;
use super::*;
use std::collections::BTreeMap;

/// A small deterministic generator (xorshift), so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 0
    }

    fn pick(&mut self, choices: &[usize]) -> usize {
        choices[(self.next() % choices.len() as u64) as usize]
    }
}

const SIZES: [usize; 9] = [512, 4096, 1 << 20, 2 << 20, 3 << 20, 1 << 30, usize::MAX - 511, 1024 * 1023, 20 << 20];

fn hostile_config(rng: &mut Rng) -> Config {
    let mut config = Config {
        small_max: rng.pick(&SIZES),
        small_segment: rng.pick(&SIZES),
        large_segment: rng.pick(&SIZES),
        own_segment_from: rng.pick(&SIZES),
        granularity: rng.pick(&SIZES),
        small_segment_divisor: rng.pick(&[0, 1, 3, 32, usize::MAX]),
        small_fit_divisor: rng.pick(&[0, 1, 4, usize::MAX]),
        large_fit_slack: rng.pick(&[0, 1, 2 << 20, usize::MAX]),
        front_depth: rng.pick(&[0, 1, 8, 65_535]),
        front_max_bytes: rng.pick(&[0, 4096, usize::MAX]),
        front_max_block: rng.pick(&[0, 1, 1 << 20, usize::MAX]),
        front_large_slot: rng.coin(),
        cross_stream_waits: rng.coin(),
        release_idle_on_miss: rng.coin(),
        live_slack_percent: rng.pick(&[0, 4, 100]),
        expandable_segments: rng.coin(),
        max_mapping_bytes: rng.pick(&[0, 1, 4 << 20, usize::MAX]),
        own_range_from: rng.pick(&[0, 1, 16 << 20, usize::MAX]),
        map_ahead_bytes: rng.pick(&[0, 1, 4 << 20, usize::MAX]),
        lowest_for_whole_pages: rng.coin(),
    };
    if config.check().is_err() {
        config.small_segment = config.small_segment.max(config.small_max);
    }
    config
}

#[test]
fn every_accepted_config_survives_any_request_without_a_panic_or_an_overlap() {
    let rounds: u64 = if cfg!(miri) { 4 } else { 300 };
    for seed in 1..=rounds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let config = hostile_config(&mut rng);
        let backend = if rng.coin() { FakeBackend::with_pages(2 << 20, 1 << 44) } else { FakeBackend::address_only() };
        let Ok(cache) = CachingAllocator::new(backend, config.clone()) else {
            assert!(config.check().is_err(), "seed {seed}: a config check() accepts was refused");
            continue;
        };
        let streams = [StreamKey(1), StreamKey(2)];
        let mut held: Vec<CachedBlock> = Vec::new();
        let mut live = BTreeMap::new();
        for _ in 0..if cfg!(miri) { 16 } else { 120 } {
            match rng.next() % 5 {
                0 | 1 => {
                    let bytes = match rng.next() % 4 {
                        0 => usize::MAX - (rng.next() % 4096) as usize,
                        1 => (rng.next() % (4 << 30)) as usize,
                        _ => (rng.next() % (4 << 20)) as usize,
                    };
                    let stream = streams[(rng.next() % 2) as usize];
                    if let Ok(block) = cache.alloc(bytes, &stream) {
                        let start = block.ptr().as_ptr() as usize;
                        assert!(block.bytes() >= bytes, "seed {seed}: a block smaller than its request");
                        let before = live.range(..start + block.bytes()).next_back();
                        assert!(
                            before.is_none_or(|(&s, &end)| end <= start || s >= start + block.bytes()),
                            "seed {seed}: overlap"
                        );
                        live.insert(start, start + block.bytes());
                        held.push(block);
                    }
                }
                2 | 3 if !held.is_empty() => {
                    let block = held.swap_remove((rng.next() % held.len() as u64) as usize);
                    live.remove(&(block.ptr().as_ptr() as usize));
                    // SAFETY: a block of this allocator; the fake runs no work on it.
                    unsafe { cache.free(block) };
                }
                _ => {
                    cache.empty_cache();
                }
            }
        }
        cache.check_invariants();
        for block in held {
            // SAFETY: as above.
            unsafe { cache.free(block) };
        }
        cache.empty_cache();
        assert_eq!(cache.stats().reserved.current, 0, "seed {seed}: everything given back");
    }
}
