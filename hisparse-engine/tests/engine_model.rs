//! The emulated model's GEMMs in the decode step (CPU backend, a tiny model shaped like the
//! presets): they run every layer and take time, they leave the attention outputs exactly as
//! they were, and a model whose layers disagree with the geometry is refused by name.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{config, run_on};
use hisparse_engine::{Engine, ModelShape, RequestSpec};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{Mode, RequestId};

fn tiny() -> ModelShape {
    ModelShape {
        name: "tiny".into(),
        layers: 4,
        hidden: 64,
        heads: 4,
        q_lora: 32,
        kv_lora: 512,
        rope: 64,
        qk_nope: 16,
        v_head: 16,
        index_heads: 8,
        index_dim: 128,
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
        cfg.model = Some(tiny());
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
    cfg.model = Some(ModelShape { layers: 5, ..tiny() });
    let e = Engine::new(CpuBackend::new(), cfg).err().unwrap();
    assert!(e.to_string().contains("model.layers") && e.to_string().contains('5'), "{e}");
    let mut cfg = config(Mode::Resident, "lru");
    cfg.model = Some(ModelShape { moe_inter: 20, ..tiny() });
    let e = Engine::new(CpuBackend::new(), cfg).err().unwrap();
    assert!(e.to_string().contains("model.moe_inter"), "{e}");
}
