//! The driver's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`), reached through the runtime's driver entry
//! points: address ranges reserved whole and backed a page at a time, each page its own
//! allocation and mapping so that any page can be unmapped (`cuMemUnmap` takes whole mappings
//! only) and mapped again elsewhere.

use super::driver_entry::entry_point;
use crate::error::{CudaError, ErrorKind, OomReport, Result};
use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Location {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (`allocFlags` spelled out: compression, RDMA, usage, reserved).
#[repr(C)]
struct AllocationProp {
    kind: c_int,
    handle_types: c_int,
    location: Location,
    win32_metadata: *mut c_void,
    compression: u8,
    rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location: Location,
    flags: c_int,
}

const ALLOCATION_TYPE_PINNED: c_int = 1;
const LOCATION_TYPE_DEVICE: c_int = 1;
const ACCESS_READ_WRITE: c_int = 3;
const GRANULARITY_MINIMUM: c_int = 0;
const ATTRIBUTE_VMM_SUPPORTED: c_int = 102;
const ERROR_OUT_OF_MEMORY: c_int = 2;

type DeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type GetGranularity = unsafe extern "C" fn(*mut usize, *const AllocationProp, c_int) -> c_int;
type AddressReserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> c_int;
type AddressFree = unsafe extern "C" fn(u64, usize) -> c_int;
type Create = unsafe extern "C" fn(*mut u64, usize, *const AllocationProp, u64) -> c_int;
type Release = unsafe extern "C" fn(u64) -> c_int;
type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> c_int;
type Unmap = unsafe extern "C" fn(u64, usize) -> c_int;
type SetAccess = unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> c_int;

/// The driver functions, looked up once.
struct Driver {
    device_get_attribute: DeviceGetAttribute,
    get_granularity: GetGranularity,
    address_reserve: AddressReserve,
    address_free: AddressFree,
    create: Create,
    release: Release,
    map: Map,
    unmap: Unmap,
    set_access: SetAccess,
}

fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, CudaError>> = OnceLock::new();
    let looked_up = DRIVER.get_or_init(|| {
        let at = |symbol: &'static CStr| entry_point(symbol);
        let functions = [
            at(c"cuDeviceGetAttribute")?,
            at(c"cuMemGetAllocationGranularity")?,
            at(c"cuMemAddressReserve")?,
            at(c"cuMemAddressFree")?,
            at(c"cuMemCreate")?,
            at(c"cuMemRelease")?,
            at(c"cuMemMap")?,
            at(c"cuMemUnmap")?,
            at(c"cuMemSetAccess")?,
        ];
        // SAFETY: each address is the driver's entry point of that name for CUDA 12.0's ABI,
        // whose C signature the type it becomes spells out (cuda.h; `CUdeviceptr` and
        // `CUmemGenericAllocationHandle` are 64-bit integers, enums are `int`).
        unsafe {
            use std::mem::transmute as f;
            Ok(Driver {
                device_get_attribute: f::<usize, DeviceGetAttribute>(functions[0]),
                get_granularity: f::<usize, GetGranularity>(functions[1]),
                address_reserve: f::<usize, AddressReserve>(functions[2]),
                address_free: f::<usize, AddressFree>(functions[3]),
                create: f::<usize, Create>(functions[4]),
                release: f::<usize, Release>(functions[5]),
                map: f::<usize, Map>(functions[6]),
                unmap: f::<usize, Unmap>(functions[7]),
                set_access: f::<usize, SetAccess>(functions[8]),
            })
        }
    });
    looked_up.as_ref().map_err(Clone::clone)
}

/// The error of a driver call that returned `code`.
#[cold]
fn driver_error(code: c_int, operation: String, requested: usize) -> CudaError {
    if code == ERROR_OUT_OF_MEMORY {
        let report = OomReport { requested, ..OomReport::default() };
        return CudaError::new(ErrorKind::OutOfMemory { code: None, report: Box::new(report) }, operation);
    }
    let message = format!("CUresult {code}");
    CudaError::new(ErrorKind::Library { name: "CUDA driver", code: Some(code), message }, operation)
}

fn call(code: c_int, operation: impl FnOnce() -> String, requested: usize) -> Result<()> {
    if code == 0 { Ok(()) } else { Err(driver_error(code, operation(), requested)) }
}

fn device_prop(device: c_int) -> AllocationProp {
    AllocationProp {
        kind: ALLOCATION_TYPE_PINNED,
        handle_types: 0,
        location: Location { kind: LOCATION_TYPE_DEVICE, id: device },
        win32_metadata: std::ptr::null_mut(),
        compression: 0,
        rdma: 0,
        usage: 0,
        reserved: [0; 4],
    }
}

/// The page size of device memory on `device` when its driver manages virtual memory, else
/// `None` (no such driver function, or the device says it lacks the capability).
pub(crate) fn page_bytes(device: c_int) -> Result<Option<usize>> {
    let Ok(driver) = driver() else { return Ok(None) };
    let mut supported = 0;
    // SAFETY: a valid out-pointer; the attribute and ordinal are plain integers.
    let code = unsafe { (driver.device_get_attribute)(&mut supported, ATTRIBUTE_VMM_SUPPORTED, device) };
    call(code, || format!("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, {device})"), 0)?;
    if supported == 0 {
        return Ok(None);
    }
    let mut page = 0;
    let prop = device_prop(device);
    // SAFETY: valid pointers to a written value and a complete property struct.
    let code = unsafe { (driver.get_granularity)(&mut page, &prop, GRANULARITY_MINIMUM) };
    call(code, || format!("cuMemGetAllocationGranularity(device {device})"), 0)?;
    Ok((page > 0).then_some(page))
}

/// Reserves `bytes` of addresses aligned to `align`, nothing mapped.
pub(crate) fn reserve(bytes: usize, align: usize) -> Result<u64> {
    let driver = driver()?;
    let mut base = 0u64;
    // SAFETY: a valid out-pointer; no fixed address is asked for (0).
    let code = unsafe { (driver.address_reserve)(&mut base, bytes, align, 0, 0) };
    call(code, || format!("cuMemAddressReserve({bytes} bytes)"), bytes)?;
    Ok(base)
}

/// Gives back a range from [`reserve`].
///
/// # Safety
/// `base` and `bytes` are a range from `reserve`, nothing mapped in it, freed once.
pub(crate) unsafe fn free(base: u64, bytes: usize) -> Result<()> {
    let driver = driver()?;
    // SAFETY: the caller's contract.
    let code = unsafe { (driver.address_free)(base, bytes) };
    call(code, || format!("cuMemAddressFree({bytes} bytes)"), 0)
}

/// A new allocation of physical memory of `bytes` (whole pages) on `device`, mapped nowhere:
/// its handle.
pub(crate) fn create(bytes: usize, device: c_int) -> Result<u64> {
    let driver = driver()?;
    let prop = device_prop(device);
    let mut handle = 0u64;
    // SAFETY: valid pointers to a written handle and a complete property struct.
    let code = unsafe { (driver.create)(&mut handle, bytes, &prop, 0) };
    call(code, || format!("cuMemCreate({bytes} bytes on device {device})"), bytes)?;
    Ok(handle)
}

/// Gives an allocation from [`create`] back to the device once nothing maps it.
///
/// # Safety
/// `handle` came from `create`, is released once, and is mapped nowhere that work still uses.
pub(crate) unsafe fn release(handle: u64) -> Result<()> {
    let driver = driver()?;
    // SAFETY: the caller's contract.
    let code = unsafe { (driver.release)(handle) };
    call(code, || "cuMemRelease".into(), 0)
}

/// Maps the whole allocation `handle` (of `bytes`) at `at`, as one mapping of its own (a part
/// of an allocation cannot be mapped: the driver refuses an offset).
///
/// # Safety
/// The `bytes` from `at` are unmapped pages of a range from [`reserve`], and `handle` an
/// allocation of exactly `bytes` from [`create`] that is mapped nowhere else.
pub(crate) unsafe fn map(at: u64, bytes: usize, handle: u64) -> Result<()> {
    let driver = driver()?;
    // SAFETY: the caller's contract.
    let code = unsafe { (driver.map)(at, bytes, 0, handle, 0) };
    call(code, || format!("cuMemMap({bytes} bytes)"), bytes)
}

/// Makes `bytes` from `at` readable and writable from `device`.
///
/// # Safety
/// The run is mapped.
pub(crate) unsafe fn set_access(at: u64, bytes: usize, device: c_int) -> Result<()> {
    let driver = driver()?;
    let access = AccessDesc { location: Location { kind: LOCATION_TYPE_DEVICE, id: device }, flags: ACCESS_READ_WRITE };
    // SAFETY: the run is mapped (the caller's contract); a valid pointer to one descriptor.
    let code = unsafe { (driver.set_access)(at, bytes, &access, 1) };
    call(code, || format!("cuMemSetAccess({bytes} bytes, device {device})"), bytes)
}

/// Unmaps the mapping of `bytes` at `at` (made whole by [`map`]).
///
/// # Safety
/// One whole mapping made by [`map`], no work using it any more.
pub(crate) unsafe fn unmap(at: u64, bytes: usize) -> Result<()> {
    let driver = driver()?;
    // SAFETY: the caller's contract.
    let code = unsafe { (driver.unmap)(at, bytes) };
    call(code, || format!("cuMemUnmap({bytes} bytes)"), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_the_layout_of_cuda_h() {
        // cuda.h (13.0): CUmemLocation is two ints, CUmemAllocationProp 32 bytes with its
        // metadata pointer at 16 and allocFlags at 24, CUmemAccessDesc 12 bytes.
        assert_eq!(std::mem::size_of::<Location>(), 8);
        assert_eq!(std::mem::size_of::<AllocationProp>(), 32);
        assert_eq!(std::mem::offset_of!(AllocationProp, win32_metadata), 16);
        assert_eq!(std::mem::offset_of!(AllocationProp, compression), 24);
        assert_eq!(std::mem::size_of::<AccessDesc>(), 12);
    }

    #[test]
    fn driver_errors_are_typed() {
        let oom = driver_error(ERROR_OUT_OF_MEMORY, "cuMemCreate".into(), 4096);
        assert!(oom.is_out_of_memory());
        let other = driver_error(1, "cuMemMap".into(), 0);
        assert!(matches!(other.kind(), ErrorKind::Library { name: "CUDA driver", code: Some(1), .. }));
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls the CUDA runtime, which Miri cannot run")]
    fn without_a_driver_there_are_no_pages() {
        // This machine may have no driver (CI has none): then the device has no pages, and
        // no error. With a driver, device 0 answers with its granularity.
        match page_bytes(0) {
            Ok(None) => {}
            Ok(Some(page)) => assert!(page.is_power_of_two()),
            Err(err) => panic!("{err}"),
        }
    }
}
