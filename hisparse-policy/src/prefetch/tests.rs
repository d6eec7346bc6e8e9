//! Unit tests of the built-in prefetchers and their registry.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use super::*;

fn sel<'a>(layer: u32, selected: &'a [u32], near: &'a [u32], index_source: &'a [u32]) -> LayerSelection<'a> {
    LayerSelection { layer, layers: 6, step: 3, seq_len: 100, top_k: 8, selected, near, index_source }
}

fn nominations(p: &dyn Prefetcher, s: &LayerSelection<'_>) -> Vec<Nomination> {
    let mut out = Vec::new();
    p.nominate(s, &mut out);
    out
}

#[test]
fn shared_index_nominates_exactly_the_layers_that_share() {
    // Layers 0 and 3 full; 1, 2 share 0; 4, 5 share 3.
    let src = [0, 0, 0, 3, 3, 3];
    let s = [1, 5, 9];
    let got = nominations(&SharedIndex, &sel(0, &s, &[], &src));
    let want: Vec<Nomination> = [1, 2]
        .map(|target| Nomination { target, when: When::ThisStep, candidates: Candidates::Selection, budget: 3 })
        .to_vec();
    assert_eq!(got, want);
    assert_eq!(nominations(&SharedIndex, &sel(3, &s, &[], &src)).iter().map(|n| n.target).collect::<Vec<_>>(), [4, 5]);
    assert!(nominations(&SharedIndex, &sel(1, &s, &[], &src)).is_empty(), "a shared layer nominates nothing");
    assert!(nominations(&SharedIndex, &sel(0, &s, &[], &[])).is_empty(), "every layer full: nothing shares");
}

#[test]
fn adjacent_layer_targets_the_next_layer_within_its_budget() {
    let s = [1, 5, 9];
    let got = nominations(&AdjacentLayer { budget: 2 }, &sel(2, &s, &[], &[]));
    assert_eq!(got, [Nomination { target: 3, when: When::ThisStep, candidates: Candidates::Selection, budget: 2 }]);
    assert!(nominations(&AdjacentLayer { budget: 2 }, &sel(5, &s, &[], &[])).is_empty(), "the last layer has no next");
    // Budget 0 means a quarter of top-k.
    assert_eq!(nominations(&AdjacentLayer { budget: 0 }, &sel(2, &s, &[], &[]))[0].budget, 2);
}

#[test]
fn next_step_needs_near_candidates() {
    let s = [1, 5, 9];
    assert!(nominations(&NextStep { budget: 4 }, &sel(2, &s, &[], &[])).is_empty());
    let got = nominations(&NextStep { budget: 4 }, &sel(2, &s, &[7, 3], &[]));
    assert_eq!(got, [Nomination { target: 2, when: When::NextStep, candidates: Candidates::Near, budget: 4 }]);
    assert!(NextStep { budget: 4 }.needs_near() && !NextStep { budget: 4 }.crosses_layers());
}

#[test]
fn the_registry_round_trips_names_configs_and_cuda() {
    for b in BuiltinPrefetcher::ALL {
        let spec = b.spec();
        let p = make_prefetcher(spec.name, &PrefetcherConfig { budget: 7 }).unwrap();
        assert_eq!(p.name(), spec.name);
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(json, format!("\"{}\"", spec.name));
        assert_eq!(serde_json::from_str::<BuiltinPrefetcher>(&json).unwrap(), b);
        assert!(cuda::program(p.as_ref()).unwrap().contains("prefetch_nominate"), "{}", spec.name);
    }
    assert_eq!(PREFETCHER_NAMES.to_vec(), BuiltinPrefetcher::ALL.map(|b| b.spec().name).to_vec());
    let c: PrefetcherConfig = serde_json::from_str(r#"{"budget": 64}"#).unwrap();
    assert_eq!(c.budget, 64);
    assert!(serde_json::from_str::<PrefetcherConfig>(r#"{"bugdet": 64}"#).is_err(), "unknown keys are refused");
    assert!(make_prefetcher("nope", &PrefetcherConfig::default()).unwrap_err().to_string().contains("next-step"));
    // Embedding code's own prefetcher.
    #[derive(Debug)]
    struct EveryOther;
    impl Prefetcher for EveryOther {
        fn name(&self) -> &str {
            "every-other"
        }
        fn nominate(&self, s: &LayerSelection<'_>, out: &mut Vec<Nomination>) {
            if s.layer.is_multiple_of(2) && s.layer + 2 < s.layers {
                out.push(Nomination {
                    target: s.layer + 2,
                    when: When::ThisStep,
                    candidates: Candidates::Selection,
                    budget: 1,
                });
            }
        }
        fn cuda(&self) -> Option<Cow<'static, str>> {
            None
        }
    }
    let spec = PrefetcherSpec { name: "every-other", about: "test", make: |_| std::sync::Arc::new(EveryOther) };
    register_prefetcher(spec).unwrap();
    assert!(register_prefetcher(spec).is_err(), "a name is registered once");
    assert_eq!(prefetcher_by_name("every-other").unwrap().name(), "every-other");
    assert!(prefetcher_specs().iter().any(|s| s.name == "every-other"));
}
