//! The trace format: binary and JSON-lines round trips, a corpus of bad files (each must fail
//! with its expected error and byte offset), and random or mutated input that must never panic.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;

use hisparse_policy::trace::{
    TraceHeader, TraceReader, TraceRecord, TraceWriter, jsonl, parallel, raw, read_trace, read_trace_from,
};
use hisparse_policy::{BuiltinPolicy, BuiltinPrefetcher, PolicyError, SimConfig, simulate};
use proptest::prelude::*;

fn header(scores: bool) -> TraceHeader {
    TraceHeader { top_k: 8, layers: 3, row_bytes: 656, has_scores: scores, ..TraceHeader::default() }
}

/// A version-2 header: layer 1 shares layer 0's selection; up to 3 near-cut candidates.
fn header_v2() -> TraceHeader {
    TraceHeader { score_margin: 3, index_source: vec![0, 0, 2], ..header(true) }
}

/// `records(true)` with near-cut candidates (fewer than the margin on some).
fn records_v2() -> Vec<TraceRecord> {
    records(true)
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let near: Vec<(u32, f32)> = (0..r.seq_len)
                .rev()
                .filter(|p| r.selected.binary_search(p).is_err())
                .take(i % 4)
                .enumerate()
                .map(|(j, p)| (p, -1.0 - j as f32 * 0.25))
                .collect();
            TraceRecord { near: Some(near), ..r }
        })
        .collect()
}

/// `records_v2()` as version 2 wrote them (one checksum per record), as earlier builds did.
fn binary_v2() -> Vec<u8> {
    let h = header_v2();
    let raw_header = raw::RawHeader {
        version: 2,
        flags: 3,
        top_k: h.top_k,
        layers: h.layers,
        row_bytes: h.row_bytes,
        margin: h.score_margin,
        layer_table: Some(h.index_source.clone()),
    };
    let recs: Vec<raw::RawRecord> = records_v2()
        .into_iter()
        .map(|r| raw::RawRecord {
            step: r.step,
            request: r.request,
            layer: r.layer,
            seq_len: r.seq_len,
            count: r.selected.len() as u32,
            deltas: r
                .selected
                .iter()
                .enumerate()
                .map(|(i, &p)| if i == 0 { p } else { p - r.selected[i - 1] - 1 })
                .collect(),
            scores: r.scores.unwrap(),
            near: r.near.map(|n| (n.len() as u32, n)),
            trailing: vec![],
        })
        .collect();
    raw::encode(&raw_header, &recs, recs.len() as u64)
}

/// `records_v2()` as the writer writes them: version 3 (selection and score parts checksummed
/// apart).
fn binary_v3() -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), header_v2()).unwrap();
    for r in records_v2() {
        w.write(&r).unwrap();
    }
    w.finish().unwrap()
}

fn records(scores: bool) -> Vec<TraceRecord> {
    (0..20u32)
        .map(|i| {
            let seq_len = 1000 + i * 37;
            let selected: Vec<u32> =
                (0..(i % 8 + 1)).map(|j| (j * j * 131 + i) % (seq_len / 8) + j * (seq_len / 8)).collect();
            let scores = scores.then(|| selected.iter().map(|&p| p as f32 * 0.5 - 3.0).collect());
            TraceRecord {
                step: i / 3 + 1,
                request: u64::from(i % 3) << 40,
                layer: i % 3,
                seq_len,
                selected,
                scores,
                near: None,
            }
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
    // Version 1 without scores stays version 1 (byte 8); with scores, or near-cut candidates
    // and the layer structure, the writer writes version 3; version 2 (earlier builds) reads as
    // it always did, to the same records.
    assert_eq!(binary(false)[8], 1);
    assert_eq!(binary(true)[8], 3);
    assert_eq!(binary_v3()[8], 3);
    for bytes in [binary_v2(), binary_v3()] {
        let mut r = TraceReader::new(bytes.as_slice()).unwrap();
        assert_eq!(*r.header(), header_v2());
        let back: Vec<TraceRecord> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(back, records_v2());
        assert_eq!(r.offset(), bytes.len() as u64);
    }
    // A layer structure alone is version 2.
    let h = TraceHeader { index_source: vec![0, 0, 2], ..header(false) };
    assert_eq!(TraceWriter::new(Vec::new(), h).unwrap().finish().unwrap()[8], 2);
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
        let (h, recs) = read_trace(p, u64::MAX).unwrap();
        assert_eq!((h, recs), (header(true), records(true)), "{}", p.display());
        std::fs::remove_file(p).unwrap();
    }
    let hand = "{\"hisparse_trace\": 1, \"top_k\": 2, \"layers\": 1}\n# a comment\n\n{\"step\": 1, \"request\": 0, \"layer\": 0, \"seq_len\": 9, \"selected\": [2, 8]}\n";
    let (h, recs) = jsonl::read(hand.as_bytes()).unwrap();
    assert_eq!((h.top_k, recs.len(), recs[0].selected.clone()), (2, 1, vec![2, 8]));
    // Version 2 by hand, and a round trip of the version-2 records.
    let v2 = "{\"hisparse_trace\": 2, \"top_k\": 2, \"layers\": 2, \"score_margin\": 2, \"index_source\": [0, 0]}\n{\"step\": 1, \"request\": 0, \"layer\": 1, \"seq_len\": 20, \"selected\": [5, 19], \"near\": [[9, 0.5], [1, 0.25]]}\n";
    let (h, recs) = jsonl::read(v2.as_bytes()).unwrap();
    assert_eq!((h.source_of(1), recs[0].near.clone()), (0, Some(vec![(9, 0.5), (1, 0.25)])));
    let mut text = Vec::new();
    jsonl::write(&mut text, &header_v2(), &records_v2()).unwrap();
    assert_eq!(jsonl::read(text.as_slice()).unwrap(), (header_v2(), records_v2()));
    for (from, to, why) in [
        ("[[9, 0.5], [1, 0.25]]", "[[9, 0.25], [1, 0.5]]", "must not increase"),
        ("[[9, 0.5], [1, 0.25]]", "[[5, 0.5]]", "also selected"),
        ("[[9, 0.5], [1, 0.25]]", "[[9, 0.5], [9, 0.25]]", "repeated"),
        ("[[9, 0.5], [1, 0.25]]", "[[9, 0.5], [1, 0.25], [2, 0.1]]", "score_margin is 2"),
        ("\"index_source\": [0, 0]", "\"index_source\": [1, 1]", "not an earlier full layer"),
        ("\"hisparse_trace\": 2", "\"hisparse_trace\": 1", "need hisparse_trace = 2"),
    ] {
        let e = jsonl::read(v2.replace(from, to).as_bytes()).unwrap_err();
        assert!(e.to_string().contains(why), "{to}: {e}");
    }
    let bad = hand.replace("[2, 8]", "[8, 2]");
    let e = jsonl::read(bad.as_bytes()).unwrap_err();
    assert!(matches!(e, PolicyError::Trace { offset, .. } if offset as usize == hand.rfind("{\"step").unwrap()), "{e}");
    let e = jsonl::read(hand.replace("\"hisparse_trace\": 1", "\"hisparse_trace\": 3").as_bytes()).unwrap_err();
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
    ("version-4.hstrace", "unsupported version", 8),
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
    ("v2-layer-table-checksum.hstrace", "corrupt header", 36),
    ("v2-layer-table-size.hstrace", "corrupt header", 32),
    ("v2-shared-layer-source.hstrace", "corrupt header", 36),
    ("v2-margin-without-flag.hstrace", "corrupt header", 24),
    ("v2-near-selected.hstrace", "corrupt record", 0),
    ("v2-near-count.hstrace", "corrupt record", 0),
    ("v3-selection-checksum.hstrace", "corrupt record", 0),
    ("v3-score-checksum.hstrace", "corrupt record", 0),
    ("v3-selection-length.hstrace", "corrupt record", 0),
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
    b[8] = 4;
    push("version-4.hstrace", b, 8);
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
    // Version 2: the layer table (bytes 32..52 for 3 layers) and near-cut candidates.
    let v2 = binary_v2();
    let mut b = v2.clone();
    b[40] ^= 1;
    push("v2-layer-table-checksum.hstrace", b, 36);
    let mut b = v2.clone();
    b[32] = 2;
    push("v2-layer-table-size.hstrace", b, 32);
    let table = |sources: [u32; 3]| {
        let mut t = 3u32.to_le_bytes().to_vec();
        for s in sources {
            t.extend_from_slice(&s.to_le_bytes());
        }
        let c = crc32fast::hash(&t);
        t.extend_from_slice(&c.to_le_bytes());
        t
    };
    let mut b = v2.clone();
    b[32..52].copy_from_slice(&table([0, 2, 2])); // layer 1 from a later layer
    push("v2-shared-layer-source.hstrace", b, 36);
    let mut b = v2.clone();
    b[24..28].copy_from_slice(&0u32.to_le_bytes());
    let c = crc32fast::hash(&b[..28]);
    b[28..32].copy_from_slice(&c.to_le_bytes());
    push("v2-margin-without-flag.hstrace", b, 24);
    // Records with right checksums: a near-cut candidate that is selected; more than the margin.
    let rec = |near: &[(u32, f32)]| {
        let mut body = Vec::new();
        body.extend_from_slice(&1u32.to_le_bytes()); // step
        body.extend_from_slice(&7u64.to_le_bytes()); // request
        body.extend_from_slice(&0u32.to_le_bytes()); // layer
        body.extend_from_slice(&100u32.to_le_bytes()); // seq_len
        body.extend_from_slice(&1u32.to_le_bytes()); // count
        body.push(40); // position 40
        body.extend_from_slice(&1.5f32.to_le_bytes()); // its score
        body.extend_from_slice(&(near.len() as u32).to_le_bytes());
        for &(p, s) in near {
            body.extend_from_slice(&p.to_le_bytes());
            body.extend_from_slice(&s.to_le_bytes());
        }
        let c = crc32fast::hash(&body);
        body.extend_from_slice(&c.to_le_bytes());
        let mut bytes = v2[..52].to_vec();
        bytes.push(0x01);
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes
    };
    push("v2-near-selected.hstrace", rec(&[(41, 1.0), (40, 0.5)]), 52);
    // The count is refused where it stands: after the tag, length, 24 bytes of fields, one varint
    // and one score.
    push("v2-near-count.hstrace", rec(&[(1, 1.0), (2, 0.5), (3, 0.25), (4, 0.1)]), 52 + 5 + 24 + 1 + 4);
    // Version 3: the second record's selection part, its score part, its selection length.
    let v3 = binary_v3();
    let first_len = u32::from_le_bytes(v3[53..57].try_into().unwrap()) as usize;
    let second = 52 + 5 + first_len;
    let sel_len = u32::from_le_bytes(v3[second + 5..second + 9].try_into().unwrap()) as usize;
    let mut b = v3.clone();
    b[second + 9 + 20] ^= 1; // its count
    push("v3-selection-checksum.hstrace", b, (second + 9 + sel_len) as u64);
    let mut b = v3.clone();
    let len = u32::from_le_bytes(v3[second + 1..second + 5].try_into().unwrap()) as usize;
    b[second + 13 + sel_len] ^= 0x40; // its first score
    push("v3-score-checksum.hstrace", b, (second + 5 + len - 4) as u64);
    let mut b = v3.clone();
    b[second + 5..second + 9].copy_from_slice(&(len as u32).to_le_bytes());
    push("v3-selection-length.hstrace", b, (second + 5) as u64);
    out
}

fn first_error(bytes: &[u8]) -> Option<PolicyError> {
    let serial = match TraceReader::new(bytes) {
        Err(e) => Some(e),
        Ok(r) => r.filter_map(Result::err).next(),
    };
    // The parallel reader meets the same first error, or reads the same records.
    let parallel = parallel::read_all(bytes, true);
    match (&serial, &parallel) {
        (Some(a), Err(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (None, Ok((h, recs))) => {
            let mut r = TraceReader::new(bytes).unwrap();
            assert_eq!(r.header(), h);
            assert_eq!(&r.by_ref().map(Result::unwrap).collect::<Vec<_>>(), recs);
        }
        _ => panic!("serial {serial:?}, parallel {:?}", parallel.map(|(_, r)| r.len())),
    }
    // Read without its scores: the same first error (their bytes are still delimited and
    // checksummed), or the same records with their scores left out — also where the only fault
    // was in what the scores say (a near-cut candidate also selected, or out of order), which a
    // replay that reads no scores cannot meet.
    // What the near-cut candidates say (checked only where they are decoded).
    // Version 3 does not checksum the scores it does not decode.
    let meaning = |e: &PolicyError| {
        let m = format!("{e:?}");
        (m.contains("near-cut") && !m.contains("run past")) || m.contains("score checksum")
    };
    match (&parallel, parallel::read_all(bytes, false)) {
        // Past a fault in what the scores say, the reader without them meets the next one, or none.
        (Err(a), _) if meaning(a) => {}
        (Err(a), Err(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (Ok((h, recs)), Ok((h2, recs2))) => {
            assert_eq!(h2, hisparse_policy::trace::binary::without_scores(h));
            let stripped: Vec<_> =
                recs.iter().cloned().map(|r| TraceRecord { scores: None, near: None, ..r }).collect();
            assert_eq!(recs2, stripped);
        }
        (a, b) => panic!("with scores {:?}, without {:?}", a.as_ref().map(|x| x.1.len()), b.map(|x| x.1.len())),
    }
    // From a file that seeks, a version-3 trace's score parts are skipped: the same records as
    // the reader without scores, and the same first error but for faults in the skipped parts
    // (what it does not read, it cannot meet; their lengths are still checked).
    let skipped = |e: &PolicyError| {
        let m = format!("{e:?}");
        m.contains("score") || m.contains("near-cut") || m.contains("unexplained")
    };
    let size = bytes.len() as u64;
    let skim = hisparse_policy::trace::read_trace_file_with(std::io::Cursor::new(bytes), size, u64::MAX, false);
    let whole = hisparse_policy::trace::read_trace_from_with(bytes, Some(size), u64::MAX, false);
    match (whole, &skim) {
        (Ok(a), Ok(b)) => assert_eq!(&a, b),
        (Err(a), Err(b)) if !skipped(&a) && !skipped(b) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (Err(a), _) if skipped(&a) => {}
        (_, Err(b)) if skipped(b) => {}
        (a, b) => panic!("whole {:?}, skimmed {:?}", a.map(|x| x.1.len()), b.as_ref().map(|x| x.1.len())),
    }
    encoded_reads_as_skimmed(bytes, &skim);
    serial
}

/// The reader that leaves positions encoded accepts what the reader without scores accepts and
/// decodes the same records; it refuses what that reader refuses — with the same error where
/// the fault is one only decoding meets (it checks framing, checksums and fields first, positions
/// as they are decoded).
fn encoded_reads_as_skimmed(bytes: &[u8], skim: &Result<(TraceHeader, Vec<TraceRecord>), PolicyError>) {
    use hisparse_policy::trace::TraceData;
    let size = bytes.len() as u64;
    let read = hisparse_policy::trace::read_trace_file_encoded(std::io::Cursor::new(bytes), size, u64::MAX);
    let decoded = match &read {
        Ok(TraceData::Encoded(t)) => {
            let (h, recs) = (t.header().clone(), t.records());
            let all = t.decode();
            assert_eq!(t.check_positions().err(), all.as_ref().err().cloned(), "checked as decoded");
            if let Ok((h2, r)) = &all {
                assert_eq!((h2, r.len()), (&h, recs.len()));
                for (e, r) in recs.iter().zip(r) {
                    assert_eq!(
                        (e.step, e.request, e.layer, e.seq_len, e.count as usize),
                        (r.step, r.request, r.layer, r.seq_len, r.selected.len())
                    );
                }
            }
            all
        }
        Ok(TraceData::Records(h, r)) => Ok((h.clone(), r.clone())),
        Err(e) => Err(e.clone()),
    };
    match (skim, &decoded) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) if read.is_ok() => assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("skimmed {:?}, encoded {:?}", a.as_ref().map(|x| x.1.len()), b.as_ref().map(|x| x.1.len())),
    }
    // From a pipe: read whole, as the whole-file reader without scores reads it (version 3's
    // score parts too), the positions left encoded.
    let whole = hisparse_policy::trace::read_trace_from_with(bytes, None, u64::MAX, false);
    let piped = hisparse_policy::trace::read_trace_from_encoded(bytes, None, u64::MAX);
    let piped_decoded = match &piped {
        Ok(TraceData::Encoded(t)) => t.decode(),
        Ok(TraceData::Records(h, r)) => Ok((h.clone(), r.clone())),
        Err(e) => Err(e.clone()),
    };
    match (&whole, &piped_decoded) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) if piped.is_ok() => assert_eq!(format!("{a:?}"), format!("{b:?}")),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole {:?}, piped {:?}", a.as_ref().map(|x| x.1.len()), b.as_ref().map(|x| x.1.len())),
    }
    // Described (`trace info`): the same verdict, header and records from a file and a stream.
    let described = |size| {
        hisparse_policy::trace::read_trace_described(std::io::Cursor::new(bytes), size, u64::MAX).and_then(
            |(stored, d)| match d {
                TraceData::Encoded(t) => t.decode().map(|(h, r)| (stored, h, r)),
                TraceData::Records(h, r) => Ok((stored, h, r)),
            },
        )
    };
    let (from_file, from_stream) = (described(Some(size)), described(None));
    assert_eq!(from_file.is_ok(), from_stream.is_ok(), "{from_file:?} / {from_stream:?}");
    if let (Ok(a), Ok(b)) = (&from_file, &from_stream) {
        assert_eq!(a, b);
    }
}

/// A version-3 trace whose score part is damaged: every reader that reads no scores accepts it,
/// from a file and from a stream alike (the score part is delimited, never checksummed); every
/// reader of scores refuses it, from either.
#[test]
fn a_damaged_score_part_gets_one_verdict_from_a_file_and_a_stream() {
    use hisparse_policy::trace::{TraceData, read_trace_described, read_trace_file_encoded, read_trace_file_with};
    use hisparse_policy::trace::{read_trace_from_encoded, read_trace_from_with};
    let mut bytes = binary_v3();
    // The first record's score part: its last byte before the record's score checksum. The
    // first record starts after the header; find it by damaging bytes until only the score
    // checksum fails.
    let good = read_trace_from_with(bytes.as_slice(), None, u64::MAX, true).unwrap();
    let damaged = (0..bytes.len()).rev().find_map(|i| {
        let mut b = bytes.clone();
        b[i] ^= 0x40;
        let e = read_trace_from_with(b.as_slice(), None, u64::MAX, true).err()?;
        e.to_string().contains("score checksum").then_some(b)
    });
    bytes = damaged.expect("a byte whose damage only the score checksum sees");
    let len = bytes.len() as u64;
    let cur = || std::io::Cursor::new(bytes.as_slice());
    let plain = |r: TraceData| match r {
        TraceData::Encoded(t) => t.decode().unwrap(),
        TraceData::Records(h, r) => (h, r),
    };
    let want = (hisparse_policy::trace::binary::without_scores(&good.0), good.1.iter().map(strip).collect::<Vec<_>>());
    assert_eq!(read_trace_file_with(cur(), len, u64::MAX, false).unwrap(), want);
    assert_eq!(read_trace_from_with(cur(), None, u64::MAX, false).unwrap(), want);
    assert_eq!(plain(read_trace_file_encoded(cur(), len, u64::MAX).unwrap()), want);
    assert_eq!(plain(read_trace_from_encoded(cur(), None, u64::MAX).unwrap()), want);
    for s in [Some(len), None] {
        let (stored, d) = read_trace_described(cur(), s, u64::MAX).unwrap();
        assert_eq!((stored, plain(d)), (good.0.clone(), want.clone()));
    }
    for e in [
        read_trace_file_with(cur(), len, u64::MAX, true).unwrap_err(),
        read_trace_from_with(cur(), None, u64::MAX, true).unwrap_err(),
    ] {
        assert!(e.to_string().contains("score checksum"), "{e}");
    }
}

fn strip(r: &TraceRecord) -> TraceRecord {
    TraceRecord { scores: None, near: None, ..r.clone() }
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
    // Near-cut candidates (read only under a version-2 header): mostly in range with falling
    // scores, sometimes selected, repeated, rising, NaN, too many, or miscounted.
    let score = prop_oneof![40 => -4.0f32..4.0, 1 => Just(f32::NAN)];
    let near = prop::collection::vec(
        (prop_oneof![40 => (0u32..1 << 20).prop_map(Some), 1 => any::<u32>().prop_map(|_| None)], score),
        0..5,
    );
    let sorted = prop_oneof![20 => Just(true), 1 => Just(false)];
    let near_count = prop_oneof![30 => Just(None), 1 => (0u32..8).prop_map(Some)];
    (1u32..6, 0u64..3, layer, with_seq, count, bad_scores, trailing, (near, sorted, near_count)).prop_map(
        |(step, request, layer, (deltas, seq_len), count, bad_scores, trailing, (mut near, sorted, near_count))| {
            let n = deltas.len();
            if sorted {
                near.sort_by(|a, b| b.1.total_cmp(&a.1));
            }
            // Mostly positions inside the sequence (some selected or repeated by chance), some
            // far outside; mostly within the margin of 3.
            if near.len() == 4 && sorted {
                near.pop();
            }
            let near: Vec<(u32, f32)> =
                near.into_iter().map(|(p, sc)| (p.map_or(u32::MAX - 1, |p| p % seq_len.max(1)), sc)).collect();
            let r = raw::RawRecord {
                step,
                request,
                layer,
                seq_len,
                count: count.unwrap_or(n as u32),
                scores: vec![0.5; if bad_scores { n + 1 } else { n }],
                near: Some((near_count.unwrap_or(near.len() as u32), near)),
                deltas,
                trailing,
            };
            (r, bad_scores)
        },
    )
}

/// Whether a raw record's near-cut candidates are valid under a margin of 3, decided
/// independently of the reader.
fn near_valid(r: &raw::RawRecord, positions: &[u32]) -> bool {
    let Some((count, near)) = &r.near else { return false };
    let mut ps: Vec<u32> = near.iter().map(|x| x.0).collect();
    ps.sort_unstable();
    *count as usize == near.len()
        && near.len() <= 3
        && near.iter().all(|&(p, s)| p < r.seq_len && !positions.contains(&p) && !s.is_nan())
        && near.windows(2).all(|w| w[1].1 <= w[0].1)
        && ps.windows(2).all(|w| w[0] != w[1])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Past the checksums: the reader hands out exactly the records that are valid (decoded
    /// positions equal the deltas' prefix sums), refuses the others with an error, and never
    /// panics; the simulator then replays whatever was read without panicking, and its counts
    /// add up.
    #[test]
    fn checksummed_hostile_traces_are_read_exactly_or_refused(
        mut recs in prop::collection::vec(raw_record(3), 0..6),
        top_k in prop_oneof![8 => 4u32..16, 1 => Just(0u32), 1 => Just(u32::MAX)],
        wrong_end in prop_oneof![8 => Just(false), 1 => Just(true)],
        v2 in any::<bool>(),
        good_table in prop_oneof![6 => Just(true), 1 => Just(false)],
        split in any::<bool>(),
    ) {
        let mut header = if v2 {
            let table = if good_table { vec![0, 0, 2] } else { vec![0, 2, 2] };
            raw::RawHeader { version: 2, flags: 3, top_k, layers: 3, row_bytes: 656, margin: 3, layer_table: Some(table) }
        } else {
            for (r, _) in &mut recs {
                r.near = None;
            }
            raw::RawHeader { version: 1, flags: 1, top_k, layers: 3, row_bytes: 656, margin: 0, layer_table: None }
        };
        // Version 3: the same records, their selection and score parts checksummed apart.
        if split {
            header.version = 3;
            header.layer_table.get_or_insert_with(Vec::new);
        }
        let records: Vec<raw::RawRecord> = recs.iter().map(|(r, _)| r.clone()).collect();
        let end = records.len() as u64 + u64::from(wrong_end);
        let bytes = raw::encode(&header, &records, end);
        let got: Result<Vec<TraceRecord>, PolicyError> = TraceReader::new(bytes.as_slice()).and_then(|r| r.collect());
        let _ = first_error(&bytes);
        // What a correct reader must decide, computed independently of it.
        let header_ok = (1..=hisparse_policy::trace::MAX_TOP_K).contains(&top_k) && (!v2 || good_table);
        let valid = |(r, bad_scores): &(raw::RawRecord, bool)| {
            let Some(pos) = raw::positions(&r.deltas) else { return false };
            (!v2 || near_valid(r, &pos))
                && r.count as usize == r.deltas.len()
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
                    prop_assert_eq!(a.near.clone(), b.near.clone().map(|n| n.1));
                    prop_assert_eq!((a.step, a.request, a.layer, a.seq_len), (b.step, b.request, b.layer, b.seq_len));
                }
                let h = if v2 {
                    TraceHeader { top_k, layers: 3, row_bytes: 656, has_scores: true, score_margin: 3, index_source: vec![0, 0, 2] }
                } else {
                    TraceHeader { top_k, layers: 3, row_bytes: 656, has_scores: true, ..TraceHeader::default() }
                };
                if !read.is_empty() && hisparse_policy::memory_estimate(&read).is_some_and(|b| b < 64 << 20) {
                    let mut cfg = SimConfig { policies: vec![BuiltinPolicy::Lru.into(), BuiltinPolicy::Belady.into()], buffer_sizes: vec![top_k as usize, 2 * top_k as usize], ..SimConfig::default() };
                    if v2 {
                        cfg.policies.push(BuiltinPolicy::Score.into());
                        cfg.prefetchers = BuiltinPrefetcher::ALL.map(Into::into).to_vec();
                    }
                    if let Ok(rep) = simulate(&h, &read, &cfg, &|_| {}) {
                        for x in &rep.results {
                            prop_assert!(x.swap.misses <= x.selected && (0.0..=1.0).contains(&x.miss_ratio), "{x:?}");
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
    for v2 in [false, true] {
        let mut ok = 0;
        for _ in 0..300 {
            let (recs, top_k) = strategy.new_tree(&mut runner).unwrap().current();
            let records: Vec<raw::RawRecord> = recs.iter().map(|(r, _)| r.clone()).collect();
            let (header, records) = if v2 {
                let table = Some(vec![0, 0, 2]);
                (
                    raw::RawHeader {
                        version: 2,
                        flags: 3,
                        top_k,
                        layers: 3,
                        row_bytes: 656,
                        margin: 3,
                        layer_table: table,
                    },
                    records,
                )
            } else {
                let h = raw::RawHeader {
                    version: 1,
                    flags: 1,
                    top_k,
                    layers: 3,
                    row_bytes: 656,
                    margin: 0,
                    layer_table: None,
                };
                (h, records.into_iter().map(|r| raw::RawRecord { near: None, ..r }).collect())
            };
            let bytes = raw::encode(&header, &records, records.len() as u64);
            ok +=
                usize::from(TraceReader::new(bytes.as_slice()).and_then(|r| r.collect::<Result<Vec<_>, _>>()).is_ok());
        }
        assert!(
            (20..270).contains(&ok),
            "{ok} of 300 hostile traces (v2: {v2}) were readable: the mix checks too little"
        );
    }
}

#[test]
fn a_trace_is_refused_by_its_header_before_its_size_and_by_its_size_before_its_records() {
    // A large input that is no trace: refused for its header, whatever its claimed size.
    let mut junk = b"HSPTRACE".to_vec();
    junk.extend_from_slice(&[0u8; 100]);
    let e = read_trace_from(junk.as_slice(), Some(1 << 40), 64).unwrap_err().to_string();
    assert!(e.contains("version 0"), "{e}");
    // A good header on an input said to be larger than allowed: refused before reading on.
    let good = binary(false);
    let e = read_trace_from(&good[..40], Some(1 << 40), 1000).unwrap_err();
    assert!(matches!(e, PolicyError::TooLarge { bytes: Some(_), limit: 1000 }), "{e}");
    // Of unknown size (a pipe): refused once more than allowed has come.
    let e = read_trace_from(good.as_slice(), None, good.len() as u64 - 1).unwrap_err();
    assert!(matches!(e, PolicyError::TooLarge { bytes: None, .. }), "{e}");
    assert_eq!(read_trace_from(good.as_slice(), None, good.len() as u64).unwrap().1, records(false));
    // JSON lines likewise.
    let mut text = Vec::new();
    jsonl::write(&mut text, &header(true), &records(true)).unwrap();
    let e = read_trace_from(text.as_slice(), None, text.len() as u64 / 2).unwrap_err();
    assert!(matches!(e, PolicyError::TooLarge { .. }), "{e}");
    assert_eq!(read_trace_from(text.as_slice(), None, text.len() as u64).unwrap().1, records(true));
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

impl<R: std::io::Seek> std::io::Seek for Counted<R> {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

/// From a file that seeks, a scored version-3 trace read without scores gives the records the
/// whole-file reader gives, reading well under half of the file (the selection parts, a read
/// buffer's worth each); with scores it reads all of it.
#[test]
fn a_scored_trace_read_without_scores_skips_its_score_parts() {
    let header = TraceHeader {
        top_k: 2048,
        layers: 2,
        row_bytes: 656,
        has_scores: true,
        score_margin: 6144,
        ..TraceHeader::default()
    };
    let mut w = TraceWriter::new(Vec::new(), header.clone()).unwrap();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for i in 0..24u32 {
        let seq_len = 65_536;
        let mut all: Vec<f32> = (0..seq_len).map(|_| (next() % 1_000_000) as f32 * 1e-3).collect();
        all[0] = -1.0;
        let mut order: Vec<u32> = (0..seq_len).collect();
        order.sort_by(|&a, &b| all[b as usize].total_cmp(&all[a as usize]).then(a.cmp(&b)));
        let mut selected = order[..2048].to_vec();
        selected.sort_unstable();
        let mut r =
            TraceRecord { step: i / 2 + 1, request: 1, layer: i % 2, seq_len, selected, scores: None, near: None };
        r.set_scores(&all, 6144);
        w.write(&r).unwrap();
    }
    let bytes = w.finish().unwrap();
    assert_eq!(bytes[8], 3);
    let size = bytes.len() as u64;
    let whole = hisparse_policy::trace::read_trace_from_with(bytes.as_slice(), Some(size), u64::MAX, false).unwrap();
    assert!(whole.1.iter().all(|r| r.selected.len() == 2048 && r.scores.is_none()));
    let mut counted = Counted { inner: std::io::Cursor::new(bytes.as_slice()), read: 0 };
    let skimmed = hisparse_policy::trace::read_trace_file_with(&mut counted, size, u64::MAX, false).unwrap();
    assert_eq!(skimmed, whole);
    assert!(counted.read * 100 < size * 45, "read {} of {size} bytes", counted.read);
    let mut counted = Counted { inner: std::io::Cursor::new(bytes.as_slice()), read: 0 };
    let (h, recs) = hisparse_policy::trace::read_trace_file_with(&mut counted, size, u64::MAX, true).unwrap();
    assert_eq!((h, recs.len()), (header, 24));
    assert!(recs.iter().all(|r| r.scores.as_ref().is_some_and(|s| s.len() == 2048)));
    assert_eq!(counted.read, size);
}

/// A position past 2^32 met inside a run of eight one-byte distances (which the reader decodes
/// at once) is refused with the error, and at the offset, it has where no such run is read: a
/// record of seven positions, the same bytes up to the fault.
#[test]
fn a_position_past_2_32_is_refused_alike_inside_a_run_of_short_distances() {
    let header =
        raw::RawHeader { version: 1, flags: 0, top_k: 16, layers: 1, row_bytes: 656, margin: 0, layer_table: None };
    let error = |deltas: Vec<u32>| {
        let rec = raw::RawRecord {
            step: 1,
            request: 0,
            layer: 0,
            seq_len: u32::MAX,
            count: deltas.len() as u32,
            deltas,
            scores: Vec::new(),
            near: None,
            trailing: Vec::new(),
        };
        first_error(&raw::encode(&header, &[rec], 1)).map(|e| e.to_string())
    };
    // The first position 5 below 2^32 - 1, then distances of one: the seventh is 2^32.
    let in_run = error([vec![u32::MAX - 5], vec![0; 8]].concat()).unwrap();
    let alone = error([vec![u32::MAX - 5], vec![0; 6]].concat()).unwrap();
    assert!(in_run.contains("position 4294967296 above 2^32"), "{in_run}");
    assert_eq!(in_run, alone);
    // Below 2^32 the run is read whole: the same positions as one by one.
    assert_eq!(error([vec![u32::MAX - 9], vec![0; 8]].concat()), None);
}

/// Faults only decoding positions meets — a count that leaves bytes after the positions or runs
/// past them, a last position beyond the sequence — in version 1 without scores and version 3:
/// the reader that leaves positions encoded reads the trace, and decoding the record gives the
/// error the whole-file reader gives.
#[test]
fn faults_in_positions_are_met_when_the_positions_are_decoded() {
    let good = |step| raw::RawRecord {
        step,
        request: 1,
        layer: 0,
        seq_len: 50 + step,
        count: 3,
        deltas: vec![4, 0, 9],
        scores: vec![],
        near: None,
        trailing: vec![],
    };
    let faults = [
        ("few", raw::RawRecord { count: 2, ..good(2) }),
        ("many", raw::RawRecord { count: 4, ..good(2) }),
        ("beyond", raw::RawRecord { seq_len: 12, ..good(2) }),
        ("trailing", raw::RawRecord { trailing: vec![7], ..good(2) }),
    ];
    for version in [1u16, 3] {
        let (flags, margin, table) = if version == 3 { (2, 1, Some(vec![])) } else { (0, 0, None) };
        let header = raw::RawHeader { version, flags, top_k: 8, layers: 1, row_bytes: 656, margin, layer_table: table };
        for (name, bad) in &faults {
            let near = if version == 3 { Some((0, vec![])) } else { None };
            let recs: Vec<raw::RawRecord> = [good(1), bad.clone(), good(3)]
                .into_iter()
                .map(|r| raw::RawRecord { near: near.clone(), ..r })
                .collect();
            let bytes = raw::encode(&header, &recs, 3);
            if version == 3 && *name == "trailing" {
                // After the score part in version 3: its length is checked as the trace is read.
                assert!(first_error(&bytes).is_some());
                continue;
            }
            let want = first_error(&bytes).unwrap_or_else(|| panic!("v{version} {name}: read"));
            let size = bytes.len() as u64;
            let read = hisparse_policy::trace::read_trace_file_encoded(std::io::Cursor::new(&bytes), size, u64::MAX);
            let Ok(hisparse_policy::trace::TraceData::Encoded(t)) = read else {
                panic!("v{version} {name}: the encoded read refused it: {read:?}")
            };
            assert_eq!(t.records()[1].count, bad.count);
            assert!(t.record(0).is_ok() && t.record(2).is_ok());
            let mut out = vec![99];
            let got = t.positions_into(1, &mut out).unwrap_err();
            assert_eq!(format!("{got:?}"), format!("{want:?}"), "v{version} {name}");
            assert!(t.positions_into(3, &mut out).is_err(), "a record past the last");
        }
    }
}
