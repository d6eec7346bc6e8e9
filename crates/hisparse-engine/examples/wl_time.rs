#![allow(clippy::unwrap_used, missing_docs)]
use hisparse_engine::Workload;
use hisparse_memory::KvGeometry;
use rayon::prelude::*;
use std::time::Instant;
fn main() {
    let g = KvGeometry::preset("deepseek-v3.2").unwrap();
    let w = Workload::new(&g, 1);
    let n = 32;
    let mut ds: Vec<_> = (0..n).map(|i| w.start(i as u64)).collect();
    let t = Instant::now();
    ds.par_iter_mut().enumerate().for_each(|(i, d)| w.advance(i as u64, d));
    println!("advance x{n}: {:?}", t.elapsed());
    let t = Instant::now();
    for (i, d) in ds.iter_mut().enumerate() {
        w.advance(i as u64, d);
    }
    println!("advance serial x{n}: {:?}", t.elapsed());
    let t = Instant::now();
    let mut q = vec![0f32; 64 * 128];
    let mut wt = vec![0f32; 64];
    for l in 0..61 {
        for (i, d) in ds.iter().enumerate() {
            w.indexer_query(i as u64, l, d, &mut q, &mut wt);
        }
    }
    println!("indexer queries serial 61 layers x{n}: {:?}", t.elapsed());
    let t = Instant::now();
    let mut v = vec![0f32; 576];
    for l in 0..61 {
        for i in 0..n {
            w.kv_row(i as u64, l, 5000, &mut v);
        }
    }
    println!("kv rows serial: {:?}", t.elapsed());
}
