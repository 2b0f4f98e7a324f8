//! Reading the inputs: the C++ program's JSON lines and criterion's saved samples.

use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// One row of the C++ program: its figure, unit ("us", "GB/s") and what it measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRow {
    pub value: f64,
    pub unit: String,
    pub detail: String,
}

/// Everything the C++ program printed: the machine (every field of the `"key":"env"` line) and
/// the rows by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawRun {
    pub env: Option<Map<String, Value>>,
    pub rows: BTreeMap<String, RawRow>,
}

/// Reads a whole file; the error names it.
pub fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Parses the C++ program's output: one JSON object per line, blank lines ignored.
pub fn parse_raw(text: &str) -> Result<RawRun, String> {
    let mut run = RawRun::default();
    for (index, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = |what: &str| format!("line {}: {what}: {line}", index + 1);
        let Ok(Value::Object(object)) = serde_json::from_str(line) else { return Err(at("not a JSON object")) };
        let key = object.get("key").and_then(Value::as_str).ok_or_else(|| at("no \"key\""))?.to_string();
        if key == "env" {
            run.env = Some(object);
            continue;
        }
        let text = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
        let row = RawRow {
            value: object.get("value").and_then(Value::as_f64).ok_or_else(|| at("no numeric \"value\""))?,
            unit: text("unit"),
            detail: text("detail"),
        };
        if run.rows.insert(key, row).is_some() {
            return Err(at("a key seen twice"));
        }
    }
    Ok(run)
}

/// One benchmark's samples from criterion's `sample.json` (`{"iters":[..],"times":[..]}`):
/// iterations (batches of K operations) and nanoseconds per sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    pub iters: Vec<f64>,
    pub times: Vec<f64>,
}

/// Parses criterion's `sample.json`.
pub fn parse_samples(text: &str) -> Result<Samples, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let numbers = |name: &str| -> Option<Vec<f64>> { value.get(name)?.as_array()?.iter().map(Value::as_f64).collect() };
    let (Some(iters), Some(times)) = (numbers("iters"), numbers("times")) else {
        return Err("no \"iters\" and \"times\" arrays of numbers".into());
    };
    if iters.len() != times.len() || iters.is_empty() || iters.iter().any(|&n| n.is_nan() || n < 1.0) {
        return Err(format!("{} iteration counts (each at least 1) for {} times", iters.len(), times.len()));
    }
    Ok(Samples { iters, times })
}

/// Every benchmark's latest samples in criterion's folder, by `<group>/<function id>`: criterion
/// 0.7 keeps them at `<dir>/<group>/<function>/new/sample.json`. A missing folder holds none.
pub fn read_criterion(dir: &Path) -> Result<BTreeMap<String, Samples>, String> {
    let list = |dir: &Path| match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.map(|e| e.path())).collect::<Result<Vec<_>, _>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    };
    let mut found = BTreeMap::new();
    for group in list(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        for bench in list(&group).unwrap_or_default() {
            let path = bench.join("new/sample.json");
            if path.is_file() {
                let samples = parse_samples(&read(&path)?).map_err(|e| format!("{}: {e}", path.display()))?;
                let name = |p: &Path| p.file_name().unwrap_or_default().to_string_lossy().into_owned();
                found.insert(format!("{}/{}", name(&group), name(&bench)), samples);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_errors_name_the_line() {
        // The committed report's test (crate::cli) parses a whole run.
        assert!(parse_raw("{\"key\":\"a\",\"value\":1}\nnot json").unwrap_err().starts_with("line 2"));
        assert!(parse_raw("{\"value\":1}").unwrap_err().contains("no \"key\""));
        assert!(parse_raw("{\"key\":\"a\",\"value\":\"x\"}").unwrap_err().contains("numeric"));
        assert!(parse_raw("{\"key\":\"a\",\"value\":1}\n{\"key\":\"a\",\"value\":2}").unwrap_err().contains("twice"));
    }

    #[test]
    fn criterion_samples_parse_validate_and_are_found_by_group_and_key() {
        assert!(parse_samples(r#"{"iters":[1.0],"times":[]}"#).is_err());
        assert!(parse_samples(r#"{"iters":[0.0],"times":[1.0]}"#).is_err());
        assert!(parse_samples(r#"{"times":[1.0]}"#).is_err());
        let dir = std::env::temp_dir().join(format!("cuda-mem-bench-inputs-{}", std::process::id()));
        assert!(read_criterion(&dir).unwrap().is_empty());
        std::fs::create_dir_all(dir.join("alloc/malloc_4k/new")).unwrap();
        std::fs::create_dir_all(dir.join("alloc/report")).unwrap();
        let sample = r#"{"sampling_mode":"Flat","iters":[1.0,1.0],"times":[2000.0,3000.0]}"#;
        std::fs::write(dir.join("alloc/malloc_4k/new/sample.json"), sample).unwrap();
        let found = read_criterion(&dir).unwrap();
        assert_eq!(found.keys().collect::<Vec<_>>(), ["alloc/malloc_4k"]);
        assert_eq!(found["alloc/malloc_4k"], Samples { iters: vec![1.0, 1.0], times: vec![2000.0, 3000.0] });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
