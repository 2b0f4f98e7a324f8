//! The generators' randomness: MT19937-64 (so the churn script is the one `std::mt19937_64`
//! gives RMM's benchmark) and libstdc++'s `uniform_real_distribution<double>` over it.

/// MT19937-64, as C++'s `std::mt19937_64`.
#[derive(Debug, Clone)]
pub struct Mt64 {
    state: Box<[u64; 312]>,
    index: usize,
}

impl Mt64 {
    const N: usize = 312;
    const M: usize = 156;
    const UPPER: u64 = 0xFFFF_FFFF_8000_0000;
    const LOWER: u64 = 0x7FFF_FFFF;

    /// Seeded as `std::mt19937_64(seed)`.
    pub fn new(seed: u64) -> Self {
        let mut state = Box::new([0u64; 312]);
        state[0] = seed;
        for i in 1..Self::N {
            let prev = state[i - 1];
            state[i] = 6364136223846793005u64.wrapping_mul(prev ^ (prev >> 62)).wrapping_add(i as u64);
        }
        Self { state, index: Self::N }
    }

    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..Self::N {
            let x = (s[i] & Self::UPPER) | (s[(i + 1) % Self::N] & Self::LOWER);
            let mut next = x >> 1;
            if x & 1 == 1 {
                next ^= 0xB502_6F5A_A966_19E9;
            }
            s[i] = s[(i + Self::M) % Self::N] ^ next;
        }
        self.index = 0;
    }

    /// The next 64-bit output.
    pub fn next_u64(&mut self) -> u64 {
        if self.index >= Self::N {
            self.twist();
        }
        let mut x = self.state[self.index];
        self.index += 1;
        x ^= (x >> 29) & 0x5555_5555_5555_5555;
        x ^= (x << 17) & 0x71D6_7FFF_EDA6_0000;
        x ^= (x << 37) & 0xFFF7_EEE0_0000_0000;
        x ^ (x >> 43)
    }

    /// Uniform in `[0, 1)`, as libstdc++'s `generate_canonical<double, 53>` over this engine.
    pub fn canonical(&mut self) -> f64 {
        let r = self.next_u64() as f64 / 18446744073709551616.0;
        if r >= 1.0 { 1.0 - f64::EPSILON / 2.0 } else { r }
    }

    /// Uniform in `[low, high)`, as `std::uniform_real_distribution<double>(low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        self.canonical() * (high - low) + low
    }

    /// Uniform in `0..n` (n > 0); not C++'s distribution, for this crate's own generators.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Log-uniform in `[low, high]`, rounded to a multiple of `step`.
    pub fn log_uniform(&mut self, low: usize, high: usize, step: usize) -> usize {
        let x = self.uniform((low as f64).ln(), (high as f64).ln()).exp();
        ((x as usize).div_ceil(step) * step).clamp(low.div_ceil(step) * step, high)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.canonical() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_matches_cpp() {
        // The C++ standard fixes the 10000th output of a default-seeded mt19937_64.
        let mut rng = Mt64::new(5489);
        let mut x = 0;
        for _ in 0..10000 {
            x = rng.next_u64();
        }
        assert_eq!(x, 9981545732273789042);
    }

    #[test]
    fn uniform_stays_in_range() {
        let mut rng = Mt64::new(1);
        for _ in 0..10000 {
            let x = rng.uniform(2.0, 3.0);
            assert!((2.0..3.0).contains(&x));
            let y = rng.log_uniform(256, 1 << 20, 256);
            assert!((256..=1 << 20).contains(&y) && y.is_multiple_of(256));
        }
    }
}
