//! Writes every workload of [`cuda_mem_workloads::corpus`] as `NAME.cmwl` into the folder given
//! as the argument (made if missing), for the peers' replayers (`cuda-mem-bench/workloads/`), and
//! prints one line per workload: name, lanes, ops, allocations and the round-robin peak of live
//! bytes ([`cuda_mem_workloads::Shape::peak_live_round_robin`]), which those replayers compute
//! from the file too.
//!
//! ```sh
//! cargo run --release -p cuda-mem-workloads --example write_corpus -- OUT_DIR
//! ```

use cuda_mem_workloads::{corpus, format};
use std::io::{BufWriter, Write};
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: write_corpus OUT_DIR");
        std::process::exit(2);
    };
    std::fs::create_dir_all(&dir)?;
    for workload in corpus() {
        let shape = workload.shape();
        let path = dir.join(format!("{}.cmwl", workload.name));
        let mut out = BufWriter::new(std::fs::File::create(&path)?);
        format::write(&workload, &mut out)?;
        out.flush()?;
        println!(
            "{} lanes={} ops={} allocations={} peak_live_round_robin={}",
            workload.name,
            workload.lanes.len(),
            workload.ops(),
            shape.allocations,
            shape.peak_live_round_robin
        );
    }
    Ok(())
}
