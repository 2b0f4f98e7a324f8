//! `bench_report --raw DIR --out DIR [--date YYYY-MM-DD]`: the main job's report from the
//! section folders `./run --bench DIR` wrote (see `cuda_mem_bench::suite`).

use cuda_mem_bench::suite;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let (Some(raw), Some(out)) = (value("--raw"), value("--out")) else {
        eprintln!("usage: bench_report --raw DIR --out DIR [--date YYYY-MM-DD] (DIR: the folder ./run --bench wrote)");
        std::process::exit(2);
    };
    let date = value("--date").unwrap_or_else(|| "undated".into());
    let report = suite::collect(std::path::Path::new(&raw), &date);
    if report.ran.is_empty() {
        eprintln!("bench_report: {raw} holds no section folder ({})", suite::SECTIONS.join(", "));
        std::process::exit(1);
    }
    match report.write(std::path::Path::new(&out)) {
        Ok(files) => {
            let measured = report.rows.iter().filter(|r| r.status == "measured").count();
            println!("{} rows ({measured} with cuda-mem and peer measured) in {}", report.rows.len(), out);
            for f in files {
                println!("  {}", f.display());
            }
        }
        Err(e) => {
            eprintln!("bench_report: write {out}: {e}");
            std::process::exit(1);
        }
    }
}
