//! What GPU code the build embeds, checked without a GPU and without cuobjdump: the CUDA fat
//! binaries in the `.nv_fatbin` ELF sections of
//!
//! 1. every object of the static library the build script handed to the linker
//!    (`CUDA_MEM_KERNELS_LIB`), one object per `kernels/*.cu`, and
//! 2. this test executable itself, which links the kernels (so: what is actually linked).
//!
//! With the default `CUDA_MEM_ARCHS`, each must hold sm_80 and sm_90 machine code and compute_90
//! PTX; with another setting, exactly the targets it names.
//!
//! Fat binary layout (CUDA 12/13, as read from nvcc's output): a container is a 16-byte header
//! (u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of the entries that follow),
//! then entries, each a header (u16 kind: 1 = PTX, 2 = ELF cubin; u32 header size at +4; u64
//! payload size at +8; u32 SM architecture at +28, e.g. 90; u64 flags at +40, where 0x8000 marks a
//! compressed payload) and its payload. Containers of several objects are concatenated, padded
//! with zeros, in a linked executable's section.

use std::collections::BTreeSet;
use std::path::Path;

/// The targets `CUDA_MEM_ARCHS` defaults to.
const DEFAULT_TARGETS: &str = "sm_80,sm_90,compute_90";

/// Kernels every build holds (`__global__` functions in kernels/*.cu).
const KERNELS: [&str; 9] = [
    "fill_b32",
    "scale_f32",
    "axpy_f32",
    "checksum_u32",
    "stream_read_u32",
    "stream_write_u32",
    "touch_write_u32",
    "touch_read_u32",
    "pointer_chase_u32",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ptx,
    Cubin,
    Other(u16),
}

/// (kind, SM architecture number).
type Target = (Kind, u32);

#[derive(Debug)]
struct Entry<'a> {
    kind: Kind,
    arch: u32,
    compressed: bool,
    payload: &'a [u8],
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, String> {
    bytes
        .get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or_else(|| format!("truncated: no u16 at {at} of {}", bytes.len()))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, String> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| format!("truncated: no u32 at {at} of {}", bytes.len()))
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, String> {
    bytes
        .get(at..at + 8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| format!("truncated: no u64 at {at} of {}", bytes.len()))
}

fn usize_at(bytes: &[u8], at: usize) -> Result<usize, String> {
    usize::try_from(u64_at(bytes, at)?).map_err(|e| e.to_string())
}

mod fatbin {
    use super::*;

    pub const MAGIC: u32 = 0xBA55_ED50;
    const COMPRESSED: u64 = 0x8000;

    /// Every container of a `.nv_fatbin` section, each as its list of entries.
    pub fn containers(section: &[u8]) -> Result<Vec<Vec<Entry<'_>>>, String> {
        let mut containers = Vec::new();
        let mut at = 0;
        loop {
            // Zero padding separates the containers of different objects.
            while section.get(at) == Some(&0) {
                at += 1;
            }
            if at >= section.len() {
                return Ok(containers);
            }
            let magic = u32_at(section, at)?;
            if magic != MAGIC {
                return Err(format!("no fat binary magic at offset {at}: {magic:#010x}"));
            }
            let header = usize::from(u16_at(section, at + 6)?);
            let size = usize_at(section, at + 8)?;
            let end = at + header + size;
            if header < 16 || end > section.len() {
                return Err(format!("container at {at} (header {header}, size {size}) overruns {}", section.len()));
            }
            containers.push(entries(&section[at + header..end])?);
            at = end;
        }
    }

    fn entries(mut rest: &[u8]) -> Result<Vec<Entry<'_>>, String> {
        let mut entries = Vec::new();
        while !rest.is_empty() {
            let kind = match u16_at(rest, 0)? {
                1 => Kind::Ptx,
                2 => Kind::Cubin,
                other => Kind::Other(other),
            };
            let header = u32_at(rest, 4)? as usize;
            let size = usize_at(rest, 8)?;
            if header < 48 || header + size > rest.len() {
                return Err(format!("entry (header {header}, size {size}) overruns its container"));
            }
            let arch = u32_at(rest, 28)?;
            let compressed = u64_at(rest, 40)? & COMPRESSED != 0;
            entries.push(Entry { kind, arch, compressed, payload: &rest[header..header + size] });
            rest = &rest[header + size..];
        }
        Ok(entries)
    }
}

mod elf {
    use super::*;

    /// The contents of the section called `name` in a little-endian ELF64 file, if it has one.
    pub fn section<'a>(file: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, String> {
        if file.get(..4) != Some(b"\x7fELF") || file.get(4) != Some(&2) || file.get(5) != Some(&1) {
            return Err("not a little-endian ELF64 file".into());
        }
        let table = usize_at(file, 0x28)?;
        let entry_size = usize::from(u16_at(file, 0x3a)?);
        let header = |index: usize| table + index * entry_size;
        // Extended numbering: counts that do not fit in 16 bits live in section 0.
        let mut count = usize::from(u16_at(file, 0x3c)?);
        if count == 0 {
            count = usize_at(file, header(0) + 32)?;
        }
        let mut names_index = usize::from(u16_at(file, 0x3e)?);
        if names_index == 0xffff {
            names_index = u32_at(file, header(0) + 40)? as usize;
        }
        let contents = |index: usize| -> Result<&'a [u8], String> {
            let offset = usize_at(file, header(index) + 24)?;
            let size = usize_at(file, header(index) + 32)?;
            file.get(offset..offset + size).ok_or_else(|| format!("section {index} lies outside the file"))
        };
        let names = contents(names_index)?;
        for index in 1..count {
            let name_at = u32_at(file, header(index))? as usize;
            let section_name = names.get(name_at..).and_then(|n| n.split(|&b| b == 0).next()).unwrap_or_default();
            if section_name == name.as_bytes() {
                return contents(index).map(Some);
            }
        }
        Ok(None)
    }
}

mod ar {
    /// (name, contents) of every member of a System V / GNU `ar` archive, except its symbol and
    /// long-name tables.
    pub fn members(archive: &[u8]) -> Result<Vec<(String, &[u8])>, String> {
        let mut rest = archive.strip_prefix(b"!<arch>\n").ok_or("not an ar archive")?;
        let mut long_names: &[u8] = &[];
        let mut members = Vec::new();
        while rest.len() >= 60 {
            let (header, body) = rest.split_at(60);
            let field = |range: std::ops::Range<usize>| String::from_utf8_lossy(&header[range]).trim().to_string();
            let size: usize = field(48..58).parse().map_err(|e| format!("member size: {e}"))?;
            let data = body.get(..size).ok_or("truncated member")?;
            let raw_name = field(0..16);
            match raw_name.as_str() {
                "/" | "/SYM64/" => {}
                "//" => long_names = data,
                _ => {
                    let name = match raw_name.strip_prefix('/').and_then(|n| n.parse::<usize>().ok()) {
                        Some(at) => {
                            let tail = long_names.get(at..).ok_or("long name outside the table")?;
                            let end = tail.iter().position(|&b| b == b'\n').unwrap_or(tail.len());
                            String::from_utf8_lossy(&tail[..end]).to_string()
                        }
                        None => raw_name.clone(),
                    };
                    members.push((name.trim_end_matches('/').to_string(), data));
                }
            }
            // Members start at even offsets.
            rest = body.get(size + size % 2..).unwrap_or_default();
        }
        Ok(members)
    }
}

/// The targets the build was configured with, as (kind, architecture number).
fn expected_targets() -> BTreeSet<Target> {
    cuda_mem_kernels::COMPILED_TARGETS
        .split(',')
        .map(|name| {
            let (kind, arch) = match (name.strip_prefix("sm_"), name.strip_prefix("compute_")) {
                (Some(arch), _) => (Kind::Cubin, arch),
                (_, Some(arch)) => (Kind::Ptx, arch),
                _ => panic!("unexpected target name {name}"),
            };
            let number = arch.trim_end_matches(['a', 'f']).parse().unwrap_or_else(|e| panic!("{name}: {e}"));
            (kind, number)
        })
        .collect()
}

/// Checks one container set (one object, or all of an executable) against the expected targets:
/// the same (kind, architecture) pairs, sane payloads, and every kernel in every cubin target.
fn check_entries(what: &str, entries: &[Entry<'_>]) {
    let expected = expected_targets();
    if cuda_mem_kernels::COMPILED_TARGETS == DEFAULT_TARGETS {
        let default: BTreeSet<Target> = [(Kind::Cubin, 80), (Kind::Cubin, 90), (Kind::Ptx, 90)].into();
        assert_eq!(expected, default, "the default targets are sm_80 and sm_90 SASS plus compute_90 PTX");
    }
    let found: BTreeSet<Target> = entries.iter().map(|e| (e.kind, e.arch)).collect();
    for target in &expected {
        assert!(found.contains(target), "{what}: no {target:?} image; it holds {found:?}");
    }
    assert_eq!(found, expected, "{what}: images for targets nobody asked for");

    for entry in entries.iter().filter(|e| !e.compressed) {
        match entry.kind {
            Kind::Cubin => {
                assert_eq!(entry.payload.get(..4), Some(&b"\x7fELF"[..]), "{what}: sm_{} cubin is not ELF", entry.arch);
                // e_machine 190 = EM_CUDA.
                assert_eq!(u16_at(entry.payload, 18), Ok(190), "{what}: sm_{} cubin is not a CUDA ELF", entry.arch);
            }
            Kind::Ptx => {
                let target = format!(".target sm_{}", entry.arch);
                let text = String::from_utf8_lossy(entry.payload);
                assert!(text.contains(&target), "{what}: compute_{} PTX lacks `{target}`", entry.arch);
            }
            Kind::Other(_) => {}
        }
    }
}

/// Asserts every kernel's code is in the uncompressed cubins of each SASS architecture.
fn check_kernels_present(what: &str, entries: &[Entry<'_>]) {
    for &(kind, arch) in expected_targets().iter().filter(|(kind, _)| *kind == Kind::Cubin) {
        let cubins: Vec<_> = entries.iter().filter(|e| (e.kind, e.arch) == (kind, arch) && !e.compressed).collect();
        if cubins.is_empty() {
            eprintln!("{what}: sm_{arch} cubins are compressed; kernel names not checked");
            continue;
        }
        for kernel in KERNELS {
            let found = cubins.iter().any(|c| c.payload.windows(kernel.len()).any(|w| w == kernel.as_bytes()));
            assert!(found, "{what}: kernel {kernel} missing from the sm_{arch} cubins");
        }
    }
}

fn kernel_source_count() -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter(|entry| entry.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cu")))
        .count()
}

#[test]
fn every_object_of_the_linked_library_holds_sm80_sm90_sass_and_compute90_ptx() {
    let Some(library) = option_env!("CUDA_MEM_KERNELS_LIB") else {
        panic!("the build script compiled no kernels (DOCS_RS set?)");
    };
    let archive = std::fs::read(library).unwrap_or_else(|e| panic!("{library}: {e}"));
    let members = ar::members(&archive).unwrap();
    let mut objects = 0;
    let mut all = Vec::new();
    for (name, object) in &members {
        let section = elf::section(object, ".nv_fatbin").unwrap_or_else(|e| panic!("{name}: {e}"));
        let Some(section) = section else { panic!("{name} has no .nv_fatbin section") };
        let containers = fatbin::containers(section).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(containers.len(), 1, "{name}: one fat binary per object");
        let entries: Vec<Entry<'_>> = containers.into_iter().flatten().collect();
        check_entries(name, &entries);
        all.extend(entries);
        objects += 1;
    }
    assert_eq!(objects, kernel_source_count(), "one object per kernels/*.cu in {library}");
    check_kernels_present(library, &all);
}

/// Uses a launcher from each kernel file, so the linker pulls every kernel object into this
/// executable (the launchers are never called: there is no GPU here).
fn keep_every_kernel_object_linked() {
    use cuda_mem::{DeviceSlice, DeviceSliceMut, Result, StreamScope};
    type Scope = StreamScope<'static, 'static>;
    type Out<T> = DeviceSliceMut<'static, T>;
    type In<T> = DeviceSlice<'static, T>;
    let fill: fn(&Scope, &mut Out<u32>, u32) -> Result<()> = cuda_mem_kernels::fill_u32;
    let checksum: fn(&Scope, In<u32>, &mut Out<u64>) -> Result<()> = cuda_mem_kernels::checksum_u32;
    let read: fn(&Scope, In<u32>, &mut Out<u32>) -> Result<()> = cuda_mem_kernels::stream_read_u32;
    let touch: fn(&Scope, &mut Out<u32>, usize, u32) -> Result<()> = cuda_mem_kernels::touch_pages_write;
    type Chase = fn(&Scope, In<u32>, u32, u64, &mut Out<u32>) -> Result<()>;
    let chase: Chase = cuda_mem_kernels::pointer_chase;
    std::hint::black_box((fill, checksum, read, touch, chase));
}

#[test]
fn this_executable_links_sm80_sm90_sass_and_compute90_ptx_of_every_kernel() {
    keep_every_kernel_object_linked();
    let exe = std::env::current_exe().unwrap();
    let file = std::fs::read(&exe).unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let what = exe.display().to_string();
    let section = elf::section(&file, ".nv_fatbin").unwrap().unwrap_or_else(|| panic!("{what}: no .nv_fatbin"));
    let containers = fatbin::containers(section).unwrap();
    assert_eq!(containers.len(), kernel_source_count(), "{what}: one fat binary per kernel object");
    for (index, container) in containers.iter().enumerate() {
        check_entries(&format!("{what}, fat binary {index}"), container);
    }
    check_kernels_present(&what, &containers.into_iter().flatten().collect::<Vec<_>>());
}

#[test]
fn a_missing_target_fails_the_check() {
    let expected: Vec<Target> = expected_targets().into_iter().collect();
    let entry = |&(kind, arch): &Target| Entry { kind, arch, compressed: true, payload: &[] };
    let complete: Vec<Entry<'_>> = expected.iter().map(entry).collect();
    check_entries("all targets", &complete);
    for missing in &expected {
        let partial: Vec<Entry<'_>> = expected.iter().filter(|t| *t != missing).map(entry).collect();
        let checked = std::panic::catch_unwind(|| check_entries("one target short", &partial));
        assert!(checked.is_err(), "a fat binary without {missing:?} passed the check");
    }
    let mut extra = complete;
    extra.push(Entry { kind: Kind::Cubin, arch: 75, compressed: true, payload: &[] });
    assert!(std::panic::catch_unwind(|| check_entries("one target more", &extra)).is_err());
}

#[test]
fn parser_reads_a_handmade_container() {
    let payload = b"\x7fELF\x02\x01\x01\x41";
    let mut entry = vec![0u8; 64];
    entry[0..2].copy_from_slice(&2u16.to_le_bytes());
    entry[4..8].copy_from_slice(&64u32.to_le_bytes());
    entry[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    entry[28..32].copy_from_slice(&86u32.to_le_bytes());
    entry[40..48].copy_from_slice(&0x11u64.to_le_bytes());
    entry.extend(payload);
    let mut container = fatbin::MAGIC.to_le_bytes().to_vec();
    container.extend(1u16.to_le_bytes());
    container.extend(16u16.to_le_bytes());
    container.extend((entry.len() as u64).to_le_bytes());
    container.extend(&entry);
    // Two containers with zero padding between them, as in a linked executable.
    let mut section = container.clone();
    section.extend([0u8; 8]);
    section.extend(&container);
    let containers = fatbin::containers(&section).unwrap();
    assert_eq!(containers.len(), 2);
    for entries in &containers {
        assert_eq!(entries.len(), 1);
        let entry = &entries[0];
        assert_eq!((entry.kind, entry.arch, entry.compressed), (Kind::Cubin, 86, false));
        assert_eq!(entry.payload, payload);
    }
}

#[test]
fn parsers_reject_what_they_do_not_understand() {
    assert!(fatbin::containers(&[0u8; 32]).unwrap().is_empty());
    assert!(fatbin::containers(b"\x50\xed\x55\xbb0123456789abcdef").is_err());
    let mut truncated = fatbin::MAGIC.to_le_bytes().to_vec();
    truncated.extend([1, 0, 16, 0]);
    truncated.extend(100u64.to_le_bytes());
    assert!(fatbin::containers(&truncated).is_err());
    assert!(elf::section(b"not an elf", ".nv_fatbin").is_err());
    assert!(ar::members(b"plain text").is_err());
}
