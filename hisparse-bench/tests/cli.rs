//! The built `hisparse` program, as a newcomer runs it: a synthetic trace, the simulator on it
//! (table, JSON, CSV, SVG), and one-line errors with exit status 2 for bad input.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{argv, program};

fn hisparse(args: &[impl AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(program()).args(args).output().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn synth_then_simulate_writes_every_output() {
    let dir = tmp("sim");
    let trace = dir.join("t.hstrace");
    let o =
        hisparse(&argv!("trace synth --out", trace, "--requests 2 --layers 2 --steps 30 --prompt 3000 --top-k 256"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.join("out");
    let o = hisparse(&argv!("simulate --trace", trace, "--out", out, "--buffers 256,512,1024"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    for p in ["lru", "fifo", "random", "clock", "belady", "compulsory"] {
        assert!(table.contains(p), "{table}");
    }
    for f in ["simulate.json", "simulate.csv", "miss_ratio.svg", "misses_over_time.svg"] {
        let bytes = std::fs::read(out.join(f)).unwrap();
        assert!(bytes.len() > 200, "{f} is too small");
    }
    let csv = std::fs::read_to_string(out.join("simulate.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 5 * 3 + 1, "{csv}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("simulate.json")).unwrap()).unwrap();
    assert_eq!(json["records"], 2 * 2 * 30);
    let svg = std::fs::read_to_string(out.join("miss_ratio.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("belady"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_prints_one_line_and_exits_2() {
    let dir = tmp("bad");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["simulate".into(), "--trace".into(), dir.join("missing.hstrace").display().to_string()],
            "missing.hstrace",
        ),
        (
            vec!["selfcheck".into(), "--preset".into(), "llama".into()],
            "--preset <PRESET>': expected one of deepseek-v3.2",
        ),
        (vec!["selfcheck".into(), "--batch".into(), "0".into()], "--batch = 0"),
        (
            vec!["sweep".into(), "--backend".into(), "cpu".into(), "--emulate-model".into(), "on".into()],
            "preset cpu-small is not a real model",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = hisparse(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // A corrupt trace names the byte offset.
    let bad = dir.join("bad.hstrace");
    std::fs::write(&bad, b"HSPTRACE\x07\x00garbage, garbage, garbage, garbage").unwrap();
    let o = hisparse(&["simulate", "--trace", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("at byte 8") && err.contains("version"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sweep_over_two_ranks_sums_their_requests_and_tokens() {
    let dir = tmp("sweep-ranks");
    let out = dir.join("out");
    let args =
        ["sweep", "--backend", "cpu", "--concurrency", "1,3", "--context", "600", "--warmup", "1", "--window", "2"];
    let o = hisparse(&[&args[..], &["--gpus", "2", "--out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("deployment: 2 GPUs"), "{table}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["gpus"], 2);
    for p in json["points"].as_array().unwrap() {
        // Every request submitted runs, on one rank or the other (1 on rank 0; 2 + 1).
        assert_eq!(p["running"].as_f64().unwrap(), p["concurrency"].as_f64().unwrap(), "{p}");
        assert!(p["tokens_per_s"].as_f64().unwrap() > 0.0, "{p}");
    }
    let o = hisparse(&[&args[..], &["--gpus", "0", "--out", out.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--gpus"), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_over_two_ranks_decodes_every_request_and_names_the_deployment() {
    let dir = tmp("run-ranks");
    let out = dir.join("out");
    let args = ["run", "--backend", "cpu", "--concurrency", "5", "--context", "300,900", "--output", "3,6"];
    let o = hisparse(&[&args[..], &["--gpus", "2", "--arrival-rate", "200", "--out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("2 GPUs, one engine each"), "{table}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    for m in 0..2 {
        // Requests 0, 2, 4 on rank 0 and 1, 3 on rank 1: 3 + 6 + 3 + 6 + 3 tokens in all.
        assert_eq!(json[m]["gpus"], 2);
        assert_eq!(json[m]["summary"]["tokens"], 21, "{}", json[m]["summary"]);
        let running: Vec<u64> =
            json[m]["steps"].as_array().unwrap().iter().map(|s| s["running"].as_u64().unwrap()).collect();
        assert!(running.iter().any(|&r| r >= 2), "both ranks decoded at once: {running:?}");
    }
    for (extra, needle) in
        [(vec!["--gpus", "0"], "--gpus"), (vec!["--gpus", "2", "--record-trace", "t.hstrace"], "--record-trace")]
    {
        let o = hisparse(&[&args[..], &extra[..], &["--out", out.to_str().unwrap()]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(needle), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sweep_of_one_mode_leaves_the_others_columns_and_plots_out() {
    let dir = tmp("sweep-one-mode");
    for (mode, other) in [("hisparse", "resident"), ("resident", "hisparse")] {
        let out = dir.join(mode);
        let args = ["sweep", "--backend", "cpu", "--concurrency", "1,2", "--context", "600", "--warmup", "1"];
        // The hisparse run also quantises the indexer's queries (named in the model line) and
        // asks for the mma.sync indexer; the resident one for the mma.sync attention: CUDA
        // kernels the CPU backend has not (accepted, not named).
        let (queries, knob) = if mode == "hisparse" {
            ("fp8", ["--serial-prefetch", "--indexer-kernel=mma-sync"])
        } else {
            ("exact", ["--attention-kernel=mma-sync", "--indexer-kernel=wgmma"])
        };
        let o = hisparse(
            &[
                &args[..],
                &["--window", "2", "--mode", mode, "--index-queries", queries],
                &knob[..],
                &["--out", out.to_str().unwrap()],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{mode}: {}", String::from_utf8_lossy(&o.stderr));
        let table = String::from_utf8_lossy(&o.stdout);
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
        let points = json["points"].as_array().unwrap();
        assert_eq!(points.len(), 2, "{mode}: {table}");
        let named = json["emulation"].as_str().unwrap().contains("indexer queries fp8");
        assert_eq!(named, mode == "hisparse", "{}", json["emulation"]);
        assert!(!json["emulation"].as_str().unwrap().contains("mma.sync"), "{}", json["emulation"]);
        assert!(points.iter().all(|p| p["mode"] == mode && p["tokens_per_s"].as_f64().unwrap() > 0.0), "{mode}");
        // No ratio without both modes; the plots of the other mode's data are not made.
        assert!(table.lines().any(|l| l.trim_start().starts_with("600") && l.contains(" - ")), "{mode}: {table}");
        assert!(out.join("throughput.svg").exists());
        assert_eq!(out.join("transfers.svg").exists(), mode == "hisparse", "{mode} (not {other})");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_small_sweep_writes_its_table_and_plots() {
    let dir = tmp("sweep");
    let out = dir.join("out");
    let o = hisparse(&argv!(
        "sweep --backend cpu --concurrency 1,3 --context 600 --warmup 1 --window 2 --prefetcher adjacent-layer --out",
        out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("throughput.svg") && table.contains("ratio"), "{table}");
    assert!(table.contains("hisparse transfers per step") && table.contains("prefetch used"), "{table}");
    for f in
        ["sweep.json", "sweep.csv", "throughput.svg", "transfers.svg", "misses_over_time.svg", "misses_by_buffer.svg"]
    {
        assert!(std::fs::metadata(out.join(f)).unwrap().len() > 200, "{f}");
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    assert!(json["emulation"].as_str().unwrap().starts_with("none"), "{}", json["emulation"]);
    for p in points {
        let want = p["concurrency"].as_f64().unwrap();
        assert!(p["running"].as_f64().unwrap() <= want && p["tokens_per_s"].as_f64().unwrap() > 0.0, "{p}");
        // Three windows; the point is their median, with the min and max beside it.
        let w: Vec<f64> = p["window_tokens_per_s"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(w.len(), 3, "{p}");
        let (lo, mid, hi) = (
            p["tokens_per_s_min"].as_f64().unwrap(),
            p["tokens_per_s"].as_f64().unwrap(),
            p["tokens_per_s_max"].as_f64().unwrap(),
        );
        let mut sorted = w.clone();
        sorted.sort_by(f64::total_cmp);
        assert_eq!((lo, mid, hi), (sorted[0], sorted[1], sorted[2]), "{p}");
        // Transfers: misses and prefetches in hisparse mode (none resident), the bandwidth
        // their sum over the step time, and a share of the prefetched rows used.
        let f = |k: &str| p[k].as_f64().unwrap();
        if p["mode"] == "resident" {
            assert_eq!((f("h2d_mb_per_step"), f("prefetch_mb_per_step")), (0.0, 0.0), "{p}");
        } else {
            assert!(f("h2d_mb_per_step") > 0.0 && f("prefetch_mb_per_step") > 0.0, "{p}");
            let moved = (f("h2d_mb_per_step") + f("prefetch_mb_per_step")) / 1e3;
            let rate = f("h2d_gb_per_s") * f("step_ms") / 1e3;
            assert!((rate - moved).abs() <= 0.01 * moved, "{rate} vs {moved}: {p}");
            let used = f("prefetch_useful_share");
            assert!(used > 0.0 && used <= 1.0 && f("prefetched_per_step") > 0.0, "{p}");
        }
    }
    // Steady state: one engine per mode, measured misses for every step of both levels
    // (1 warm-up step and 3 windows of 2 steps each).
    let measured = json["misses_over_time"].as_array().unwrap();
    assert_eq!(measured.len(), 1, "one hisparse series per context");
    assert_eq!(measured[0][1].as_array().unwrap().len(), 2 * 7, "a value for every step of both levels");
    assert_eq!(json["level_starts"], serde_json::json!([[1, 0], [3, 7]]));
    // The table prints the spread and the device budget the tiers really hold.
    assert!(table.contains("median of 3 windows") && table.contains("tiers hold: resident"), "{table}");
    let svg = std::fs::read_to_string(out.join("throughput.svg")).unwrap();
    assert!(svg.contains("Requests decoding at once") && svg.contains("context 600"), "the running-requests panel");
    let svg = std::fs::read_to_string(out.join("transfers.svg")).unwrap();
    assert!(svg.contains("Rows host to device") && svg.contains("prefetched, context 600"), "the transfers plot");
    let svg = std::fs::read_to_string(out.join("misses_over_time.svg")).unwrap();
    assert!(svg.contains("3 req"), "the level markers");
    assert!(
        table.contains("hierarchy: lru eviction, prefetcher adjacent-layer, misses filled by the swap-in"),
        "{table}"
    );
    // `replot` renders the same table and the same files from the JSON, elsewhere; it refuses
    // to write into the JSON's own folder.
    let again = dir.join("again");
    let o = hisparse(&["replot", out.join("sweep.json").to_str().unwrap(), "--out", again.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let retable = String::from_utf8_lossy(&o.stdout);
    let body = |t: &str| t.lines().take_while(|l| !l.starts_with("wrote")).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&retable), body(&table), "the replotted table");
    for f in ["sweep.csv", "throughput.svg", "transfers.svg", "misses_over_time.svg", "misses_by_buffer.svg"] {
        assert_eq!(std::fs::read(again.join(f)).unwrap(), std::fs::read(out.join(f)).unwrap(), "{f}");
    }
    let o = hisparse(&["replot", out.join("sweep.json").to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--out"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = hisparse(&["replot", out.join("sweep.csv").to_str().unwrap(), "--out", again.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a sweep report"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_rejects_the_too_large_request_and_records_a_trace_the_simulator_reads() {
    let dir = tmp("run");
    let trace = dir.join("run.hstrace");
    let out = dir.join("out");
    let o = hisparse(&argv!(
        "run --backend cpu --concurrency 3 --context 700,10000000 --output 3 --record-trace",
        trace,
        "--out",
        out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("request 1 rejected: needs"), "{table}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(json[1]["summary"]["tokens"], 6, "the two others generated their tokens");
    let o = hisparse(&argv!("simulate --trace", trace, "--out", dir.join("sim"), "--buffers 256,512"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_with_poisson_arrivals_reports_latencies_and_the_queue_refuses_beyond_its_bound() {
    let dir = tmp("arrivals");
    let out = dir.join("out");
    let o = hisparse(&argv!(
        "run --backend cpu --concurrency 5 --arrival-rate 40 --context 300,900 --output 3,6 --out",
        out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("time to first decode p50") && table.contains("per token p50"), "{table}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    for m in 0..2 {
        // Different output lengths in one run: 3 + 6 + 3 + 6 + 3 tokens.
        assert_eq!(json[m]["summary"]["tokens"], 21);
        assert_eq!(json[m]["latency"]["first_decode"]["count"], 5);
        assert_eq!(json[m]["latency"]["per_token"]["count"], 16);
        let (p50, max) = (&json[m]["latency"]["per_token"]["p50"], &json[m]["latency"]["per_token"]["max"]);
        assert!(p50.as_f64().unwrap() > 0.0 && p50.as_f64() <= max.as_f64(), "{p50} {max}");
    }
    // All at once into a queue of 2: three are refused, the two others decode.
    let o = hisparse(&argv!(
        "run --backend cpu --mode hisparse --concurrency 5 --context 300 --output 2 --max-queued 2 --out",
        out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 requests refused by the full waiting queue"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(json[0]["refused"], serde_json::json!([2, 3, 4]));
    assert_eq!(json[0]["summary"]["tokens"], 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--arrival-rate` with several rates is a load sweep: every mode at every load with the same
/// requests, `load.csv` with the latency percentiles of each, `latency.svg`, and where each mode
/// first made requests wait; `--record-trace` records one run, so a sweep with it is refused.
#[test]
fn run_sweeps_offered_loads_with_the_same_requests() {
    let dir = tmp("load-sweep");
    let out = dir.join("out");
    let o = hisparse(&argv!(
        "run --backend cpu --preset cpu-small --concurrency 6 --context 600 --output 8 --device-memory 8MB",
        "--arrival-rate 2,1000 --out",
        out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    for label in ["resident@2/s", "hisparse@2/s", "resident@1000/s", "hisparse@1000/s"] {
        assert!(table.contains(label), "{label}: {table}");
    }
    let csv = std::fs::read_to_string(out.join("load.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    for r in &rows {
        // The same six requests at every load and mode, each with its 8 tokens' latencies.
        assert_eq!((r[2], r[3], r[4]), ("6", "0", "0"), "{csv}");
        let (p50, p99): (f64, f64) = (r[7].parse().unwrap(), r[9].parse().unwrap());
        assert!(p50 > 0.0 && p50 <= p99, "{csv}");
    }
    // At 1000 requests/s they all arrive within a few ms, more than 8 MB holds: some wait, and
    // the table names the load where each mode first made requests wait.
    let waited = |rate: &str| rows.iter().filter(|r| r[0] == rate).map(|r| r[5].parse::<usize>().unwrap()).min();
    assert!(waited("1000") > Some(0), "{csv}");
    assert!(table.contains("resident: requests first waited for capacity at"), "{table}");
    assert!(std::fs::read_to_string(out.join("latency.svg")).unwrap().contains("time to first decode, P99"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(json[3]["arrival_rate"], 1000.0);
    let o = hisparse(&argv!(
        "run --backend cpu --preset cpu-small --concurrency 6 --context 600 --output 8 --device-memory 8MB",
        "--arrival-rate 2,4 --record-trace",
        dir.join("t.bin"),
        "--out",
        dir.join("o2")
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--record-trace") && err.contains("one --arrival-rate"), "{err}");
    let o = hisparse(&argv!("run --backend cpu --arrival-rate 2,4,2 --out", dir.join("o3")));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--arrival-rate = 2") && err.contains("twice"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dump_step_writes_tensors_that_reproduce_the_attention() {
    use hisparse_kernels::dense_attention;
    use safetensors::SafeTensors;
    let dir = tmp("dump");
    let path = dir.join("step.safetensors");
    let o = hisparse(&argv!("dump-step --backend cpu --concurrency 2 --context 900 --step 2 --out", path));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name).unwrap().data().chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let i32s = |name: &str| -> Vec<i32> {
        st.tensor(name).unwrap().data().chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    let scale: f32 = meta["softmax_scale"].parse().unwrap();
    assert_eq!(meta["mode"], "hisparse");
    for layer in 0..4 {
        let q: Vec<f32> = st
            .tensor(&format!("L{layer}.attention_queries"))
            .unwrap()
            .data()
            .chunks(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect();
        let rows = f32s(&format!("L{layer}.selected_rows_f32"));
        let lens = i32s(&format!("L{layer}.selection_lens"));
        let (out, lse) = (f32s(&format!("L{layer}.out")), f32s(&format!("L{layer}.lse")));
        let (heads, dqk, dv) = (16, 576, 512);
        let mut start = 0;
        for (r, &n) in lens.iter().enumerate() {
            let n = n as usize;
            let (o, l) = dense_attention(
                &q[r * heads * dqk..(r + 1) * heads * dqk],
                &rows[start * dqk..(start + n) * dqk],
                heads,
                dqk,
                dv,
                scale,
            );
            let got = &out[r * heads * dv..(r + 1) * heads * dv];
            let err = o.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 2e-5, "layer {layer} request {r}: out differs by {err}");
            let err = l.iter().zip(&lse[r * heads..(r + 1) * heads]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 2e-5, "layer {layer} request {r}: lse differs by {err}");
            start += n;
        }
        check_scores_and_selections(&st, layer);
    }
    // The help lists every tensor with its dtype and shape.
    let help = String::from_utf8_lossy(&hisparse(&["dump-step", "--help"]).stdout).into_owned();
    for t in ["index_key_codes", "index_key_scales", "scores", "selections", "locations", "selected_rows_f32", "lse"] {
        assert!(help.contains(&format!("L{{l}}.{t}")), "--help lacks {t}: {help}");
    }
    assert!(help.contains("U8   [sum of seq_lens, index_dim]"), "{help}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An e4m3 code's value, from the format (sign, 4 exponent bits of bias 7, 3 mantissa bits;
/// subnormals below exponent 1), written here apart from the codec.
fn e4m3(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((code >> 3) & 0xf), f32::from(code & 7));
    sign * if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) }
}

/// The dump's indexer inputs reproduce its scores (`sum_h w_h relu(q_h . key_t)`, the newest
/// position +inf), one per position, and its selections are the top-k of those scores.
fn check_scores_and_selections(st: &safetensors::SafeTensors<'_>, layer: usize) {
    let t = |n: &str| st.tensor(&format!("L{layer}.{n}")).unwrap();
    let f32s =
        |n: &str| -> Vec<f32> { t(n).data().chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect() };
    let i32s =
        |n: &str| -> Vec<i32> { t(n).data().chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect() };
    let q: Vec<f32> = t("index_queries")
        .data()
        .chunks(2)
        .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    let (w, scores, key_scales) = (f32s("index_weights"), f32s("scores"), f32s("index_key_scales"));
    let codes = t("index_key_codes").data().to_vec();
    let (seq_lens, sels, sel_lens) = (i32s("seq_lens"), i32s("selections"), i32s("selection_lens"));
    let (heads, dim) = (t("index_weights").shape()[1], t("index_key_codes").shape()[1]);
    let total: usize = seq_lens.iter().map(|&n| n as usize).sum();
    assert_eq!(scores.len(), total, "layer {layer}: one score per position");
    assert_eq!((key_scales.len(), codes.len()), (total, total * dim));
    assert_eq!(i32s("locations").len(), sels.len());
    let (mut at, mut sel_at) = (0, 0);
    for (r, &n) in seq_lens.iter().enumerate() {
        let n = n as usize;
        for p in 0..n {
            let got = scores[at + p];
            if p == n - 1 {
                assert!(got.is_infinite() && got > 0.0, "the newest position is pinned");
                continue;
            }
            let key: Vec<f32> =
                codes[(at + p) * dim..(at + p + 1) * dim].iter().map(|&c| e4m3(c) * key_scales[at + p]).collect();
            let (mut want, mut size) = (0f64, 0f64);
            for h in 0..heads {
                let qh = &q[(r * heads + h) * dim..(r * heads + h + 1) * dim];
                let dot: f64 = qh.iter().zip(&key).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                want += f64::from(w[r * heads + h]) * dot.max(0.0);
                size += f64::from(w[r * heads + h].abs()) * dot.abs();
            }
            assert!(
                (f64::from(got) - want).abs() <= 1e-5 * size.max(1e-6),
                "layer {layer} request {r} position {p}: {got} vs {want}"
            );
        }
        // The selection: the top-k of the scores, ties to the lower position.
        let k = sel_lens[r] as usize;
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| scores[at + b].total_cmp(&scores[at + a]).then(a.cmp(&b)));
        let mut want: Vec<i32> = order[..k].iter().map(|&p| p as i32).collect();
        want.sort_unstable();
        assert_eq!(&sels[sel_at..sel_at + k], want.as_slice(), "layer {layer} request {r}: selection");
        at += n;
        sel_at += k;
    }
}

#[test]
fn the_copy_engine_flags_reach_the_backend_and_bad_values_are_named_by_flag() {
    let dir = tmp("copy-engine-flags");
    let base = [
        "sweep",
        "--backend",
        "cpu",
        "--concurrency",
        "1",
        "--context",
        "600",
        "--warmup",
        "1",
        "--window",
        "2",
        "--mode",
        "hisparse",
        "--miss-fill",
        "copy-engine",
    ];
    let out = dir.join("ok");
    let ok = ["--copy-engine-share", "0.25", "--host-gather-threads", "2", "--out", out.to_str().unwrap()];
    let o = hisparse(&[&base[..], &ok[..]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (bad, flag) in [
        (["--copy-engine-share", "1.5"], "--copy-engine-share"),
        (["--host-gather-threads", "1000"], "--host-gather-threads"),
        // A parameter of other forms than the one chosen.
        (["--miss-fill-max-batch", "3"], "auto or no-copies, not copy-engine"),
    ] {
        let o = hisparse(&[&base[..], &bad[..], &["--out", dir.join("bad").to_str().unwrap()]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flag} {}: accepted", bad[1]);
        assert!(err.contains(flag) && err.contains(bad[1]), "{err}");
    }
    // A policy the form cannot run is refused naming the flag; the form is the backend's
    // option, so a config file that sets it is refused naming the key.
    let (score_out, keyed_out) = (dir.join("score"), dir.join("keyed"));
    let score = ["--eviction-policy", "score", "--out", score_out.to_str().unwrap()];
    let err = String::from_utf8_lossy(&hisparse(&[&base[..], &score[..]].concat()).stderr).into_owned();
    assert!(err.contains("--miss-fill = copy-engine") && err.contains("score policy"), "{err}");
    let config = dir.join("fill.json");
    std::fs::write(&config, r#"{"miss_fill": "auto"}"#).unwrap();
    let keyed = ["--config", config.to_str().unwrap(), "--out", keyed_out.to_str().unwrap()];
    let err = String::from_utf8_lossy(&hisparse(&[&base[..], &keyed[..]].concat()).stderr).into_owned();
    assert!(err.contains("--config") && err.contains("unknown field `miss_fill`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sweep_with_the_bound_labels_it_everywhere_and_reports_the_headline() {
    let dir = tmp("sweep-bound");
    let out = dir.join("out");
    let args = ["sweep", "--backend", "cpu", "--concurrency", "1,3", "--context", "600", "--warmup", "1"];
    let o = hisparse(&[&args[..], &["--window", "2", "--bound", "--out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("swap-in-free bound (timing only") && table.contains("outputs are wrong"), "{table}");
    assert!(
        table.contains("capacity") && table.contains("efficiency") && table.contains("peak against peak"),
        "{table}"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
    assert!(json["bound"].as_str().unwrap().contains("outputs are wrong"), "{}", json["bound"]);
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 6);
    let bound: Vec<_> = points.iter().filter(|p| p["mode"] == "bound").collect();
    assert_eq!(bound.len(), 2);
    for b in &bound {
        assert!(b["tokens_per_s"].as_f64().unwrap() > 0.0 && b["misses_per_step"].as_f64().unwrap() > 0.0, "{b}");
    }
    let h = &json["headline"][0];
    assert_eq!(h["context"], 600);
    let (cap, eff) = (h["capacity"].as_f64().unwrap(), h["efficiency"].as_f64().unwrap());
    assert!(cap > 0.0 && eff > 0.0, "{h}");
    let hs3 = points.iter().find(|p| p["mode"] == "hisparse" && p["concurrency"] == h["at_concurrency"]).unwrap();
    let b3 = bound.iter().find(|p| p["concurrency"] == h["at_concurrency"]).unwrap();
    let want = hs3["tokens_per_s"].as_f64().unwrap() / b3["tokens_per_s"].as_f64().unwrap();
    assert!((eff - want).abs() < 1e-9, "{eff} vs {want}");
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().filter(|l| l.split(',').nth(2) == Some("bound")).count(), 2, "{csv}");
    let svg = std::fs::read_to_string(out.join("throughput.svg")).unwrap();
    assert!(svg.contains("bound (no swap-in copies; timing only)"), "the plot names the bound");
    // One engine only.
    let o = hisparse(&[&args[..], &["--bound", "--gpus", "2", "--out", dir.join("x").to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--gpus") && err.contains("--bound") && err.lines().count() == 1, "{err}");
    // A run without copies says so in its table and its JSON, for the hisparse mode only.
    let run_out = dir.join("run");
    let o = hisparse(&argv!(
        "run --backend cpu --concurrency 2 --context 600 --output 4 --miss-fill no-copies --miss-fill-max-batch 1 --out",
        run_out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("hisparse: timing only"), "the run's table");
    let runs: serde_json::Value = serde_json::from_slice(&std::fs::read(run_out.join("run.json")).unwrap()).unwrap();
    let noted: Vec<bool> = runs.as_array().unwrap().iter().map(|r| r["timing_only"].is_string()).collect();
    assert_eq!(noted, [false, true], "resident, hisparse");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn trace_info_describes_a_scored_trace_from_its_selections_and_leaves_its_scores_unread() {
    let dir = tmp("info");
    let trace = dir.join("t.hstrace");
    let o = hisparse(&argv!(
        "trace synth --out",
        trace,
        "--requests 2 --layers 3 --steps 20 --prompt 3000 --top-k 128 --scores --score-margin 64"
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = hisparse(&argv!("trace info", trace));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let info = String::from_utf8_lossy(&o.stdout);
    // The header as stored, though the records were read without their scores.
    assert!(info.contains("top_k 128, 3 layers") && info.contains("scores: true, near-cut candidates: 64"), "{info}");
    assert!(info.contains("120 records, 6 streams (request x layer), steps 1..=20"), "{info}");
    // A trace whose score part is corrupt: described (its scores are not read), while a replay
    // that reads scores refuses it at the checksum.
    let bad =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-policy/tests/data/bad-traces/v3-score-checksum.hstrace");
    let o = hisparse(&argv!("trace info", bad));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("scores: true, near-cut candidates: 3"));
    let o = hisparse(&argv!("simulate --policies score --trace", bad, "--out", dir.join("s")));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("score checksum mismatch"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// LRU and FIFO without prefetch replay a binary trace a record at a time from its encoded
/// positions: the rows are those of a run whose Belady makes it decode the trace whole (with
/// and without scores in the file), and `trace info` describes it as from a pipe (read whole); a
/// record whose positions are faulty stops either with the reader's one-line error, and the run
/// leaves no output behind.
#[test]
fn simulate_replays_lru_and_fifo_from_encoded_positions_as_from_decoded_ones() {
    let dir = tmp("encoded");
    for (name, extra) in [("plain", ""), ("scored", " --scores --score-margin 64")] {
        let trace = dir.join(format!("{name}.hstrace"));
        let synth = format!("--requests 2 --layers 2 --steps 30 --prompt 3000 --top-k 256 --rho 0.8{extra}");
        let mut args = argv!("trace synth --out", trace);
        args.extend(synth.split_whitespace().map(Into::into));
        let o = hisparse(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rows = |policies: &str| {
            let out = dir.join(format!("{name}-{}", policies.replace(',', "-")));
            let o = hisparse(&argv!(
                "simulate --trace",
                trace,
                "--out",
                out,
                "--buffers 256,700 --warmup-steps 2 --policies",
                policies
            ));
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(out.join("simulate.json")).unwrap()).unwrap();
            json["results"].as_array().unwrap().clone()
        };
        // `trace info` from the file (positions kept encoded) and from a pipe (read whole).
        let piped = Command::new(program())
            .args(["trace", "info", "/dev/stdin"])
            .stdin(std::fs::File::open(&trace).unwrap())
            .output()
            .unwrap();
        let from_file = hisparse(&argv!("trace info", trace));
        let tail = |o: &Output| String::from_utf8_lossy(&o.stdout).lines().skip(1).collect::<Vec<_>>().join("\n");
        assert!(from_file.status.success() && piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
        assert_eq!(tail(&from_file), tail(&piped), "{name}");
        assert!(tail(&from_file).contains("120 records"), "{}", tail(&from_file));
        let streamed = rows("lru,fifo");
        let decoded = rows("lru,fifo,belady");
        // From a pipe: read whole, positions still encoded; the same rows.
        let out = dir.join(format!("{name}-piped"));
        let o = Command::new(program())
            .args(argv!(
                "simulate --trace /dev/stdin --out",
                out,
                "--buffers 256,700 --warmup-steps 2 --policies lru,fifo"
            ))
            .stdin(std::fs::File::open(&trace).unwrap())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("simulate.json")).unwrap()).unwrap();
        assert_eq!(json["results"].as_array().unwrap(), &streamed, "{name}: from a pipe");
        assert_eq!(streamed.len(), 5);
        for r in &streamed {
            assert!(decoded.contains(r), "{name}: {r} is not among the decoded run's rows");
        }
        assert!(streamed.iter().any(|r| r["misses"].as_u64().unwrap() > 100), "{name}: the trace misses");
    }
    let header = hisparse_policy::trace::raw::RawHeader {
        version: 1,
        flags: 0,
        top_k: 8,
        layers: 1,
        row_bytes: 656,
        margin: 0,
        layer_table: None,
    };
    let records: Vec<_> = (1..=5u32)
        .map(|step| hisparse_policy::trace::raw::RawRecord {
            step,
            request: 0,
            layer: 0,
            seq_len: 40 + step,
            count: 2,
            // Step 3's second position, 3 + 50 + 1 = 54, is past its 43 tokens.
            deltas: vec![3, if step == 3 { 50 } else { 10 }],
            scores: vec![],
            near: None,
            trailing: vec![],
        })
        .collect();
    let bad = dir.join("bad.hstrace");
    std::fs::write(&bad, hisparse_policy::trace::raw::encode(&header, &records, 5)).unwrap();
    let out = dir.join("bad-out");
    let o = hisparse(&argv!("simulate --trace", bad, "--out", out, "--policies lru --buffers 8"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("position 54 of a sequence of 43 tokens"), "{err}");
    assert!(!out.exists());
    let o = hisparse(&argv!("trace info", bad));
    let info_err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{info_err}");
    assert_eq!(info_err.trim().lines().count(), 1, "{info_err}");
    assert!(info_err.contains("position 54 of a sequence of 43 tokens"), "{info_err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--top-k` sets the emulated model's selection: past every request's length each layer attends
/// over every position and no selection runs (dense attention, the `llama-3.1-8b` sweeps'
/// dense baseline); below it, the indexer scores and each layer reads top-k rows.
#[test]
fn top_k_sets_the_selection_and_past_every_request_is_dense() {
    let stages = |k: usize| {
        let out = tmp(&format!("top-k-{k}"));
        let o = hisparse(&argv!(
            "run --backend cpu --preset smollm2-135m --context 200 --output 2 --concurrency 1 --mode resident --top-k",
            k.to_string(),
            "--out",
            out
        ));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
        let s = &json[0]["summary"];
        (s["stages"]["indexer"].as_f64().unwrap(), s["stages"]["top_k"].as_f64().unwrap(), s["hits"].as_u64().unwrap())
    };
    // 30 layers; the two steps see 201 and 202 positions.
    let (indexer, top_k, hits) = stages(4096);
    assert_eq!((indexer, top_k, hits), (0.0, 0.0, 30 * (201 + 202)));
    let (indexer, top_k, hits) = stages(64);
    assert!(indexer > 0.0 && top_k > 0.0, "{indexer} {top_k}");
    assert_eq!(hits, 30 * 64 * 2);
}

/// Dense attention keeps no index keys: the same device budget holds more resident requests
/// with a top-k past every request (KV rows alone) than with a real selection (rows and keys).
#[test]
fn dense_attention_holds_more_requests_in_the_same_budget() {
    let running = |k: usize| {
        let out = tmp(&format!("dense-capacity-{k}"));
        let o = hisparse(&argv!(
            "sweep --backend cpu --preset smollm2-135m --context 256 --concurrency 64 --mode resident",
            "--device-memory 0.3GB --warmup 1 --window 1 --windows 3 --top-k",
            k.to_string(),
            "--out",
            out
        ));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
        std::fs::remove_dir_all(&out).unwrap();
        let dense = json["hierarchy"].as_str().unwrap().starts_with("dense attention: top-k 4096 covers every request");
        assert_eq!(dense, k == 4096, "{}", json["hierarchy"]);
        json["points"][0]["running"].as_f64().unwrap()
    };
    // 30 layers of 3 KV heads of 64: 23,040 B of bf16 rows a token, beside 5,760 B of fp8 keys;
    // 300 MB in pages of 64 positions, 5 pages a request: 203 pages of rows alone (40
    // requests), 162 of rows and keys (32).
    let (dense, sparse) = (running(4096), running(64));
    assert_eq!((dense, sparse), (40.0, 32.0));
}

/// `check-kernels --only` names a source it does not know, with the known ones, before looking
/// for NVRTC.
#[test]
fn check_kernels_refuses_an_unknown_source_by_name() {
    let o = hisparse(&argv!("check-kernels --only rows,nope"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--only") && err.contains("nope") && err.contains("gqa_attention"), "{err}");
}

#[test]
fn every_preset_is_listed_where_a_preset_is_chosen() {
    for cmd in ["sweep", "run", "selfcheck"] {
        let o = hisparse(&[cmd, "--help"]);
        let help = String::from_utf8_lossy(&o.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
        for p in hisparse_memory::Preset::ALL {
            assert!(help.contains(p.name()), "{cmd} --help does not name {p}: {help}");
        }
    }
}

/// `--mode all` runs hybrid placement beside resident and hisparse: `run` says what it moved,
/// `sweep` tables it against both, its points in the JSON and the plot.
#[test]
fn hybrid_placement_runs_beside_the_other_modes() {
    let dir = tmp("hybrid");
    let (run, sweep) = (dir.join("run"), dir.join("sweep"));
    let o = hisparse(&argv!(
        "run --backend cpu --preset cpu-small --context 1024,2048 --device-memory 12MiB --mode all",
        "--concurrency 6 --output 8 --demotion largest --out",
        run
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let moved = text.lines().find(|l| l.starts_with("hybrid: ") && l.contains("demotions")).expect("placement line");
    assert!(!moved.starts_with("hybrid: 0 demotions"), "6 requests in 12 MiB demote some: {text}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    let text_runs = json.to_string();
    assert!(text_runs.contains("\"bytes_demoted\"") && text_runs.contains("\"hybrid\""), "{text_runs:.400}");
    let o = hisparse(&argv!(
        "sweep --backend cpu --preset cpu-small --context 1024,2048 --device-memory 12MiB --mode all",
        "--concurrency 1,4 --warmup 1 --window 2 --out",
        sweep
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("hybrid placement") && table.contains("vs better"), "{table}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(sweep.join("sweep.json")).unwrap()).unwrap();
    let hybrid = json["points"].as_array().unwrap().iter().filter(|p| p["mode"] == "hybrid").count();
    assert_eq!(hybrid, 4, "2 contexts x 2 levels");
    assert!(std::fs::read_to_string(sweep.join("throughput.svg")).unwrap().contains("hybrid, context 1024"));
    // Hybrid alone: its own table, no empty one of the other two modes.
    let o = hisparse(&argv!(
        "sweep --backend cpu --preset cpu-small --context 1024 --device-memory 12MiB --mode hybrid",
        "--concurrency 1,4 --warmup 1 --window 2 --out",
        dir.join("hybrid-only")
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("hybrid placement") && !table.contains("hs miss %"), "{table}");
    let o = hisparse(&argv!("run --backend cpu --mode hybrid --demotion newest --out", dir.join("bad")));
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--demotion") && e.contains("oldest or largest"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
