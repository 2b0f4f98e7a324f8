//! Mirrors the CUDA major version that cuda-mem-sys selected (CUDA 13 changed the signatures of
//! cudaMemAdvise and cudaMemPrefetchAsync) as `cfg(cuda_major = "..")`.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cuda_major, values(\"12\", \"13\"))");
    println!("cargo:rerun-if-env-changed=DEP_CUDART_VERSION");
    let version: u32 = std::env::var("DEP_CUDART_VERSION").ok().and_then(|v| v.parse().ok()).unwrap_or(13000);
    println!("cargo:rustc-cfg=cuda_major=\"{}\"", version / 1000);
}
