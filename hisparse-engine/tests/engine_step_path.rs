//! The engine's one step path on the CPU backend: the emulated model's projections make, where
//! the kernels run, exactly the rows and keys the workload defines; the next step's inputs are
//! generated during the step before when the batch is unchanged; every layer keeps its digest
//! (the CPU backend cannot capture, so every layer is launched).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{config, expected_count, run_counted};
use hisparse_engine::workload::Workload;
use hisparse_kernels::{CpuBackend, fill_new_rows_host};
use hisparse_memory::{KvGeometry, KvRowFormat, Mode};

#[test]
fn the_emulated_projection_makes_the_workloads_rows_and_keys() {
    for (preset, format) in [("glm-5.1", KvRowFormat::Fp8), ("deepseek-v3.2", KvRowFormat::Bf16)] {
        let mut g = KvGeometry::preset(preset).unwrap();
        g.kv_format = format;
        let (kv, key) = (g.kv_row().unwrap(), g.index_key().unwrap());
        let wl = Workload::new(&g, 99);
        for l in [0, 1, g.layers - 1] {
            let reqs: Vec<(u64, usize)> = (0..9).map(|i| (3 + i as u64, 17 * i + l)).collect();
            let seeds: Vec<u64> = reqs.iter().map(|&(r, p)| wl.kv_row_seed(r, l, p)).collect();
            let key_seeds: Vec<u64> = reqs.iter().flat_map(|&(r, p)| wl.index_key_seeds(r, l, p)).collect();
            let (mut rows, mut keys) = (vec![0u8; 9 * kv.row_bytes()], vec![0u8; 9 * key.row_bytes()]);
            fill_new_rows_host(kv, &seeds, key, Some(&key_seeds), wl.key_mix(l), &mut rows, Some(&mut keys)).unwrap();
            for (i, &(r, p)) in reqs.iter().enumerate() {
                let (mut v, mut k) = (vec![0f32; g.d_qk()], vec![0f32; g.index_dim]);
                wl.kv_row(r, l, p, &mut v);
                wl.index_key(r, l, p, &mut k);
                let (mut want_row, mut want_key) = (vec![0u8; kv.row_bytes()], vec![0u8; key.row_bytes()]);
                kv.encode(&v, &mut want_row).unwrap();
                key.encode(&k, &mut want_key).unwrap();
                assert_eq!(&rows[i * kv.row_bytes()..(i + 1) * kv.row_bytes()], &want_row[..], "{preset} layer {l}");
                assert_eq!(&keys[i * key.row_bytes()..(i + 1) * key.row_bytes()], &want_key[..], "{preset} layer {l}");
                assert!(want_row.iter().any(|&b| b != 0) && want_key.iter().any(|&b| b != 0));
            }
        }
    }
}

#[test]
fn inputs_come_ahead_while_the_batch_holds_and_every_layer_keeps_its_digest() {
    for mode in [Mode::Resident, Mode::HiSparse] {
        let (digests, counts) = run_counted(CpuBackend::new(), config(mode, "lru"), &[], None);
        assert_eq!(digests.len(), expected_count(), "{mode}: a layer lost its digest");
        // Most steps' inputs were generated during the step before (the batch unchanged).
        let ahead = counts.iter().filter(|c| c.ahead).count();
        assert!(ahead > counts.len() / 3 && ahead < counts.len(), "{mode}: {ahead} of {} steps ahead", counts.len());
        assert_eq!(counts.iter().map(|c| c.replays + c.captures).sum::<u64>(), 0, "the CPU backend never captures");
    }
}
