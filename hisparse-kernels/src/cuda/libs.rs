//! Whether CUDA's libraries can be loaded here: each tried with `dlopen` by its unversioned
//! name and the sonames of the CUDA releases cudarc supports. The answer holds however cudarc
//! gets them — loaded at run time (`dynamic-loading`, ours) or linked by another crate in the
//! build (`dynamic-linking`, candle's), in which case they are loaded already and `dlopen`
//! finds them (cudarc's own check exists only with `dynamic-loading`).

/// Sonames tried after the bare name: CUDA 13 back to 9, NCCL's 2, the driver's 1.
const VERSIONS: [&str; 7] = ["13", "12", "11", "10", "9", "2", "1"];

/// Whether a library of one of `names` (short names: "cuda", "nvrtc", ...) loads.
pub fn library_present(names: &[&str]) -> bool {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    names.iter().any(|n| {
        let bare = format!("{DLL_PREFIX}{n}{DLL_SUFFIX}");
        loads(&bare) || VERSIONS.iter().any(|v| loads(&format!("{bare}.{v}")))
    })
}

#[cfg(unix)]
fn loads(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    // SAFETY: `c` is a NUL-terminated name; dlopen only maps the library (its initialisers run,
    // as they would when cudarc loads it), and the handle is closed at once.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

#[cfg(not(unix))]
fn loads(_name: &str) -> bool {
    // Elsewhere cudarc's own loading reports a missing library.
    true
}

/// Whether a CUDA driver library (`libcuda`) can be loaded here.
pub fn driver_available() -> bool {
    library_present(&["cuda", "nvcuda"])
}

/// Whether the NVRTC library can be loaded here.
pub fn nvrtc_available() -> bool {
    library_present(&["nvrtc"])
}

/// Whether cuBLAS can be loaded here.
pub fn blas_available() -> bool {
    library_present(&["cublas"])
}

/// Whether the NCCL library (`libnccl`) can be loaded here.
#[cfg(feature = "nccl")]
pub fn nccl_available() -> bool {
    library_present(&["nccl"])
}
