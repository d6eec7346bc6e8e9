//! Request identity and the two serving modes, shared by every pool.

use serde::{Deserialize, Serialize};

/// A request's id, unique among the requests a pool has seen alive at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a request's KV rows live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The baseline: the whole KV (and the index keys) on the device; attention reads rows by
    /// position.
    Resident,
    /// HiSparse: the whole KV in the host tier; on the device a hot buffer of
    /// `device_buffer_size + 1` slots per layer and the index keys.
    #[serde(rename = "hisparse")]
    HiSparse,
    /// Hybrid placement: each request's whole KV on the device (read by position, as resident)
    /// while the device has room, demoted to a hot buffer plus the host tier (as hisparse) when
    /// admitting others needs the room, promoted back when it frees. Admission is hisparse's
    /// (a seat and host pages for every request), so capacity is hisparse's; the seats and the
    /// KV pages share one pool of rows per layer.
    Hybrid,
}

impl Mode {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Resident => "resident",
            Self::HiSparse => "hisparse",
            Self::Hybrid => "hybrid",
        }
    }

    /// Whether requests in this mode hold a hot-buffer seat and host-tier pages for their whole
    /// life (hisparse and hybrid: the host tier, the swap-in and the backup exist).
    pub fn has_host_tier(self) -> bool {
        self != Self::Resident
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
