//! `cuda_mem.Buffer`: memory cuda-mem owns, shared with Python (and with DLPack consumers, which
//! keep it alive through an `Arc` until their deleter runs).

use crate::stream::Stream;
use crate::{args, capsule, device_or_current, dtype, to_py};
use cuda_mem::dlpack::ffi::{kDLCUDA, kDLCUDAHost, kDLCUDAManaged};
use cuda_mem::dlpack::{ConsumerStream, DLDevice, DataType, DlpackTensor};
use cuda_mem::{
    CachedBuffer, Device, DeviceBuffer, DeviceCache, HostAllocFlags, ManagedBuffer, PinnedBuffer, StreamBuffer,
};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyString, PyTuple};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The owning cuda-mem buffer.
enum Storage {
    Device(DeviceBuffer<u8>),
    Managed(ManagedBuffer<u8>),
    // Held for its free; its bytes are reached through raw pointers (see `read`).
    Pinned(#[allow(dead_code)] PinnedBuffer<u8>),
    Pooled(StreamBuffer<'static, u8>),
    Cached(CachedBuffer<'static, u8>),
}

/// One allocation, shared by every `Buffer` view of it and every export.
struct Allocation {
    storage: Mutex<Storage>,
    /// The address, fixed at allocation (as an integer: the struct is shared across threads).
    data: usize,
    nbytes: usize,
    kind: &'static str,
    /// Where DLPack places the memory.
    natural: DLDevice,
    device: Device,
    /// The stream of a pooled or cached buffer, where its pending work is.
    producer: Option<cuda_mem::Stream>,
}

impl Allocation {
    fn lock(&self) -> MutexGuard<'_, Storage> {
        self.storage.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What an export keeps alive: the allocation. A pooled or cached buffer's release waits for the
/// device first, as the consumer's streams are unknown (the other kinds' frees wait by themselves).
struct Keep(Arc<Allocation>);

impl Drop for Keep {
    fn drop(&mut self) {
        if self.0.producer.is_some() {
            // On failure the context is broken; the free that may follow reports nothing either.
            self.0.device.synchronize().ok();
        }
    }
}

/// Memory allocated by cuda-mem: `kind` is `"device"` (`cudaMalloc`), `"managed"`
/// (`cudaMallocManaged`), `"pinned"` (`cudaMallocHost`), `"pooled"` (`cudaMallocFromPoolAsync`
/// from cuda-mem's retaining pool, on `stream`) or `"cached"` (a block of the device's
/// `DeviceCache`, cuda-mem's caching allocator, on `stream`). Consumers take it with `torch.from_dlpack`,
/// `cupy.from_dlpack`, `jax.dlpack.from_dlpack` or `numpy.from_dlpack`, without a copy.
#[pyclass(module = "cuda_mem", frozen)]
pub(crate) struct Buffer {
    alloc: Arc<Allocation>,
    shape: Vec<usize>,
    dtype: DataType,
    /// The device `__dlpack_device__` reports (see `with_dl_device`).
    presented: DLDevice,
}

/// Allocates a zeroed buffer.
#[pyfunction]
#[pyo3(
    signature = (shape, dtype=None, kind="device", device=None, stream=None),
    text_signature = "(shape, dtype='float32', kind='device', device=None, stream=None)"
)]
pub(crate) fn zeros(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    kind: &str,
    device: Option<&Bound<'_, PyAny>>,
    stream: Option<&Stream>,
) -> PyResult<Buffer> {
    new_buffer(py, shape, dtype, kind, device, stream, Contents::Zeroed)
}

/// Allocates a buffer without initialising it (device, managed and pooled memory hold whatever
/// they held before; pinned memory is zeroed, as host memory must be initialised to be read).
#[pyfunction]
#[pyo3(
    signature = (shape, dtype=None, kind="device", device=None, stream=None),
    text_signature = "(shape, dtype='float32', kind='device', device=None, stream=None)"
)]
pub(crate) fn empty(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    kind: &str,
    device: Option<&Bound<'_, PyAny>>,
    stream: Option<&Stream>,
) -> PyResult<Buffer> {
    new_buffer(py, shape, dtype, kind, device, stream, Contents::Unspecified)
}

/// What a new buffer holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contents {
    Zeroed,
    Unspecified,
}

/// Checks every argument (no CUDA call before), then allocates.
fn new_buffer(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    kind: &str,
    device: Option<&Bound<'_, PyAny>>,
    stream: Option<&Stream>,
    contents: Contents,
) -> PyResult<Buffer> {
    let device = args::device(device)?;
    let shape = args::shape(shape)?;
    let dtype = dtype.map(args::dtype).transpose()?.unwrap_or(DataType::F32);
    let nbytes = dtype::bytes(&shape, dtype)?;
    // DLPack counts elements in int64.
    if i64::try_from(nbytes).is_err() {
        return Err(PyValueError::new_err(format!("shape {shape:?}: {nbytes} bytes are more than int64 can count")));
    }
    let kind = args::kind(kind)?;
    if stream.is_some() && !STREAM_ORDERED.contains(&kind) {
        return Err(PyValueError::new_err(format!("stream= is for pooled and cached buffers, not {kind} ones")));
    }
    let device = match (stream, device) {
        (Some(stream), None) => stream.inner.device(),
        (Some(stream), Some(ordinal)) if stream.inner.device().ordinal() != ordinal => {
            return Err(PyValueError::new_err(format!(
                "device {ordinal} differs from the stream's device {}",
                stream.inner.device().ordinal()
            )));
        }
        (_, device) => device_or_current(device)?,
    };
    let stream = stream.map(|s| s.inner.clone());
    let alloc = py.detach(|| allocate(kind, nbytes, device, stream, contents))?;
    let presented = alloc.natural;
    Ok(Buffer { alloc: Arc::new(alloc), shape, dtype, presented })
}

/// Allocates a buffer holding a copy of `data` (`bytes` or `bytearray`), 1-D unless `shape` is
/// given.
#[pyfunction]
#[pyo3(
    signature = (data, dtype=None, shape=None, kind="device", device=None, stream=None),
    text_signature = "(data, dtype='uint8', shape=None, kind='device', device=None, stream=None)"
)]
pub(crate) fn from_bytes(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    shape: Option<&Bound<'_, PyAny>>,
    kind: &str,
    device: Option<&Bound<'_, PyAny>>,
    stream: Option<&Stream>,
) -> PyResult<Buffer> {
    let bytes = host_bytes(data)?;
    let element_type = dtype.map(args::dtype).transpose()?.unwrap_or(DataType::U8);
    let shape = match shape {
        Some(shape) => args::shape(shape)?,
        None if bytes.len().is_multiple_of(element_type.size()) => vec![bytes.len() / element_type.size()],
        None => {
            return Err(PyValueError::new_err(format!(
                "{} bytes are not whole {} elements",
                bytes.len(),
                element_type.name()
            )));
        }
    };
    let shape_obj = PyTuple::new(py, &shape)?;
    let dtype_obj = PyString::new(py, element_type.name());
    let buffer =
        new_buffer(py, shape_obj.as_any(), Some(dtype_obj.as_any()), kind, device, stream, Contents::Unspecified)?;
    buffer.write(py, data)?;
    Ok(buffer)
}

fn host_bytes(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(bytes.as_bytes().to_vec());
    }
    if let Ok(array) = data.cast::<PyByteArray>() {
        return Ok(array.to_vec());
    }
    Err(PyTypeError::new_err(format!("expected bytes or bytearray, not {}", data.get_type().name()?)))
}

fn allocate(
    kind: &'static str,
    nbytes: usize,
    device: Device,
    stream: Option<cuda_mem::Stream>,
    contents: Contents,
) -> PyResult<Allocation> {
    let cuda = DLDevice { device_type: kDLCUDA, device_id: device.ordinal() as i32 };
    let (storage, data, kind, natural, producer) = device
        .run_on(|| -> cuda_mem::Result<_> {
            Ok(match kind {
                "device" => {
                    let b = match contents {
                        Contents::Zeroed => DeviceBuffer::<u8>::zeroed(nbytes)?,
                        // SAFETY: bytes, any value valid; this module reads device memory only
                        // through runtime copies, which initialise what they write on the host.
                        Contents::Unspecified => unsafe { DeviceBuffer::<u8>::uninit(nbytes)? },
                    };
                    let data = b.as_slice().as_device_ptr() as usize;
                    (Storage::Device(b), data, "device", cuda, None)
                }
                "managed" => {
                    let b = match contents {
                        Contents::Zeroed => ManagedBuffer::<u8>::zeroed(nbytes)?,
                        // SAFETY: as for device memory: read only through runtime copies here.
                        Contents::Unspecified => unsafe { ManagedBuffer::<u8>::uninit(nbytes)? },
                    };
                    let data = b.as_slice().as_device_ptr() as usize;
                    let natural = DLDevice { device_type: kDLCUDAManaged, device_id: cuda.device_id };
                    (Storage::Managed(b), data, "managed", natural, None)
                }
                "pinned" => {
                    let b = PinnedBuffer::<u8>::zeroed_with_flags(nbytes, HostAllocFlags::PORTABLE)?;
                    let data = b.as_ptr() as usize;
                    (Storage::Pinned(b), data, "pinned", DLDevice { device_type: kDLCUDAHost, device_id: 0 }, None)
                }
                "pooled" => {
                    let stream = stream_or_new(stream, device)?;
                    let b = match contents {
                        Contents::Zeroed => StreamBuffer::<u8>::zeroed(stream.clone(), nbytes)?,
                        // SAFETY: as for device memory; reads here are copies ordered after the
                        // stream's work.
                        Contents::Unspecified => unsafe { StreamBuffer::<u8>::uninit(stream.clone(), nbytes)? },
                    };
                    let data = b.as_slice().as_device_ptr() as usize;
                    (Storage::Pooled(b), data, "pooled", cuda, Some(stream))
                }
                "cached" => {
                    let (cache, stream) = (DeviceCache::for_device(device)?, stream_or_new(stream, device)?);
                    let b = match contents {
                        Contents::Zeroed => cache.zeroed::<u8>(stream.clone(), nbytes)?,
                        // SAFETY: as for pooled memory.
                        Contents::Unspecified => unsafe { cache.uninit::<u8>(stream.clone(), nbytes)? },
                    };
                    let data = b.as_slice().as_device_ptr() as usize;
                    (Storage::Cached(b), data, "cached", cuda, Some(stream))
                }
                _ => {
                    let kind =
                        cuda_mem::ErrorKind::InvalidArgument("kind is device, managed, pinned, pooled or cached");
                    return Err(cuda_mem::CudaError::new(kind, "allocating a cuda_mem.Buffer"));
                }
            })
        })
        .and_then(|r| r)
        .map_err(to_py)?;
    Ok(Allocation { storage: Mutex::new(storage), data, nbytes, kind, natural, device, producer })
}

/// The kinds whose memory is ordered on a stream.
const STREAM_ORDERED: [&str; 2] = ["pooled", "cached"];

/// The stream a stream-ordered buffer is allocated on: the given one or a new one of `device`.
fn stream_or_new(stream: Option<cuda_mem::Stream>, device: Device) -> cuda_mem::Result<cuda_mem::Stream> {
    match stream {
        Some(stream) => Ok(stream),
        None => cuda_mem::Stream::on_device(device),
    }
}

#[pymethods]
impl Buffer {
    /// The extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The element type's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.alloc.nbytes
    }

    /// `"device"`, `"managed"`, `"pinned"`, `"pooled"` or `"cached"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.alloc.kind
    }

    /// The device ordinal (for pinned memory: the device current at allocation).
    #[getter]
    fn device(&self) -> usize {
        self.alloc.device.ordinal()
    }

    /// The address, as an integer.
    #[getter]
    fn ptr(&self) -> usize {
        self.alloc.data
    }

    /// The stream of a pooled or cached buffer (its allocation, zeroing and queued fills), else
    /// None.
    #[getter]
    fn stream(&self) -> Option<Stream> {
        self.alloc.producer.clone().map(|inner| Stream { inner })
    }

    /// A copy of the contents (blocking; after the buffer's pending work).
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let alloc = &*self.alloc;
        let bytes = py.detach(|| -> cuda_mem::Result<Vec<u8>> {
            match &*alloc.lock() {
                Storage::Device(b) => b.to_vec(),
                Storage::Managed(b) => b.as_slice().to_vec(),
                Storage::Pooled(b) => b.as_slice().to_vec(),
                Storage::Cached(b) => b.as_slice().to_vec(),
                Storage::Pinned(_) => {
                    let mut out = vec![0u8; alloc.nbytes];
                    // SAFETY: the lock keeps the buffer, which holds `nbytes` at `data`; the copy
                    // goes through raw pointers, forming no Rust reference to memory consumers
                    // may write.
                    unsafe { std::ptr::copy_nonoverlapping(alloc.data as *const u8, out.as_mut_ptr(), alloc.nbytes) };
                    Ok(out)
                }
            }
        });
        Ok(PyBytes::new(py, &bytes.map_err(to_py)?))
    }

    /// Overwrites the contents with `data` (`bytes` or `bytearray` of `nbytes` bytes; blocking).
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes = host_bytes(data)?;
        let alloc = &*self.alloc;
        if bytes.len() != alloc.nbytes {
            return Err(PyValueError::new_err(format!("{} bytes given for a buffer of {}", bytes.len(), alloc.nbytes)));
        }
        py.detach(|| match &mut *alloc.lock() {
            Storage::Device(b) => b.as_mut_slice().copy_from_host(&bytes),
            Storage::Managed(b) => b.as_mut_slice().copy_from_host(&bytes),
            Storage::Pooled(b) => b.as_mut_slice().copy_from_host(&bytes),
            Storage::Cached(b) => b.as_mut_slice().copy_from_host(&bytes),
            Storage::Pinned(_) => {
                // SAFETY: as in `read`, for writes of `nbytes` (checked above).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), alloc.data as *mut u8, alloc.nbytes) };
                Ok(())
            }
        })
        .map_err(to_py)
    }

    /// Sets every byte to `value` (blocking).
    fn fill_byte(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = args::byte(value)?;
        let alloc = &*self.alloc;
        py.detach(|| match &mut *alloc.lock() {
            Storage::Device(b) => b.as_mut_slice().set_bytes(value),
            Storage::Managed(b) => b.as_mut_slice().set_bytes(value),
            Storage::Pooled(b) => b.as_mut_slice().set_bytes(value),
            Storage::Cached(b) => b.as_mut_slice().set_bytes(value),
            Storage::Pinned(_) => {
                // SAFETY: as in `write`.
                unsafe { std::ptr::write_bytes(alloc.data as *mut u8, value, alloc.nbytes) };
                Ok(())
            }
        })
        .map_err(to_py)
    }

    /// Queues a fill of every byte with `value` on the stream of a pooled or cached buffer and
    /// returns at once: pending work, which `__dlpack__(stream=...)` orders consumers after.
    fn fill_byte_async(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = args::byte(value)?;
        match &mut *self.alloc.lock() {
            Storage::Pooled(b) => b.set_bytes_async(value).map_err(to_py),
            Storage::Cached(b) => b.set_bytes_async(value).map_err(to_py),
            _ => Err(PyValueError::new_err("only pooled and cached buffers have a stream to queue work on")),
        }
    }

    /// The same memory with another shape (same element count).
    fn reshape(&self, shape: &Bound<'_, PyAny>) -> PyResult<Buffer> {
        let shape = args::shape(shape)?;
        if dtype::elements(&shape)? != dtype::elements(&self.shape)? {
            return Err(PyValueError::new_err(format!("cannot reshape {:?} to {shape:?}", self.shape)));
        }
        Ok(Buffer { alloc: self.alloc.clone(), shape, dtype: self.dtype, presented: self.presented })
    }

    /// The same bytes as a 1-D buffer of `dtype`.
    fn view(&self, dtype: &Bound<'_, PyAny>) -> PyResult<Buffer> {
        let dtype = args::dtype(dtype)?;
        if !self.alloc.nbytes.is_multiple_of(dtype.size()) {
            return Err(PyValueError::new_err(format!(
                "{} bytes are not whole {} elements",
                self.alloc.nbytes,
                dtype.name()
            )));
        }
        let shape = vec![self.alloc.nbytes / dtype.size()];
        Ok(Buffer { alloc: self.alloc.clone(), shape, dtype, presented: self.presented })
    }

    /// The same buffer, reported to DLPack consumers as `(device_type, device_id)`: managed memory
    /// as `(2, ordinal)` (kDLCUDA) for consumers that do not know managed memory, pinned memory as
    /// `(1, 0)` (kDLCPU) for NumPy.
    fn with_dl_device(&self, dl_device: (i64, i64)) -> PyResult<Buffer> {
        let presented = args::dl_device(dl_device)?;
        self.export()?.with_device(presented).map_err(to_py)?;
        Ok(Buffer { alloc: self.alloc.clone(), shape: self.shape.clone(), dtype: self.dtype, presented })
    }

    /// The CUDA Array Interface, version 3 (Numba, CuPy): device, managed, pooled and cached
    /// memory; `stream` is a pooled or cached buffer's stream (the consumer waits for it), else None (no pending
    /// work). Pinned memory, and bfloat16 (no typestr), have none: `AttributeError`, so
    /// `hasattr` says so.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.alloc.kind == "pinned" {
            return Err(PyAttributeError::new_err("pinned memory is host memory: use __dlpack__"));
        }
        let Some(typestr) = dtype::typestr(self.dtype) else {
            return Err(PyAttributeError::new_err(format!(
                "{} has no CUDA Array Interface typestr: use __dlpack__",
                self.dtype.name()
            )));
        };
        let interface = PyDict::new(py);
        interface.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        interface.set_item("typestr", typestr)?;
        interface.set_item("data", (self.alloc.data, false))?;
        interface.set_item("version", 3)?;
        interface.set_item("strides", py.None())?;
        let stream = self.alloc.producer.as_ref().map(|s| s.as_raw() as usize);
        interface.set_item("stream", stream)?;
        Ok(interface)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.presented.device_type, self.presented.device_id)
    }

    /// The DLPack protocol: a `"dltensor_versioned"` capsule when `max_version` is 1.x or later,
    /// else the legacy `"dltensor"` one. For CUDA memory, the consumer's `stream` (`None` or 1:
    /// legacy default, 2: per-thread default, -1: no ordering, else a `cudaStream_t`) is made to
    /// wait for the buffer's pending work. A handle above 2 is trusted, as the protocol has the
    /// consumer vouch for it: it must be a live stream of the buffer's device (0 and values below
    /// -1 are refused with `ValueError`; no call can tell a live handle from a stale one).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i64, i64)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(true) {
            return Err(PyBufferError::new_err("cuda_mem shares its memory; copy=True is not supported"));
        }
        let mut tensor = self.export()?;
        if let Some(dl_device) = dl_device {
            tensor = tensor
                .with_device(args::dl_device(dl_device)?)
                .map_err(|err| PyBufferError::new_err(err.to_string()))?;
        }
        let device_type = tensor.device().device_type;
        if device_type == kDLCUDA || device_type == kDLCUDAManaged {
            // SAFETY: a handle above 2 is the consumer's live stream: the protocol's contract,
            // which the caller of `__dlpack__` keeps.
            let consumer = unsafe { ConsumerStream::from_dlpack_arg(stream) }.map_err(to_py)?;
            tensor.order_consumer(&consumer).map_err(to_py)?;
        }
        let legacy = max_version.is_none_or(|(major, _)| major < 1);
        capsule::export(py, tensor, legacy)
    }

    fn __repr__(&self) -> String {
        format!(
            "cuda_mem.Buffer(shape={:?}, dtype={}, kind={}, device={}, ptr={:#x})",
            self.shape,
            self.dtype.name(),
            self.alloc.kind,
            self.alloc.device.ordinal(),
            self.alloc.data
        )
    }
}

impl Buffer {
    /// An owned export of the whole allocation with this buffer's type, shape and presentation.
    fn export(&self) -> PyResult<DlpackTensor<'static>> {
        let alloc = &self.alloc;
        // SAFETY: `Keep` holds the allocation, which is freed only when the last `Arc` drops;
        // this module touches host memory (pinned) only through raw pointers, never through a
        // Rust reference while a consumer may write it.
        let tensor = unsafe {
            DlpackTensor::from_raw_parts(
                alloc.data as *mut c_void,
                alloc.nbytes,
                DataType::U8,
                alloc.natural,
                alloc.producer.clone(),
                Keep(alloc.clone()),
                true,
            )
        };
        tensor
            .and_then(|t| t.with_dtype(self.dtype))
            .and_then(|t| t.reshape(&self.shape))
            .and_then(|t| t.with_device(self.presented))
            .map_err(to_py)
    }
}
