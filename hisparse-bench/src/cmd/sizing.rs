//! Default sizes of the tiers where the user gives none: the device KV budget beside an emulated
//! model's weights (what a serving engine leaves for the KV cache: 90% of the GPU's memory, as
//! SGLang's default memory fraction, minus the weights and a margin for activations), and a
//! host tier that fits the machine's available memory.

use crate::error::{BenchError, Result};

/// Bytes kept free on the GPU for activations, scores, cuBLAS and scratch buffers.
const DEVICE_MARGIN: u64 = 4 << 30;

/// Share of the GPU's memory a serving engine takes (SGLang's `mem_fraction_static` default).
const MEM_FRACTION: f64 = 0.9;

/// The device KV budget beside `weights` bytes of emulated model on GPU 0.
pub fn device_kv_budget(weights: u64) -> Result<u64> {
    let (free, total) = gpu_memory()?;
    // From the total, not what is free now: every engine of a sweep gets the same budget.
    let budget = ((total as f64 * MEM_FRACTION) as u64).saturating_sub(weights + DEVICE_MARGIN);
    if budget < 1 << 30 {
        return Err(BenchError::flag(
            "device-memory",
            format!("{:.1} GB", budget as f64 / 1e9),
            format!(
                "too little GPU memory left for the KV cache beside {:.1} GB of emulated weights \
                 ({:.1} of {:.1} GB free)",
                weights as f64 / 1e9,
                free as f64 / 1e9,
                total as f64 / 1e9
            ),
        ));
    }
    Ok(budget)
}

#[cfg(feature = "cuda")]
fn gpu_memory() -> Result<(u64, u64)> {
    hisparse_kernels::cuda::memory_info(0).map_err(|e| BenchError::flag("backend", "cuda", e.to_string()))
}

#[cfg(not(feature = "cuda"))]
fn gpu_memory() -> Result<(u64, u64)> {
    Err(BenchError::flag("backend", "cuda", "this build has no CUDA support (feature `cuda`)"))
}

/// On the CPU backend an emulated model's weights live in host memory: fails, naming the flag,
/// when they would take more than half of `available` bytes.
pub fn check_cpu_room(shape: &hisparse_engine::emulated::EmulatedModel, available: u64) -> Result<()> {
    let w = shape.weight_bytes();
    if w > available / 2 {
        return Err(BenchError::flag(
            "emulate-model",
            "on",
            format!(
                "{}'s emulated weights ({:.1} GB) need a GPU: the CPU backend would hold them in host \
                 memory ({:.1} GB available); use --backend cuda",
                shape.name,
                w as f64 / 1e9,
                available as f64 / 1e9
            ),
        ));
    }
    Ok(())
}

/// The largest host-to-device ratio whose host tier fits in three quarters of `available`.
pub fn host_ratio_cap(device_kv_bytes: u64, available: u64) -> f64 {
    0.75 * available as f64 / device_kv_bytes.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emulated_model_too_big_for_the_host_is_refused_on_the_cpu() {
        let glm = hisparse_engine::emulated::EmulatedModel::preset(hisparse_memory::Preset::Glm51).unwrap();
        let e = check_cpu_room(&glm, 128 << 30).unwrap_err().to_string();
        assert!(e.contains("--emulate-model") && e.contains("need a GPU") && e.contains("106.3 GB"), "{e}");
        check_cpu_room(&glm, 1 << 40).unwrap();
    }

    #[test]
    fn the_host_cap_keeps_a_quarter_free() {
        assert!((host_ratio_cap(40 << 30, 128 << 30) - 2.4).abs() < 1e-9);
        assert!(crate::guard::available_memory().is_none_or(|b| b > 0));
    }
}
