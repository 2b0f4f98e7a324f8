//! Writes a synthetic LLM serving trace as an allocation log for the `replay` example: steps of
//! decode with prefill bursts, KV blocks of 16 KiB–64 MiB living 1–1000 steps, prefill
//! activations and per-step temporaries (the model is `cuda_mem_workloads::serving_trace::ServingTrace`).
//! Deterministic for a seed; needs no GPU.
//!
//! `serving_trace [--seed 1] [--steps 3000] [OUT]` (standard output without OUT); a summary goes
//! to standard error.

use cuda_mem_workloads::log::{ReplayEvent, write_log};
use cuda_mem_workloads::serving_trace::ServingTrace;
use std::io::Write;

const USAGE: &str = "usage: serving_trace [--seed N] [--steps N] [OUT]";

fn main() {
    if let Err(message) = run() {
        eprintln!("serving_trace: {message}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut model = ServingTrace::default();
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
    let events = model.events();
    let sink: Box<dyn Write> = match &out {
        Some(path) => Box::new(std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?),
        None => Box::new(std::io::stdout().lock()),
    };
    write_log(&events, "serving", std::io::BufWriter::new(sink)).map_err(|e| e.to_string())?;
    let (mut live, mut peak, mut allocations) = (0usize, 0usize, 0usize);
    for event in &events {
        match *event {
            ReplayEvent::Allocate { bytes, .. } => {
                allocations += 1;
                live += bytes;
                peak = peak.max(live);
            }
            ReplayEvent::Free { bytes, .. } => live -= bytes,
        }
    }
    eprintln!(
        "serving trace, seed {} and {} steps: {allocations} allocations, peak {peak} bytes requested{}",
        model.seed,
        model.steps,
        out.map_or(String::new(), |path| format!(", written to {path}"))
    );
    Ok(())
}
