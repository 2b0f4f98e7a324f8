//! Verdicts on the claims of the source document (docs/reference/yardsticks.md, "Claims in the
//! source document"), from this run's raw CUDA figures: the claims are about CUDA, not about
//! cuda-mem.

use crate::inputs::RawRun;
use std::fmt;

/// What the run says about a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The measurement contradicts the claim.
    False,
    /// True only under conditions the claim leaves out.
    Misleading,
    /// The measurement agrees with the claim.
    Holds,
    /// The claimed effect did not show on this host (the claim itself says "up to").
    NotObservedHere,
    /// The behaviour is not documented; the documented remedy is what was measured.
    Undocumented,
    /// The call under test failed, but not in the way the claim predicts.
    Inconclusive,
    /// A fact of the API, not a measurement.
    ApiFact,
    /// The rows needed were not in this run.
    NotMeasured,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::False => "false",
            Verdict::Misleading => "misleading",
            Verdict::Holds => "holds in this run",
            Verdict::NotObservedHere => "no gain on this host",
            Verdict::Undocumented => "not documented behaviour",
            Verdict::Inconclusive => "inconclusive",
            Verdict::ApiFact => "wrong (API fact)",
            Verdict::NotMeasured => "not measured in this run",
        })
    }
}

/// One claim and what this run says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimCheck {
    /// The claim, quoted or paraphrased from the source document.
    pub claim: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// The measured figures (or the API fact) behind the verdict.
    pub evidence: String,
}

const SIZES: [&str; 3] = ["4k", "1m", "64m"];

fn value(raw: &RawRun, key: &str) -> Option<f64> {
    raw.rows.get(key).map(|r| r.value)
}

/// Checks every claim against the raw rows of this run.
pub fn check(raw: &RawRun) -> Vec<ClaimCheck> {
    vec![
        async_order_of_magnitude(raw),
        pool_alignment(raw),
        cross_stream_free(raw),
        pinned_other_thread(raw),
        write_combined(raw),
        managed_pages(raw),
        ClaimCheck {
            claim: "Its code frees cudaHostAlloc memory with `cudaHostFree`",
            verdict: Verdict::ApiFact,
            evidence: "`cudaHostFree` does not exist in the CUDA runtime: memory from cudaHostAlloc / cudaMallocHost \
                       is released with `cudaFreeHost` (what cuda-mem's PinnedBuffer calls on drop, and what every \
                       pinned row of this run used)"
                .into(),
        },
        cpu_device_id(raw),
    ]
}

fn async_order_of_magnitude(raw: &RawRun) -> ClaimCheck {
    let claim = "\"cudaMallocAsync is an order of magnitude faster than cudaMalloc\"";
    let mut retain = Vec::new();
    let mut default = Vec::new();
    for size in SIZES {
        let malloc = value(raw, &format!("malloc_{size}"));
        let nosync = value(raw, &format!("async_retain_nosync_{size}"));
        let synced = value(raw, &format!("async_default_sync_{size}"));
        let (Some(malloc), Some(nosync), Some(synced)) = (malloc, nosync, synced) else {
            return ClaimCheck {
                claim,
                verdict: Verdict::NotMeasured,
                evidence: format!("needs malloc_{size}, async_retain_nosync_{size} and async_default_sync_{size}"),
            };
        };
        retain.push((size, malloc, nosync, malloc / nosync));
        default.push((size, synced, malloc / synced));
    }
    let all_retain = retain.iter().all(|r| r.3 >= 10.0);
    let any_retain = retain.iter().any(|r| r.3 >= 10.0);
    let all_default = default.iter().all(|d| d.2 >= 10.0);
    let verdict = match (all_retain && all_default, any_retain) {
        (true, _) => Verdict::Holds,
        (false, true) => Verdict::Misleading,
        (false, false) => Verdict::False,
    };
    let retain_text: Vec<String> = retain
        .iter()
        .map(|(size, malloc, nosync, x)| {
            format!("{size}: {} µs vs cudaMalloc {} µs ({})", num(*nosync), num(*malloc), times(*x))
        })
        .collect();
    let default_text: Vec<String> =
        default.iter().map(|(size, synced, x)| format!("{size}: {} µs ({})", num(*synced), times(*x))).collect();
    let lead = match verdict {
        Verdict::Misleading => "Only with a pool that retains its memory. ",
        _ => "",
    };
    ClaimCheck {
        claim,
        verdict,
        evidence: format!(
            "{lead}Pair with release threshold UINT64_MAX, no sync: {}. With the default threshold 0 and a sync \
             per pair: {} (speed-up over cudaMalloc in parentheses)",
            retain_text.join("; "),
            default_text.join("; ")
        ),
    }
}

fn claim_row(raw: &RawRun, key: &str) -> Option<(bool, String)> {
    raw.rows.get(key).map(|r| (r.value == 1.0, r.detail.clone()))
}

fn pool_alignment(raw: &RawRun) -> ClaimCheck {
    let claim = "\"Pools must be 32 MB aligned in size and start address or cudaErrorInvalidValue\"";
    let pairs = match (value(raw, "pool_odd_16441"), value(raw, "pool_odd_67121209")) {
        (Some(a), Some(b)) => format!("; alloc+free pairs of those sizes cost {} µs and {} µs", num(a), num(b)),
        _ => String::new(),
    };
    match claim_row(raw, "claim_pool_odd_sizes") {
        None => ClaimCheck { claim, verdict: Verdict::NotMeasured, evidence: "claim_pool_odd_sizes not run".into() },
        Some((true, detail)) => ClaimCheck {
            claim,
            verdict: Verdict::False,
            evidence: format!(
                "cudaMallocFromPoolAsync of 16441 B and 67121209 B from a created pool returned {detail}{pairs}; \
                 32 MiB is the pool's growth step, not a requirement"
            ),
        },
        Some((false, detail)) => ClaimCheck {
            claim,
            verdict: if detail == "cudaErrorInvalidValue" { Verdict::Holds } else { Verdict::Inconclusive },
            evidence: format!("cudaMallocFromPoolAsync of an odd size returned {detail}{pairs}"),
        },
    }
}

fn cross_stream_free(raw: &RawRun) -> ClaimCheck {
    let claim = "\"Freeing on another stream causes a segfault\"";
    match claim_row(raw, "claim_cross_stream_free") {
        None => ClaimCheck { claim, verdict: Verdict::NotMeasured, evidence: "claim_cross_stream_free not run".into() },
        Some((true, detail)) => ClaimCheck {
            claim,
            verdict: Verdict::False,
            evidence: format!(
                "cudaMallocAsync on stream A, cudaEventRecord on A, cudaStreamWaitEvent(B), cudaFreeAsync on B: \
                 {detail}, and the process went on. Cross-stream free is legal when ordered; unordered use is \
                 undefined behaviour, not a guaranteed crash"
            ),
        },
        Some((false, detail)) => ClaimCheck {
            claim,
            verdict: Verdict::Inconclusive,
            evidence: format!("the ordered cross-stream free returned {detail} (an error code, not a segfault)"),
        },
    }
}

fn pinned_other_thread(raw: &RawRun) -> ClaimCheck {
    let claim = "\"Pinned memory is only accessible by the CPU thread that allocated it\"";
    match claim_row(raw, "claim_pinned_other_thread") {
        None => {
            ClaimCheck { claim, verdict: Verdict::NotMeasured, evidence: "claim_pinned_other_thread not run".into() }
        }
        Some((true, detail)) => ClaimCheck {
            claim,
            verdict: Verdict::False,
            evidence: format!(
                "cudaMallocHost in one thread, cudaMemcpy from it in another thread: {detail}. The limit concerns \
                 devices/contexts, which cudaHostAllocPortable lifts"
            ),
        },
        Some((false, detail)) => ClaimCheck {
            claim,
            verdict: Verdict::Inconclusive,
            evidence: format!("the copy from another thread returned {detail}"),
        },
    }
}

fn write_combined(raw: &RawRun) -> ClaimCheck {
    let claim = "\"Write-combined memory gives up to 40% faster transfers\"";
    let gains: Option<Vec<(&str, f64, f64)>> = [("H2D", "h2d"), ("D2H", "d2h")]
        .into_iter()
        .map(|(label, dir)| Some((label, value(raw, &format!("{dir}_wc"))?, value(raw, &format!("{dir}_pinned"))?)))
        .collect();
    let Some(gains) = gains else {
        return ClaimCheck { claim, verdict: Verdict::NotMeasured, evidence: "needs h2d/d2h _wc and _pinned".into() };
    };
    let best = gains.iter().map(|(_, wc, pinned)| wc / pinned - 1.0).fold(f64::NEG_INFINITY, f64::max);
    let verdict = if best >= 0.40 {
        Verdict::Holds
    } else if best > 0.05 {
        Verdict::Misleading
    } else {
        Verdict::NotObservedHere
    };
    let text: Vec<String> = gains
        .iter()
        .map(|(label, wc, pinned)| {
            format!(
                "{label} write-combined {} GB/s vs pinned {} GB/s ({:+.1}%)",
                num(*wc),
                num(*pinned),
                (wc / pinned - 1.0) * 100.0
            )
        })
        .collect();
    ClaimCheck {
        claim,
        verdict,
        evidence: format!(
            "{}. The programming guide says \"up to\", on some systems; write-combined memory is also very slow \
             to read from the CPU",
            text.join("; ")
        ),
    }
}

fn managed_pages(raw: &RawRun) -> ClaimCheck {
    let claim = "\"Managed memory uses 64 KB pages; 2 MB huge pages cut faults 16384 → 512 per GB\"";
    let fault = value(raw, "managed_first_read_fault_1g");
    let prefetch = value(raw, "managed_first_read_prefetch_1g");
    let advise = value(raw, "managed_first_read_advise_prefetch_1g");
    let resident = value(raw, "managed_resident_read_1g");
    let (Some(fault), Some(prefetch)) = (fault, prefetch) else {
        return ClaimCheck {
            claim,
            verdict: Verdict::NotMeasured,
            evidence: "needs managed_first_read_fault_1g and managed_first_read_prefetch_1g; page sizes are not \
                       documented in any case"
                .into(),
        };
    };
    let ms = |gbs: f64| (1u64 << 30) as f64 / gbs / 1e6;
    let mut text = format!(
        "First GPU read of 1 GiB written by the CPU: on-demand faults {} GB/s ({} ms), prefetch first {} GB/s \
         ({} ms, {} faster)",
        num(fault),
        num(ms(fault)),
        num(prefetch),
        num(ms(prefetch)),
        times(prefetch / fault)
    );
    if let Some(advise) = advise {
        text += &format!(", advise + prefetch {} GB/s", num(advise));
    }
    if let Some(resident) = resident {
        text += &format!("; resident re-read {} GB/s", num(resident));
    }
    text += ". The driver migrates in larger blocks with prefetching heuristics; explicit prefetch is the \
             documented remedy";
    ClaimCheck { claim, verdict: Verdict::Undocumented, evidence: text }
}

fn cpu_device_id(raw: &RawRun) -> ClaimCheck {
    let runtime = raw.env.as_ref().map(|e| e.runtime.clone()).unwrap_or_default();
    let major: Option<u32> = runtime.split('.').next().and_then(|m| m.parse().ok());
    let this_run = match major {
        Some(m) if m >= 13 => {
            format!(" This run's runtime is {runtime}: the CUDA 12 form does not compile against it.")
        }
        Some(_) => format!(" This run's runtime is {runtime}, which still has the int form."),
        None => String::new(),
    };
    ClaimCheck {
        claim: "Its code calls `cudaMemAdvise(ptr, n, advice, cudaCpuDeviceId)`",
        verdict: Verdict::ApiFact,
        evidence: format!(
            "That is the CUDA 12 signature. CUDA 13's cudaMemAdvise and cudaMemPrefetchAsync take a \
             `cudaMemLocation` (`cudaMemLocationTypeHost` for the CPU); cuda-mem's `Location::Host` maps to \
             either.{this_run}"
        ),
    }
}

/// A figure with three significant digits (more for large values), no exponent.
pub fn num(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else if magnitude >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

fn times(factor: f64) -> String {
    format!("{}×", num(factor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::parse_raw;

    fn run(rows: &[(&str, f64, &str)]) -> RawRun {
        let text: String = rows
            .iter()
            .map(|(key, value, detail)| {
                format!("{{\"key\":\"{key}\",\"value\":{value},\"unit\":\"x\",\"detail\":\"{detail}\"}}\n")
            })
            .collect();
        parse_raw(&text).unwrap()
    }

    fn async_rows(malloc: f64, nosync: f64, synced: f64) -> RawRun {
        let mut rows = Vec::new();
        for size in SIZES {
            rows.push((format!("malloc_{size}"), malloc));
            rows.push((format!("async_retain_nosync_{size}"), nosync));
            rows.push((format!("async_default_sync_{size}"), synced));
        }
        let rows: Vec<(&str, f64, &str)> = rows.iter().map(|(k, v)| (k.as_str(), *v, "")).collect();
        run(&rows)
    }

    #[test]
    fn async_claim_is_misleading_when_only_retention_is_fast() {
        let check = async_order_of_magnitude(&async_rows(63.0, 0.8, 120.0));
        assert_eq!(check.verdict, Verdict::Misleading);
        assert!(check.evidence.contains("78.8×"), "{}", check.evidence);
        assert!(check.evidence.contains("0.525×"), "{}", check.evidence);
        assert_eq!(async_order_of_magnitude(&async_rows(63.0, 0.8, 5.0)).verdict, Verdict::Holds);
        assert_eq!(async_order_of_magnitude(&async_rows(63.0, 10.0, 120.0)).verdict, Verdict::False);
        assert_eq!(async_order_of_magnitude(&run(&[("malloc_4k", 1.0, "")])).verdict, Verdict::NotMeasured);
    }

    #[test]
    fn claim_rows_decide_false_holds_or_inconclusive() {
        let ok = run(&[("claim_pool_odd_sizes", 1.0, "cudaSuccess"), ("pool_odd_16441", 0.7, "")]);
        assert_eq!(pool_alignment(&ok).verdict, Verdict::False);
        let invalid = run(&[("claim_pool_odd_sizes", 0.0, "cudaErrorInvalidValue")]);
        assert_eq!(pool_alignment(&invalid).verdict, Verdict::Holds);
        let other = run(&[("claim_pool_odd_sizes", 0.0, "cudaErrorMemoryAllocation")]);
        assert_eq!(pool_alignment(&other).verdict, Verdict::Inconclusive);
        assert_eq!(pool_alignment(&RawRun::default()).verdict, Verdict::NotMeasured);

        let free = run(&[("claim_cross_stream_free", 1.0, "cudaSuccess")]);
        assert_eq!(cross_stream_free(&free).verdict, Verdict::False);
        assert!(cross_stream_free(&free).evidence.contains("cudaSuccess"));
        let failed = run(&[("claim_cross_stream_free", 0.0, "cudaErrorInvalidValue")]);
        assert_eq!(cross_stream_free(&failed).verdict, Verdict::Inconclusive);

        let pinned = run(&[("claim_pinned_other_thread", 1.0, "cudaSuccess")]);
        assert_eq!(pinned_other_thread(&pinned).verdict, Verdict::False);
    }

    #[test]
    fn write_combined_gain_thresholds() {
        let wc = |h2d_wc: f64| {
            run(&[("h2d_wc", h2d_wc, ""), ("h2d_pinned", 55.0, ""), ("d2h_wc", 55.0, ""), ("d2h_pinned", 55.0, "")])
        };
        assert_eq!(write_combined(&wc(55.2)).verdict, Verdict::NotObservedHere);
        assert_eq!(write_combined(&wc(66.0)).verdict, Verdict::Misleading);
        assert_eq!(write_combined(&wc(77.5)).verdict, Verdict::Holds);
        assert!(write_combined(&wc(55.0)).evidence.contains("+0.0%"));
        assert_eq!(write_combined(&RawRun::default()).verdict, Verdict::NotMeasured);
    }

    #[test]
    fn managed_claim_reports_prefetch_speedup() {
        let raw = run(&[("managed_first_read_fault_1g", 6.65, ""), ("managed_first_read_prefetch_1g", 45.8, "")]);
        let check = managed_pages(&raw);
        assert_eq!(check.verdict, Verdict::Undocumented);
        assert!(check.evidence.contains("6.89×"), "{}", check.evidence);
        assert!(check.evidence.contains("161 ms"), "{}", check.evidence);
        assert_eq!(managed_pages(&RawRun::default()).verdict, Verdict::NotMeasured);
    }

    #[test]
    fn api_facts_mention_the_runtime_of_the_run() {
        let raw =
            parse_raw("{\"key\":\"env\",\"device\":\"d\",\"driver\":\"13.0\",\"runtime\":\"13.0\",\"cc\":\"9.0\"}")
                .unwrap();
        let checks = check(&raw);
        assert_eq!(checks.len(), 8);
        let advise = checks.last().unwrap();
        assert_eq!(advise.verdict, Verdict::ApiFact);
        assert!(advise.evidence.contains("runtime is 13.0"));
        assert!(checks.iter().any(|c| c.evidence.contains("cudaFreeHost")));
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!(num(2055.4), "2055");
        assert_eq!(num(55.43), "55.4");
        assert_eq!(num(6.654), "6.65");
        assert_eq!(num(0.6312), "0.631");
    }
}
