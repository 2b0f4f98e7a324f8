//! Prints the workload corpus's tables from a folder of raw results (see
//! `cuda_mem_bench::workload_table`), or writes them into a document between its markers:
//! `workload_table DIR [--doc FILE [TAG]]` (TAG names the markers, `workload-table TAG: begin`).

use cuda_mem_bench::workload_table::{tables_of, with_tables};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first() else {
        eprintln!(
            "usage: workload_table DIR [--doc FILE [TAG]] (DIR: cuda_mem.jsonl, rmm.jsonl, torch*.jsonl, training.jsonl)"
        );
        std::process::exit(2);
    };
    let tables = tables_of(std::path::Path::new(dir));
    match args.get(1).map(String::as_str) {
        None => print!("{tables}"),
        Some("--doc") if (3..=4).contains(&args.len()) => {
            let tag = args.get(3).map_or("", String::as_str);
            let doc = std::fs::read_to_string(&args[2]).unwrap_or_else(|e| fail(&format!("read {}: {e}", args[2])));
            let doc = with_tables(&doc, tag, &tables)
                .unwrap_or_else(|| fail(&format!("{}: no workload-table markers tagged {tag:?}", args[2])));
            std::fs::write(&args[2], doc).unwrap_or_else(|e| fail(&format!("write {}: {e}", args[2])));
        }
        Some(other) => fail(&format!("unknown argument {other}")),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("workload_table: {message}");
    std::process::exit(2);
}
