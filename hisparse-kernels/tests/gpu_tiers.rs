//! The tiers on CUDA: the device tier over `CudaMemory` holds and returns rows in both modes
//! and frees everything; a registered host tier is unregistered when dropped (registering a new
//! tier, at the same addresses, again and again, succeeds) and kernels read it through its
//! device address.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_kernels::cuda::CudaDevice;
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::{
    DeviceMemory, DeviceTier, DeviceTierConfig, HostTier, HostTierConfig, IndexKeyLayout, KvRowFormat, KvRowLayout,
    Mode, RequestId,
};

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_tier_on_cuda_holds_rows_in_both_modes() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let mem = CudaMemory::new(dev.stream().clone());
    let cfg = DeviceTierConfig {
        layers: 3,
        // Two of the three layers store index keys (IndexShare).
        index_layers: 2,
        kv_row: KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap(),
        index_key: IndexKeyLayout::new(128).unwrap(),
        keeps_index: true,
        page_tokens: 16,
        kv_pages: 20,
        index_pages: 40,
        seats: 4,
        device_buffer_size: 64,
        shared_pool: false,
    };
    let mut t = DeviceTier::new(mem.clone(), cfg).unwrap();
    let (res, hs) = (RequestId(1), RequestId(2));
    t.register(res, Mode::Resident).unwrap();
    t.register(hs, Mode::HiSparse).unwrap();
    t.grow(res, 100).unwrap();
    t.grow(hs, 300).unwrap();
    let row = |x: u8| -> Vec<u8> { (0..656).map(|i| (i as u8).wrapping_mul(7) ^ x).collect() };
    for l in 0..3 {
        for p in [0usize, 17, 99] {
            t.write_kv_row(res, l, p, &row(p as u8 + l as u8)).unwrap();
        }
        for s in [0usize, 63, 64] {
            t.write_hot_row(hs, l, s, &row(s as u8 ^ 0x55)).unwrap();
        }
        if l < 2 {
            t.write_index_key(hs, l, 299, &row(9 + l as u8)[..132]).unwrap();
        }
    }
    assert!(t.write_index_key(hs, 2, 299, &row(9)[..132]).is_err(), "no third key pool");
    let mut out = vec![0u8; 656];
    for l in 0..3 {
        for s in [0usize, 63, 64] {
            t.read_hot_row(hs, l, s, &mut out).unwrap();
            assert_eq!(out, row(s as u8 ^ 0x55));
        }
        let kv = mem.download(t.kv(l)).unwrap();
        for p in [0usize, 17, 99] {
            let at = t.kv_row(res, p).unwrap() * 656;
            assert_eq!(&kv[at..at + 656], row(p as u8 + l as u8).as_slice());
        }
        if l < 2 {
            let keys = mem.download(t.keys(l)).unwrap();
            let at = t.index_key_row(hs, 299).unwrap() * 132;
            assert_eq!(&keys[at..at + 132], &row(9 + l as u8)[..132]);
        }
    }
    assert!(t.write_hot_row(hs, 0, 65, &row(0)).is_err(), "only 64 + 1 slots");
    t.release(res).unwrap();
    t.release(hs).unwrap();
    assert_eq!(t.bytes_in_use(), 0);
    t.check().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_registered_host_tier_is_unregistered_when_dropped() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    for i in 0..6u8 {
        let mut h =
            HostTier::new(&HostTierConfig { bytes: 64 << 20, layers: 2, row_bytes: 656, page_tokens: 16, file: None })
                .unwrap();
        let mapped = h.register_cuda(dev.context()).unwrap();
        let p1 = mapped.device_ptr();
        assert_eq!(h.register_cuda(dev.context()).unwrap().device_ptr(), p1, "registered once");
        assert_eq!(h.cuda_mapping().map(|m| m.device_ptr()), Some(p1));
        // The device reads what the host wrote, through the mapped address.
        h.register(RequestId(1)).unwrap();
        h.grow(RequestId(1), 10).unwrap();
        let row: Vec<u8> = (0..656).map(|j| (j as u8) ^ i).collect();
        h.write_row(RequestId(1), 1, 7, &row).unwrap();
        let at = h.locate(RequestId(1), 1, 7).unwrap().0;
        let mut d = dev.stream().alloc_zeros::<u8>(656).unwrap();
        // SAFETY: copying 656 bytes from the registered mapping (its device address) into `d`.
        let r = unsafe {
            use cudarc::driver::DevicePtrMut;
            let (dst, _g) = d.device_ptr_mut(dev.stream());
            cudarc::driver::sys::cuMemcpyDtoD_v2(dst, p1 + at, 656)
        };
        assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
        assert_eq!(dev.stream().clone_dtoh(&d).unwrap(), row);
        // The handle keeps the mapping registered after the tier is gone: the same read still
        // returns the row (nothing was unmapped under the device).
        drop(h);
        let mut e = dev.stream().alloc_zeros::<u8>(656).unwrap();
        // SAFETY: as above; `mapped` keeps the range mapped and registered.
        let r = unsafe {
            use cudarc::driver::DevicePtrMut;
            let (dst, _g) = e.device_ptr_mut(dev.stream());
            cudarc::driver::sys::cuMemcpyDtoD_v2(dst, mapped.device_ptr() + at, 656)
        };
        assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
        assert_eq!(dev.stream().clone_dtoh(&e).unwrap(), row, "read through the handle after the tier dropped");
        assert!(mapped.check_rows("rows", &[mapped.layout().rows()]).is_err(), "one past the last row");
    }
}
