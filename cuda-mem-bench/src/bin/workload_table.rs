//! Prints the workload corpus's tables from a folder of raw results (see
//! `cuda_mem_bench::workload_table`): `workload_table DIR`.

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: workload_table DIR (cuda_mem.jsonl, rmm.jsonl, torch*.jsonl, training.jsonl)");
        std::process::exit(2);
    };
    print!("{}", cuda_mem_bench::workload_table::tables_of(std::path::Path::new(&dir)));
}
