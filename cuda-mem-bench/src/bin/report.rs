//! `report`: joins raw_reference's rows with criterion's samples; see `report --help`.

use cuda_mem_bench::cli;

fn main() {
    match cli::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => match cli::run(&options) {
            Ok(path) => println!("report written to {}", path.display()),
            Err(e) => {
                eprintln!("report: {e}");
                std::process::exit(1);
            }
        },
        Ok(None) => println!("{}", cli::USAGE),
        Err(e) => {
            eprintln!("report: {e}\n\n{}", cli::USAGE);
            std::process::exit(2);
        }
    }
}
