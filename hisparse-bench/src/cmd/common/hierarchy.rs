//! The hierarchy's config from the command line: a `--config` file (SGLang's hisparse-config
//! keys) under the flags, each error naming the flag or key that set the value; the device and
//! host budgets; the host-tier file's checks; whether one request fits the tiers.

use std::path::PathBuf;

use hisparse_kernels::{KernelError, MissFill, MissFillMode};
use hisparse_memory::{KvGeometry, MemoryError, Mode};
use hisparse_policy::{BuiltinPrefetcher, HiSparseConfig, PolicyError};

use super::{EngineArgs, parse_bytes};
use crate::error::{BenchError, Result};
use crate::guard;

/// The flag that sets config field `field`, if there is one.
fn flag_of(field: &str) -> Option<&'static str> {
    Some(match field {
        "device_buffer_size" => "device-buffer-size",
        "host_to_device_ratio" => "host-to-device-ratio",
        "swap_in_block_size" => "swap-in-block-size",
        "eviction_policy" => "eviction-policy",
        "prefetcher" => "prefetcher",
        "prefetch_budget" => "prefetch-budget",
        "host_tier_file" | "host_tier_path" => "host-tier-file",
        _ => return None,
    })
}

impl EngineArgs {
    /// Whether the user set config field `field` with its flag.
    fn flag_given(&self, field: &str) -> bool {
        match field {
            "device_buffer_size" => self.device_buffer_size.is_some(),
            "host_to_device_ratio" => self.host_to_device_ratio.is_some(),
            "swap_in_block_size" => self.swap_in_block_size.is_some(),
            "eviction_policy" => self.eviction_policy.is_some(),
            "prefetcher" => self.prefetcher.is_some(),
            "prefetch_budget" => self.prefetch_budget.is_some(),
            "host_tier_file" | "host_tier_path" => self.host_tier_file.is_some(),
            _ => false,
        }
    }

    /// The backend's miss-fill form from the flags (`--miss-fill` and its parameters, each
    /// parameter's default where not given), checked against `hs`'s eviction policy; a parameter
    /// of another mode, or out of range, is refused naming its flag.
    pub fn miss_fill(&self, hs: &HiSparseConfig) -> Result<MissFill> {
        let mode = self.miss_fill.unwrap_or(MissFill::default().mode());
        let (max_batch, share, threads) =
            (MissFill::DEFAULT_MAX_BATCH, MissFill::DEFAULT_SHARE, MissFill::DEFAULT_HOST_THREADS);
        let (batched, engine) = (&[MissFillMode::Auto, MissFillMode::NoCopies][..], &[MissFillMode::CopyEngine][..]);
        for (flag, given, of) in [
            ("miss-fill-max-batch", self.miss_fill_max_batch.map(|v| v.to_string()), batched),
            ("copy-engine-share", self.copy_engine_share.map(|v| format!("{v:?}")), engine),
            ("host-gather-threads", self.host_gather_threads.map(|v| v.to_string()), engine),
        ] {
            if let Some(v) = given.filter(|_| !of.contains(&mode)) {
                let of = of.iter().map(ToString::to_string).collect::<Vec<_>>().join(" or ");
                return Err(BenchError::flag(flag, v, format!("applies to --miss-fill {of}, not {mode}")));
            }
        }
        let fill = MissFill::new(
            mode,
            self.miss_fill_max_batch.unwrap_or(max_batch),
            self.copy_engine_share.unwrap_or(share),
            self.host_gather_threads.unwrap_or(threads),
        );
        let named = |e: KernelError| match e {
            KernelError::InvalidArgument { field, value, reason } => {
                let flag = match field {
                    "copy_engine_share" => "copy-engine-share",
                    "host_gather_threads" => "host-gather-threads",
                    _ => "miss-fill",
                };
                BenchError::flag(flag, value, reason)
            }
            e => BenchError::flag("miss-fill", mode, e.to_string()),
        };
        fill.validate().map_err(named)?;
        fill.check_policy(&hs.online_policy().map_err(|e| self.name_error(e))?).map_err(named)?;
        Ok(fill)
    }

    /// The `--config` file's text (read on first use) and the keys it sets.
    fn config_file(&self) -> Result<Option<(&std::path::Path, String, Vec<String>)>> {
        let Some(p) = &self.config else { return Ok(None) };
        let text = match self.config_text.get() {
            Some(t) => t,
            None => {
                let t = crate::files::input::read_config("config", p)?;
                self.config_text.get_or_init(|| t)
            }
        };
        let keys = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
            .unwrap_or_default();
        Ok(Some((p.as_path(), text.clone(), keys)))
    }

    /// The error for a size that several inputs set (`--flag` or config `key`): by the flag
    /// if the user gave it, else by the config key if the file set it, else by the flag that
    /// would change the preset's default.
    fn size_error(&self, sources: &[(&'static str, Option<String>, &str)], reason: &str) -> Result<BenchError> {
        if let Some((flag, Some(v), _)) = sources.iter().find(|s| s.1.is_some()) {
            return Ok(BenchError::flag(flag, v, reason.to_string()));
        }
        if let Some((path, text, keys)) = self.config_file()?
            && let Some(key) = sources.iter().map(|s| s.2).find(|k| keys.iter().any(|x| x == k))
        {
            let v = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get(key).map(ToString::to_string))
                .unwrap_or_default();
            return Ok(BenchError::flag("config", path.display(), format!("{key} = {v}: {reason}")));
        }
        let flag = sources.first().map_or("device-memory", |s| s.0);
        Ok(BenchError::flag(flag, "(the preset's default)", reason.to_string()))
    }

    /// A config error as the user would name it: by the flag they gave, else by the config file
    /// it came from, else as the library named it (a preset's value).
    fn name_error(&self, e: PolicyError) -> BenchError {
        let (field, value, reason) = match &e {
            PolicyError::Memory(MemoryError::InvalidField { field, value, reason })
            | PolicyError::Invalid { field, value, reason } => (*field, value, reason),
            PolicyError::UnknownPolicy { name, known } => {
                return match (&self.eviction_policy, &self.config) {
                    (Some(_), _) => BenchError::flag("eviction-policy", name, format!("known policies: {known}")),
                    (None, Some(path)) => BenchError::flag("config", path.display(), e.to_string()),
                    _ => e.into(),
                };
            }
            _ => return e.into(),
        };
        match (flag_of(field), &self.config) {
            (Some(flag), _) if self.flag_given(field) => BenchError::flag(flag, value, reason.clone()),
            (_, Some(path)) => BenchError::flag("config", path.display(), format!("{field} = {value}: {reason}")),
            _ => e.into(),
        }
    }

    /// The hierarchy's config: the preset's defaults, then the `--config` file's keys, then
    /// flags; checked against the geometry and against this machine's memory. Errors name the
    /// flag (or the file) the value came from.
    pub fn hisparse(&self, g: &KvGeometry) -> Result<HiSparseConfig> {
        let base = HiSparseConfig::for_geometry(g);
        let mut longest_given = false;
        let mut c = match self.config_file()? {
            Some((p, text, keys)) => {
                longest_given = keys.iter().any(|k| k == "max_request_tokens");
                HiSparseConfig::from_json_over(g, &base, &text)
                    .map_err(|e| BenchError::flag("config", p.display(), e.to_string()))?
            }
            None => base,
        };
        if let Some(v) = self.device_buffer_size {
            c.device_buffer_size = v;
        }
        // A tier file the config names (no --host-tier-file): checked as the flag's is, by its key.
        if self.host_tier_file.is_none()
            && let Some(p) = &c.host_tier_path
            && let Some((path, _, _)) = self.config_file()?
        {
            let by_key = |reason: String| {
                BenchError::flag(
                    "config",
                    path.display(),
                    format!("host_tier_path = {:?}: {reason}", p.display().to_string()),
                )
            };
            if p.as_os_str().is_empty() {
                return Err(by_key("give a file path (or leave the key out)".into()));
            }
            check_tier_path(p, c.host_tier_overwrite).map_err(|e| match e {
                BenchError::Flag { reason, .. } => {
                    by_key(reason.replace("--overwrite-host-tier-file", "host_tier_overwrite"))
                }
                e => e,
            })?;
        }
        if let Some(v) = self.host_to_device_ratio {
            if !(v.is_finite() && v > 0.0) {
                return Err(BenchError::flag(
                    "host-to-device-ratio",
                    format!("{v:?}"),
                    "must be a finite number above 0",
                ));
            }
            c.host_to_device_ratio = v;
        }
        if let Some(v) = self.swap_in_block_size {
            c.swap_in_block_size = v;
        }
        if let Some(v) = self.eviction_policy {
            c.eviction = v.into();
        }
        if self.prefetcher == Some(BuiltinPrefetcher::NextStep) && self.uses_cuda() {
            return Err(BenchError::flag(
                "prefetcher",
                "next-step",
                "the CUDA backend prefetches a layer's selection into later layers \
                 (shared-index, adjacent-layer); next-step needs near-cut candidates on the \
                 device, not built yet: use --backend cpu (or compare prefetchers on a trace \
                 with `hisparse simulate --prefetchers`)",
            ));
        }
        c.prefetch = c
            .prefetch
            .overridden(self.prefetcher.map(Into::into), self.prefetch_budget)
            .map_err(|e| self.name_error(e))?;
        if let Some(p) = &self.host_tier_file {
            if self.uses_cuda() {
                return Err(BenchError::flag(
                    "host-tier-file",
                    p.display(),
                    "the CUDA backend cannot register a file mapping as pinned host memory \
                     (cuMemHostRegister refuses it); use --backend cpu for the file-backed tier",
                ));
            }
            // With --keep-host-tier-file the engines of one command (each mode, each point of a
            // sweep) use the file in turn: the first creates it, the later ones replace it.
            let reuse = self.keep_host_tier_file && kept_tier(p);
            check_tier_path(p, self.overwrite_host_tier_file || reuse)?;
            if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
                return Err(BenchError::flag(
                    "host-tier-file",
                    p.display(),
                    format!("its folder {} does not exist", d.display()),
                ));
            }
            c.host_tier_path = Some(p.clone());
            c.host_tier_overwrite = self.overwrite_host_tier_file || reuse;
            c.host_tier_keep = self.keep_host_tier_file;
        }
        let cuda = self.uses_cuda();
        let avail = guard::available_memory();
        let default = if g.name == "cpu-small" {
            48u64 << 20
        } else if cuda {
            64u64 << 30
        } else {
            // On the CPU the "device" is host memory: a quarter of what is available, at most 64 GiB.
            (64u64 << 30).min(avail.map_or(u64::MAX, |a| a / 4)).max(48 << 20)
        };
        c.device_kv_bytes = match (&self.device_memory, self.emulated_model()?) {
            (Some(s), _) => parse_bytes("device-memory", s)?,
            (None, _) if c.device_kv_bytes > 0 => c.device_kv_bytes,
            (None, Some(m)) if cuda => crate::cmd::sizing::device_kv_budget(m.weight_bytes())?,
            (None, _) => default,
        };
        if !cuda
            && let Err(BenchError::Flag { reason, .. }) =
                guard::memory("device-memory", "", "the CPU backend's device tier", Some(c.device_kv_bytes))
        {
            return Err(self.size_error(&[("device-memory", self.device_memory.clone(), "device_kv_bytes")], &reason)?);
        }
        if self.host_to_device_ratio.is_none()
            && let Some(avail) = avail
        {
            // The default ratio may ask for more host memory than there is: shrink it to fit
            // (beside the CPU backend's device tier, which is host memory too).
            let left = if cuda { avail } else { avail.saturating_sub(c.device_kv_bytes) };
            c.host_to_device_ratio =
                c.host_to_device_ratio.min(crate::cmd::sizing::host_ratio_cap(c.device_kv_bytes, left));
        }
        // The longest request the tiers must hold: what the host tier holds, up to the default
        // (each command checks its own lengths against the tiers, naming its flag).
        let per_token = g.kv_bytes_per_token()? as u64;
        let fits = (c.host_bytes() / per_token.max(1)) as usize / c.page_tokens.max(1) * c.page_tokens;
        if fits == 0 {
            let reason = format!(
                "the host tier ({}) holds less than one page of {} tokens of {per_token} B",
                guard::human_bytes(c.host_bytes()),
                c.page_tokens
            );
            return Err(self.size_error(
                &[
                    ("host-to-device-ratio", self.host_to_device_ratio.map(|r| format!("{r:?}")), "host_tier_bytes"),
                    ("host-to-device-ratio", None, "host_to_device_ratio"),
                    ("device-memory", self.device_memory.clone(), "device_kv_bytes"),
                    ("device-memory", None, "page_tokens"),
                ],
                &reason,
            )?);
        }
        if !longest_given {
            c.max_request_tokens = c.max_request_tokens.min(fits);
        }
        c.validate(g).map_err(|e| self.name_error(e))?;
        let host = c.host_bytes();
        // What this machine's memory must hold: the host tier (unless a file backs it) and, on
        // the CPU backend, the device tier too.
        let in_memory = match (self.host_tier_file.is_some(), cuda) {
            (true, true) => None,
            (true, false) => Some((Some(c.device_kv_bytes), "the CPU backend's device tier")),
            (false, true) => Some((Some(host), "the host tier")),
            (false, false) => {
                Some((host.checked_add(c.device_kv_bytes), "the host tier beside the CPU backend's device tier"))
            }
        };
        if let Some((bytes, what)) = in_memory
            && let Err(BenchError::Flag { reason, .. }) = guard::memory("device-memory", "", what, bytes)
        {
            let sources: &[(&'static str, Option<String>, &str)] = if self.host_tier_file.is_some() {
                &[("device-memory", self.device_memory.clone(), "device_kv_bytes")]
            } else {
                &[
                    ("host-to-device-ratio", self.host_to_device_ratio.map(|r| format!("{r:?}")), "host_tier_bytes"),
                    ("device-memory", self.device_memory.clone(), "device_kv_bytes"),
                    ("host-to-device-ratio", None, "host_to_device_ratio"),
                ]
            };
            return Err(self.size_error(sources, &reason)?);
        }
        if let Some(p) = &self.host_tier_file {
            check_tier_room(p, host)?;
            if !self.keep_host_tier_file {
                // A second Ctrl-C removes the file this process created and holds locked.
                static TIER: std::sync::OnceLock<crate::cleanup::Registered> = std::sync::OnceLock::new();
                TIER.get_or_init(|| crate::cleanup::register(crate::cleanup::Leftover::LockedFile(p.clone())));
            }
        }
        Ok(c)
    }

    /// Checks that one request of `tokens` positions (set by `flag` = `value`) fits the tiers
    /// of `c` in `mode` on its own — what the cache's capacity plan says it takes
    /// ([`hisparse_memory::CapacityPlan::request_bytes`]) — and stays below the kernels' 2^31
    /// positions. Refuses naming the flag otherwise.
    pub fn check_request_fits(
        &self,
        g: &KvGeometry,
        c: &HiSparseConfig,
        mode: Mode,
        flag: &'static str,
        value: impl std::fmt::Display + Copy,
        tokens: usize,
    ) -> Result<()> {
        if tokens > u32::MAX as usize / 2 {
            return Err(BenchError::flag(flag, value, "a request must stay below 2^31 positions"));
        }
        let cache = hisparse_engine::CacheConfig {
            hisparse: c.clone(),
            ..hisparse_engine::CacheConfig::new(g.clone(), mode, 0)
        }
        .sized_for(tokens, tokens);
        let plan = cache.capacity_plan()?;
        let too_big = |_| BenchError::flag(flag, value, "one request's bytes overflow");
        let one = plan.request_bytes(tokens).map_err(too_big)?;
        let device = match (mode, plan.keeps_index) {
            (Mode::HiSparse | Mode::Hybrid, _) => "device budget (hot buffer and index keys)",
            (Mode::Resident, true) => "device budget (KV rows and index keys)",
            (Mode::Resident, false) => "device budget (KV rows)",
        };
        let needs = [
            (one.host, plan.host_bytes, "host tier", "--host-to-device-ratio"),
            (one.device, plan.device_bytes, device, "--device-memory"),
        ];
        for (need, have, tier, knob) in needs {
            if need > have {
                return Err(BenchError::flag(
                    flag,
                    value,
                    format!(
                        "one request of {tokens} tokens needs {} of the {mode} {tier}, which holds {} (raise {knob})",
                        guard::human_bytes(need as u64),
                        guard::human_bytes(have as u64)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Whether an earlier engine of this process was given `p` as a kept tier file; claims it for
/// the later ones otherwise.
fn kept_tier(p: &std::path::Path) -> bool {
    static KEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    // A panic while the list was held leaves a consistent Vec: keep using it.
    let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept.iter().any(|k| k == p) {
        return true;
    }
    kept.push(p.to_owned());
    false
}

/// Refuses a `--host-tier-file` path that could not hold a tier of this process's own: a
/// folder, a link (never followed: the tier would land in whatever it points to), something
/// that is not a regular file (a FIFO, a device), a folder that does not exist, or an existing
/// file without `--overwrite-host-tier-file`.
fn check_tier_path(p: &std::path::Path, overwrite: bool) -> Result<()> {
    let bad = |why: &str| Err(BenchError::flag("host-tier-file", p.display(), why.to_string()));
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => return bad("is a folder; give a file name"),
        Ok(m) if m.file_type().is_symlink() => {
            return bad("is a symbolic link; a host tier file is never reached through one (give the file's own path)");
        }
        Ok(m) if !m.is_file() => {
            return bad("is not a regular file (a FIFO, socket or device): a host tier needs a file of its own");
        }
        Ok(_) if !overwrite => {
            return bad("exists; refusing to overwrite it (pass --overwrite-host-tier-file to replace it)");
        }
        _ => {}
    }
    Ok(())
}

/// Refuses a host-tier file of `bytes` that the file system it would be on has no room for
/// (checked before any work; the tier reserves its space again when it is made).
fn check_tier_room(p: &std::path::Path, bytes: u64) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return Ok(()) };
    // SAFETY: statvfs writes only the zeroed struct it is given; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers live across the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Ok(());
    }
    // Both are 64-bit on Linux.
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    // An existing file being replaced gives its blocks back.
    let own = std::fs::symlink_metadata(p).map_or(0, |m| m.len());
    if bytes > free.saturating_add(own) {
        return Err(BenchError::flag(
            "host-tier-file",
            p.display(),
            format!(
                "the host tier needs {}; its file system has {} free",
                guard::human_bytes(bytes),
                guard::human_bytes(free)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        engine: EngineArgs,
    }

    /// One request fits as the cache plans it: a dense resident cache (top-k past the request)
    /// holds rows alone, so a budget between the rows and rows with keys takes it; a sparse one
    /// does not, naming the flag and what is short.
    #[test]
    fn a_request_fits_as_the_cache_plans_it() {
        // SmolLM2-135M: 30 layers of 3 KV heads of 64 bf16 (23,040 B a token), 5,760 B of fp8
        // keys. 320 tokens are 5 pages: 7,372,800 B of rows, 9,216,000 B with keys.
        let fits = |top_k: &str| {
            let argv = ["t", "--preset", "smollm2-135m", "--device-memory", "8MB", "--top-k", top_k];
            let e = Flags::try_parse_from(argv).unwrap().engine;
            let g = e.geometry().unwrap();
            let c = e.hisparse(&g).unwrap();
            e.check_request_fits(&g, &c, Mode::Resident, "context", 300, 320)
        };
        fits("320").unwrap();
        let e = fits("64").unwrap_err().to_string();
        assert!(
            e.contains("--context") && e.contains("(KV rows and index keys)") && e.contains("--device-memory"),
            "{e}"
        );
    }
}
