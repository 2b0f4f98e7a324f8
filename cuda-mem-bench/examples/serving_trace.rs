//! Writes the corpus's LLM serving workload (`cuda_mem_workloads::serving::Serving`: 2 MiB KV
//! pages of requests living 50–800 steps, 24–96 MiB prefill buffers, per-step activations,
//! logits and scratch) as one thread's allocation log for the `replay` example: the threads' ops
//! in round-robin order, a free on another stream as a plain free, `empty_cache` left out
//! (`cuda_mem_workloads::log::events_of`). Deterministic for a seed; needs no GPU.
//!
//! `serving_trace [--seed 11] [--steps 3000] [OUT]` (standard output without OUT); a summary
//! goes to standard error.

use cuda_mem_workloads::log::{events_of, peak_live, write_log};
use cuda_mem_workloads::serving::Serving;
use std::io::Write;

const USAGE: &str = "usage: serving_trace [--seed N] [--steps N] [OUT]";

fn main() {
    if let Err(message) = run() {
        eprintln!("serving_trace: {message}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut model = Serving::default();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |flag: &str| -> Result<u64, String> {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value; {USAGE}"))?;
            value.parse().map_err(|_| format!("{flag} {value:?} is not a number; {USAGE}"))
        };
        match arg.as_str() {
            "--seed" => model.seed = number("--seed")?,
            "--steps" => model.steps = usize::try_from(number("--steps")?).map_err(|e| e.to_string())?,
            flag if flag.starts_with('-') => return Err(format!("unknown flag {flag}; {USAGE}")),
            path => out = Some(path.to_string()),
        }
    }
    let events = events_of(&model.workload());
    let sink: Box<dyn Write> = match &out {
        Some(path) => Box::new(std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?),
        None => Box::new(std::io::stdout().lock()),
    };
    write_log(&events, "serving", std::io::BufWriter::new(sink)).map_err(|e| e.to_string())?;
    eprintln!(
        "serving workload, seed {} and {} steps: {} events, peak {} bytes requested{}",
        model.seed,
        model.steps,
        events.len(),
        peak_live(&events),
        out.map_or(String::new(), |path| format!(", written to {path}"))
    );
    Ok(())
}
