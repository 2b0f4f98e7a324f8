//! Exports: cuda-mem memory described as a `DLManagedTensorVersioned` (or the legacy
//! `DLManagedTensor`), with a deleter that gives the memory back.

use super::dtype::DataType;
use super::ffi::{self, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use super::stream::{ConsumerStream, order_consumer_after};
use super::{checked_elements, invalid};
use crate::error::Result;
use crate::stream::Stream;
use std::collections::BTreeSet;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A DLPack tensor made by cuda-mem: an owned export (`DlpackTensor<'static>`, which owns the
/// buffer moved into it) or a borrowed one (which lives no longer than the borrow of its
/// source). Dropping it runs its deleter. Only an owned export becomes a raw
/// `*mut DLManagedTensorVersioned` for foreign code ([`DlpackTensor::into_raw`]), whose deleter
/// then frees the buffer; a borrowed export lends its struct for the borrow only
/// ([`DlpackTensor::as_mut_ptr`]).
///
/// New exports are 1-D and contiguous; [`reshape`](DlpackTensor::reshape) makes them N-D
/// (row-major) with the element count checked.
///
/// ```no_run
/// # fn main() -> Result<(), cuda_mem::CudaError> {
/// use cuda_mem::DeviceBuffer;
/// use cuda_mem::dlpack::DlpackTensor;
/// let weights = DeviceBuffer::from_slice(&[0.5f32; 6])?;
/// let tensor = DlpackTensor::owned(weights)?.reshape(&[2, 3])?;
/// assert_eq!(tensor.shape(), [2, 3]);
/// let raw = tensor.into_raw(); // hand to a consumer; its deleter frees the buffer
/// # let _ = raw;
/// # Ok(()) }
/// ```
///
/// A borrowed export cannot outlive what it borrows, nor become a raw pointer:
///
/// ```compile_fail,E0505
/// # use cuda_mem::DeviceBuffer;
/// # use cuda_mem::dlpack::DlpackTensor;
/// let buffer = DeviceBuffer::<f32>::zeroed(4).unwrap();
/// let tensor = DlpackTensor::shared(&buffer).unwrap();
/// drop(buffer); // error: cannot move out of `buffer` because it is borrowed
/// # drop(tensor);
/// ```
///
/// ```compile_fail,E0521
/// # use cuda_mem::DeviceBuffer;
/// # use cuda_mem::dlpack::DlpackTensor;
/// fn leak(buffer: &DeviceBuffer<f32>) -> *mut cuda_mem::dlpack::ffi::DLManagedTensorVersioned {
///     DlpackTensor::shared(buffer).unwrap().into_raw() // error: `into_raw` needs 'static
/// }
/// ```
pub struct DlpackTensor<'a> {
    header: NonNull<Header>,
    _borrow: PhantomData<&'a ()>,
}

// SAFETY: the export owns its context (shape, strides, and for owned exports the buffer, which
// is `Send`: constructors require it). Another thread may read its metadata, order a consumer
// stream (`Stream` and `Event` are usable from any thread), hand it to foreign code or drop it,
// which runs the deleter there.
unsafe impl Send for DlpackTensor<'_> {}
// SAFETY: `&DlpackTensor` only reads the metadata; every change takes `&mut self` or `self`.
unsafe impl Sync for DlpackTensor<'_> {}

/// The context every export keeps behind `manager_ctx`, first in each `Context<K>`.
#[repr(C)]
struct Header {
    versioned: DLManagedTensorVersioned,
    legacy: DLManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    /// Where the memory lives, and the device types it may be presented as.
    natural: DLDevice,
    data: *mut c_void,
    len: usize,
    dtype: DataType,
    /// The stream whose pending work the memory is ordered after, for stream-ordered memory.
    producer: Option<Stream>,
    /// Drops the whole `Context<K>` this header starts.
    drop_context: unsafe fn(NonNull<Header>),
}

/// A header and what the export keeps alive: the owner of an owned export, `()` for a borrow.
#[repr(C)]
struct Context<K> {
    header: Header,
    keep: K,
}

/// The addresses of every live export's header: an import recognises cuda-mem's own exports by
/// them and takes their producer stream (the raw structs have no field for it). An address is
/// added when its header is made and removed, under the lock, before the header is freed.
static LIVE_HEADERS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live_headers() -> MutexGuard<'static, BTreeSet<usize>> {
    // The set stays consistent whatever panicked while it was held (inserts and removes only).
    LIVE_HEADERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// True while the export whose header is at `context` is live (for tests of the set).
#[cfg(test)]
pub(crate) fn is_live_export(context: usize) -> bool {
    live_headers().contains(&context)
}

/// Frees the `Context<K>` starting at `header`.
///
/// # Safety
/// `header` is the start of a `Box<Context<K>>` leaked by [`DlpackTensor::build`], freed once.
unsafe fn drop_context<K>(header: NonNull<Header>) {
    live_headers().remove(&(header.as_ptr() as usize));
    // SAFETY: the header is the first field of a repr(C) `Context<K>` allocated as a Box.
    drop(unsafe { Box::from_raw(header.as_ptr().cast::<Context<K>>()) });
}

/// The producer stream of `tensor` when it is one of this module's exports (as
/// [`DlpackTensor::into_raw`] hands them out), else `None`.
///
/// # Safety
/// `tensor` is live, and owned by the caller (nothing frees it during the call).
pub(crate) unsafe fn producer_of_versioned(tensor: NonNull<DLManagedTensorVersioned>) -> Option<Stream> {
    // SAFETY: live, per the caller.
    let context = unsafe { tensor.as_ref().manager_ctx };
    // SAFETY: forwarded; the versioned struct sits at `versioned` in our headers.
    unsafe { producer_of(context, tensor.as_ptr().cast(), |header| &raw const (*header).versioned as *const c_void) }
}

/// As [`producer_of_versioned`], for a legacy struct.
///
/// # Safety
/// As for [`producer_of_versioned`].
pub(crate) unsafe fn producer_of_legacy(tensor: NonNull<DLManagedTensor>) -> Option<Stream> {
    // SAFETY: live, per the caller.
    let context = unsafe { tensor.as_ref().manager_ctx };
    // SAFETY: forwarded; the legacy struct sits at `legacy` in our headers.
    unsafe { producer_of(context, tensor.as_ptr().cast(), |header| &raw const (*header).legacy as *const c_void) }
}

/// # Safety
/// `tensor` is a live struct the caller owns, whose `manager_ctx` is `context`; `field` gives
/// the address of that struct's kind inside a header without reading it.
unsafe fn producer_of(
    context: *mut c_void,
    tensor: *const c_void,
    field: impl FnOnce(*const Header) -> *const c_void,
) -> Option<Stream> {
    let live = live_headers();
    if !live.contains(&(context as usize)) {
        return None;
    }
    let header = context.cast::<Header>().cast_const();
    // A live header of ours: a foreign struct, itself live, cannot sit inside it, so only our
    // own export's struct has its address.
    if field(header) != tensor {
        return None;
    }
    // SAFETY: a live header (registered, and only removed under the lock we hold before being
    // freed); its export was handed out by `into_raw`, so nothing mutates it (the caller owns
    // the struct). `producer` is only read, and cloned.
    unsafe { (*header).producer.clone() }
}

/// The deleter of the versioned struct: frees the context (and an owned buffer with it).
///
/// # Safety
/// `tensor` is null or an export of this module whose deleter has not run.
unsafe extern "C" fn delete_versioned(tensor: *mut DLManagedTensorVersioned) {
    if let Some(tensor) = NonNull::new(tensor) {
        // SAFETY: `manager_ctx` of our exports is their header, freed once (the caller's duty).
        unsafe { release(tensor.as_ref().manager_ctx) }
    }
}

/// The deleter of the legacy struct; see [`delete_versioned`].
///
/// # Safety
/// As for [`delete_versioned`].
unsafe extern "C" fn delete_legacy(tensor: *mut DLManagedTensor) {
    if let Some(tensor) = NonNull::new(tensor) {
        // SAFETY: as in `delete_versioned`.
        unsafe { release(tensor.as_ref().manager_ctx) }
    }
}

/// # Safety
/// `context` is the header of a live export, released once.
unsafe fn release(context: *mut c_void) {
    if let Some(header) = NonNull::new(context.cast::<Header>()) {
        // SAFETY: the header is live; `drop_context` was set for its `Context<K>`. Dropping
        // never unwinds: the owners' drops do not panic (they report through `raw::quiet`).
        unsafe { (header.as_ref().drop_context)(header) }
    }
}

pub(crate) use sealed::Described;

pub(crate) mod sealed {
    use super::{DLDevice, DataType, Stream, c_void};

    /// What a source says of its memory.
    #[derive(Debug)]
    pub struct Described {
        pub(crate) data: *mut c_void,
        pub(crate) len: usize,
        pub(crate) dtype: DataType,
        pub(crate) device: DLDevice,
        pub(crate) producer: Option<Stream>,
    }

    pub trait Source {
        fn describe(&self) -> crate::Result<Described>;
    }
    pub trait Owner {
        type Keep: Send + 'static;
        fn keep(self) -> Self::Keep;
    }
}

/// Memory a borrowed export may describe: the owning buffers and their device views.
pub trait DlpackSource: sealed::Source {}
/// Sources whose exclusive borrow lets the consumer write ([`DlpackTensor::exclusive`]): the
/// owning buffers and [`DeviceSliceMut`](crate::DeviceSliceMut), not the shared `DeviceSlice`.
pub trait DlpackSourceMut: DlpackSource {}
/// Buffers an owned export may own ([`DlpackTensor::owned`]).
pub trait DlpackOwner: DlpackSource + sealed::Owner + Send + 'static {}

impl<'a> DlpackTensor<'a> {
    fn build<K: Send + 'a>(described: Described, keep: K, writable: bool) -> Result<Self> {
        let Described { data, len, dtype, device, producer } = described;
        let len_i64 = i64::try_from(len).map_err(|_| invalid("more elements than int64 can count", "DLPack export"))?;
        let dl_tensor = DLTensor {
            data,
            device,
            ndim: 1,
            dtype: dtype.to_dl(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let header = Header {
            versioned: DLManagedTensorVersioned {
                version: DLPackVersion { major: ffi::DLPACK_MAJOR_VERSION, minor: ffi::DLPACK_MINOR_VERSION },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: if writable { 0 } else { ffi::DLPACK_FLAG_BITMASK_READ_ONLY },
                dl_tensor,
            },
            legacy: DLManagedTensor { dl_tensor, manager_ctx: std::ptr::null_mut(), deleter: Some(delete_legacy) },
            shape: vec![len_i64],
            strides: vec![1],
            natural: device,
            data,
            len,
            dtype,
            producer,
            drop_context: drop_context::<K>,
        };
        let context = NonNull::from(Box::leak(Box::new(Context { header, keep })));
        live_headers().insert(context.as_ptr() as usize);
        let mut tensor = Self { header: context.cast(), _borrow: PhantomData };
        let ctx = tensor.header.as_ptr().cast::<c_void>();
        let header = tensor.header_mut();
        header.versioned.manager_ctx = ctx;
        header.legacy.manager_ctx = ctx;
        header.sync();
        Ok(tensor)
    }

    /// A read-only export borrowing `source` (`DLPACK_FLAG_BITMASK_READ_ONLY` is set).
    pub fn shared<S: DlpackSource + ?Sized>(source: &'a S) -> Result<Self> {
        Self::build(source.describe()?, (), false)
    }

    /// A writable export borrowing `source` exclusively.
    pub fn exclusive<S: DlpackSourceMut + ?Sized>(source: &'a mut S) -> Result<Self> {
        Self::build(source.describe()?, (), true)
    }

    fn header(&self) -> &Header {
        // SAFETY: the header lives until `self` drops or is turned into a raw pointer.
        unsafe { self.header.as_ref() }
    }

    fn header_mut(&mut self) -> &mut Header {
        // SAFETY: as in `header`; `&mut self` makes the access exclusive (no raw pointer was
        // handed out yet: `into_raw` consumes `self`, `as_mut_ptr` borrows it).
        unsafe { self.header.as_mut() }
    }

    /// The extents, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.header().shape
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.header().dtype
    }

    /// The device the consumer is told the memory is on.
    pub fn device(&self) -> DLDevice {
        self.header().versioned.dl_tensor.device
    }

    /// Whether the consumer may write (false for [`DlpackTensor::shared`] exports).
    pub fn is_writable(&self) -> bool {
        self.header().versioned.flags & ffi::DLPACK_FLAG_BITMASK_READ_ONLY == 0
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.header().len
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of the first element.
    pub fn data_ptr(&self) -> *mut c_void {
        self.header().data
    }

    /// The stream the memory's pending work is on, for stream-ordered memory.
    pub fn producer(&self) -> Option<&Stream> {
        self.header().producer.as_ref()
    }

    /// Row-major extents with the same element count (checked, without overflow), e.g. `[2, 3]`
    /// for 6 elements; `[]` is a scalar of one element. A wrong count is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        let count = checked_elements(shape.iter().copied())
            .ok_or_else(|| invalid("the shape's element count overflows", format!("reshaping to {shape:?}")))?;
        if count != self.len() {
            return Err(invalid(
                "the shape's element count differs from the memory's",
                format!("reshaping {} elements to {shape:?} ({count} elements)", self.len()),
            ));
        }
        if shape.len() > i32::MAX as usize {
            return Err(invalid(
                "more dimensions than int32 can count",
                format!("reshaping to {} dimensions", shape.len()),
            ));
        }
        // An empty shape's extents are not bounded by its count (`[0, usize::MAX]`), and a
        // consumer reads extents and strides as non-negative int64: refuse what does not fit.
        let (shape, strides) = compact_layout(shape).ok_or_else(|| {
            invalid("an extent or row-major stride does not fit int64", format!("reshaping to {shape:?}"))
        })?;
        let header = self.header_mut();
        header.strides = strides;
        header.shape = shape;
        header.sync();
        Ok(self)
    }

    /// The same bytes as elements of `dtype`, 1-D: the byte length must be a multiple of the new
    /// element size, and the address (of a non-empty export) aligned to it.
    pub fn with_dtype(mut self, dtype: DataType) -> Result<Self> {
        let bytes = self.len() * self.dtype().size();
        let size = dtype.size();
        if !bytes.is_multiple_of(size) {
            return Err(invalid(
                "the byte length is not a multiple of the element size",
                format!("viewing {bytes} bytes as {}", dtype.name()),
            ));
        }
        if bytes != 0 && !(self.data_ptr() as usize).is_multiple_of(size) {
            return Err(invalid(
                "the address is not aligned to the element size",
                format!("viewing {:p} as {}", self.data_ptr(), dtype.name()),
            ));
        }
        let len = bytes / size;
        let len_i64 = i64::try_from(len).map_err(|_| {
            invalid("more elements than int64 can count", format!("viewing {bytes} bytes as {}", dtype.name()))
        })?;
        let header = self.header_mut();
        header.dtype = dtype;
        header.len = len;
        header.shape = vec![len_i64];
        header.strides = vec![1];
        header.sync();
        Ok(self)
    }

    /// Presents the memory as `device` where that needs no copy: its own device, managed memory
    /// as `kDLCUDA` of its device, pinned host memory as `kDLCPU`. Anything else is
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn with_device(mut self, device: DLDevice) -> Result<Self> {
        let natural = self.header().natural;
        let allowed = device == natural
            || (natural.device_type == ffi::kDLCUDAManaged
                && device == DLDevice { device_type: ffi::kDLCUDA, device_id: natural.device_id })
            || (natural.device_type == ffi::kDLCUDAHost
                && device == DLDevice { device_type: ffi::kDLCPU, device_id: 0 });
        if !allowed {
            return Err(invalid(
                "the memory cannot be presented on that device without a copy",
                format!("exporting memory of {natural:?} as {device:?}"),
            ));
        }
        let header = self.header_mut();
        header.versioned.dl_tensor.device = device;
        header.sync();
        Ok(self)
    }

    /// Orders `consumer` after the work pending on the memory's stream (the stream contract of
    /// `__dlpack__(stream=…)`); nothing to do for memory without a producer stream.
    pub fn order_consumer(&self, consumer: &ConsumerStream) -> Result<()> {
        match self.producer() {
            Some(producer) => order_consumer_after(producer, consumer),
            None => Ok(()),
        }
    }

    /// The versioned struct, valid while `self` lives, for foreign calls that use it without
    /// taking ownership. Its deleter must not be called: `self` runs it on drop.
    pub fn as_mut_ptr(&mut self) -> *mut DLManagedTensorVersioned {
        &raw mut self.header_mut().versioned
    }

    /// The tensor description, as a `DLTensor` for foreign calls.
    pub fn as_dl_tensor(&self) -> &DLTensor {
        &self.header().versioned.dl_tensor
    }
}

impl DlpackTensor<'static> {
    /// An export that owns `owner` (a device, managed, pinned or stream-ordered buffer:
    /// `StreamBuffer`, `CachedBuffer` and `ResourceBuffer` of lifetime `'static`; or another
    /// process's memory: an `IpcMapping`, an `ImportedSlice<'static, T>`): its deleter frees (or
    /// releases) it. Writable. A stream-ordered buffer's pending work is on
    /// [`DlpackTensor::producer`]; its deleter waits for the device before the free, because the
    /// consumer's work on other streams is unknown (`cudaFree` of the other families waits too).
    ///
    /// The consumer may keep the export for any time, so a buffer that borrows its cache (or
    /// stream, pool or resource) for less than `'static` cannot be owned by it:
    ///
    /// ```compile_fail,E0597
    /// # use cuda_mem::{Device, DeviceCache, Stream};
    /// # use cuda_mem::dlpack::DlpackTensor;
    /// let stream = Stream::non_blocking().unwrap();
    /// let cache = DeviceCache::new(Device::current().unwrap()).unwrap();
    /// let block = cache.zeroed::<f32>(stream.clone(), 16).unwrap(); // error: `cache` does not live long enough
    /// let raw = DlpackTensor::owned(block).unwrap().into_raw();
    /// # let _ = raw;
    /// ```
    pub fn owned<O: DlpackOwner>(owner: O) -> Result<Self> {
        let described = owner.describe()?;
        Self::build(described, owner.keep(), true)
    }

    /// An owned export of memory described by raw parts, for bindings that own memory in their
    /// own types (cuda-mem's Python module).
    ///
    /// # Safety
    /// `data` addresses `len` elements of `dtype` on `device`, which stay allocated while `keep`
    /// lives and are not freed by anything but dropping `keep`; if `writable`, no Rust reference
    /// to the memory (a `&[T]` of host memory) exists while the consumer may write it.
    pub unsafe fn from_raw_parts<K: Send + 'static>(
        data: *mut c_void,
        len: usize,
        dtype: DataType,
        device: DLDevice,
        producer: Option<Stream>,
        keep: K,
        writable: bool,
    ) -> Result<Self> {
        Self::build(Described { data, len, dtype, device, producer }, keep, writable)
    }

    /// Hands the export to foreign code as a `DLManagedTensorVersioned`, which must call its
    /// deleter exactly once.
    ///
    /// **Ordering.** Memory with pending work on [`producer`](DlpackTensor::producer) is still
    /// ordered on that stream: [`DlpackImport::from_raw`](super::DlpackImport::from_raw)
    /// recognises cuda-mem's exports and takes the stream with them (their views wait for it).
    /// For any other consumer, order its stream first with
    /// [`order_consumer`](DlpackTensor::order_consumer) (what `__dlpack__(stream=...)` does),
    /// as the raw struct carries no stream.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let mut this = std::mem::ManuallyDrop::new(self);
        &raw mut this.header_mut().versioned
    }

    /// Hands the export to foreign code as a legacy (pre-1.0) `DLManagedTensor`, for consumers
    /// that ask for no versioned struct; ordered as [`into_raw`](DlpackTensor::into_raw) says. That struct has no read-only flag, so read-only exports
    /// are refused with [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn into_raw_legacy(self) -> Result<*mut DLManagedTensor> {
        if !self.is_writable() {
            return Err(invalid(
                "a read-only export cannot be a legacy DLManagedTensor (it has no read-only flag)",
                "DlpackTensor::into_raw_legacy",
            ));
        }
        let mut this = std::mem::ManuallyDrop::new(self);
        Ok(&raw mut this.header_mut().legacy)
    }
}

impl Header {
    /// Copies shape, strides, dtype and device into both structs after a change.
    fn sync(&mut self) {
        let tensor = &mut self.versioned.dl_tensor;
        tensor.ndim = self.shape.len() as i32; // bounded by `reshape`
        tensor.shape = self.shape.as_mut_ptr();
        tensor.strides = self.strides.as_mut_ptr();
        tensor.dtype = self.dtype.to_dl();
        self.legacy.dl_tensor = *tensor;
    }
}

impl Drop for DlpackTensor<'_> {
    fn drop(&mut self) {
        let ptr = self.as_mut_ptr();
        // SAFETY: our own export, whose deleter has not run (into_raw forgets `self`).
        unsafe { delete_versioned(ptr) }
    }
}

impl fmt::Debug for DlpackTensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DlpackTensor")
            .field("data", &self.data_ptr())
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .field("writable", &self.is_writable())
            .finish()
    }
}

/// `shape` and its row-major strides (in elements, an extent of 0 counted as 1, as PyTorch
/// does) as DLPack's int64s, or `None` where an extent or a stride does not fit `i64`.
fn compact_layout(shape: &[usize]) -> Option<(Vec<i64>, Vec<i64>)> {
    let extents = shape.iter().map(|&d| i64::try_from(d).ok()).collect::<Option<Vec<i64>>>()?;
    let mut strides = vec![1i64; extents.len()];
    for i in (0..extents.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].checked_mul(extents[i + 1].max(1))?;
    }
    Some((extents, strides))
}
