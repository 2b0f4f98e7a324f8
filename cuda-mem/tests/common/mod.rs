//! Helpers shared by the GPU test binaries.
#![allow(dead_code)] // each test binary uses a different subset

/// A deterministic, non-trivial pattern (no zeros runs that would hide unwritten memory).
pub fn pattern(len: usize, seed: u32) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        })
        .collect()
}

/// FNV-1a over the words.
pub fn checksum(data: &[u32]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

/// Asserts equality by checksum first (cheap message), then by content.
#[track_caller]
pub fn assert_same(got: &[u32], want: &[u32]) {
    assert_eq!(got.len(), want.len(), "length");
    if checksum(got) != checksum(want) {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!("data differs first at element {first}: got {:#x}, want {:#x}", got[first], want[first]);
    }
}

pub const KIB: usize = 1 << 10;
pub const MIB: usize = 1 << 20;

/// Tests that need the device to themselves (no other test's synchronizing calls such as
/// `cudaFreeHost`, or no memory pressure from them) take this for writing; the others for reading.
pub static EXCLUSIVE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A shared hold on the device (most tests).
pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    EXCLUSIVE.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The device to this test alone.
pub fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    EXCLUSIVE.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}
