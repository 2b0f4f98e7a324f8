//! Time spent inside CUDA API calls, per thread, through CUPTI's callback API (`paired
//! --api-time`): the wrapper's own code runs outside CUDA calls, the driver's work inside, so the
//! split shows where a difference between cuda-mem and raw C++ comes from. CUPTI ships with the
//! toolkit where perf, strace and nsys may be missing; it is loaded at run time (`dlopen`), so
//! nothing here is needed to build or to run without it. Callbacks cost time of their own, on
//! both sides alike, so profiled runs are never the judged ones.

use std::cell::Cell;
use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// `CUPTI_CB_DOMAIN_DRIVER_API` and `CUPTI_CB_DOMAIN_RUNTIME_API` (cupti_callbacks.h).
const DOMAINS: [u32; 2] = [1, 2];
/// `CUPTI_API_ENTER` (cupti_callbacks.h); the exit site is 1.
const API_ENTER: u32 = 0;

/// Where to look for the library when `CUDA_MEM_CUPTI` does not name one.
const CANDIDATES: [&str; 3] = [
    "libcupti.so.13",
    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
    "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13",
];

/// Cumulative time inside CUDA calls on this thread, and how many outermost calls made it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApiTotals {
    /// Time between entering and leaving outermost CUDA calls (driver or runtime).
    pub inside: Duration,
    /// Outermost calls.
    pub calls: u64,
}

impl ApiTotals {
    const ZERO: ApiTotals = ApiTotals { inside: Duration::ZERO, calls: 0 };
}

impl std::ops::Sub for ApiTotals {
    type Output = ApiTotals;
    fn sub(self, earlier: ApiTotals) -> ApiTotals {
        ApiTotals { inside: self.inside.saturating_sub(earlier.inside), calls: self.calls - earlier.calls }
    }
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

thread_local! {
    /// This thread's nesting depth (runtime calls enter driver calls), the start of its outermost
    /// call, and its totals.
    static STATE: Cell<(u32, Duration, ApiTotals)> = const { Cell::new((0, Duration::ZERO, ApiTotals::ZERO)) };
}

/// This thread's totals so far (zero until [`start`] succeeded).
pub fn totals() -> ApiTotals {
    STATE.with(|state| state.get().2)
}

/// The CUPTI callback: called on the calling thread at the entry and exit of every CUDA call.
extern "C" fn on_api(_userdata: *mut c_void, domain: u32, _cbid: u32, data: *const c_void) {
    if !DOMAINS.contains(&domain) || data.is_null() {
        return;
    }
    // SAFETY: for the API domains, `data` points to a CUpti_CallbackData whose first field is
    // the 32-bit callback site (cupti_callbacks.h).
    let site = unsafe { *data.cast::<u32>() };
    let now = EPOCH.elapsed();
    // `try_with`: the thread may be exiting; nothing here may unwind into CUDA.
    let _ = STATE.try_with(|state| {
        let (depth, entered, t) = state.get();
        state.set(match (site == API_ENTER, depth) {
            (true, 0) => (1, now, t),
            (true, _) => (depth + 1, entered, t),
            // An exit without its entry (subscribed mid-call) is ignored.
            (false, 0) => (0, entered, t),
            (false, 1) => (0, entered, ApiTotals { inside: t.inside + (now - entered), calls: t.calls + 1 }),
            (false, _) => (depth - 1, entered, t),
        });
    });
}

type SubscribeFn =
    unsafe extern "C" fn(*mut *mut c_void, extern "C" fn(*mut c_void, u32, u32, *const c_void), *mut c_void) -> c_int;
type EnableDomainFn = unsafe extern "C" fn(u32, *mut c_void, u32) -> c_int;

/// Loads CUPTI (`CUDA_MEM_CUPTI`, else the usual names) and subscribes to the driver and runtime
/// API domains for the rest of the process. Call before the first CUDA call.
/// Returns the path of the library it loaded.
pub fn start() -> Result<String, String> {
    match std::env::var("CUDA_MEM_CUPTI") {
        Ok(path) => start_from(&[path]),
        Err(_) => start_from(&CANDIDATES.map(String::from)),
    }
}

fn start_from(names: &[String]) -> Result<String, String> {
    LazyLock::force(&EPOCH);
    let (library, path) = names
        .iter()
        .find_map(|name| {
            let c_name = CString::new(name.as_str()).ok()?;
            // SAFETY: a NUL-terminated path; the library stays loaded for the process.
            let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            (!handle.is_null()).then(|| (handle, name.clone()))
        })
        .ok_or_else(|| format!("CUPTI not found (tried {}; set CUDA_MEM_CUPTI)", names.join(", ")))?;
    let symbol = |name: &CStr| {
        // SAFETY: `library` is a live handle and `name` NUL-terminated.
        let found = unsafe { libc::dlsym(library, name.as_ptr()) };
        if found.is_null() { Err(format!("{path} has no {}", name.to_string_lossy())) } else { Ok(found) }
    };
    // SAFETY: the signatures of cuptiSubscribe and cuptiEnableDomain in cupti_callbacks.h.
    let (subscribe, enable) = unsafe {
        (
            std::mem::transmute::<*mut c_void, SubscribeFn>(symbol(c"cuptiSubscribe")?),
            std::mem::transmute::<*mut c_void, EnableDomainFn>(symbol(c"cuptiEnableDomain")?),
        )
    };
    let mut subscriber: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `on_api` lives for the process and never unwinds.
    let code = unsafe { subscribe(&mut subscriber, on_api, std::ptr::null_mut()) };
    if code != 0 {
        return Err(format!("cuptiSubscribe failed with CUPTI error {code}"));
    }
    for domain in DOMAINS {
        // SAFETY: a subscriber returned by cuptiSubscribe.
        let code = unsafe { enable(1, subscriber, domain) };
        if code != 0 {
            return Err(format!("cuptiEnableDomain({domain}) failed with CUPTI error {code}"));
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_calls_count_once_and_other_domains_are_ignored() {
        // Runs on its own test thread, so the thread-locals start at zero. `site`: 0 enter, 1 exit.
        let call = |domain: u32, site: u64| on_api(std::ptr::null_mut(), domain, 0, [site, 0, 0, 0].as_ptr().cast());
        call(2, 0); // runtime call
        call(1, 0); // its driver call
        std::thread::sleep(Duration::from_millis(2));
        call(1, 1);
        call(2, 1);
        call(3, 0); // resource domain: not an API call
        let first = totals();
        assert!(first.calls == 1 && first.inside >= Duration::from_millis(2), "{first:?}");
        call(1, 0);
        call(1, 1);
        call(1, 1); // an unmatched exit (subscribed mid-call) is ignored
        assert_eq!((totals() - first).calls, 1);
    }

    #[test]
    fn a_missing_library_is_one_clear_error() {
        let err = start_from(&["/nonexistent/libcupti.so.13".into()]).unwrap_err();
        assert!(err.contains("CUPTI not found") && err.contains("/nonexistent/libcupti.so.13"), "{err}");
    }
}
