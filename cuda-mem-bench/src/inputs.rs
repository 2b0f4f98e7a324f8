//! Reading the two inputs: the C++ program's JSON lines and criterion's saved samples.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The machine, from the C++ program's first line (`"key":"env"`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Env {
    /// Device name, e.g. "NVIDIA H200".
    pub device: String,
    /// Driver's CUDA version, e.g. "13.0".
    pub driver: String,
    /// Runtime version the program was linked with, e.g. "13.0".
    pub runtime: String,
    /// Compute capability, e.g. "9.0".
    pub cc: String,
    /// Every field of the line, for results.json.
    pub fields: serde_json::Map<String, Value>,
}

/// One row of the C++ program.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRow {
    /// Median figure (µs, GB/s) or 1/0 for claims.
    pub value: f64,
    /// "us", "GB/s" or "ok".
    pub unit: String,
    /// What was measured, or the error name for claims.
    pub detail: String,
    /// Operations per sample, when the program says.
    pub k: Option<u32>,
    /// Samples, when the program says.
    pub samples: Option<u32>,
    /// What a claim row called (claims only).
    pub what: Option<String>,
}

/// Everything the C++ program printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawRun {
    /// The environment line, if present.
    pub env: Option<Env>,
    /// Rows by key.
    pub rows: BTreeMap<String, RawRow>,
}

fn text_field(object: &serde_json::Map<String, Value>, name: &str) -> String {
    match object.get(name) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

fn count_field(object: &serde_json::Map<String, Value>, name: &str) -> Option<u32> {
    object.get(name)?.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// Parses the C++ program's output: one JSON object per line, blank lines ignored.
pub fn parse_raw(text: &str) -> Result<RawRun, String> {
    let mut run = RawRun::default();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("line {}: not JSON ({e}): {line}", index + 1))?;
        let Value::Object(object) = value else {
            return Err(format!("line {}: not a JSON object: {line}", index + 1));
        };
        let key = object
            .get("key")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("line {}: no \"key\": {line}", index + 1))?
            .to_string();
        if key == "env" {
            run.env = Some(Env {
                device: text_field(&object, "device"),
                driver: text_field(&object, "driver"),
                runtime: text_field(&object, "runtime"),
                cc: text_field(&object, "cc"),
                fields: object,
            });
            continue;
        }
        let value = object
            .get("value")
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("line {}: row {key} has no numeric \"value\"", index + 1))?;
        let row = RawRow {
            value,
            unit: text_field(&object, "unit"),
            detail: text_field(&object, "detail"),
            k: count_field(&object, "k"),
            samples: count_field(&object, "samples"),
            what: object.get("what").and_then(Value::as_str).map(str::to_string),
        };
        if run.rows.insert(key.clone(), row).is_some() {
            return Err(format!("line {}: row {key} appears twice", index + 1));
        }
    }
    Ok(run)
}

/// Criterion's saved samples of one benchmark (`new/sample.json`): `iters[i]` iterations took
/// `times[i]` nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    /// Iterations per sample (one iteration is one batch of K operations).
    pub iters: Vec<f64>,
    /// Nanoseconds per sample.
    pub times: Vec<f64>,
}

/// Parses criterion's `sample.json` (`{"sampling_mode":..,"iters":[..],"times":[..]}`).
pub fn parse_samples(text: &str) -> Result<Samples, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let numbers = |name: &str| -> Result<Vec<f64>, String> {
        value
            .get(name)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("no \"{name}\" array"))?
            .iter()
            .map(|v| v.as_f64().ok_or_else(|| format!("\"{name}\" holds a non-number: {v}")))
            .collect()
    };
    let samples = Samples { iters: numbers("iters")?, times: numbers("times")? };
    if samples.iters.len() != samples.times.len() || samples.iters.is_empty() {
        return Err(format!("{} iteration counts for {} times", samples.iters.len(), samples.times.len()));
    }
    if samples.iters.iter().any(|&n| n.is_nan() || n < 1.0) {
        return Err("an iteration count below 1".into());
    }
    Ok(samples)
}

/// Where criterion keeps a benchmark's latest samples: `<dir>/<group>/<function>/new/sample.json`
/// (criterion 0.7, `BenchmarkId::as_directory_name`; group and key contain no characters that
/// criterion would replace).
pub fn sample_path(criterion_dir: &Path, group: &str, key: &str) -> PathBuf {
    criterion_dir.join(group).join(key).join("new").join("sample.json")
}

/// The samples of one benchmark, `Ok(None)` if it was not run.
pub fn read_samples(criterion_dir: &Path, group: &str, key: &str) -> Result<Option<Samples>, String> {
    let path = sample_path(criterion_dir, group, key);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_samples(&text).map(Some).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: &str = r#"{"key":"env","device":"NVIDIA H200","driver":"13.0","runtime":"13.0","cc":"9.0","sms":132}

{"key":"malloc_4k","value":61.5,"unit":"us","detail":"cudaMalloc + cudaFree","k":200,"samples":30}
{"key":"claim_cross_stream_free","value":1,"unit":"ok","detail":"cudaSuccess","what":"free on B"}
"#;

    #[test]
    fn raw_lines_parse_with_env_rows_and_claims() {
        let run = parse_raw(RAW).unwrap();
        let env = run.env.as_ref().unwrap();
        assert_eq!((env.device.as_str(), env.driver.as_str(), env.cc.as_str()), ("NVIDIA H200", "13.0", "9.0"));
        assert_eq!(env.fields["sms"], 132);
        let malloc = &run.rows["malloc_4k"];
        assert_eq!((malloc.value, malloc.unit.as_str(), malloc.k, malloc.samples), (61.5, "us", Some(200), Some(30)));
        let claim = &run.rows["claim_cross_stream_free"];
        assert_eq!(
            (claim.value, claim.detail.as_str(), claim.what.as_deref()),
            (1.0, "cudaSuccess", Some("free on B"))
        );
    }

    #[test]
    fn raw_errors_name_the_line() {
        assert!(parse_raw("{\"key\":\"a\",\"value\":1}\nnot json").unwrap_err().starts_with("line 2"));
        assert!(parse_raw("{\"value\":1}").unwrap_err().contains("no \"key\""));
        assert!(parse_raw("{\"key\":\"a\",\"value\":\"x\"}").unwrap_err().contains("numeric"));
        assert!(parse_raw("{\"key\":\"a\",\"value\":1}\n{\"key\":\"a\",\"value\":2}").unwrap_err().contains("twice"));
    }

    #[test]
    fn criterion_samples_parse_and_validate() {
        let s = parse_samples(r#"{"sampling_mode":"Flat","iters":[1.0,1.0],"times":[2000.0,3000.0]}"#).unwrap();
        assert_eq!(s, Samples { iters: vec![1.0, 1.0], times: vec![2000.0, 3000.0] });
        assert!(parse_samples(r#"{"iters":[1.0],"times":[]}"#).is_err());
        assert!(parse_samples(r#"{"iters":[0.0],"times":[1.0]}"#).is_err());
        assert!(parse_samples(r#"{"times":[1.0]}"#).is_err());
    }

    #[test]
    fn samples_are_read_from_criterions_layout() {
        let dir = std::env::temp_dir().join(format!("cuda-mem-bench-inputs-{}", std::process::id()));
        let path = sample_path(&dir, "alloc", "malloc_4k");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, r#"{"sampling_mode":"Flat","iters":[1.0],"times":[5.0]}"#).unwrap();
        assert_eq!(path, dir.join("alloc/malloc_4k/new/sample.json"));
        assert!(read_samples(&dir, "alloc", "malloc_4k").unwrap().is_some());
        assert!(read_samples(&dir, "alloc", "malloc_1m").unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
