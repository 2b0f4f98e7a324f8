//! Compiles the C++ shims: `shim/throw.cpp` (PyTorch's pluggable allocator does not check for a
//! null pointer, so a refused allocation must reach it as a C++ exception, as the native
//! allocator's out-of-memory error does, which only C++ can throw) and `shim/graphs.cpp` (the
//! filter PyTorch passes to the CUDA graph hook is a `std::function`, copied, called and deleted
//! in C++).

fn main() {
    println!("cargo:rerun-if-changed=shim/throw.cpp");
    println!("cargo:rerun-if-changed=shim/graphs.cpp");
    cc::Build::new()
        .cpp(true)
        .file("shim/throw.cpp")
        .file("shim/graphs.cpp")
        .flag_if_supported("-std=c++17")
        .compile("cuda_mem_torch_shim");
}
