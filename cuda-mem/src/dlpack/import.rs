//! Imports: a producer's `DLManagedTensorVersioned` (or legacy `DLManagedTensor`) checked and
//! held by a guard that calls the producer's deleter once, on drop; device views borrow the
//! guard.

use super::dtype::{DataType, DlpackElement};
use super::ffi::{self, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use super::{checked_elements, invalid};
use crate::device::Device;
use crate::error::Result;
use crate::slice::{DeviceSlice, DeviceSliceMut};
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;

/// The most dimensions an import accepts (NumPy's limit).
pub const MAX_NDIM: usize = 64;

/// A DLPack tensor taken over from a producer. Dropping it calls the producer's deleter, once;
/// the device views it hands out borrow it, so they cannot outlive the producer's memory.
///
/// Only compact row-major tensors are accepted; every malformed input is
/// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) with a message naming the
/// problem, and the tensor is released (its deleter called) before the error returns.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::Device;
/// use cuda_mem::dlpack::{DlpackImport, ffi::DLManagedTensorVersioned};
/// # let from_producer: *mut DLManagedTensorVersioned = std::ptr::null_mut();
/// // SAFETY: the producer handed over this tensor, which we now own.
/// let tensor = unsafe { DlpackImport::from_raw(from_producer)? };
/// let view = tensor.device_slice::<f32>(Device::current()?)?;
/// println!("{} elements, shape {:?}: {:?}", view.len(), tensor.shape(), view.to_vec()?);
/// # Ok(()) }
/// ```
pub struct DlpackImport {
    managed: Managed,
    data: *mut c_void,
    shape: Vec<usize>,
    len: usize,
    dtype: DataType,
    device: DLDevice,
    read_only: bool,
}

/// The producer's struct, for its deleter.
#[derive(Clone, Copy)]
enum Managed {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

// SAFETY: the guard owns the producer's tensor: another thread may read its checked metadata,
// copy through its views (like any `DeviceSlice`), and drop it, calling the deleter there; the
// DLPack protocol lets the consumer release a tensor from any thread.
unsafe impl Send for DlpackImport {}
// SAFETY: `&DlpackImport` gives shared views only (reads through runtime copies) and metadata.
unsafe impl Sync for DlpackImport {}

impl Managed {
    /// Calls the producer's deleter, if it gave one.
    ///
    /// # Safety
    /// The struct is live and its deleter has not run.
    unsafe fn release(self) {
        // SAFETY: live (the caller's duty); the deleter is the producer's, called once.
        unsafe {
            match self {
                Self::Versioned(ptr) => {
                    if let Some(deleter) = ptr.as_ref().deleter {
                        deleter(ptr.as_ptr());
                    }
                }
                Self::Legacy(ptr) => {
                    if let Some(deleter) = ptr.as_ref().deleter {
                        deleter(ptr.as_ptr());
                    }
                }
            }
        }
    }
}

impl DlpackImport {
    /// Takes over a versioned tensor. Null is an error. A major version other than 1 is refused
    /// (its deleter, at a position every major version keeps, is still called).
    ///
    /// # Safety
    /// `tensor` is null or a live `DLManagedTensorVersioned` whose ownership passes to this call
    /// (its deleter is called exactly once: here on error, or when the import drops); its
    /// `shape` and `strides` hold `ndim` values; `data + byte_offset` addresses the described
    /// elements on the described device and stays valid until the deleter runs.
    pub unsafe fn from_raw(tensor: *mut DLManagedTensorVersioned) -> Result<Self> {
        let Some(ptr) = NonNull::new(tensor) else {
            return Err(invalid("a null DLManagedTensorVersioned", "importing a DLPack tensor"));
        };
        let managed = Managed::Versioned(ptr);
        // SAFETY: live, per the caller; `version` is at the same place in every major version.
        let version = unsafe { ptr.as_ref().version };
        if version.major != ffi::DLPACK_MAJOR_VERSION {
            // SAFETY: owned by this call, released once.
            unsafe { managed.release() };
            return Err(invalid(
                "an unsupported DLPack major version",
                format!("importing a DLPack {}.{} tensor (cuda-mem reads 1.x)", version.major, version.minor),
            ));
        }
        // SAFETY: live, version 1.x: the layout of `ffi`.
        let (tensor, flags) = unsafe { (ptr.as_ref().dl_tensor, ptr.as_ref().flags) };
        // SAFETY: forwarded from the caller.
        unsafe { Self::checked(managed, &tensor, flags & ffi::DLPACK_FLAG_BITMASK_READ_ONLY != 0) }
    }

    /// Takes over a legacy (pre-1.0) tensor, writable as that struct has no flags.
    ///
    /// # Safety
    /// As for [`DlpackImport::from_raw`], for a `DLManagedTensor`.
    pub unsafe fn from_raw_legacy(tensor: *mut DLManagedTensor) -> Result<Self> {
        let Some(ptr) = NonNull::new(tensor) else {
            return Err(invalid("a null DLManagedTensor", "importing a DLPack tensor"));
        };
        // SAFETY: live, per the caller.
        let dl_tensor = unsafe { ptr.as_ref().dl_tensor };
        // SAFETY: forwarded from the caller.
        unsafe { Self::checked(Managed::Legacy(ptr), &dl_tensor, false) }
    }

    /// # Safety
    /// `managed` is owned by this call; `tensor` is its description, as `from_raw` requires.
    unsafe fn checked(managed: Managed, tensor: &DLTensor, read_only: bool) -> Result<Self> {
        // SAFETY: forwarded from the caller.
        match unsafe { describe(tensor) } {
            Ok((data, shape, len, dtype)) => {
                Ok(Self { managed, data, shape, len, dtype, device: tensor.device, read_only })
            }
            Err(err) => {
                // SAFETY: owned by this call, released once.
                unsafe { managed.release() };
                Err(err)
            }
        }
    }

    /// The extents, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The device the producer names.
    pub fn device(&self) -> DLDevice {
        self.device
    }

    /// True when the producer set `DLPACK_FLAG_BITMASK_READ_ONLY`.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The address of the first element (`data + byte_offset`).
    pub fn data_ptr(&self) -> *mut c_void {
        self.data
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len * self.dtype.size()
    }

    /// Checks that the tensor lives on `device` (device or managed memory of that ordinal) and
    /// holds `T`, and that `T`'s alignment is met.
    fn view_parts<T: DlpackElement>(&self, device: Device) -> Result<(*mut T, usize)> {
        if self.dtype != T::DTYPE {
            return Err(invalid(
                "the tensor's element type differs from the view's",
                format!("viewing a DLPack tensor of {} as {}", self.dtype.name(), T::DTYPE.name()),
            ));
        }
        self.check_device(device)?;
        if !self.data.cast::<T>().is_aligned() {
            return Err(invalid(
                "the tensor's address is not aligned for its element type",
                format!("viewing {:p} as {}", self.data, T::DTYPE.name()),
            ));
        }
        Ok((self.data.cast(), self.len))
    }

    fn check_device(&self, device: Device) -> Result<()> {
        let DLDevice { device_type, device_id } = self.device;
        if device_type != ffi::kDLCUDA && device_type != ffi::kDLCUDAManaged {
            return Err(invalid(
                "the tensor is not in CUDA device or managed memory",
                format!("viewing a DLPack tensor of device type {device_type} on {device}"),
            ));
        }
        if device_id != device.as_raw() {
            return Err(invalid(
                "the tensor is on another device",
                format!("viewing a DLPack tensor of device {device_id} on {device}"),
            ));
        }
        Ok(())
    }

    /// A shared device view of the elements, for the tensor on `device`.
    pub fn device_slice<T: DlpackElement>(&self, device: Device) -> Result<DeviceSlice<'_, T>> {
        let (ptr, len) = self.view_parts::<T>(device)?;
        // SAFETY: the producer keeps `len` elements at `ptr` on `device` allocated until its
        // deleter runs, which is after the view's borrow of `self` ends. Others may write the
        // memory meanwhile (DLPack shares it); the host only copies through it, and with Pod
        // elements a concurrent write leaves unspecified values, never host UB.
        Ok(unsafe { DeviceSlice::from_raw_parts(ptr, len) })
    }

    /// An exclusive device view; refused for read-only tensors.
    pub fn device_slice_mut<T: DlpackElement>(&mut self, device: Device) -> Result<DeviceSliceMut<'_, T>> {
        self.require_writable()?;
        let (ptr, len) = self.view_parts::<T>(device)?;
        // SAFETY: as in `device_slice`; the producer allowed writes (no read-only flag) and
        // `&mut self` makes this the only view cuda-mem hands out meanwhile.
        Ok(unsafe { DeviceSliceMut::from_raw_parts(ptr, len) })
    }

    /// The elements' bytes, whatever their type, as a shared device view.
    pub fn device_bytes(&self, device: Device) -> Result<DeviceSlice<'_, u8>> {
        self.check_device(device)?;
        // SAFETY: as in `device_slice`, over the same bytes.
        Ok(unsafe { DeviceSlice::from_raw_parts(self.data.cast(), self.size_bytes()) })
    }

    /// The elements' bytes as an exclusive device view; refused for read-only tensors.
    pub fn device_bytes_mut(&mut self, device: Device) -> Result<DeviceSliceMut<'_, u8>> {
        self.require_writable()?;
        self.check_device(device)?;
        // SAFETY: as in `device_slice_mut`, over the same bytes.
        Ok(unsafe { DeviceSliceMut::from_raw_parts(self.data.cast(), self.size_bytes()) })
    }

    fn require_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(invalid("the producer marked the tensor read-only", "writing an imported DLPack tensor"));
        }
        Ok(())
    }
}

impl Drop for DlpackImport {
    fn drop(&mut self) {
        // SAFETY: owned since the import succeeded; released once, here.
        unsafe { self.managed.release() }
    }
}

impl fmt::Debug for DlpackImport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DlpackImport")
            .field("data", &self.data)
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// The checked address, shape, element count and type of a tensor.
///
/// # Safety
/// `shape` and `strides` (when not null) hold `ndim` values.
unsafe fn describe(tensor: &DLTensor) -> Result<(*mut c_void, Vec<usize>, usize, DataType)> {
    let op = || format!("importing a DLPack tensor of {} dimensions", tensor.ndim);
    let dtype = DataType::from_dl(tensor.dtype)?;
    let ndim = usize::try_from(tensor.ndim).map_err(|_| invalid("a negative ndim", op()))?;
    if ndim > MAX_NDIM {
        return Err(invalid("more dimensions than cuda-mem accepts (64)", op()));
    }
    if ndim > 0 && tensor.shape.is_null() {
        return Err(invalid("a null shape with ndim above 0", op()));
    }
    // SAFETY: `ndim` values, per the caller (none read when ndim is 0).
    let extents = if ndim == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(tensor.shape, ndim) } };
    let shape: Vec<usize> = extents
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| invalid("a negative extent in the shape", format!("shape {extents:?}")))
        })
        .collect::<Result<_>>()?;
    let len = checked_elements(shape.iter().copied())
        .filter(|len| len.checked_mul(dtype.size()).is_some())
        .ok_or_else(|| invalid("the shape's size overflows", format!("shape {extents:?} of {}", dtype.name())))?;
    if !tensor.strides.is_null() && len > 0 {
        // SAFETY: `ndim` values, per the caller.
        let strides = unsafe { std::slice::from_raw_parts(tensor.strides, ndim) };
        if !is_compact(&shape, strides) {
            return Err(invalid(
                "strides that are not compact row-major (a non-contiguous tensor)",
                format!("shape {extents:?} with strides {strides:?}"),
            ));
        }
    }
    if len == 0 {
        return Ok((NonNull::<u8>::dangling().as_ptr().cast(), shape, 0, dtype));
    }
    if tensor.data.is_null() {
        return Err(invalid("a null data pointer for a non-empty tensor", format!("shape {extents:?}")));
    }
    let offset = usize::try_from(tensor.byte_offset).ok().filter(|&o| (tensor.data as usize).checked_add(o).is_some());
    let Some(offset) = offset else {
        return Err(invalid(
            "a byte offset past the end of the address space",
            format!("offset {}", tensor.byte_offset),
        ));
    };
    Ok((tensor.data.cast::<u8>().wrapping_add(offset).cast(), shape, len, dtype))
}

/// True when `strides` are the row-major ones of `shape` (extents of 1 may have any stride).
fn is_compact(shape: &[usize], strides: &[i64]) -> bool {
    let mut expected: i64 = 1;
    for (&extent, &stride) in shape.iter().zip(strides).rev() {
        if extent != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(extent as i64);
    }
    true
}
