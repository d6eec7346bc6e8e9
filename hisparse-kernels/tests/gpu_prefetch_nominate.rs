//! GPU twins of the prefetchers: each built-in's CUDA `prefetch_nominate` (its program: the
//! prefetch prelude and its rule), run on the GPU, against its Rust form on random selections
//! (layer, layers, sizes, near-cut candidates), layer structures (every layer full, GLM-5.2's,
//! random ones) and budgets: the same nominations in the same order.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use cudarc::driver::{LaunchConfig, PushKernelArg};
use hisparse_kernels::cuda::{self, CudaDevice, GpuNomination, GpuPrefetchSource};
use hisparse_memory::KvGeometry;
use hisparse_policy::prefetch::{BuiltinPrefetcher, LayerSelection, Nomination, PrefetcherConfig};
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gpu_prefetcher_nominates_as_its_rust_form() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let glm52 = KvGeometry::preset("glm-5.2").unwrap();
    let cap = 96u32;
    let mut nominations = 0usize;
    for b in BuiltinPrefetcher::ALL {
        for budget in [0usize, 1, 77, 4096] {
            let p = (b.spec().make)(&PrefetcherConfig { budget });
            let src = cuda::prefetcher_harness(p.as_ref()).unwrap();
            let name = src.name.clone();
            let f = dev.function_of(&name, "prefetch_nominations", || Some(src)).unwrap();
            for structure in 0..3 {
                let layers: u32 = if structure == 1 { glm52.layers as u32 } else { rng.random_range(1..=90) };
                // Per layer, the layer whose selection it uses: none (every layer full),
                // GLM-5.2's, or random (a shared layer takes an earlier full one).
                let index_source: Option<Vec<u32>> = match structure {
                    0 => None,
                    1 => Some((0..glm52.layers).map(|l| glm52.index_source(l) as u32).collect()),
                    _ => {
                        let mut v: Vec<u32> = Vec::new();
                        for l in 0..layers {
                            let full = l == 0 || rng.random_bool(0.3);
                            let last_full = (0..l).rev().find(|&x| v[x as usize] == x).unwrap_or(0);
                            v.push(if full { l } else { last_full });
                        }
                        Some(v)
                    }
                };
                let n = 2048u32;
                let srcs: Vec<GpuPrefetchSource> = (0..n)
                    .map(|_| {
                        let top_k = rng.random_range(1..=4096u32);
                        let seq_len = rng.random_range(1..=1_000_000u32);
                        GpuPrefetchSource {
                            layer: rng.random_range(0..layers),
                            layers,
                            step: rng.random_range(1..100_000),
                            seq_len,
                            top_k,
                            n_selected: rng.random_range(1..=top_k.min(seq_len)),
                            n_near: if rng.random_bool(0.2) { 0 } else { rng.random_range(0..=top_k) },
                        }
                    })
                    .collect();
                let srcs_d = s.clone_htod(&srcs).unwrap();
                // The harness reads `index_source` only through the prelude, which takes null as
                // "every layer full": an empty buffer stands for null here.
                let table = index_source.clone().unwrap_or_default();
                let table_d = s.clone_htod(if table.is_empty() { &[u32::MAX][..] } else { &table[..] }).unwrap();
                let null: u64 = 0;
                let mut out = s.alloc_zeros::<GpuNomination>((n * cap) as usize).unwrap();
                let mut counts = s.alloc_zeros::<u32>(n as usize).unwrap();
                let mut launch = s.launch_builder(&f);
                launch.arg(&srcs_d).arg(&n);
                if index_source.is_some() {
                    launch.arg(&table_d);
                } else {
                    launch.arg(&null);
                }
                launch.arg(&cap).arg(&mut out).arg(&mut counts);
                // SAFETY: `srcs_d` holds n sources, `out` n * cap nominations, `counts` n entries;
                // the table holds `layers` entries (or the pointer is null); argument types match
                // the harness.
                unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
                let (out, counts) = (s.clone_dtoh(&out).unwrap(), s.clone_dtoh(&counts).unwrap());
                let selected: Vec<u32> = (0..4096).collect();
                let near: Vec<u32> = (4096..8192).collect();
                let sources = index_source.clone().unwrap_or_default();
                for (i, x) in srcs.iter().enumerate() {
                    let view = LayerSelection {
                        layer: x.layer,
                        layers: x.layers,
                        step: x.step,
                        seq_len: x.seq_len as usize,
                        top_k: x.top_k as usize,
                        selected: &selected[..x.n_selected as usize],
                        near: &near[..x.n_near as usize],
                        index_source: &sources,
                    };
                    let mut want: Vec<Nomination> = Vec::new();
                    p.nominate(&view, &mut want);
                    want.truncate(cap as usize);
                    let got: Vec<Nomination> = out[i * cap as usize..][..counts[i] as usize]
                        .iter()
                        .map(|g| g.to_nomination().unwrap_or_else(|| panic!("bad nomination {g:?}")))
                        .collect();
                    assert_eq!(got, want, "{} (budget {budget}, structure {structure}) on {x:?}", p.name());
                    nominations += got.len();
                }
            }
        }
    }
    assert!(nominations > 10_000, "only {nominations} nominations compared");
}
