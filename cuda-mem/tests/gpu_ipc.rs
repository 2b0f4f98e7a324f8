//! IPC across two processes on one GPU: the parent exports pool memory (pool fd + pointer) and a
//! `cudaMalloc` buffer (legacy handle); a child process (this same binary, re-executed) imports
//! each, writes a pattern, and exits; the parent verifies the data.
//!
//! A plain `main` (harness = false), since one binary plays both roles. Like the other GPU tests
//! it runs only with `--include-ignored` or `--ignored` and otherwise reports its tests ignored;
//! it reads libtest's `--list`, name filters, `--skip` and `--exact` too, so the runners' passes
//! (see `common/mod.rs`) select from it as from the others.

mod common;

use common::{MIB, assert_same, pattern};
use cuda_mem::*;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::process::Command;

const ROLE: &str = "CUDA_MEM_IPC_ROLE";
const FD: &str = "CUDA_MEM_IPC_FD";
const DATA: &str = "CUDA_MEM_IPC_DATA";
const LEN: usize = 4 * MIB;
const SEED: u32 = 0xC0FFEE;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> [u8; EXPORT_BYTES] {
    std::array::from_fn(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex"))
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        child(&role);
        return;
    }
    let args = Args::parse(std::env::args().skip(1));
    let tests: [(&str, fn()); 2] = [("gpu_ipc_pool_fd_and_pointer", pool_path), ("gpu_ipc_legacy_handle", legacy_path)];
    let selected: Vec<_> = tests.iter().filter(|(name, _)| args.selects(name)).collect();
    let filtered_out = tests.len() - selected.len();
    if args.list {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        println!("\n{} tests, 0 benchmarks", selected.len());
        return;
    }
    if !args.run_ignored {
        for (name, _) in &selected {
            println!("test {name} ... ignored, needs a CUDA GPU");
        }
        println!(
            "\ntest result: ok. 0 passed; 0 failed; {} ignored; 0 measured; {filtered_out} filtered out",
            selected.len()
        );
        return;
    }
    let mut failed = 0;
    for (name, test) in &selected {
        let outcome = std::panic::catch_unwind(test);
        println!("test {name} ... {}", if outcome.is_ok() { "ok" } else { "FAILED" });
        failed += usize::from(outcome.is_err());
    }
    let passed = selected.len() - failed;
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; {filtered_out} filtered out",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        std::process::exit(101);
    }
}

/// The libtest arguments this harness honours, read as libtest reads them; other options are
/// accepted and have no effect.
#[derive(Debug, Default)]
struct Args {
    list: bool,
    /// `--ignored` or `--include-ignored`: both tests are ignored by default, so either runs them.
    run_ignored: bool,
    exact: bool,
    filters: Vec<String>,
    skips: Vec<String>,
}

impl Args {
    fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let mut parsed = Args::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--list" => parsed.list = true,
                "--ignored" | "--include-ignored" => parsed.run_ignored = true,
                "--exact" => parsed.exact = true,
                "--skip" => parsed.skips.extend(args.next()),
                // Options whose value is the next argument (`--test-threads=1` is one argument).
                "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" => {
                    args.next();
                }
                _ if arg.starts_with('-') => {}
                _ => parsed.filters.push(arg),
            }
        }
        parsed
    }

    /// libtest's rule: some filter matches (or there is none) and no `--skip` does; a match is a
    /// substring, or the whole name with `--exact`.
    fn selects(&self, name: &str) -> bool {
        let matches = |pattern: &String| if self.exact { name == pattern } else { name.contains(pattern.as_str()) };
        (self.filters.is_empty() || self.filters.iter().any(matches)) && !self.skips.iter().any(matches)
    }
}

fn run_child(role: &str, data: &[u8], fd: Option<BorrowedFd<'_>>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(ROLE, role).env(DATA, hex(data));
    if let Some(fd) = fd {
        // The descriptor must survive exec: clear close-on-exec.
        // SAFETY: fcntl on a descriptor we own, with valid flag arguments.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags & !libc::FD_CLOEXEC) }, 0);
        command.env(FD, fd.as_raw_fd().to_string());
    }
    let status = command.status().unwrap();
    assert!(status.success(), "child {role} failed: {status}");
}

fn pool_path() {
    let device = Device::current().unwrap();
    let stream = Stream::non_blocking().unwrap();
    let pool = MemPool::new(PoolProps::new(device).shareable(ShareableHandle::PosixFileDescriptor)).unwrap();
    let buffer = StreamBuffer::<u32>::zeroed_from(&pool, &stream, LEN).unwrap();
    stream.synchronize().unwrap(); // the importer may use it only after the allocation completed
    // The pool is shared first: pointers can be exported only from an already shared pool.
    let supported = device.attribute(DeviceAttribute::MemoryPoolSupportedHandleTypes).unwrap();
    let fd = pool
        .export_fd()
        .unwrap_or_else(|err| panic!("{err} (device's supported pool handle types: {supported:#x}; POSIX fd is 0x1)"));
    let (exported, export) = buffer.export().unwrap_or_else(|err| panic!("{err}"));
    run_child("pool", &export.to_bytes(), Some(fd.as_fd()));
    assert_same(&exported.as_slice().to_vec().unwrap(), &pattern(LEN, SEED));
    // SAFETY: the child process dropped its import and exited.
    unsafe { exported.free_after_importers() }.unwrap();
    stream.synchronize().unwrap();
}

fn legacy_path() {
    let buffer = DeviceBuffer::<u32>::zeroed(LEN).unwrap();
    let (exported, handle) = buffer.export_ipc().unwrap();
    run_child("legacy", &handle.to_bytes(), None);
    assert_same(&exported.as_slice().to_vec().unwrap(), &pattern(LEN, SEED + 1));
    // SAFETY: the child closed its mapping and exited.
    unsafe { exported.free_after_importers() }.unwrap();
}

/// The export bytes with the length field (the last 8 bytes) replaced, as a forger would.
fn with_len(data: [u8; EXPORT_BYTES], bytes: usize) -> [u8; EXPORT_BYTES] {
    let mut forged = data;
    forged[64..].copy_from_slice(&(bytes as u64).to_le_bytes());
    forged
}

/// A forged length beyond the mapped allocation is a typed error, never a longer view.
#[track_caller]
fn assert_forged_length_refused<T: std::fmt::Debug>(result: Result<T>) {
    let err = result.expect_err("a length 1024 times the allocation was accepted");
    assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{err}");
}

/// Writes `data` over the mapped memory through a `Pending` that owns it while the upload runs,
/// and takes it back; the parent checks the data after the child has exited.
fn upload_through_a_pending<D: DeviceMemory<Elem = u32> + Send + 'static>(mapped: D, data: Vec<u32>) -> D {
    let stream = Stream::non_blocking().unwrap();
    let host = PinnedBuffer::from_slice(&data, HostAllocFlags::empty()).unwrap();
    let (mapped, _host) = stream.upload(mapped, host).unwrap().wait().unwrap();
    mapped
}

/// Releases the mapping: with DLPack, through an owned export's deleter after reading the memory
/// back through the export (so it names the mapping's device and address); else with `close`.
#[cfg(feature = "dlpack")]
fn release<D: cuda_mem::dlpack::DlpackOwner>(mapped: D, seed: u32, _close: impl FnOnce(D) -> Result<()>) {
    use cuda_mem::dlpack::{DLDevice, DlpackImport, DlpackTensor, ffi::kDLCUDA};
    let device = Device::current().unwrap();
    let tensor = DlpackTensor::owned(mapped).unwrap();
    assert_eq!(tensor.device(), DLDevice { device_type: kDLCUDA, device_id: device.ordinal() as i32 });
    assert_eq!(tensor.len(), LEN);
    // SAFETY: a live export whose ownership passes to the import.
    let import = unsafe { DlpackImport::from_raw(tensor.into_raw()) }.unwrap();
    let seen = import.device_slice::<u32>(device).unwrap().to_vec().unwrap();
    assert_same(&seen, &pattern(LEN, seed));
    drop(import); // the deleter waits for every device, then releases the mapping
}

#[cfg(not(feature = "dlpack"))]
fn release<D>(mapped: D, _seed: u32, close: impl FnOnce(D) -> Result<()>) {
    close(mapped).unwrap();
}

fn child(role: &str) {
    let data = unhex(&std::env::var(DATA).unwrap());
    let device = Device::current().unwrap();
    match role {
        "pool" => {
            let raw_fd: i32 = std::env::var(FD).unwrap().parse().unwrap();
            // SAFETY: the parent passed this open descriptor to us through exec.
            let fd = unsafe { BorrowedFd::borrow_raw(raw_fd) };
            let pool = MemPool::import_fd(fd, device).unwrap();
            let forged = PoolPointerExport::from_bytes(with_len(data, LEN * 4 * 1024));
            assert_forged_length_refused(pool.import_pointer::<u32>(&forged));
            // A pool that lives for good lends `'static` imports, which a `Pending` and an owned
            // DLPack export can own.
            let pool: &'static MemPool = Box::leak(Box::new(pool));
            let mut import = pool.import_pointer::<u32>(&PoolPointerExport::from_bytes(data)).unwrap();
            assert_eq!(import.len(), LEN);
            import.as_mut_slice().copy_from_host(&pattern(LEN, SEED ^ 0xFF)).unwrap();
            let import = upload_through_a_pending(import, pattern(LEN, SEED));
            release(import, SEED, ImportedSlice::close);
            // The pool is released as before this test leaked it, so the sanitizers' leak check
            // sees the child release everything it imported.
            // SAFETY: `pool` came from `Box::leak` above and nothing borrows it any more: its one
            // import was released by `release`, and `pool` is not used after this.
            drop(unsafe { Box::from_raw(std::ptr::from_ref(pool).cast_mut()) });
        }
        "legacy" => {
            assert_forged_length_refused(IpcMemHandle::from_bytes(with_len(data, LEN * 4 * 1024)).open::<u32>());
            let mut mapping = IpcMemHandle::from_bytes(data).open::<u32>().unwrap();
            assert_eq!(mapping.len(), LEN);
            mapping.as_mut_slice().copy_from_host(&pattern(LEN, SEED ^ 0xFF)).unwrap();
            let mapping = upload_through_a_pending(mapping, pattern(LEN, SEED + 1));
            release(mapping, SEED + 1, |mapping| {
                drop(mapping); // cudaIpcCloseMemHandle
                Ok(())
            });
        }
        other => panic!("unknown role {other}"),
    }
    device.synchronize().unwrap();
}
