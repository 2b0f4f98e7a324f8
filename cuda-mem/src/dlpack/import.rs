//! Imports: a producer's `DLManagedTensorVersioned` (or legacy `DLManagedTensor`) checked and
//! held by a guard that calls the producer's deleter once, on drop; device views borrow the
//! guard.

use super::dtype::{DataType, DlpackElement};
use super::export;
use super::ffi::{self, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use super::layout::Layout;
use super::stream::{ConsumerStream, order_consumer_after};
use super::strided::{self, Way};
use super::{checked_elements, invalid};
use crate::device::{CurrentDevice, Device};
use crate::error::Result;
use crate::slice::{DeviceSlice, DeviceSliceMut};
use crate::stream::Stream;
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;

/// The most dimensions an import accepts (NumPy's limit).
pub const MAX_NDIM: usize = 64;

/// A DLPack tensor taken over from a producer. Dropping it calls the producer's deleter, once;
/// the device views it hands out borrow it, so they cannot outlive the producer's memory.
///
/// Any strided layout is accepted: a compact row-major tensor gives zero-copy device views
/// ([`device_slice`](DlpackImport::device_slice)); any other (transposed, stepped, broadcast,
/// reversed) is read and written element by element through
/// [`read_bytes`](DlpackImport::read_bytes) / [`write_bytes`](DlpackImport::write_bytes)
/// (strided copies), and has no contiguous view: no view ever reaches past the elements the
/// tensor names. Every malformed input (strides that overflow or leave the address space
/// included) is [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) with a message
/// naming the problem, and the tensor is released (its deleter called) before the error returns.
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
    /// Element strides (the row-major ones when the producer gave none).
    strides: Vec<i64>,
    /// The checked span of a non-compact tensor; `None` for compact (or empty) ones.
    strided: Option<Layout>,
    len: usize,
    dtype: DataType,
    device: DLDevice,
    read_only: bool,
    /// The stream the producer's pending work is on, for cuda-mem's own exports of
    /// stream-ordered memory (see [`DlpackImport::from_raw`]).
    producer: Option<Stream>,
}

/// The producer's struct, for its deleter.
#[derive(Clone, Copy)]
enum Managed {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

// SAFETY: the guard owns the producer's tensor: another thread may read its checked metadata,
// copy through its views (like any `DeviceSlice`) or with `read_bytes`/`write_bytes` (blocking
// runtime copies), wait on or order after its producer stream (a `Stream`, usable from any
// thread), and drop it, calling the deleter there; the DLPack protocol lets the consumer release
// a tensor from any thread.
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
    /// **Ordering.** The raw struct has no field for a stream, so the producer promises that its
    /// writes are ordered before the consumer's use in one of two ways: a tensor cuda-mem
    /// exported ([`DlpackTensor::into_raw`](super::DlpackTensor::into_raw)) is recognised and
    /// its producer stream comes with it ([`DlpackImport::producer`]): the import's views carry
    /// that stream, so blocking copies wait for it and scopes on other streams are ordered
    /// after it, and [`DlpackImport::order_consumer`] orders any other stream. Any other
    /// producer must have completed its writes, or ordered them before the consumer's stream,
    /// before handing the tensor over, as `__dlpack__(stream=...)` asks of it; blocking
    /// copies of the import run on the legacy default stream.
    ///
    /// # Safety
    /// `tensor` is null or a live `DLManagedTensorVersioned` whose ownership passes to this call
    /// (its deleter is called exactly once: here on error, or when the import drops); its
    /// `shape` and `strides` hold `ndim` values; `data + byte_offset` plus every offset the
    /// shape and strides reach addresses the described elements on the described device, which
    /// stay valid until the deleter runs; its writes are ordered as said above.
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
        // SAFETY: live, per the caller.
        let producer = unsafe { export::producer_of_versioned(ptr) };
        // SAFETY: forwarded from the caller.
        unsafe { Self::checked(managed, &tensor, flags & ffi::DLPACK_FLAG_BITMASK_READ_ONLY != 0, producer) }
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
        // SAFETY: live, per the caller.
        let producer = unsafe { export::producer_of_legacy(ptr) };
        // SAFETY: forwarded from the caller.
        unsafe { Self::checked(Managed::Legacy(ptr), &dl_tensor, false, producer) }
    }

    /// # Safety
    /// `managed` is owned by this call; `tensor` is its description, as `from_raw` requires.
    unsafe fn checked(managed: Managed, tensor: &DLTensor, read_only: bool, producer: Option<Stream>) -> Result<Self> {
        // SAFETY: forwarded from the caller.
        match unsafe { describe(tensor) } {
            Ok(Described { data, shape, strides, strided, len, dtype }) => Ok(Self {
                managed,
                data,
                shape,
                strides,
                strided,
                len,
                dtype,
                device: tensor.device,
                read_only,
                producer,
            }),
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

    /// The strides, in elements (the row-major ones when the producer gave none).
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// True when the tensor is compact row-major (or empty): its elements have device views.
    pub fn is_compact(&self) -> bool {
        self.strided.is_none()
    }

    /// The stream the producer's pending work is on, for cuda-mem's own exports of
    /// stream-ordered memory; `None` for other producers (see [`DlpackImport::from_raw`]).
    pub fn producer(&self) -> Option<&Stream> {
        self.producer.as_ref()
    }

    /// Makes `consumer` wait, on the device, for the producer's pending work (nothing to do
    /// when no producer stream is known: the producer ordered its writes before the hand-over).
    pub fn order_consumer(&self, consumer: &ConsumerStream) -> Result<()> {
        match &self.producer {
            Some(producer) => order_consumer_after(producer, consumer),
            None => Ok(()),
        }
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
        self.require_compact()?;
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

    /// Checks that the tensor lives on `device`: CUDA device or managed memory of its ordinal.
    pub fn check_device(&self, device: Device) -> Result<()> {
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
        // SAFETY: the tensor is compact, so the producer keeps `len` elements at `ptr` on
        // `device` allocated until its deleter runs, which is after the view's borrow of `self`
        // ends. Others may write the memory meanwhile (DLPack shares it); the host only copies
        // through it, and with Pod elements a concurrent write leaves unspecified values, never
        // host UB. The producer's stream, when known, orders the view.
        Ok(unsafe { self.shared_view(ptr, len) })
    }

    /// An exclusive device view; refused for read-only tensors.
    pub fn device_slice_mut<T: DlpackElement>(&mut self, device: Device) -> Result<DeviceSliceMut<'_, T>> {
        self.require_writable()?;
        let (ptr, len) = self.view_parts::<T>(device)?;
        // SAFETY: as in `device_slice`; the producer allowed writes (no read-only flag) and
        // `&mut self` makes this the only view cuda-mem hands out meanwhile.
        Ok(unsafe { self.exclusive_view(ptr, len) })
    }

    /// The elements' bytes, whatever their type, as a shared device view.
    pub fn device_bytes(&self, device: Device) -> Result<DeviceSlice<'_, u8>> {
        self.require_compact()?;
        self.check_device(device)?;
        // SAFETY: as in `device_slice`, over the same bytes.
        Ok(unsafe { self.shared_view(self.data.cast(), self.size_bytes()) })
    }

    /// The elements' bytes as an exclusive device view; refused for read-only tensors.
    pub fn device_bytes_mut(&mut self, device: Device) -> Result<DeviceSliceMut<'_, u8>> {
        self.require_writable()?;
        self.require_compact()?;
        self.check_device(device)?;
        // SAFETY: as in `device_slice_mut`, over the same bytes.
        Ok(unsafe { self.exclusive_view(self.data.cast(), self.size_bytes()) })
    }

    /// The elements' bytes, row-major, copied to the host (blocking; after the producer's
    /// pending work when its stream is known): one copy for a compact tensor, strided copies
    /// for any other layout.
    pub fn read_bytes(&self, device: Device) -> Result<Vec<u8>> {
        self.check_device(device)?;
        let Some(layout) = &self.strided else { return self.device_bytes(device)?.to_vec() };
        let _current = CurrentDevice::set(device)?;
        self.wait_for_producer()?;
        let mut host = vec![0u8; self.size_bytes()];
        // SAFETY: the layout was checked against the tensor's address; the producer keeps every
        // element it reaches allocated until its deleter runs (after this call); `host` holds
        // the elements row-major.
        unsafe { strided::copy(self.data, layout, self.dtype.size(), host.as_mut_ptr(), Way::Gather)? };
        Ok(host)
    }

    /// Overwrites the elements with `data`, their bytes row-major (blocking; after the
    /// producer's pending work when its stream is known). Refused for read-only tensors and for
    /// a length other than [`size_bytes`](DlpackImport::size_bytes). Where strides name one
    /// element more than once (a stride of 0), one of the values given for it stays.
    pub fn write_bytes(&mut self, device: Device, data: &[u8]) -> Result<()> {
        self.require_writable()?;
        self.check_device(device)?;
        crate::raw::same_len(data.len(), self.size_bytes(), "writing an imported DLPack tensor")?;
        let Some(layout) = &self.strided else { return self.device_bytes_mut(device)?.copy_from_host(data) };
        let _current = CurrentDevice::set(device)?;
        self.wait_for_producer()?;
        // SAFETY: as in `read_bytes`, for writes the producer allowed (no read-only flag);
        // `data` is only read.
        unsafe { strided::copy(self.data, layout, self.dtype.size(), data.as_ptr().cast_mut(), Way::Scatter) }
    }

    fn wait_for_producer(&self) -> Result<()> {
        match &self.producer {
            Some(producer) => producer.synchronize(),
            None => Ok(()),
        }
    }

    fn require_compact(&self) -> Result<()> {
        if let Some(layout) = &self.strided {
            return Err(invalid(
                "a strided tensor has no contiguous view (read_bytes and write_bytes copy its elements)",
                format!("viewing a DLPack tensor of shape {:?} with strides {:?}", layout.shape, layout.strides),
            ));
        }
        Ok(())
    }

    /// # Safety
    /// As for [`DeviceSlice::from_raw_parts`], for `len` elements at `ptr` that `self` keeps.
    unsafe fn shared_view<T: bytemuck::Pod>(&self, ptr: *const T, len: usize) -> DeviceSlice<'_, T> {
        // SAFETY: forwarded from the caller; the producer stream, when known, is the one the
        // memory is ordered on (cuda-mem's own export said so), and lives as long as `self`.
        unsafe {
            match &self.producer {
                Some(stream) => DeviceSlice::ordered_on(ptr, len, stream),
                None => DeviceSlice::from_raw_parts(ptr, len),
            }
        }
    }

    /// # Safety
    /// As for [`DeviceSliceMut::from_raw_parts`], for `len` elements at `ptr` that `self` keeps.
    unsafe fn exclusive_view<T: bytemuck::Pod>(&self, ptr: *mut T, len: usize) -> DeviceSliceMut<'_, T> {
        // SAFETY: as in `shared_view`.
        unsafe {
            match &self.producer {
                Some(stream) => DeviceSliceMut::ordered_on(ptr, len, stream),
                None => DeviceSliceMut::from_raw_parts(ptr, len),
            }
        }
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

/// What [`describe`] finds in a tensor.
struct Described {
    data: *mut c_void,
    shape: Vec<usize>,
    strides: Vec<i64>,
    strided: Option<Layout>,
    len: usize,
    dtype: DataType,
}

/// The checked address, shape, strides, element count and type of a tensor.
///
/// # Safety
/// `shape` and `strides` (when not null) hold `ndim` values.
unsafe fn describe(tensor: &DLTensor) -> Result<Described> {
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
    let compact = compact_strides(&shape);
    let strides = if tensor.strides.is_null() || ndim == 0 {
        compact
    } else {
        // SAFETY: `ndim` values, per the caller.
        unsafe { std::slice::from_raw_parts(tensor.strides, ndim) }.to_vec()
    };
    if len == 0 {
        let data = NonNull::<u8>::dangling().as_ptr().cast();
        return Ok(Described { data, shape, strides, strided: None, len: 0, dtype });
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
    let data: *mut c_void = tensor.data.cast::<u8>().wrapping_add(offset).cast();
    let layout = Layout::checked(&shape, &strides, dtype.size(), data as usize)?;
    let strided = (!layout.is_compact()).then_some(layout);
    Ok(Described { data, shape, strides, strided, len, dtype })
}

/// Row-major strides (in elements) of `shape`, saturating (only compared, for sizes that fit).
fn compact_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1) as i64);
    }
    strides
}
