//! Dense attention in f64: the oracle the sparse kernels are tested against. Slow and simple on
//! purpose; not part of the `Backend` trait.

/// Attention of `heads` query heads (`q`: `[heads, d_qk]`) over every row of `kv` (`[n, d_qk]`,
/// already decoded to f32), values being each row's first `d_v` dims. Returns the output
/// `[heads, d_v]` and the log-sum-exp per head, computed in f64.
///
/// ```
/// use hisparse_kernels::dense_attention;
/// // One head over two rows of (d_qk = 2, d_v = 1).
/// let (o, lse) = dense_attention(&[1.0, 0.0], &[1.0, 0.0, 3.0, 0.0], 1, 2, 1, 1.0);
/// let w = (1f64.exp(), 3f64.exp());
/// assert!((f64::from(o[0]) - (w.0 * 1.0 + w.1 * 3.0) / (w.0 + w.1)).abs() < 1e-6);
/// assert!((f64::from(lse[0]) - (w.0 + w.1).ln()).abs() < 1e-6);
/// ```
pub fn dense_attention(
    q: &[f32],
    kv: &[f32],
    heads: usize,
    d_qk: usize,
    d_v: usize,
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0f32; heads * d_v];
    let mut lse = vec![f32::NEG_INFINITY; heads];
    let n = kv.len() / d_qk;
    if n == 0 {
        return (out, lse);
    }
    for h in 0..heads {
        let qh = &q[h * d_qk..(h + 1) * d_qk];
        let logits: Vec<f64> = kv
            .chunks(d_qk)
            .map(|k| f64::from(scale) * qh.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>())
            .collect();
        let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for d in 0..d_v {
            let acc: f64 = kv.chunks(d_qk).zip(&weights).map(|(k, w)| w * f64::from(k[d])).sum();
            out[h * d_v + d] = (acc / sum) as f32;
        }
        lse[h] = (m + sum.ln()) as f32;
    }
    (out, lse)
}
