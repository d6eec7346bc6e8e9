//! The trace format: binary and JSON-lines round trips, a corpus of bad files (each must fail
//! with its expected error and byte offset), and random or mutated input that must never panic.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;

use hisparse_policy::trace::{TraceHeader, TraceReader, TraceRecord, TraceWriter, jsonl, raw, read_trace};
use hisparse_policy::{PolicyError, SimConfig, simulate};
use proptest::prelude::*;

fn header(scores: bool) -> TraceHeader {
    TraceHeader { top_k: 8, layers: 3, row_bytes: 656, has_scores: scores }
}

fn records(scores: bool) -> Vec<TraceRecord> {
    (0..20u32)
        .map(|i| {
            let seq_len = 1000 + i * 37;
            let selected: Vec<u32> =
                (0..(i % 8 + 1)).map(|j| (j * j * 131 + i) % (seq_len / 8) + j * (seq_len / 8)).collect();
            let scores = scores.then(|| selected.iter().map(|&p| p as f32 * 0.5 - 3.0).collect());
            TraceRecord { step: i / 3 + 1, request: u64::from(i % 3) << 40, layer: i % 3, seq_len, selected, scores }
        })
        .collect()
}

fn binary(scores: bool) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), header(scores)).unwrap();
    for r in records(scores) {
        w.write(&r).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn binary_round_trip_with_and_without_scores() {
    for scores in [false, true] {
        let bytes = binary(scores);
        let mut r = TraceReader::new(bytes.as_slice()).unwrap();
        assert_eq!(*r.header(), header(scores));
        let back: Vec<TraceRecord> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(back, records(scores));
        assert_eq!(r.offset(), bytes.len() as u64);
    }
    // Compact: under 2 bytes per selected position without scores.
    let positions: usize = records(false).iter().map(|r| r.selected.len()).sum();
    assert!(binary(false).len() < 32 + 13 + 20 * 33 + 2 * positions, "{} bytes", binary(false).len());
}

#[test]
fn jsonl_round_trip_and_auto_detection() {
    let mut text = Vec::new();
    jsonl::write(&mut text, &header(true), &records(true)).unwrap();
    let dir = std::env::temp_dir();
    let (pj, pb) = (
        dir.join(format!("hs-trace-{}.jsonl", std::process::id())),
        dir.join(format!("hs-trace-{}.hstrace", std::process::id())),
    );
    std::fs::write(&pj, &text).unwrap();
    std::fs::write(&pb, binary(true)).unwrap();
    for p in [&pj, &pb] {
        let (h, recs) = read_trace(p).unwrap();
        assert_eq!((h, recs), (header(true), records(true)), "{}", p.display());
        std::fs::remove_file(p).unwrap();
    }
    let hand = "{\"hisparse_trace\": 1, \"top_k\": 2, \"layers\": 1}\n# a comment\n\n{\"step\": 1, \"request\": 0, \"layer\": 0, \"seq_len\": 9, \"selected\": [2, 8]}\n";
    let (h, recs) = jsonl::read(hand.as_bytes()).unwrap();
    assert_eq!((h.top_k, recs.len(), recs[0].selected.clone()), (2, 1, vec![2, 8]));
    let bad = hand.replace("[2, 8]", "[8, 2]");
    let e = jsonl::read(bad.as_bytes()).unwrap_err();
    assert!(matches!(e, PolicyError::Trace { offset, .. } if offset as usize == hand.rfind("{\"step").unwrap()), "{e}");
    let e = jsonl::read(hand.replace("\"hisparse_trace\": 1", "\"hisparse_trace\": 2").as_bytes()).unwrap_err();
    assert!(e.to_string().contains("unsupported version"), "{e}");
}

#[test]
fn the_writer_refuses_bad_records() {
    let mut w = TraceWriter::new(Vec::new(), header(false)).unwrap();
    let good = records(false)[3].clone();
    for bad in [
        TraceRecord { layer: 3, ..good.clone() },
        TraceRecord { selected: vec![5, 5], ..good.clone() },
        TraceRecord { selected: vec![good.seq_len], ..good.clone() },
        TraceRecord { selected: (0..9).collect(), ..good.clone() },
        TraceRecord { scores: Some(vec![1.0]), ..good.clone() },
    ] {
        assert!(matches!(w.write(&bad), Err(PolicyError::Trace { .. })), "{bad:?}");
    }
    assert_eq!(w.records(), 0);
}

/// Each bad file of the corpus and the error it must give: (file, what, offset).
const CORPUS: &[(&str, &str, u64)] = &[
    ("empty.hstrace", "truncated", 0),
    ("short-header.hstrace", "truncated", 20),
    ("bad-magic.hstrace", "not a trace", 0),
    ("version-2.hstrace", "unsupported version", 8),
    ("header-checksum.hstrace", "corrupt header", 28),
    ("unknown-flag.hstrace", "unsupported flags", 10),
    ("truncated-record.hstrace", "truncated", 0),
    ("record-checksum.hstrace", "corrupt record", 0),
    ("unknown-tag.hstrace", "corrupt record", 0),
    ("huge-length.hstrace", "corrupt record", 0),
    ("position-beyond-sequence.hstrace", "corrupt record", 0),
    ("no-end-marker.hstrace", "truncated", 0),
    ("wrong-record-count.hstrace", "corrupt end marker", 0),
    ("trailing-bytes.hstrace", "trailing bytes", 0),
];

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad-traces")
}

/// Builds the corpus (run with HISPARSE_REGEN_TRACE_CORPUS=1 to rewrite the files). Offsets 0
/// in `CORPUS` stand for offsets computed here from the good file's structure.
fn build_corpus() -> Vec<(&'static str, Vec<u8>, u64)> {
    let good = binary(false);
    let first_len = u32::from_le_bytes(good[33..37].try_into().unwrap()) as usize;
    let second = 32 + 5 + first_len;
    let end = good.len() - 13;
    let mut out = Vec::new();
    let mut push = |name, bytes: Vec<u8>, at| out.push((name, bytes, at));
    push("empty.hstrace", vec![], 0);
    push("short-header.hstrace", good[..20].to_vec(), 20);
    let mut b = good.clone();
    b[..8].copy_from_slice(b"NOTATRCE");
    push("bad-magic.hstrace", b, 0);
    let mut b = good.clone();
    b[8] = 2;
    push("version-2.hstrace", b, 8);
    let mut b = good.clone();
    b[16] ^= 1;
    push("header-checksum.hstrace", b, 28);
    let mut b = good.clone();
    b[10] = 2;
    let c = crc32fast::hash(&b[..28]);
    b[28..32].copy_from_slice(&c.to_le_bytes());
    push("unknown-flag.hstrace", b, 10);
    push("truncated-record.hstrace", good[..second + 20].to_vec(), (second + 20) as u64);
    let mut b = good.clone();
    b[second + 30] ^= 0x40;
    push("record-checksum.hstrace", b, second as u64);
    let mut b = good.clone();
    b[second] = 0x07;
    push("unknown-tag.hstrace", b, second as u64);
    let mut b = good.clone();
    b[second + 1..second + 5].copy_from_slice(&u32::MAX.to_le_bytes());
    push("huge-length.hstrace", b, (second + 1) as u64);
    // A record with a right checksum whose last position is beyond its sequence.
    let mut bytes = good[..second].to_vec();
    let mut body = Vec::new();
    body.extend_from_slice(&2u32.to_le_bytes()); // step
    body.extend_from_slice(&7u64.to_le_bytes()); // request
    body.extend_from_slice(&0u32.to_le_bytes()); // layer
    body.extend_from_slice(&1000u32.to_le_bytes()); // seq_len
    body.extend_from_slice(&2u32.to_le_bytes()); // count
    body.extend_from_slice(&[0xDE, 0x07, 0x09]); // 990, then 990 + 9 + 1 = 1000
    let c = crc32fast::hash(&body);
    body.extend_from_slice(&c.to_le_bytes());
    bytes.push(0x01);
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    push("position-beyond-sequence.hstrace", bytes, second as u64);
    push("no-end-marker.hstrace", good[..end].to_vec(), end as u64);
    let mut b = good.clone();
    b[end + 1] ^= 1;
    let c = crc32fast::hash(&b[end + 1..end + 9]);
    b[end + 9..end + 13].copy_from_slice(&c.to_le_bytes());
    push("wrong-record-count.hstrace", b, (end + 1) as u64);
    let mut b = good.clone();
    b.extend_from_slice(b"junk");
    push("trailing-bytes.hstrace", b, (end + 13) as u64);
    out
}

fn first_error(bytes: &[u8]) -> Option<PolicyError> {
    match TraceReader::new(bytes) {
        Err(e) => Some(e),
        Ok(r) => r.filter_map(Result::err).next(),
    }
}

#[test]
fn every_bad_file_of_the_corpus_fails_with_its_offset() {
    let built = build_corpus();
    if std::env::var_os("HISPARSE_REGEN_TRACE_CORPUS").is_some() {
        for (name, bytes, _) in &built {
            std::fs::write(corpus_dir().join(name), bytes).unwrap();
        }
    }
    assert_eq!(built.len(), CORPUS.len());
    for ((name, what, _), (bname, bbytes, at)) in CORPUS.iter().zip(&built) {
        assert_eq!(name, bname);
        let bytes = std::fs::read(corpus_dir().join(name)).unwrap();
        assert_eq!(&bytes, bbytes, "{name}: the committed file differs from the generator (regenerate the corpus)");
        match first_error(&bytes) {
            Some(PolicyError::Trace { what: w, offset, message }) => {
                assert_eq!((w, offset), (*what, *at), "{name}: {message}");
            }
            other => panic!("{name}: expected a trace error, got {other:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = first_error(&bytes);
        let mut with_magic = b"HSPTRACE\x01\x00".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = first_error(&with_magic);
        let _ = jsonl::read(bytes.as_slice());
    }

    #[test]
    fn mutated_traces_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<prop::sample::Index>()) {
        let mut b = binary(true);
        for (i, v) in flips {
            let at = i.index(b.len());
            b[at] = v;
        }
        let n = cut.index(b.len() + 1);
        let _ = first_error(&b[..n]);
        let _ = first_error(&b);
    }
}

/// Raw records, mostly valid, often not: absurd sequence lengths, counts that disagree with the
/// positions, layers out of range, huge deltas, missing or extra scores, trailing bytes.
fn raw_record(layers: u32) -> impl Strategy<Value = (raw::RawRecord, bool)> {
    let deltas = prop::collection::vec(prop_oneof![12 => 0u32..40, 1 => any::<u32>()], 0..12);
    let with_seq = deltas.prop_flat_map(|d| {
        let last = raw::positions(&d).and_then(|p| p.last().copied()).unwrap_or(0);
        // Mostly just past the last position (valid), sometimes before it, 0, or absurd.
        let seq = prop_oneof![
            8 => (1u32..30).prop_map(move |x| last.saturating_add(x)),
            1 => 0u32..=last,
            1 => Just(0u32),
            1 => Just(u32::MAX),
        ];
        (Just(d), seq)
    });
    let layer = prop_oneof![8 => 0u32..layers, 1 => layers..layers + 3];
    let count = prop_oneof![12 => Just(None), 1 => any::<u32>().prop_map(Some)];
    let bad_scores = prop_oneof![12 => Just(false), 1 => Just(true)];
    let trailing = prop_oneof![12 => Just(Vec::new()), 1 => prop::collection::vec(any::<u8>(), 1..3)];
    (1u32..6, 0u64..3, layer, with_seq, count, bad_scores, trailing).prop_map(
        |(step, request, layer, (deltas, seq_len), count, bad_scores, trailing)| {
            let n = deltas.len();
            let r = raw::RawRecord {
                step,
                request,
                layer,
                seq_len,
                count: count.unwrap_or(n as u32),
                scores: vec![0.5; if bad_scores { n + 1 } else { n }],
                deltas,
                trailing,
            };
            (r, bad_scores)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Past the checksums: the reader hands out exactly the records that are valid (decoded
    /// positions equal the deltas' prefix sums), refuses the others with an error, and never
    /// panics; the simulator then replays whatever was read without panicking, and its counts
    /// add up.
    #[test]
    fn checksummed_hostile_traces_are_read_exactly_or_refused(
        recs in prop::collection::vec(raw_record(3), 0..6),
        top_k in prop_oneof![8 => 4u32..16, 1 => Just(0u32), 1 => Just(u32::MAX)],
        wrong_end in prop_oneof![8 => Just(false), 1 => Just(true)],
    ) {
        let header = raw::RawHeader { version: 1, flags: 1, top_k, layers: 3, row_bytes: 656 };
        let records: Vec<raw::RawRecord> = recs.iter().map(|(r, _)| r.clone()).collect();
        let end = records.len() as u64 + u64::from(wrong_end);
        let bytes = raw::encode(&header, &records, end);
        let got: Result<Vec<TraceRecord>, PolicyError> = TraceReader::new(bytes.as_slice()).and_then(|r| r.collect());
        // What a correct reader must decide, computed independently of it.
        let header_ok = (1..=hisparse_policy::trace::MAX_TOP_K).contains(&top_k);
        let valid = |(r, bad_scores): &(raw::RawRecord, bool)| {
            let Some(pos) = raw::positions(&r.deltas) else { return false };
            r.count as usize == r.deltas.len()
                && !bad_scores
                && r.trailing.is_empty()
                && r.layer < 3
                && r.seq_len >= 1
                && r.deltas.len() <= top_k as usize
                && pos.last().is_none_or(|&p| p < r.seq_len)
        };
        let all_valid = header_ok && !wrong_end && recs.iter().all(valid);
        match got {
            Ok(read) => {
                prop_assert!(all_valid, "a trace with an invalid part was read: {recs:?}");
                prop_assert_eq!(read.len(), records.len());
                for (a, b) in read.iter().zip(&records) {
                    prop_assert_eq!(&a.selected, &raw::positions(&b.deltas).unwrap());
                    prop_assert_eq!((a.step, a.request, a.layer, a.seq_len), (b.step, b.request, b.layer, b.seq_len));
                }
                let h = TraceHeader { top_k, layers: 3, row_bytes: 656, has_scores: true };
                if !read.is_empty() && hisparse_policy::memory_estimate(&read).is_some_and(|b| b < 64 << 20) {
                    let cfg = SimConfig { policies: vec!["lru".into(), "belady".into()], buffer_sizes: vec![top_k as usize, 2 * top_k as usize], seed: 0, row_bytes: 0 };
                    if let Ok(rep) = simulate(&h, &read, &cfg, &|_| {}) {
                        for x in &rep.results {
                            prop_assert!(x.misses <= x.selected && (0.0..=1.0).contains(&x.miss_ratio), "{x:?}");
                        }
                    }
                }
            }
            Err(e) => {
                prop_assert!(!all_valid, "a valid trace was refused: {e}; {recs:?}");
                prop_assert!(matches!(e, PolicyError::Trace { .. }), "{e}");
            }
        }
    }
}

#[test]
fn the_hostile_trace_property_reads_a_fair_share_of_valid_traces() {
    // A generator that never produced a readable trace would make the property check nothing.
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (prop::collection::vec(raw_record(3), 1..6), 4u32..16);
    let mut ok = 0;
    for _ in 0..300 {
        let (recs, top_k) = strategy.new_tree(&mut runner).unwrap().current();
        let records: Vec<raw::RawRecord> = recs.iter().map(|(r, _)| r.clone()).collect();
        let header = raw::RawHeader { version: 1, flags: 1, top_k, layers: 3, row_bytes: 656 };
        let bytes = raw::encode(&header, &records, records.len() as u64);
        ok += usize::from(TraceReader::new(bytes.as_slice()).and_then(|r| r.collect::<Result<Vec<_>, _>>()).is_ok());
    }
    assert!((30..270).contains(&ok), "{ok} of 300 hostile traces were readable: the mix checks too little");
}
