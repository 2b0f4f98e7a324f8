//! `CUDA_MEM_TORCH_ALLOC_CONF`: the allocator's settings from the environment, in the spirit of
//! `PYTORCH_CUDA_ALLOC_CONF` (`key:value` pairs separated by commas), read when a device's
//! allocator is made. Every key sets one field of [`Config`] or the backend:
//!
//! | key | value | meaning |
//! |---|---|---|
//! | `backend` | `cache` (default), `pool` | cuda-mem's device cache, or a retaining `MemPool` |
//! | `front_depth` | integer ≤ 65535 | blocks up to 1 MiB each thread keeps per stream and size class (0: none; each thread's one large-block slot stays) |
//! | `front_max_mb` | integer | MiB each thread's front cache may hold |
//! | `large_fit_slack_mb` | integer | MiB a free block larger than a shared segment may leave when it serves a smaller request |
//! | `expandable_segments` | `True`/`False` | grow by mapping pages of one address range per stream (default `True`; as PyTorch's key) |
//! | `release_idle_on_miss` | `True`/`False` | unmap free pages (or release idle segments) before growing past the reserve's peak |
//! | `live_slack_percent` | integer ≤ 100 | with pages, map without unmapping while the reserve stays this many percent above the allocated bytes (default 4) |
//! | `cross_stream_waits` | `True`/`False` | a stream may wait on the device for another stream's idle segment |
//! | `map_ahead_mb` | integer | with pages, MiB a large miss maps beyond its request while the reserve is at least that far below its peak (after `empty_cache`), never closer to the peak than that (default 64; 0: none) |
//! | `own_range_mb` | integer | with pages, requests of this many MiB and more get address ranges of their own, apart from smaller ones (default 0: off) |
//! | `lowest_for_whole_pages` | `True`/`False` | with pages, requests of whole pages above 1 MiB take the free block at the lowest address that fits rather than the smallest (default `False`) |
//! | `max_mapping_mb` | integer | with pages, the largest physical allocation a miss creates; misses of a quarter of it and more create allocations up to it, smaller ones a page each (default 64; 0: a page each, the tightest reserve at the most driver calls) |
//!
//! A bad key or value is refused with a message naming it; nothing is half-applied.

use crate::BackendChoice;
use cuda_mem::caching::Config;
use cuda_mem::{CudaError, ErrorKind, Result};

/// The environment variable.
pub const VARIABLE: &str = "CUDA_MEM_TORCH_ALLOC_CONF";

/// Settings parsed from the variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocConf {
    /// The backend, where the variable names one.
    pub backend: Option<BackendChoice>,
    pub config: Config,
}

impl AllocConf {
    /// The settings the environment asks for (the defaults when the variable is unset).
    pub fn from_env() -> Result<Self> {
        match std::env::var(VARIABLE) {
            Ok(text) => Self::parse(&text),
            Err(std::env::VarError::NotPresent) => Ok(Self { backend: None, config: Config::default() }),
            Err(std::env::VarError::NotUnicode(_)) => Err(refused("the value is not UTF-8".into())),
        }
    }

    /// Parses `key:value,key:value`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut conf = Self { backend: None, config: Config::default() };
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once(':') else {
                return Err(refused(format!("{item:?} is not key:value")));
            };
            let (key, value) = (key.trim(), value.trim());
            let c = &mut conf.config;
            match key {
                "backend" => {
                    let choice = BackendChoice::from_name(value)
                        .ok_or_else(|| refused(format!("backend {value:?}: expected \"cache\" or \"pool\"")))?;
                    conf.backend = Some(choice);
                }
                "front_depth" => c.front_depth = integer(key, value)?,
                "front_max_mb" => c.front_max_bytes = mib(key, value)?,
                "large_fit_slack_mb" => c.large_fit_slack = mib(key, value)?,
                "expandable_segments" => c.expandable_segments = boolean(key, value)?,
                "release_idle_on_miss" => c.release_idle_on_miss = boolean(key, value)?,
                "live_slack_percent" => c.live_slack_percent = integer(key, value)?,
                "cross_stream_waits" => c.cross_stream_waits = boolean(key, value)?,
                "map_ahead_mb" => c.map_ahead_bytes = mib(key, value)?,
                "own_range_mb" => c.own_range_from = mib(key, value)?,
                "max_mapping_mb" => c.max_mapping_bytes = mib(key, value)?,
                "lowest_for_whole_pages" => c.lowest_for_whole_pages = boolean(key, value)?,
                _ => return Err(refused(format!("unknown key {key:?}"))),
            }
        }
        conf.config.check().map_err(|why| refused(why.into()))?;
        Ok(conf)
    }
}

fn refused(why: String) -> CudaError {
    CudaError::new(ErrorKind::InvalidArgument("a bad CUDA_MEM_TORCH_ALLOC_CONF"), format!("{VARIABLE}: {why}"))
}

fn integer(key: &str, value: &str) -> Result<usize> {
    value.parse().map_err(|_| refused(format!("{key}:{value}: expected a non-negative integer")))
}

fn mib(key: &str, value: &str) -> Result<usize> {
    integer(key, value)?.checked_mul(1 << 20).ok_or_else(|| refused(format!("{key}:{value}: too large")))
}

fn boolean(key: &str, value: &str) -> Result<bool> {
    match value {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(refused(format!("{key}:{value}: expected True or False"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_set_their_fields() {
        let conf = AllocConf::parse(
            "backend:pool, front_depth:2,front_max_mb:64,large_fit_slack_mb:8,release_idle_on_miss:False,cross_stream_waits:0,expandable_segments:False,live_slack_percent:10,map_ahead_mb:0,own_range_mb:16,max_mapping_mb:0,lowest_for_whole_pages:True",
        )
        .unwrap();
        assert_eq!(conf.backend, Some(BackendChoice::Pool));
        let c = conf.config;
        assert_eq!((c.front_depth, c.front_max_bytes, c.large_fit_slack), (2, 64 << 20, 8 << 20));
        assert!(!c.release_idle_on_miss && !c.cross_stream_waits && !c.expandable_segments);
        assert_eq!((c.live_slack_percent, c.map_ahead_bytes, c.own_range_from), (10, 0, 16 << 20));
        assert_eq!(c.max_mapping_bytes, 0);
        assert!(c.lowest_for_whole_pages);
        let c = AllocConf::parse("max_mapping_mb:256").unwrap().config;
        assert_eq!(c.max_mapping_bytes, 256 << 20);
        assert_eq!(AllocConf::parse("").unwrap(), AllocConf { backend: None, config: Config::default() });
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        for (text, names) in [
            ("front_depth:-1", "front_depth:-1"),
            ("front_depth:70000", "front_depth above 65535"),
            ("backend:fast", "backend \"fast\""),
            ("max_split_size_mb:128", "unknown key \"max_split_size_mb\""),
            ("release_idle_on_miss:maybe", "expected True or False"),
            ("front_depth", "not key:value"),
            ("live_slack_percent:101", "live_slack_percent above 100"),
            ("front_max_mb:99999999999999999", "too large"),
            ("map_ahead_mb:-64", "map_ahead_mb:-64: expected a non-negative integer"),
            ("max_mapping_mb:64MiB", "max_mapping_mb:64MiB: expected a non-negative integer"),
        ] {
            let err = AllocConf::parse(text).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::InvalidArgument(_)), "{text}: {err}");
            assert!(err.to_string().contains(names), "{text}: {err}");
            assert!(err.to_string().contains(VARIABLE), "{err}");
        }
    }
}
