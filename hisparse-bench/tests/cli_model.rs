//! The real-model commands on a tiny GGUF file the test writes (random weights, its own
//! vocabulary): `generate` streams text and reports hits and misses, `eval` writes its table,
//! JSON, CSV and plot and finds hisparse bit-identical to sparse resident; bad flags are named.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::{Command, Output};

use common::{argv, program};

fn hisparse(args: &[impl AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(program()).args(args).output().unwrap()
}

fn tiny(name: &str) -> (std::path::PathBuf, String) {
    let d = std::env::temp_dir().join(format!("hisparse-cli-model-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let g = d.join("tiny.gguf");
    hisparse_model::tiny::write_tiny_gguf(&g, 9).unwrap();
    let gs = g.to_str().unwrap().to_string();
    (d, gs)
}

#[test]
fn generate_streams_text_and_counts_misses() {
    let (d, g) = tiny("gen");
    let o = hisparse(&argv!(
        "generate --gguf",
        g,
        "--prompt",
        ("the theory of the thing"),
        "--raw --max-tokens 40 --top-k 8 --device-buffer-size 12 --show-misses --temperature 0.8 --seed 3"
    ));
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.trim().len() > 5, "{out:?}");
    // Past the buffer (12 slots), steps miss.
    assert!(err.lines().any(|l| l.contains("misses]") && !l.contains(" 0 misses")), "{err}");
    // The same seed gives the same text; greedy gives its own.
    let again = hisparse(&argv!(
        "generate --gguf",
        g,
        "--prompt",
        ("the theory of the thing"),
        "--raw --max-tokens 40 --top-k 8 --device-buffer-size 12 --temperature 0.8 --seed 3"
    ));
    assert_eq!(again.stdout, o.stdout);
    let bad = hisparse(&["generate", "--gguf", &g, "--prompt", "x", "--temperature", "-1"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--temperature"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn eval_writes_its_outputs_and_finds_hisparse_identical() {
    let (d, g) = tiny("eval");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let out = d.join("eval");
    let o = hisparse(&argv!(
        "eval --gguf",
        g,
        "--text",
        text,
        "--contexts 40,120 --top-k 8,16 --decode 12 --windows 2 --out",
        out
    ));
    let (stdout, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(stdout.lines().filter(|l| l.contains("hisparse") && l.contains("yes")).count(), 4, "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("eval.json")).unwrap()).unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 2 * (1 + 2 * 2));
    assert!(rows.iter().all(|r| r["perplexity"].as_f64().unwrap() > 1.0));
    // Sparse rows spend time selecting; dense attention selects nothing.
    for r in rows {
        let (dense, ms) = (r["attention"] == "dense", r["select_ms"].as_f64().unwrap());
        assert!(if dense { ms == 0.0 } else { ms > 0.0 }, "{r}");
    }
    assert!(std::fs::read_to_string(out.join("eval.svg")).unwrap().contains("<svg"));
    assert_eq!(std::fs::read_to_string(out.join("eval.csv")).unwrap().lines().count(), 1 + rows.len());
    // More windows than the machine's memory holds are refused by name before any prefill.
    let huge = hisparse(&["eval", "--gguf", &g, "--text", text, "--contexts", "40", "--windows", "100000000000"]);
    assert_eq!(huge.status.code(), Some(2), "{}", String::from_utf8_lossy(&huge.stderr));
    assert!(String::from_utf8_lossy(&huge.stderr).contains("--windows"));
    // A context beyond the text is refused by name before any decoding.
    let bad = hisparse(&["eval", "--gguf", &g, "--text", text, "--contexts", "100000"]);
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--contexts"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn eval_records_the_real_selections_for_the_simulator() {
    let (d, g) = tiny("trace");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let trace = d.join("real.hstrace");
    let eval_out = d.join("eval");
    let o = hisparse(&argv!(
        "eval --gguf",
        g,
        "--text",
        text,
        "--contexts 100 --top-k 8 --buffer-factor 2 --decode 40 --record-trace",
        trace,
        "--out",
        eval_out
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(eval_out.join("eval.json")).unwrap()).unwrap();
    let hs = json.as_array().unwrap().iter().find(|r| r["attention"] == "hisparse").unwrap().clone();
    let sim_out = d.join("sim");
    let s = hisparse(&argv!("simulate --trace", trace, "--policies lru --buffers 16 --out", sim_out));
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let sim: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sim_out.join("simulate.json")).unwrap()).unwrap();
    let lru = sim["results"].as_array().unwrap().iter().find(|r| r["policy"] == "lru").unwrap().clone();
    assert_eq!((lru["hits"].clone(), lru["misses"].clone()), (hs["hits"].clone(), hs["misses"].clone()));
    assert!(hs["misses"].as_u64().unwrap() > 50, "{hs}");
    // The file is not replaced without --overwrite; two contexts cannot share one trace.
    let again =
        hisparse(&argv!("eval --gguf", g, "--text", text, "--contexts 100 --top-k 8 --decode 4 --record-trace", trace));
    assert_eq!(again.status.code(), Some(2), "{}", String::from_utf8_lossy(&again.stderr));
    let two =
        hisparse(&argv!("eval --gguf", g, "--text", text, "--contexts 60,100 --top-k 8 --record-trace", d.join("x")));
    assert!(String::from_utf8_lossy(&two.stderr).contains("--record-trace"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn the_oracle_can_combine_by_max_and_keep_sinks_and_a_window() {
    let (d, g) = tiny("oracle");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let base = ["eval", "--gguf", &g, "--text", text, "--contexts", "120", "--top-k", "16", "--decode", "16"];
    let run = |extra: &[&str]| -> String {
        let o = hisparse(&[&base[..], extra].concat());
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).lines().find(|l| l.contains("hisparse")).unwrap().to_string()
    };
    let (sum, max, kept) = (run(&[]), run(&["--combine", "max"]), run(&["--sink", "4", "--window", "8"]));
    // Each selects otherwise (other hits and misses), and each stays bit-identical to resident.
    assert!(sum != max && sum != kept, "{sum}\n{max}\n{kept}");
    assert!([&sum, &max, &kept].iter().all(|l| l.contains("yes")));
    let bad = hisparse(&[&base[..], &["--sink", "10", "--window", "6"]].concat());
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--window"));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn the_index_format_is_chosen_by_flag_and_refused_where_it_cannot_be_read() {
    let (d, g) = tiny("index-format");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let base = ["eval", "--gguf", &g, "--text", text, "--contexts", "120", "--top-k", "16", "--decode", "16"];
    let run = |extra: &[&str]| -> (String, String) {
        let o = hisparse(&[&base[..], extra].concat());
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let hs = out.lines().find(|l| l.contains("hisparse")).unwrap().to_string();
        (out.lines().next().unwrap().to_string(), hs)
    };
    let ((head8, fp8), (head4, int4)) = (run(&[]), run(&["--index-format", "int4:16"]));
    // The tiny model's keys: 2 KV heads of 16 values, fp8 32 + 4 B, int4 16 + 2 x 4 B.
    assert!(head8.contains("fp8: 36 B per token and layer"), "{head8}");
    assert!(head4.contains("int4:16: 24 B per token and layer"), "{head4}");
    assert!(fp8.contains("yes") && int4.contains("yes"), "{fp8}\n{int4}");
    assert!(fp8 != int4, "4-bit keys select otherwise: {fp8}\n{int4}");
    // 2-bit keys: 32 values in 8 B of codes and two scales.
    let (head2, int2) = run(&["--index-format", "int2:16"]);
    assert!(head2.contains("int2:16: 16 B per token and layer"), "{head2}");
    assert!(int2.contains("yes"), "{int2}");
    // Page summaries of 8 positions: 32 bf16 minima and maxima, 128 B for 8 positions.
    let (head_pages, pages) = run(&["--index-format", "pages:8"]);
    assert!(head_pages.contains("pages:8: 16 B per token and layer"), "{head_pages}");
    assert!(pages.contains("yes") && pages != fp8, "{pages}\n{fp8}");
    // Top-channel keys, 4 of every 16 values: 8 places, 8 codes and a scale.
    let (head_channels, top) = run(&["--index-format", "channels:4:16"]);
    assert!(head_channels.contains("channels:4:16: 20 B per token and layer"), "{head_channels}");
    assert!(top.contains("yes"), "{top}");
    for (args, flag) in [
        (vec!["--index-format", "int4:5"], "--index-format"),
        (vec!["--index-format", "int8"], "--index-format"),
        (vec!["--index-format", "pages:3"], "--index-format"),
        (vec!["--index-format", "channels:4:5"], "--index-format"),
    ] {
        let bad = hisparse(&[&base[..], &args].concat());
        assert_eq!(bad.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains(flag),
            "{args:?}: {}",
            String::from_utf8_lossy(&bad.stderr)
        );
    }
    // An MLA preset selects with its lightning indexer, which reads fp8 keys only.
    let mla = hisparse(&["run", "--preset", "cpu-small", "--index-format", "int4"]);
    assert_eq!(mla.status.code(), Some(2));
    let e = String::from_utf8_lossy(&mla.stderr);
    assert!(e.contains("--index-format") && e.contains("lightning"), "{e}");
    std::fs::remove_dir_all(d).unwrap();
}

/// `eval --index-format` with several formats: one prefill, each format's rows what an eval of
/// that format alone gives, the table naming each row's keys, and a plot of perplexity against
/// the index's bytes; a command that decodes with one format refuses a list by flag.
#[test]
fn eval_compares_index_formats_in_one_run() {
    let (d, g) = tiny("index-formats");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let base = ["eval", "--gguf", &g, "--text", text, "--contexts", "120", "--top-k", "16", "--decode", "16"];
    let out = d.join("out");
    let o = hisparse(&[&base[..], &["--index-format", "fp8,int4:16,int2:16", "--out", out.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        table.starts_with("sparse runs select by index keys of fp8 (36 B), int4:16 (24 B), int2:16 (16 B)"),
        "{table}"
    );
    let sparse: Vec<&str> =
        table.lines().filter(|l| l.trim_start().starts_with("120") && !l.contains("dense")).collect();
    assert_eq!(sparse.len(), 6, "{table}");
    for f in ["fp8", "int4:16", "int2:16"] {
        assert_eq!(sparse.iter().filter(|l| l.ends_with(f)).count(), 2, "{f}: {table}");
    }
    assert!(out.join("eval-bytes.svg").is_file() && out.join("eval.svg").is_file());
    // Each format's rows equal an eval of that format alone (perplexity and agreement).
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("eval.json")).unwrap()).unwrap();
    let alone = hisparse(&[&base[..], &["--index-format", "int2:16"]].concat());
    let alone = String::from_utf8_lossy(&alone.stdout).to_string();
    let hs2 = alone.lines().find(|l| l.contains("hisparse")).unwrap();
    let row2 = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["attention"] == "hisparse" && r["index_format"] == "int2:16")
        .unwrap();
    assert!(hs2.contains(&format!("{:.3}", row2["perplexity"].as_f64().unwrap())), "{hs2} against {row2}");
    let twice = hisparse(&[&base[..], &["--index-format", "int4:16,fp8,int4:16"]].concat());
    let e = String::from_utf8_lossy(&twice.stderr);
    assert!(e.contains("--index-format = int4:16") && e.contains("twice"), "{e}");
    let e = hisparse(&["generate", "--gguf", &g, "--index-format", "fp8,int2", "--prompt", "hi"]);
    let e = String::from_utf8_lossy(&e.stderr);
    assert!(e.contains("--index-format") && e.contains("one index format"), "{e}");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn run_serves_a_model_within_a_device_budget_and_records_scores() {
    let (d, g) = tiny("run");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let (out, trace) = (d.join("run"), d.join("run.hstrace"));
    let o = hisparse(&argv!(
        "run --gguf",
        g,
        "--text",
        text,
        "--context 100 --output 6 --concurrency 6 --top-k 8 --device-memory 100KiB --record-trace",
        trace,
        "--score-margin 4 --out",
        out
    ));
    let (stdout, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("run.json")).unwrap()).unwrap();
    let runs = json.as_array().unwrap();
    let most = |mode: &str| {
        let r = runs.iter().find(|r| r["mode"] == mode).unwrap();
        assert_eq!(r["summary"]["tokens"], 36, "{mode}: {r}");
        r["summary"]["max_running"].as_u64().unwrap()
    };
    // The budget holds fewer whole requests than hot buffers and keys: resident queues more.
    let (resident, hs) = (most("resident"), most("hisparse"));
    assert!(resident >= 1 && hs > resident, "{resident} vs {hs}\n{stdout}");
    // The trace carries scores: next-step prefetch replays from it.
    let s = hisparse(&argv!(
        "simulate --trace",
        trace,
        "--policies lru --buffers 16 --prefetchers next-step --out",
        d.join("sim")
    ));
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    // A budget below one whole request: resident rejects every request, hisparse serves them all
    // (the two modes are compared on the requests both finished); resident alone is refused
    // before any decoding (a run that admits nothing).
    let small = d.join("small");
    let o = hisparse(&argv!(
        "run --gguf",
        g,
        "--text",
        text,
        "--context 100 --output 4 --concurrency 2 --top-k 8 --device-memory 24KiB --out",
        small
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(small.join("run.json")).unwrap()).unwrap();
    let by = |mode: &str| json.as_array().unwrap().iter().find(|r| r["mode"] == mode).unwrap().clone();
    assert_eq!(by("resident")["rejected"].as_array().unwrap().len(), 2, "{}", by("resident"));
    assert_eq!(by("hisparse")["summary"]["tokens"], 8, "{}", by("hisparse"));
    let alone = hisparse(&argv!(
        "run --gguf",
        g,
        "--text",
        text,
        "--context 100 --output 4 --concurrency 2 --top-k 8 --device-memory 24KiB --mode resident --out",
        d.join("alone")
    ));
    let err = String::from_utf8_lossy(&alone.stderr);
    assert_eq!(alone.status.code(), Some(2), "{err}");
    assert!(err.contains("--device-memory") && err.contains("holds no request"), "{err}");
    assert!(!d.join("alone").exists(), "refused before any output");
    // The engine's arrivals and waiting queue apply to a model's requests: Poisson arrivals
    // serve every request; a queue of 2 refuses the 4 requests submitted past it.
    let arrivals = d.join("arrivals");
    let o = hisparse(&argv!(
        "run --gguf",
        g,
        "--text",
        text,
        "--context 100 --output 3 --concurrency 4 --top-k 8 --arrival-rate 200 --mode hisparse --out",
        arrivals
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(arrivals.join("run.json")).unwrap()).unwrap();
    assert_eq!(json[0]["summary"]["tokens"], 12, "{json}");
    let queued = d.join("queued");
    let o = hisparse(&argv!(
        "run --gguf",
        g,
        "--text",
        text,
        "--context 100 --output 3 --concurrency 6 --top-k 8 --max-queued 2 --mode hisparse --out",
        queued
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(queued.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        (json[0]["summary"]["tokens"].as_u64(), json[0]["refused"].as_array().map(Vec::len)),
        (Some(6), Some(4))
    );
    // Flags a model cannot use are named.
    for (flag, extra) in [("--gpus", "2"), ("--context", "50,60"), ("--prompts", "100000000000")] {
        let o = hisparse(&["run", "--gguf", &g, "--text", text, flag, extra, "--out", d.join("x").to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{flag}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(flag), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = hisparse(&["run", "--gguf", &g, "--out", d.join("x").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--text"), "{}", String::from_utf8_lossy(&o.stderr));
    // The model's run records a binary trace, as the engine's does: a .jsonl name is refused.
    let o =
        hisparse(&argv!("run --gguf", g, "--text", text, "--record-trace", d.join("r.jsonl"), "--out", d.join("x")));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--record-trace"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!d.join("r.jsonl").exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn sweep_measures_a_model_at_each_level_within_a_device_budget() {
    let (d, g) = tiny("sweep");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let out = d.join("sweep");
    let o = hisparse(&argv!(
        "sweep --gguf",
        g,
        "--text",
        text,
        "--context 100 --concurrency 1,6 --top-k 8 --warmup 1 --window 2 --windows 3 --device-memory 100KiB --out",
        out
    ));
    let (stdout, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 2 * 2, "{stdout}");
    let running = |mode: &str, n: u64| {
        let p = points.iter().find(|p| p["mode"] == mode && p["concurrency"] == n).unwrap();
        assert!(p["tokens_per_s"].as_f64().unwrap() > 0.0, "{p}");
        p["running"].as_f64().unwrap()
    };
    assert_eq!((running("resident", 1), running("hisparse", 1)), (1.0, 1.0));
    // Within the budget six whole requests do not fit; their hot buffers and keys do.
    let (r, h) = (running("resident", 6), running("hisparse", 6));
    assert!(r < 6.0 && h > r, "{r} vs {h}");
    assert!(json["preset"] == "tiny", "{}", json["preset"]);
    assert!(!json["misses_by_buffer"].as_array().unwrap().is_empty());
    std::fs::remove_dir_all(d).unwrap();
}

/// `eval --backend cuda` runs the cache on the GPU (the engine path `gpu_model` tests there); on
/// a machine without a CUDA driver it is refused on one line naming the flag, nothing written.
#[test]
fn eval_on_cuda_without_a_driver_is_refused_by_name() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // with a driver the command would run: this test checks the refusal only
    }
    let (d, g) = tiny("eval-cuda");
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let out = d.join("out");
    let o = hisparse(&[
        "eval",
        "--gguf",
        &g,
        "--text",
        text,
        "--contexts",
        "120",
        "--top-k",
        "16",
        "--decode",
        "8",
        "--backend",
        "cuda",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--backend") && err.contains("cuda"), "{err}");
    assert!(!out.exists(), "nothing is written");
    std::fs::remove_dir_all(d).unwrap();
}
