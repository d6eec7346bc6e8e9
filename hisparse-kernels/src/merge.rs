//! Merging partial attention results by their log-sum-exp: attention over a union of disjoint
//! selections from the attention over each part. This is what lets hits be attended to while
//! misses are still being fetched.

use crate::error::{KernelError, Result, check_len};

/// Merges `(out_b, lse_b)` into `(out_a, lse_a)` for `heads` heads of `d_v` values: afterwards
/// `out_a`/`lse_a` hold the attention over the union of both selections.
///
/// With `m = max(lse_a, lse_b)`, `w_x = exp(lse_x - m)`: `out = (w_a out_a + w_b out_b) / (w_a + w_b)`
/// and `lse = m + ln(w_a + w_b)`. An empty part (`lse = -inf`) leaves the other unchanged.
///
/// ```
/// use hisparse_kernels::merge_partial;
/// let (mut o, mut l) = (vec![1.0f32, 2.0], vec![0.0f32]);
/// merge_partial(&mut o, &mut l, &[3.0, 4.0], &[0.0], 2)?;
/// assert_eq!(o, vec![2.0, 3.0]);
/// assert!((l[0] - 2f32.ln()).abs() < 1e-7);
/// # Ok::<(), hisparse_kernels::KernelError>(())
/// ```
pub fn merge_partial(out_a: &mut [f32], lse_a: &mut [f32], out_b: &[f32], lse_b: &[f32], d_v: usize) -> Result<()> {
    let heads = lse_a.len();
    if d_v == 0 {
        return Err(KernelError::invalid("d_v", d_v, "must be at least 1"));
    }
    check_len("lse_b", heads, lse_b.len())?;
    check_len("out_a", heads * d_v, out_a.len())?;
    check_len("out_b", heads * d_v, out_b.len())?;
    for h in 0..heads {
        let (la, lb) = (lse_a[h], lse_b[h]);
        if lb == f32::NEG_INFINITY {
            continue;
        }
        let oa = &mut out_a[h * d_v..(h + 1) * d_v];
        let ob = &out_b[h * d_v..(h + 1) * d_v];
        if la == f32::NEG_INFINITY {
            oa.copy_from_slice(ob);
            lse_a[h] = lb;
            continue;
        }
        let m = la.max(lb);
        let (wa, wb) = ((la - m).exp(), (lb - m).exp());
        let inv = 1.0 / (wa + wb);
        for (x, y) in oa.iter_mut().zip(ob) {
            *x = (wa * *x + wb * y) * inv;
        }
        lse_a[h] = m + (wa + wb).ln();
    }
    Ok(())
}
