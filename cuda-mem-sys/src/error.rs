//! Names for `cudaError` codes, without calling the runtime.

use crate::cudaError;
use core::fmt;

impl cudaError {
    /// The enumerator's name in the headers these bindings were generated from, e.g.
    /// `Some("cudaErrorMemoryAllocation")`; `None` for a code those headers do not declare (one
    /// from a newer runtime).
    ///
    /// Pure Rust: unlike `cudaGetErrorName`, it needs no driver and never enters libcudart.
    ///
    /// ```
    /// use cuda_mem_sys::cudaError;
    ///
    /// assert_eq!(cudaError::cudaErrorMemoryAllocation.name(), Some("cudaErrorMemoryAllocation"));
    /// assert_eq!(cudaError(2).to_string(), "cudaErrorMemoryAllocation");
    /// assert_eq!(cudaError(123_456).name(), None);
    /// assert_eq!(cudaError(123_456).to_string(), "cudaError(123456)");
    /// ```
    pub const fn name(self) -> Option<&'static str> {
        crate::cuda_error_name(self)
    }
}

/// The enumerator's name (`cudaErrorMemoryAllocation`), or `cudaError(N)` for an unknown code.
impl fmt::Display for cudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "cudaError({})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use crate::cudaError;
    use std::string::ToString;
    use std::vec::Vec;

    /// The bindings file these bindings were included from.
    #[cfg(cuda_bindgen)]
    const BINDINGS: &str = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    #[cfg(all(not(cuda_bindgen), cuda_major = "13"))]
    const BINDINGS: &str = include_str!("bindings/cuda_13_0.rs");
    #[cfg(all(not(cuda_bindgen), cuda_major = "12"))]
    const BINDINGS: &str = include_str!("bindings/cuda_12_9.rs");

    /// `pub const NAME: cudaError = cudaError(N);`, read from the bindings' text: every
    /// enumerator bindgen emitted, independently of the name table the generator built.
    fn enumerators() -> Vec<(&'static str, u32)> {
        BINDINGS
            .lines()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix("pub const ")?;
                let (name, rest) = rest.split_once(": cudaError = cudaError(")?;
                Some((name, rest.strip_suffix(");")?.parse().ok()?))
            })
            .collect()
    }

    #[test]
    fn every_enumerator_has_its_name() {
        let enumerators = enumerators();
        // CUDA 12.9 and 13.0 declare over a hundred; fewer means the text was not understood.
        assert!(enumerators.len() > 100, "found {} cudaError enumerators", enumerators.len());
        for &(name, code) in &enumerators {
            // Where two enumerators share a value, the first declared names it.
            let (first, _) = *enumerators.iter().find(|&&(_, c)| c == code).expect("the enumerator itself");
            assert_eq!(cudaError(code).name(), Some(first), "{name} = cudaError({code})");
            assert_eq!(cudaError(code).to_string(), first);
        }
    }

    #[test]
    fn known_codes_by_name() {
        assert_eq!(cudaError::cudaSuccess.name(), Some("cudaSuccess"));
        assert_eq!(cudaError(2).name(), Some("cudaErrorMemoryAllocation"));
        assert_eq!(cudaError::cudaErrorInsufficientDriver.to_string(), "cudaErrorInsufficientDriver");
        assert_eq!(cudaError::cudaErrorUnknown.to_string(), "cudaErrorUnknown");
    }

    #[test]
    fn unknown_codes_print_their_number() {
        // 10 and 11 are gaps in the enumeration; u32::MAX is far past its end.
        for code in [10, 11, 123_456, u32::MAX] {
            assert_eq!(cudaError(code).name(), None);
            assert_eq!(cudaError(code).to_string(), std::format!("cudaError({code})"));
        }
    }
}
