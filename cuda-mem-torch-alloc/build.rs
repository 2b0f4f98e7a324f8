//! Compiles `shim/throw.cpp`: PyTorch's pluggable allocator does not check for a null pointer,
//! so a refused allocation must reach it as a C++ exception (as the native allocator's
//! out-of-memory error does), which only C++ can throw.

fn main() {
    println!("cargo:rerun-if-changed=shim/throw.cpp");
    cc::Build::new().cpp(true).file("shim/throw.cpp").flag_if_supported("-std=c++17").compile("cuda_mem_torch_throw");
}
