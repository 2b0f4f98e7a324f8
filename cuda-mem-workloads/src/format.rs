//! The workload file: what a replayer in another language (PyTorch's C++ extension, the RMM
//! program) reads. Little-endian throughout:
//!
//! ```text
//! header  b"CMWL", u32 version (1), u32 lanes, u32 name length, name (UTF-8)
//! lane    u64 op count, then the ops
//! op      16 bytes: u8 kind, u8 0, u16 lane, u32 id, u64 bytes
//!         kind 0 alloc (id, bytes), 1 free (id), 2 free after lane `lane`'s stream used it
//!         (id, lane), 3 empty cache; unused fields are 0
//! ```
//!
//! A lane allocates an id only while it is not live and frees only live ids, which are below
//! [`MAX_ID`]; [`read`] refuses any other file, so a replayer can trust what it reads.

use crate::{Lane, Op, Workload};
use std::io::{self, Read, Write};

const MAGIC: &[u8; 4] = b"CMWL";

/// Ids are below this: a replayer may keep its live blocks in a table indexed by id.
pub const MAX_ID: u32 = 1 << 24;
const VERSION: u32 = 1;

/// Writes `workload` in the file format.
pub fn write(workload: &Workload, out: &mut impl Write) -> io::Result<()> {
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&u32::try_from(workload.lanes.len()).map_err(invalid)?.to_le_bytes())?;
    out.write_all(&u32::try_from(workload.name.len()).map_err(invalid)?.to_le_bytes())?;
    out.write_all(workload.name.as_bytes())?;
    for lane in &workload.lanes {
        out.write_all(&(lane.ops.len() as u64).to_le_bytes())?;
        for &op in &lane.ops {
            let (kind, other, id, bytes) = match op {
                Op::Alloc { id, bytes } => (0u8, 0u16, id, bytes),
                Op::Free { id } => (1, 0, id, 0),
                Op::FreeOn { id, lane } => (2, lane, id, 0),
                Op::EmptyCache => (3, 0, 0, 0),
            };
            let mut record = [0u8; 16];
            record[0] = kind;
            record[2..4].copy_from_slice(&other.to_le_bytes());
            record[4..8].copy_from_slice(&id.to_le_bytes());
            record[8..16].copy_from_slice(&bytes.to_le_bytes());
            out.write_all(&record)?;
        }
    }
    Ok(())
}

/// Reads a workload; malformed input is an `InvalidData` error, never a panic.
pub fn read(input: &mut impl Read) -> io::Result<Workload> {
    let mut word = [0u8; 4];
    input.read_exact(&mut word)?;
    if &word != MAGIC {
        return Err(invalid("not a workload file (no CMWL magic)"));
    }
    let version = read_u32(input)?;
    if version != VERSION {
        return Err(invalid(format!("workload file version {version}, this reader knows {VERSION}")));
    }
    let lanes = read_u32(input)? as usize;
    let name_len = read_u32(input)? as usize;
    if name_len > 4096 || lanes > u16::MAX as usize + 1 {
        return Err(invalid("implausible header"));
    }
    let mut name = vec![0u8; name_len];
    input.read_exact(&mut name)?;
    let name = String::from_utf8(name).map_err(invalid)?;
    let mut workload = Workload { name, lanes: Vec::new() };
    for _ in 0..lanes {
        let mut count = [0u8; 8];
        input.read_exact(&mut count)?;
        let count = u64::from_le_bytes(count);
        let mut lane = Lane::default();
        let mut live = std::collections::HashSet::new();
        for _ in 0..count {
            let mut r = [0u8; 16];
            input.read_exact(&mut r)?;
            let other = u16::from_le_bytes([r[2], r[3]]);
            let id = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes"));
            let bytes = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
            let op = match r[0] {
                0 if bytes > 0 && id < MAX_ID && live.insert(id) => Op::Alloc { id, bytes },
                1 if live.remove(&id) => Op::Free { id },
                2 if usize::from(other) < lanes && live.remove(&id) => Op::FreeOn { id, lane: other },
                3 => Op::EmptyCache,
                kind => {
                    let lane_index = workload.lanes.len();
                    return Err(invalid(format!(
                        "lane {lane_index}, op {}: bad op (kind {kind}, id {id}, lane {other}, bytes {bytes})",
                        lane.ops.len()
                    )));
                }
            };
            lane.ops.push(op);
        }
        workload.lanes.push(lane);
    }
    Ok(workload)
}

fn read_u32(input: &mut impl Read) -> io::Result<u32> {
    let mut word = [0u8; 4];
    input.read_exact(&mut word)?;
    Ok(u32::from_le_bytes(word))
}

fn invalid(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_round_trip() {
        let w = Workload {
            name: "t".into(),
            lanes: vec![
                Lane { ops: vec![Op::Alloc { id: 0, bytes: 7 }, Op::FreeOn { id: 0, lane: 1 }, Op::EmptyCache] },
                Lane { ops: vec![Op::Alloc { id: 3, bytes: 1 << 40 }, Op::Free { id: 3 }] },
            ],
        };
        let mut bytes = Vec::new();
        write(&w, &mut bytes).unwrap();
        assert_eq!(bytes.len(), 16 + 1 + 8 * 2 + 16 * 5);
        assert_eq!(read(&mut bytes.as_slice()).unwrap(), w);
    }

    #[test]
    fn malformed_files_are_errors() {
        let w = Workload { name: "t".into(), lanes: vec![Lane { ops: vec![Op::FreeOn { id: 0, lane: 0 }] }] };
        let mut bytes = Vec::new();
        write(&w, &mut bytes).unwrap();
        for cut in 0..bytes.len() {
            assert!(read(&mut &bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut bad_lane = bytes.clone();
        bad_lane[16 + 1 + 8 + 2] = 9; // FreeOn names lane 9 of 1
        assert!(read(&mut bad_lane.as_slice()).is_err());
        let mut bad_kind = bytes.clone();
        bad_kind[16 + 1 + 8] = 7;
        assert!(read(&mut bad_kind.as_slice()).is_err());
        // Forged scripts: a free of an id never allocated (the file above), a second allocation
        // of a live id, an id past the bound.
        for ops in [
            vec![Op::Alloc { id: 1, bytes: 8 }, Op::Alloc { id: 1, bytes: 8 }],
            vec![Op::Alloc { id: 1, bytes: 8 }, Op::Free { id: 1 }, Op::Free { id: 1 }],
            vec![Op::Alloc { id: MAX_ID, bytes: 8 }],
        ] {
            let mut forged = Vec::new();
            write(&Workload { name: "f".into(), lanes: vec![Lane { ops }] }, &mut forged).unwrap();
            let err = read(&mut forged.as_slice()).unwrap_err();
            assert!(err.to_string().contains("bad op"), "{err}");
        }
        assert!(read(&mut &b"NOPE"[..]).is_err());
    }
}
