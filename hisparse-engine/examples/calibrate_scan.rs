//! Scans workload parameters and prints the measured locality (a tool for tuning the presets).
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use hisparse_engine::calibrate::{CalibrationSpec, calibrate};
use hisparse_engine::workload::{LocalityParams, Workload};
use hisparse_memory::KvGeometry;

fn main() {
    let args: Vec<f32> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let preset = std::env::var("PRESET").unwrap_or_else(|_| "glm-5.1".into());
    let g = KvGeometry::preset(&preset).unwrap();
    let p = LocalityParams {
        drift: args[0],
        fast_drift: args[1],
        rho_slow: args[2],
        rho_fast: args[3],
        fast_heads: args[4],
        layer_noise: args[5],
        random: false,
    };
    let ctx = args.get(6).map_or(32768, |&c| c as usize);
    let steps = args.get(7).map_or(120, |&c| c as usize);
    let seed: u64 = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let w = Workload::new(&g, seed).with_locality(p);
    let layers = if std::env::var("EARLY").is_ok() { vec![0, 1, 2] } else { vec![40, 41] };
    let w = if std::env::var("PRESET_PARAMS").is_ok() { Workload::new(&g, seed) } else { w };
    let requests: usize = std::env::var("REQUESTS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let spec = CalibrationSpec {
        requests,
        layers,
        steps,
        context: ctx,
        score_margin: 0,
        stop: hisparse_engine::StopFlag::never(),
    };
    let t = std::time::Instant::now();
    let c = calibrate(&g, &w, &spec).unwrap();
    println!(
        "{:?} ctx {ctx}: LRU {:.1}/{:.1}/{:.1}%  FIFO/rand/Belady@2k {:.1}/{:.1}/{:.1}%  step overlap {:.1}%  layer overlap {:.1}%  ({:.1}s)",
        args,
        100.0 * c.lru[0],
        100.0 * c.lru[1],
        100.0 * c.lru[2],
        100.0 * c.fifo_random_belady_2x[0],
        100.0 * c.fifo_random_belady_2x[1],
        100.0 * c.fifo_random_belady_2x[2],
        100.0 * c.step_overlap.iter().map(|x| x.1).sum::<f64>() / c.step_overlap.len() as f64,
        100.0 * c.layer_overlap.last().map_or(0.0, |x| x.1),
        t.elapsed().as_secs_f64()
    );
}
