//! Contract tests without a GPU: exports over host memory with counting owners, and tensors built
//! by hand with counting deleters. No view made here is ever used for a copy.

use super::ffi::*;
use super::*;
use crate::Device;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const CUDA0: DLDevice = DLDevice { device_type: kDLCUDA, device_id: 0 };

fn device0() -> Device {
    Device::new_unchecked_for_tests(0)
}

/// An owned export of `bytes` host bytes presented as `device`, and its drop counter.
fn export_over(data: &mut [u8], device: DLDevice) -> (DlpackTensor<'static>, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    // SAFETY: the bytes outlive every use in the tests, which only read metadata; no copy runs.
    let tensor = unsafe {
        DlpackTensor::from_raw_parts(
            data.as_mut_ptr().cast(),
            data.len(),
            DataType::U8,
            device,
            None,
            Counted(drops.clone()),
            true,
        )
    }
    .unwrap();
    (tensor, drops)
}

fn kind(err: &crate::CudaError) -> &'static str {
    match err.kind() {
        crate::ErrorKind::InvalidArgument(what) => what,
        other => panic!("expected InvalidArgument, got {other:?}: {err}"),
    }
}

#[test]
fn dropping_an_export_runs_its_deleter_once() {
    let mut bytes = [0u8; 16];
    let (tensor, drops) = export_over(&mut bytes, CUDA0);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(tensor);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn raw_exports_are_recognised_by_the_import_and_released_once() {
    let mut bytes = [0u8; 16];
    let (tensor, drops) = export_over(&mut bytes, CUDA0);
    let raw = tensor.into_raw();
    // SAFETY: a live export, read only.
    let context = unsafe { (*raw).manager_ctx } as usize;
    assert!(super::export::is_live_export(context));
    // Its own import finds it (no producer stream: the memory has none) and releases it once.
    // SAFETY: our export, handed over once.
    let import = unsafe { DlpackImport::from_raw(raw) }.unwrap();
    assert!(import.producer().is_none());
    drop(import);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // (Whether the address left the set is not asserted: another test's export may take the
    // freed address at once.)
    // The legacy struct too.
    let (tensor, drops) = export_over(&mut bytes, CUDA0);
    let raw = tensor.into_raw_legacy().unwrap();
    // SAFETY: a live export, read only.
    let context = unsafe { (*raw).manager_ctx } as usize;
    assert!(super::export::is_live_export(context));
    // SAFETY: our export, handed over once.
    drop(unsafe { DlpackImport::from_raw_legacy(raw) }.unwrap());
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn a_raw_export_is_freed_by_the_consumers_deleter_call() {
    let mut bytes = [0u8; 16];
    let (tensor, drops) = export_over(&mut bytes, CUDA0);
    let raw = tensor.into_raw();
    // SAFETY: a live export; the consumer reads it and calls its deleter once.
    unsafe {
        let managed = &*raw;
        assert_eq!(managed.version, DLPackVersion { major: 1, minor: 0 });
        assert_eq!(managed.flags, 0);
        assert_eq!(managed.dl_tensor.ndim, 1);
        assert_eq!(*managed.dl_tensor.shape, 16);
        assert_eq!(*managed.dl_tensor.strides, 1);
        assert_eq!(managed.dl_tensor.data, bytes.as_mut_ptr().cast());
        assert_eq!(managed.dl_tensor.device, CUDA0);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        (managed.deleter.unwrap())(raw);
    }
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn the_legacy_struct_describes_the_same_tensor_and_frees_once() {
    let mut bytes = [0u8; 24];
    let (tensor, drops) = export_over(&mut bytes, CUDA0);
    let tensor = tensor.with_dtype(DataType::F32).unwrap().reshape(&[2, 3]).unwrap();
    let raw = tensor.into_raw_legacy().unwrap();
    // SAFETY: a live legacy export; freed once.
    unsafe {
        let t = &(*raw).dl_tensor;
        assert_eq!(t.ndim, 2);
        assert_eq!(std::slice::from_raw_parts(t.shape, 2), [2, 3]);
        assert_eq!(std::slice::from_raw_parts(t.strides, 2), [3, 1]);
        assert_eq!(t.dtype, DLDataType { code: kDLFloat, bits: 32, lanes: 1 });
        ((*raw).deleter.unwrap())(raw);
    }
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn reshape_checks_the_element_count() {
    let mut bytes = [0u8; 24];
    let (tensor, drops) = export_over(&mut bytes, CUDA0);
    let tensor = tensor.reshape(&[2, 3, 4]).unwrap();
    assert_eq!(tensor.shape(), [2, 3, 4]);
    let t = tensor.as_dl_tensor();
    // SAFETY: the export's own arrays of `ndim` values.
    assert_eq!(unsafe { std::slice::from_raw_parts(t.strides, 3) }, [12, 4, 1]);
    let err = tensor.reshape(&[5, 5]).unwrap_err();
    assert_eq!(kind(&err), "the shape's element count differs from the memory's");
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the failed reshape released the export");

    let (tensor, _) = export_over(&mut bytes, CUDA0);
    let err = tensor.reshape(&[usize::MAX, 3]).unwrap_err();
    assert_eq!(kind(&err), "the shape's element count overflows");
    let mut one = [0u8; 1];
    let (scalar, _) = export_over(&mut one, CUDA0);
    let scalar = scalar.reshape(&[]).unwrap();
    assert_eq!((scalar.as_dl_tensor().ndim, scalar.len()), (0, 1));
    let mut none = [0u8; 0];
    let (empty, _) = export_over(&mut none, CUDA0);
    assert_eq!(empty.reshape(&[3, 0, 2]).unwrap().shape(), [3, 0, 2]);
}

#[test]
fn reshape_refuses_extents_and_strides_beyond_int64() {
    let mut none = [0u8; 0];
    // An empty export's count is 0 whatever the other extents: each must still fit int64.
    for shape in [&[0, usize::MAX][..], &[0, 1 << 63], &[1 << 63, 0], &[0, 1 << 62, 4], &[0, 3, 1 << 62]] {
        let (empty, drops) = export_over(&mut none, CUDA0);
        let err = empty.reshape(shape).unwrap_err();
        assert_eq!(kind(&err), "an extent or row-major stride does not fit int64", "{shape:?}");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the refused reshape released the export");
    }
    // The largest that fits: extent i64::MAX, and strides whose product stays within it.
    let (empty, _) = export_over(&mut none, CUDA0);
    let top = i64::MAX as usize;
    let tensor = empty.reshape(&[0, top]).unwrap();
    assert_eq!(tensor.shape(), [0, i64::MAX]);
    let t = tensor.as_dl_tensor();
    // SAFETY: the export's own arrays of `ndim` values.
    assert_eq!(unsafe { std::slice::from_raw_parts(t.strides, 2) }, [i64::MAX, 1]);
    let (empty, _) = export_over(&mut none, CUDA0);
    let tensor = empty.reshape(&[0, 1 << 31, 1 << 31]).unwrap();
    let t = tensor.as_dl_tensor();
    // SAFETY: as above.
    let (shape, strides) =
        unsafe { (std::slice::from_raw_parts(t.shape, 3), std::slice::from_raw_parts(t.strides, 3)) };
    assert!(shape.iter().chain(strides).all(|&v| v >= 0), "{shape:?} {strides:?}");
    assert_eq!(strides, [1 << 62, 1 << 31, 1]);
}

#[test]
fn with_dtype_checks_length_and_alignment() {
    #[repr(align(8))]
    struct Aligned([u8; 16]);
    let mut bytes = Aligned([0; 16]);
    let (tensor, _) = export_over(&mut bytes.0, CUDA0);
    let tensor = tensor.with_dtype(DataType::F64).unwrap();
    assert_eq!((tensor.len(), tensor.shape(), tensor.dtype()), (2, &[2i64][..], DataType::F64));
    let (tensor, _) = export_over(&mut bytes.0[..6], CUDA0);
    assert_eq!(
        kind(&tensor.with_dtype(DataType::F32).unwrap_err()),
        "the byte length is not a multiple of the element size"
    );
    let (tensor, _) = export_over(&mut bytes.0[1..9], CUDA0);
    assert_eq!(kind(&tensor.with_dtype(DataType::U32).unwrap_err()), "the address is not aligned to the element size");
}

#[test]
fn with_device_allows_only_copy_free_presentations() {
    let mut bytes = [0u8; 8];
    let managed = DLDevice { device_type: kDLCUDAManaged, device_id: 1 };
    let (tensor, _) = export_over(&mut bytes, managed);
    let as_cuda = DLDevice { device_type: kDLCUDA, device_id: 1 };
    assert_eq!(tensor.with_device(as_cuda).unwrap().device(), as_cuda);
    let (tensor, _) = export_over(&mut bytes, managed);
    let err = tensor.with_device(DLDevice { device_type: kDLCUDA, device_id: 0 }).unwrap_err();
    assert_eq!(kind(&err), "the memory cannot be presented on that device without a copy");
    let (pinned, _) = export_over(&mut bytes, DLDevice { device_type: kDLCUDAHost, device_id: 0 });
    let cpu = DLDevice { device_type: kDLCPU, device_id: 0 };
    assert_eq!(pinned.with_device(cpu).unwrap().device(), cpu);
    let (device, _) = export_over(&mut bytes, CUDA0);
    assert!(device.with_device(cpu).is_err());
}

#[test]
fn read_only_exports_stay_read_only() {
    let mut bytes = [0u8; 8];
    let drops = Arc::new(AtomicUsize::new(0));
    // SAFETY: as in `export_over`.
    let tensor = unsafe {
        DlpackTensor::from_raw_parts(
            bytes.as_mut_ptr().cast(),
            8,
            DataType::U8,
            CUDA0,
            None,
            Counted(drops.clone()),
            false,
        )
    }
    .unwrap();
    assert!(!tensor.is_writable());
    let err = tensor.into_raw_legacy().unwrap_err();
    assert_eq!(kind(&err), "a read-only export cannot be a legacy DLManagedTensor (it has no read-only flag)");
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // SAFETY: as above.
    let tensor = unsafe {
        DlpackTensor::from_raw_parts(
            bytes.as_mut_ptr().cast(),
            8,
            DataType::U8,
            CUDA0,
            None,
            Counted(drops.clone()),
            false,
        )
    }
    .unwrap();
    // SAFETY: the export's ownership passes to the import.
    let mut import = unsafe { DlpackImport::from_raw(tensor.into_raw()) }.unwrap();
    assert!(import.is_read_only());
    assert!(import.device_slice::<u8>(device0()).is_ok());
    let err = import.device_slice_mut::<u8>(device0()).unwrap_err();
    assert_eq!(kind(&err), "the producer marked the tensor read-only");
    assert!(import.device_bytes_mut(device0()).is_err());
    drop(import);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

#[test]
fn an_export_imports_back_with_its_shape_type_and_device() {
    let mut floats = [0f32; 6];
    let (tensor, drops) = export_over(bytemuck::cast_slice_mut(&mut floats), CUDA0);
    let tensor = tensor.with_dtype(DataType::F32).unwrap().reshape(&[3, 2]).unwrap();
    // SAFETY: the export's ownership passes to the import.
    let mut import = unsafe { DlpackImport::from_raw(tensor.into_raw()) }.unwrap();
    assert_eq!((import.shape(), import.len(), import.dtype()), (&[3usize, 2][..], 6, DataType::F32));
    assert_eq!(import.data_ptr(), floats.as_mut_ptr().cast());
    assert_eq!(import.device_slice::<f32>(device0()).unwrap().len(), 6);
    assert_eq!(import.device_slice_mut::<f32>(device0()).unwrap().len(), 6);
    assert_eq!(import.device_bytes(device0()).unwrap().len(), 24);
    let err = import.device_slice::<u32>(device0()).unwrap_err();
    assert_eq!(kind(&err), "the tensor's element type differs from the view's");
    let err = import.device_slice::<f32>(Device::new_unchecked_for_tests(1)).unwrap_err();
    assert_eq!(kind(&err), "the tensor is on another device");
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(import);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

/// A tensor built by hand in host memory, whose deleter counts its calls.
struct Fake {
    managed: Box<DLManagedTensorVersioned>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
    calls: Box<AtomicUsize>,
}

unsafe extern "C" fn count_call(tensor: *mut DLManagedTensorVersioned) {
    // SAFETY: fakes point `manager_ctx` at their live counter.
    unsafe { (*(*tensor).manager_ctx.cast::<AtomicUsize>()).fetch_add(1, Ordering::SeqCst) };
}

impl Fake {
    fn new(data: *mut c_void, shape: &[i64], strides: Option<&[i64]>, dtype: DLDataType, device: DLDevice) -> Self {
        let mut shape = shape.to_vec();
        let mut strides = strides.map(<[i64]>::to_vec).unwrap_or_default();
        let calls = Box::new(AtomicUsize::new(0));
        let strides_ptr = if strides.is_empty() { std::ptr::null_mut() } else { strides.as_mut_ptr() };
        let managed = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 1 },
            manager_ctx: (&raw const *calls).cast_mut().cast(),
            deleter: Some(count_call),
            flags: 0,
            dl_tensor: DLTensor {
                data,
                device,
                ndim: shape.len() as i32,
                dtype,
                shape: shape.as_mut_ptr(),
                strides: strides_ptr,
                byte_offset: 0,
            },
        });
        Self { managed, _shape: shape, _strides: strides, calls }
    }

    fn f32s(data: *mut c_void, shape: &[i64], strides: Option<&[i64]>) -> Self {
        Self::new(data, shape, strides, DataType::F32.to_dl(), CUDA0)
    }

    /// Imports it; returns the error and checks the deleter ran exactly once.
    fn refused(mut self) -> &'static str {
        // SAFETY: the fake is live; ownership passes to the call.
        let err = unsafe { DlpackImport::from_raw(&raw mut *self.managed) }.unwrap_err();
        assert_eq!(self.calls.load(Ordering::SeqCst), 1, "the deleter runs once on error: {err}");
        kind(&err)
    }

    fn import(&mut self) -> DlpackImport {
        // SAFETY: as in `refused`.
        unsafe { DlpackImport::from_raw(&raw mut *self.managed) }.unwrap()
    }
}

/// An address of 64 host floats for fakes (only read as an address: nothing dereferences it).
fn host_floats() -> *mut c_void {
    static DATA: [std::sync::atomic::AtomicU32; 64] = [const { std::sync::atomic::AtomicU32::new(0) }; 64];
    DATA.as_ptr().cast_mut().cast()
}

#[test]
fn a_well_formed_tensor_imports_and_releases_once() {
    let data = host_floats();
    let mut fake = Fake::f32s(data, &[4, 2], Some(&[2, 1]));
    fake.managed.dl_tensor.byte_offset = 8;
    let import = fake.import();
    assert_eq!((import.shape(), import.len()), (&[4usize, 2][..], 8));
    assert_eq!(import.data_ptr() as usize, data as usize + 8);
    assert_eq!(fake.calls.load(Ordering::SeqCst), 0);
    drop(import);
    assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    // Null strides mean compact; extents of 1 may carry any stride; empty tensors need no data.
    let mut fake = Fake::f32s(data, &[3, 1, 2], None);
    drop(fake.import());
    let mut fake = Fake::f32s(data, &[3, 1, 2], Some(&[2, 99, 1]));
    drop(fake.import());
    let mut fake = Fake::f32s(std::ptr::null_mut(), &[0, 5], Some(&[5, 1]));
    assert!(fake.import().is_empty());
}

#[test]
fn strided_tensors_import_without_a_contiguous_view() {
    // Transposed, stepped, reversed (from the last element), broadcast: accepted as strided.
    let last = host_floats().cast::<f32>().wrapping_add(15).cast();
    for (data, strides) in
        [(host_floats(), [1i64, 4]), (host_floats(), [8, 2]), (last, [-4, -1]), (host_floats(), [0, 1])]
    {
        let mut fake = Fake::f32s(data, &[4, 4], Some(&strides));
        let mut import = fake.import();
        assert!(!import.is_compact(), "{strides:?}");
        assert_eq!((import.shape(), import.strides(), import.len()), (&[4usize, 4][..], &strides[..], 16));
        let expected = "a strided tensor has no contiguous view (read_bytes and write_bytes copy its elements)";
        assert_eq!(kind(&import.device_slice::<f32>(device0()).unwrap_err()), expected);
        assert_eq!(kind(&import.device_bytes(device0()).unwrap_err()), expected);
        assert_eq!(kind(&import.device_bytes_mut(device0()).unwrap_err()), expected);
        // The length is checked before any copy (no CUDA call here).
        let err = import.write_bytes(device0(), &[0; 8]).unwrap_err();
        assert_eq!(err.kind(), &crate::ErrorKind::LengthMismatch { src: 8, dst: 64 });
        drop(import);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }
    // Compact strides stay compact, with the producer's strides reported.
    let mut fake = Fake::f32s(host_floats(), &[4, 4], Some(&[4, 1]));
    let import = fake.import();
    assert!(import.is_compact());
    assert_eq!(import.device_slice::<f32>(device0()).unwrap().len(), 16);
}

#[test]
fn forged_strides_are_refused_and_released() {
    let outside = "strides and shape reach offsets beyond what int64 holds";
    for strides in [[i64::MAX, 1], [1, i64::MAX / 2], [i64::MIN, 1]] {
        assert_eq!(Fake::f32s(host_floats(), &[4, 4], Some(&strides)).refused(), outside, "{strides:?}");
    }
    // A negative stride from the first element reaches below address 0... of a low address.
    let low = std::ptr::without_provenance_mut::<c_void>(8);
    assert_eq!(Fake::f32s(low, &[4], Some(&[-1])).refused(), "strides and shape reach outside the address space");
    // A foreign tensor has no producer stream.
    let mut fake = Fake::f32s(host_floats(), &[4], None);
    assert!(fake.import().producer().is_none());
}

#[test]
fn malformed_shapes_are_refused() {
    assert_eq!(Fake::f32s(host_floats(), &[4, -1], None).refused(), "a negative extent in the shape");
    assert_eq!(Fake::f32s(host_floats(), &[i64::MAX, i64::MAX], None).refused(), "the shape's size overflows");
    // The element count fits, its bytes do not.
    assert_eq!(Fake::f32s(host_floats(), &[1 << 62], None).refused(), "the shape's size overflows");
    let mut fake = Fake::f32s(host_floats(), &[4], None);
    fake.managed.dl_tensor.ndim = -1;
    assert_eq!(fake.refused(), "a negative ndim");
    let mut fake = Fake::f32s(host_floats(), &[1; 65], None);
    assert_eq!(fake.managed.dl_tensor.ndim, 65);
    fake.managed.dl_tensor.ndim = 65;
    assert_eq!(fake.refused(), "more dimensions than cuda-mem accepts (64)");
    let mut fake = Fake::f32s(host_floats(), &[4], None);
    fake.managed.dl_tensor.shape = std::ptr::null_mut();
    assert_eq!(fake.refused(), "a null shape with ndim above 0");
}

#[test]
fn null_data_wrong_types_and_offsets_are_refused() {
    assert_eq!(Fake::f32s(std::ptr::null_mut(), &[4], None).refused(), "a null data pointer for a non-empty tensor");
    let vector = DLDataType { code: kDLFloat, bits: 32, lanes: 2 };
    assert_eq!(
        Fake::new(host_floats(), &[4], None, vector, CUDA0).refused(),
        "vector element types (lanes other than 1) are not supported"
    );
    let odd = DLDataType { code: kDLFloat, bits: 12, lanes: 1 };
    assert_eq!(Fake::new(host_floats(), &[4], None, odd, CUDA0).refused(), "an element type cuda-mem does not know");
    let mut fake = Fake::f32s(host_floats(), &[4], None);
    fake.managed.dl_tensor.byte_offset = u64::MAX;
    assert_eq!(fake.refused(), "a byte offset past the end of the address space");
}

#[test]
fn unsupported_major_versions_are_refused_and_released() {
    for major in [0, 2, 99] {
        let mut fake = Fake::f32s(host_floats(), &[4], None);
        fake.managed.version.major = major;
        assert_eq!(fake.refused(), "an unsupported DLPack major version");
    }
    // SAFETY: null is refused before any read.
    let err = unsafe { DlpackImport::from_raw(std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(kind(&err), "a null DLManagedTensorVersioned");
}

#[test]
fn views_check_device_type_ordinal_type_and_alignment() {
    let cpu = DLDevice { device_type: kDLCPU, device_id: 0 };
    let mut fake = Fake::new(host_floats(), &[4], None, DataType::F32.to_dl(), cpu);
    let import = fake.import();
    let err = import.device_slice::<f32>(device0()).unwrap_err();
    assert_eq!(kind(&err), "the tensor is not in CUDA device or managed memory");
    assert!(import.device_bytes(device0()).is_err());
    drop(import);
    let managed = DLDevice { device_type: kDLCUDAManaged, device_id: 0 };
    let mut fake = Fake::new(host_floats(), &[4], None, DataType::F32.to_dl(), managed);
    assert_eq!(fake.import().device_slice::<f32>(device0()).unwrap().len(), 4);
    let mut fake = Fake::f32s(host_floats(), &[4], None);
    fake.managed.dl_tensor.byte_offset = 2;
    let import = fake.import();
    let err = import.device_slice::<f32>(device0()).unwrap_err();
    assert_eq!(kind(&err), "the tensor's address is not aligned for its element type");
    assert_eq!(import.device_bytes(device0()).unwrap().len(), 16);
}

#[test]
fn legacy_tensors_import_and_release_once() {
    let calls = Box::new(AtomicUsize::new(0));
    unsafe extern "C" fn count_legacy(tensor: *mut DLManagedTensor) {
        // SAFETY: `manager_ctx` is the test's live counter.
        unsafe { (*(*tensor).manager_ctx.cast::<AtomicUsize>()).fetch_add(1, Ordering::SeqCst) };
    }
    let mut shape = [2i64, 2];
    let mut legacy = DLManagedTensor {
        dl_tensor: DLTensor {
            data: host_floats(),
            device: CUDA0,
            ndim: 2,
            dtype: DataType::F32.to_dl(),
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: (&raw const *calls).cast_mut().cast(),
        deleter: Some(count_legacy),
    };
    // SAFETY: a live legacy tensor; ownership passes to the import.
    let mut import = unsafe { DlpackImport::from_raw_legacy(&raw mut legacy) }.unwrap();
    assert!(!import.is_read_only());
    assert_eq!(import.device_slice_mut::<f32>(device0()).unwrap().len(), 4);
    drop(import);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The strides live in named arrays: a temporary array's pointer would dangle at the `;`.
    let (mut strided, mut overflowing) = ([1i64, 2], [i64::MAX, 2]);
    legacy.dl_tensor.strides = strided.as_mut_ptr();
    // SAFETY: as above.
    let import = unsafe { DlpackImport::from_raw_legacy(&raw mut legacy) }.unwrap();
    assert_eq!((import.strides(), import.is_compact()), (&[1i64, 2][..], false));
    drop(import);
    legacy.dl_tensor.strides = overflowing.as_mut_ptr();
    // SAFETY: as above.
    let err = unsafe { DlpackImport::from_raw_legacy(&raw mut legacy) }.unwrap_err();
    assert_eq!(kind(&err), "strides and shape reach offsets beyond what int64 holds");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn exports_and_imports_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<DlpackTensor<'static>>();
    send_sync::<DlpackImport>();
}
