//! Loading NCCL at run time: where libnccl is missing (CI, this crate's build machines) every
//! entry point is a typed error that says what was tried and what to install; where it is
//! present (the GPU hosts) its version is read. Runs everywhere, without a GPU.

use cuda_mem::ErrorKind;
use cuda_mem_nccl::{Communicator, LIBRARY_ENV, NcclStatus, UniqueId, is_unavailable};

#[test]
fn nccl_loads_or_its_absence_is_a_typed_error_with_a_remedy() {
    match cuda_mem_nccl::version() {
        Ok(((major, minor, patch), file)) => {
            assert!(major >= 2 && !file.is_empty(), "NCCL {major}.{minor}.{patch} from {file}");
            println!("NCCL {major}.{minor}.{patch} from {file}");
        }
        Err(err) => {
            assert!(is_unavailable(&err), "{err}");
            assert_eq!(NcclStatus::of(&err), None);
            let ErrorKind::Library { name, code, message } = err.kind() else { panic!("{err}") };
            assert_eq!((*name, *code), ("NCCL", None));
            assert!(message.contains("could not be loaded") && message.contains(LIBRARY_ENV), "{message}");
            if std::env::var_os(LIBRARY_ENV).is_none() {
                assert!(message.starts_with("libnccl.so.2 or libnccl.so could not be loaded"), "{message}");
            }
            // Every entry point says the same, typed.
            let again = UniqueId::new().unwrap_err();
            assert!(is_unavailable(&again) && again.to_string().contains(message.as_str()), "{again}");
            assert!(!Communicator::can_register());
        }
    }
}
