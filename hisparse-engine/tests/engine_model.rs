//! The emulated model's GEMMs in the decode step (CPU backend, a tiny model shaped like the
//! presets): they run every layer and take time, they leave the attention outputs exactly as
//! they were, and a model whose layers disagree with the geometry is refused by name.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{config, run_on};
use hisparse_engine::emulated::{AttentionShape, EmulatedModel, MlaShape, WeightFormat};
use hisparse_engine::{Engine, RequestSpec};
use hisparse_kernels::CpuBackend;
use hisparse_kernels::Kernels;
use hisparse_memory::{Mode, RequestId};

fn tiny() -> EmulatedModel {
    EmulatedModel {
        name: "tiny".into(),
        layers: 4,
        hidden: 64,
        heads: 4,
        attention: AttentionShape::Mla(MlaShape {
            q_lora: 32,
            kv_lora: 512,
            rope: 64,
            qk_nope: 16,
            v_head: 16,
            index_heads: 8,
            index_dim: 128,
        }),
        weights: WeightFormat::Fp8,
        dense_inter: 128,
        dense_layers: 1,
        experts: 16,
        experts_per_token: 2,
        shared_experts: 1,
        moe_inter: 32,
        vocab: 256,
        ranks: 8,
    }
}

#[test]
fn emulated_gemms_take_time_and_leave_attention_alone() {
    for mode in [Mode::Resident, Mode::HiSparse] {
        let plain = run_on(CpuBackend::new(), config(mode, "lru"), &[], None);
        let mut cfg = config(mode, "lru");
        cfg.emulated_model = Some(tiny());
        let with_model = run_on(CpuBackend::new(), cfg.clone(), &[], None);
        assert_eq!(plain, with_model, "{mode:?}: the emulated GEMMs changed attention outputs");

        let mut e = Engine::new(CpuBackend::new(), cfg).unwrap();
        e.submit(RequestSpec { id: RequestId(1), prompt_tokens: 300, output_tokens: 2 }).unwrap();
        let r = e.step().unwrap();
        assert!(r.metrics.stages.model > 0.0, "{mode:?}: no time in the emulated model");
    }
}

#[test]
fn a_model_with_other_layers_is_refused() {
    let mut cfg = config(Mode::Resident, "lru");
    cfg.emulated_model = Some(EmulatedModel { layers: 5, ..tiny() });
    let e = Engine::new(CpuBackend::new(), cfg).err().unwrap();
    assert!(e.to_string().contains("emulated_model.layers") && e.to_string().contains('5'), "{e}");
    let mut cfg = config(Mode::Resident, "lru");
    cfg.emulated_model = Some(EmulatedModel { moe_inter: 20, ..tiny() });
    let e = Engine::new(CpuBackend::new(), cfg).err().unwrap();
    assert!(e.to_string().contains("emulated_model.moe_inter"), "{e}");
}

/// Two ranks of a data-parallel deployment (threads, the CPU collectives): each engine decodes
/// its own requests — rank 1 fewer, so it idles at the end and still meets rank 0's collectives
/// — with the model's all-gathers and reduce-scatters around every FFN; the attention outputs
/// are those of the same requests without the exchange, and both ranks moved the same bytes.
#[test]
fn two_ranks_exchange_around_the_ffn_and_leave_attention_alone() {
    use hisparse_engine::emulated::RankExchange;
    use hisparse_kernels::CpuRank;
    let reqs = common::requests();
    let share = |rank: usize| -> Vec<RequestSpec> { if rank == 0 { reqs.clone() } else { reqs[..2].to_vec() } };
    let run = |rank: usize, group: Option<CpuRank>| {
        let mut cfg = config(Mode::HiSparse, "lru");
        cfg.emulated_model = Some(tiny());
        let mut e = Engine::new(CpuBackend::new(), cfg).unwrap();
        if let Some(g) = group {
            let ex = RankExchange::new(&tiny(), Box::new(g), e.cache().backend().memory()).unwrap();
            e.set_exchange(ex).unwrap();
        }
        for r in share(rank) {
            e.submit(r).unwrap();
        }
        let mut digests = std::collections::BTreeMap::new();
        // A fixed number of steps on every rank (the sweep's way), enough for all to finish.
        for _ in 0..60 {
            for (id, tok, layer, d) in e.step().unwrap().digests {
                digests.insert((id.0, tok, layer), d);
            }
        }
        assert!(e.is_idle(), "rank {rank} finished");
        (digests, e.exchanged_bytes())
    };
    let out: Vec<_> = std::thread::scope(|s| {
        let h: Vec<_> = CpuRank::group(2)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(rank, g)| {
                let run = &run;
                s.spawn(move || run(rank, Some(g)))
            })
            .collect();
        h.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (digests, bytes)) in out.iter().enumerate() {
        let (alone, none) = run(rank, None);
        assert_eq!(none, 0);
        assert!(!digests.is_empty());
        assert_eq!(digests, &alone, "rank {rank}: the exchange changed attention outputs");
        assert!(*bytes > 0 && *bytes == out[0].1, "rank {rank}: {bytes} bytes against rank 0's {}", out[0].1);
    }
    let mut e = Engine::new(CpuBackend::new(), config(Mode::HiSparse, "lru")).unwrap();
    let g = CpuRank::group(1).unwrap().pop().unwrap();
    let ex = RankExchange::new(&tiny(), Box::new(g), e.cache().backend().memory()).unwrap();
    assert!(e.set_exchange(ex).unwrap_err().to_string().contains("model"), "no model, no exchange");
}
