//! Eager backup on the GPU with an injected delay on the backup stream: when the main stream
//! waits for the backup's event before reusing the reserved slot and swapping in, a miss on the
//! previous newest token fetches its fresh row; without the wait (the control), the same run
//! fetches the stale host row — so the event is what makes it right.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use hisparse_kernels::cuda::{
    CudaDevice, GpuBackup, GpuSwapInState, GpuSwapInStateShape, MissSource, Selections, SwapOutputs, SwapReq,
    SwapTargets,
};
use hisparse_memory::host_tier::MappedHostTier;
use hisparse_memory::{HostTier, HostTierConfig, RequestId};
use hisparse_policy::policy::by_name;

const B: usize = 256;
const ROW: usize = 656;
const L: usize = 600;

fn row(tag: u8, pos: usize) -> Vec<u8> {
    (0..ROW).map(|i| (i as u8).wrapping_mul(3).wrapping_add(tag).wrapping_add(pos as u8)).collect()
}

/// Runs two steps of one request with the backup delayed; returns the row the second step's
/// swap-in fetched for the previous newest token.
fn two_steps(dev: &CudaDevice, host: &mut HostTier, mapped: &MappedHostTier, seat_req: u64, wait: bool) -> Vec<u8> {
    let s = dev.stream().clone();
    let mut backup = GpuBackup::new(dev).unwrap();
    backup.inject_delay_ns = 3_000_000;
    let lru = by_name("lru", 0).unwrap();
    let mut gpu = GpuSwapInState::new(
        dev,
        Arc::clone(&lru),
        GpuSwapInStateShape { seats: 1, layers: 1, device_buffer_size: B, block_size: 128, max_sel: 64, max_tokens: 0 },
    )
    .unwrap();
    gpu.reset_seat(0, 0).unwrap();
    let mut hot = s.alloc_zeros::<u8>((B + 1) * ROW).unwrap();
    let req = RequestId(seat_req);
    let pages = s.clone_htod(host.pages(req).unwrap()).unwrap();
    let host_row = |host: &HostTier, pos: usize| host.locate(req, 0, pos).unwrap().0 / ROW as u64;
    let reserved = (B * ROW)..((B + 1) * ROW);
    let mut step = |step: u32, sel: Vec<u32>, seq_len: usize, hot: &mut cudarc::driver::CudaSlice<u8>| {
        let sels = s.clone_htod(&sel).unwrap();
        let mut out = SwapOutputs::new(&s, 1, sel.len()).unwrap();
        let r = SwapReq {
            seat: 0,
            seq_len: seq_len as u32,
            step,
            sel_offset: 0,
            sel_len: sel.len() as u32,
            page_offset: 0,
            score_offset: 0,
            prefetch_budget: 0,
            request: seat_req,
        };
        let batch = gpu.upload_requests(&[r]).unwrap();
        let sel = Selections { positions: &sels.as_view(), scores: None };
        let src = MissSource { pages: &pages, host: mapped };
        gpu.launch(0, &batch, sel, src, SwapTargets { hot_rows: hot, out: &mut out, counts: None }).unwrap();
        out
    };
    // Step 1: the new token L goes into the reserved slot, then is backed up (slowly).
    s.memcpy_htod(&row(0xA0, L), &mut hot.slice_mut(reserved.clone())).unwrap();
    step(1, vec![3, 17, L as u32], L + 1, &mut hot);
    let done = backup.backup(&s, &hot, &[B as u32], &[host_row(host, L)], mapped).unwrap();
    // Step 2: the new token L + 1 takes the reserved slot; token L is selected: a miss.
    if wait {
        s.wait(&done).unwrap();
    }
    s.memcpy_htod(&row(0xB0, L + 1), &mut hot.slice_mut(reserved)).unwrap();
    let out = step(2, vec![3, L as u32, L as u32 + 1], L + 2, &mut hot);
    let slots = s.clone_dtoh(&out.miss_slots).unwrap();
    let counts = s.clone_dtoh(&out.counts).unwrap();
    assert_eq!(counts.len() % hisparse_kernels::SWAP_COUNTS, 0);
    assert_eq!(counts[1], 1, "token {L} must be the one miss of step 2");
    let rows = s.clone_dtoh(&hot).unwrap();
    done.synchronize().unwrap();
    let at = slots[0] as usize * ROW;
    rows[at..at + ROW].to_vec()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_backup_event_orders_slot_reuse_and_swap_in_behind_a_slow_backup() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    // SAFETY: every buffer below is ordered by hand with events (what the engine does).
    unsafe { dev.context().disable_event_tracking() };
    let mut host =
        HostTier::new(&HostTierConfig { bytes: 16 << 20, layers: 1, row_bytes: ROW, page_tokens: 16, file: None })
            .unwrap();
    for r in [1u64, 2] {
        host.register(RequestId(r)).unwrap();
        host.grow(RequestId(r), L + 2).unwrap();
        for t in 0..L + 2 {
            // Positions up to L - 1: the prompt; L and L + 1: stale until backed up.
            let tag = if t < L { 0x10 } else { 0xEE };
            host.write_row(RequestId(r), 0, t, &row(tag, t)).unwrap();
        }
    }
    let base = host.register_cuda(dev.context()).unwrap();
    let fetched = two_steps(&dev, &mut host, &base, 1, true);
    assert_eq!(fetched, row(0xA0, L), "with the wait, the miss fetches the backed-up row");
    let control = two_steps(&dev, &mut host, &base, 2, false);
    assert_eq!(control, row(0xEE, L), "without the wait, the delayed backup has not landed: the stale row is fetched");
}
