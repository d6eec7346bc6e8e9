//! Importing captured selections: `.npy` and safetensors tensors of shape `[steps, layers,
//! top_k]` become traces the simulator reads; every malformed input is refused by name.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_policy::trace::import::{
    ImportOptions, IndexDtype, RequestSelections, SelectionTensor, import, parse_npy, parse_safetensors,
};
use hisparse_policy::trace::{TraceReader, TraceWriter};
use safetensors::tensor::{Dtype, TensorView};

/// A `.npy` file (format 1.0) of little-endian integers.
fn npy(descr: &str, shape: &[usize], data: &[u8], fortran: bool) -> Vec<u8> {
    let shape = match shape {
        [n] => format!("({n},)"),
        s => format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(' ');
    }
    dict.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    b.extend_from_slice(dict.as_bytes());
    b.extend_from_slice(data);
    b
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// 3 steps, 2 layers, top_k 4; -1 pads step 1 of layer 1; positions unsorted as top-k gives them.
const SELECTED: [i32; 24] = [
    9, 3, 100, 50, /**/ 3, 9, -1, -1, //
    101, 4, 9, 50, /**/ 101, 7, 3, 60, //
    102, 9, 3, 55, /**/ 102, 61, 3, 7,
];

#[test]
fn an_npy_capture_becomes_a_trace_that_reads_back() {
    let bytes = npy("<i4", &[3, 2, 4], &i32s(&SELECTED), false);
    let t = parse_npy(&bytes).unwrap();
    assert_eq!((t.shape, t.dtype), ([3, 2, 4], IndexDtype::I32));
    let reqs = [RequestSelections { request: 0, tensor: t, seq_lens: None }];
    // Lengths from the prompt: step s has 100 + s tokens.
    let opts = ImportOptions { prompt_len: Some(100), row_bytes: 656, index_source: vec![] };
    let (h, recs) = import(&reqs, &opts).unwrap();
    assert_eq!((h.top_k, h.layers, recs.len()), (4, 2, 6));
    assert_eq!(recs[0].selected, vec![3, 9, 50, 100]);
    assert_eq!((recs[1].layer, recs[1].selected.clone()), (1, vec![3, 9]), "padding dropped");
    assert_eq!((recs[4].step, recs[4].seq_len), (3, 103));
    // Without lengths: the largest position so far plus one.
    let (_, recs) = import(&reqs, &ImportOptions::default()).unwrap();
    assert_eq!(recs.iter().map(|r| r.seq_len).collect::<Vec<_>>(), [101, 101, 102, 102, 103, 103]);
    // It writes and reads back.
    let mut w = TraceWriter::new(Vec::new(), h.clone()).unwrap();
    for r in &recs {
        w.write(r).unwrap();
    }
    let back: Vec<_> = TraceReader::new(w.finish().unwrap().as_slice()).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(back, recs);
    // A 2-D tensor is one layer; int64 works the same.
    let two: Vec<i64> = SELECTED.iter().take(12).map(|&x| i64::from(x)).collect();
    let bytes = npy("<i8", &[3, 4], &i64s(&two), false);
    let t = parse_npy(&bytes).unwrap();
    assert_eq!(t.shape, [3, 1, 4]);
}

#[test]
fn a_safetensors_capture_numbers_requests_and_reads_lengths() {
    let a = i32s(&SELECTED);
    let b: Vec<u8> = i64s(&SELECTED.iter().map(|&x| if x < 0 { -1 } else { i64::from(x) + 1 }).collect::<Vec<_>>());
    let lens = i32s(&[120, 121, 125]);
    let tensors = vec![
        ("7", TensorView::new(Dtype::I32, vec![3, 2, 4], &a).unwrap()),
        ("3", TensorView::new(Dtype::I64, vec![3, 2, 4], &b).unwrap()),
        ("3.seq_len", TensorView::new(Dtype::I32, vec![3], &lens).unwrap()),
    ];
    let file = safetensors::serialize(tensors, None).unwrap();
    let reqs = parse_safetensors(&file).unwrap();
    assert_eq!(reqs.iter().map(|r| r.request).collect::<Vec<_>>(), [3, 7], "requests by their numeric names");
    assert_eq!(reqs[0].seq_lens, Some(vec![120, 121, 125]));
    let (_, recs) = import(&reqs, &ImportOptions { prompt_len: Some(200), ..ImportOptions::default() }).unwrap();
    assert_eq!((recs[0].request, recs[0].seq_len, recs[0].selected.clone()), (3, 120, vec![4, 10, 51, 101]));
    assert_eq!((recs[6].request, recs[6].seq_len), (7, 201), "request 7 has no lengths: the prompt's");
}

#[test]
fn malformed_captures_are_refused_by_name() {
    let good = i32s(&SELECTED);
    let err = |bytes: &[u8]| parse_npy(bytes).unwrap_err().to_string();
    assert!(err(b"PK\x03\x04").contains("not a .npy file"));
    assert!(err(&npy("<f4", &[3, 2, 4], &good, false)).contains("dtype = <f4"));
    assert!(err(&npy(">i4", &[3, 2, 4], &good, false)).contains("dtype = >i4"));
    assert!(err(&npy("<i4", &[3, 2, 4], &good, true)).contains("fortran_order"));
    assert!(err(&npy("<i4", &[3, 2, 5], &good, false)).contains("bytes of data"));
    assert!(err(&npy("<i4", &[24], &good, false)).contains("[steps, layers, top_k]"));
    assert!(err(&npy("<i4", &[0, 2, 4], &[], false)).contains("at least 1"));
    let mut truncated = npy("<i4", &[3, 2, 4], &good, false);
    truncated.truncate(40);
    assert!(err(&truncated).contains("header runs past the file"));
    // Rows the trace cannot hold.
    let import_err = |v: &[i32], prompt: Option<u32>| {
        let bytes = npy("<i4", &[1, 1, 4], &i32s(v), false);
        let reqs = [RequestSelections { request: 5, tensor: parse_npy(&bytes).unwrap(), seq_lens: None }];
        import(&reqs, &ImportOptions { prompt_len: prompt, ..ImportOptions::default() }).unwrap_err().to_string()
    };
    assert!(import_err(&[1, 2, 2, 3], None).contains("request 5 step 1 layer 0: selected twice"));
    assert!(import_err(&[1, 2, -7, 3], None).contains("position = -7"));
    assert!(import_err(&[1, 2, 9, 3], Some(5)).contains("past the sequence of 6 tokens"));
    // Requests must agree on layers; a layer structure must fit them.
    let one = npy("<i4", &[3, 1, 4], &i32s(&SELECTED[..12]), false);
    let two = npy("<i4", &[3, 2, 4], &good, false);
    let reqs = [
        RequestSelections { request: 0, tensor: parse_npy(&two).unwrap(), seq_lens: None },
        RequestSelections { request: 1, tensor: parse_npy(&one).unwrap(), seq_lens: None },
    ];
    assert!(import(&reqs, &ImportOptions::default()).unwrap_err().to_string().contains("another layer count"));
    let reqs = [RequestSelections { request: 0, tensor: parse_npy(&two).unwrap(), seq_lens: None }];
    let bad = ImportOptions { index_source: vec![1, 1], ..ImportOptions::default() };
    assert!(import(&reqs, &bad).unwrap_err().to_string().contains("index_source"));
    let ok = ImportOptions { index_source: vec![0, 0], ..ImportOptions::default() };
    assert_eq!(import(&reqs, &ok).unwrap().0.source_of(1), 0);
    // A safetensors file of floats, or with no selection tensor.
    let f = 1f32.to_le_bytes().repeat(8);
    let file = safetensors::serialize(vec![("0", TensorView::new(Dtype::F32, vec![2, 4], &f).unwrap())], None).unwrap();
    assert!(parse_safetensors(&file).unwrap_err().to_string().contains("expected an integer type"));
    assert!(parse_safetensors(b"not safetensors").is_err());
    let _ = SelectionTensor::new(&[1, 4], IndexDtype::U16, &[0; 8]).unwrap();
}

#[test]
fn names_of_one_request_and_a_shrinking_sequence_are_refused() {
    let a = i32s(&SELECTED);
    for other in ["01", "+1"] {
        let tensors = vec![
            ("1", TensorView::new(Dtype::I32, vec![3, 2, 4], &a).unwrap()),
            (other, TensorView::new(Dtype::I32, vec![3, 2, 4], &a).unwrap()),
        ];
        let file = safetensors::serialize(tensors, None).unwrap();
        let e = parse_safetensors(&file).unwrap_err().to_string();
        assert!(e.contains("both name request 1"), "{other}: {e}");
    }
    // Lengths that go back: refused at import, naming the request and step.
    let lens = i32s(&[120, 119, 125]);
    let tensors = vec![
        ("3", TensorView::new(Dtype::I32, vec![3, 2, 4], &a).unwrap()),
        ("3.seq_len", TensorView::new(Dtype::I32, vec![3], &lens).unwrap()),
    ];
    let file = safetensors::serialize(tensors, None).unwrap();
    let reqs = parse_safetensors(&file).unwrap();
    let e = import(&reqs, &ImportOptions::default()).unwrap_err().to_string();
    assert!(e.contains("request 3 step 2") && e.contains("only grows"), "{e}");
}
