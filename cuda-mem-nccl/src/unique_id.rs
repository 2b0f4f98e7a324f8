//! `UniqueId`: what the ranks of one communicator share before it exists.

use crate::raw::{self, RawUniqueId, UNIQUE_ID_BYTES};
use crate::status::invalid;
use cuda_mem::Result;
use std::fmt;

/// The id every rank passes to [`Communicator::init_rank`](crate::Communicator::init_rank):
/// made once (`ncclGetUniqueId`, which also starts NCCL's bootstrap root in this process, so
/// keep the process alive until every rank has joined) and sent to the other ranks over any
/// channel they share, e.g. as [`UniqueId::to_hex`] in a command line.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem_nccl::UniqueId;
/// let id = UniqueId::new()?;
/// let text = id.to_hex(); // pass to the other processes
/// assert_eq!(UniqueId::from_hex(&text)?, id);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// Bytes in an id (`NCCL_UNIQUE_ID_BYTES`).
    pub const BYTES: usize = UNIQUE_ID_BYTES;

    /// A new id from NCCL (`ncclGetUniqueId`).
    pub fn new() -> Result<Self> {
        let raw = raw::get_unique_id()?;
        Ok(Self { bytes: raw.internal.map(|c| c as u8) })
    }

    /// An id received as bytes. Any bytes are accepted: a forged id makes the communicator's
    /// creation fail (NCCL cannot reach the root it names) or hang, never memory unsafety.
    pub fn from_bytes(bytes: [u8; UNIQUE_ID_BYTES]) -> Self {
        Self { bytes }
    }

    /// The bytes, for sending to the other ranks.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// The bytes as 256 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// An id from [`UniqueId::to_hex`]'s text; anything else is
    /// [`ErrorKind::InvalidArgument`](cuda_mem::ErrorKind::InvalidArgument).
    pub fn from_hex(text: &str) -> Result<Self> {
        let digits = text.trim().as_bytes();
        if digits.len() != 2 * UNIQUE_ID_BYTES {
            let operation = format!("UniqueId::from_hex of {} characters", digits.len());
            return Err(invalid("an NCCL unique id is 256 hex digits", operation));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok());
            *byte = pair.ok_or_else(|| invalid("an NCCL unique id is 256 hex digits", "UniqueId::from_hex"))?;
        }
        Ok(Self { bytes })
    }

    pub(crate) fn as_raw(&self) -> RawUniqueId {
        RawUniqueId { internal: self.bytes.map(|b| b as std::ffi::c_char) }
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({}…)", &self.to_hex()[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem::ErrorKind;

    #[test]
    fn hex_round_trips_every_byte() {
        let id = UniqueId::from_bytes(std::array::from_fn(|i| (i * 7 + 3) as u8));
        let text = id.to_hex();
        assert_eq!(text.len(), 256);
        assert_eq!(UniqueId::from_hex(&text).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&format!(" {}\n", text.to_uppercase())).unwrap(), id);
        assert_eq!(id.as_raw().internal.map(|c| c as u8), *id.as_bytes());
        assert!(format!("{id:?}").starts_with("UniqueId(030a1118"));
    }

    #[test]
    fn bad_hex_is_a_typed_error() {
        let short = UniqueId::from_hex("abcd").unwrap_err();
        assert!(matches!(short.kind(), ErrorKind::InvalidArgument(_)), "{short}");
        assert!(short.operation().contains("4 characters"), "{short}");
        let not_hex = "zz".repeat(128);
        assert!(matches!(UniqueId::from_hex(&not_hex).unwrap_err().kind(), ErrorKind::InvalidArgument(_)));
        // Multi-byte characters are not split into invalid UTF-8 and accepted.
        let wide = "é".repeat(128);
        assert!(UniqueId::from_hex(&wide).is_err());
    }
}
