//! The device tier's unit tests: both modes' rows, failed growth, hybrid placement.

use super::*;
use crate::device_memory::EmulatedDevice;
use crate::row::KvRowFormat;

fn tier() -> DeviceTier<EmulatedDevice> {
    let cfg = DeviceTierConfig {
        layers: 2,
        index_layers: 2,
        kv_row: KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap(),
        index_key: IndexKeyLayout::new(128).unwrap(),
        keeps_index: true,
        page_tokens: 4,
        kv_pages: 6,
        index_pages: 8,
        seats: 2,
        device_buffer_size: 3,
        shared_pool: false,
    };
    DeviceTier::new(EmulatedDevice, cfg).unwrap()
}

#[test]
fn a_tier_without_index_keys_holds_kv_rows_only() {
    let dense = DeviceTierConfig { keeps_index: false, index_pages: 0, seats: 0, ..tier().config().clone() };
    let mut t = DeviceTier::new(EmulatedDevice, dense.clone()).unwrap();
    let r = RequestId(1);
    t.register(r, Mode::Resident).unwrap();
    t.grow(r, 10).unwrap();
    assert_eq!(t.index_pages(r).unwrap(), &[] as &[u32]);
    assert!(t.index_pages(RequestId(9)).is_err(), "an unknown request is still refused");
    let e = t.index_key_row(r, 0).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidField { field: "keeps_index", .. }), "{e}");
    assert!(t.write_index_key(r, 0, 0, &[1u8; 132]).is_err());
    assert_eq!(t.bytes_in_use(), 2 * 3 * 4 * 656, "3 KV pages in 2 layers, no keys");
    assert!(t.register(RequestId(2), Mode::HiSparse).is_err(), "no seats");
    t.release(r).unwrap();
    assert_eq!(t.bytes_in_use(), 0);
    t.check().unwrap();
    for bad in [DeviceTierConfig { index_pages: 1, ..dense.clone() }, DeviceTierConfig { seats: 1, ..dense }] {
        let e = DeviceTier::new(EmulatedDevice, bad).err().unwrap();
        assert!(matches!(e, MemoryError::InvalidField { field: "keeps_index", .. }), "{e}");
    }
}

#[test]
fn both_modes_hold_their_rows_and_free_them() {
    let mut t = tier();
    let (res, hs) = (RequestId(1), RequestId(2));
    t.register(res, Mode::Resident).unwrap();
    t.register(hs, Mode::HiSparse).unwrap();
    t.grow(res, 10).unwrap();
    t.grow(hs, 17).unwrap();
    assert!(matches!(t.hot_row(res, 0), Err(MemoryError::InvalidField { field: "mode", .. })));
    assert!(matches!(t.kv_row(hs, 0), Err(MemoryError::UnknownRequest { .. })));
    let row: Vec<u8> = (0..656).map(|i| (i % 251) as u8).collect();
    t.write_kv_row(res, 1, 9, &row).unwrap();
    t.write_hot_row(hs, 1, 3, &row).unwrap();
    t.write_index_key(hs, 0, 16, &row[..132]).unwrap();
    let mut out = vec![0u8; 656];
    t.read_hot_row(hs, 1, 3, &mut out).unwrap();
    assert_eq!(out, row);
    let at = t.kv_row(res, 9).unwrap() * 656;
    assert_eq!(&t.kv(1)[at..at + 656], row.as_slice());
    assert!(t.write_kv_row(res, 0, 12, &row).is_err(), "position beyond the grown pages");
    assert!(t.write_hot_row(hs, 0, 4, &row).is_err(), "3 regular slots + the reserved slot 3");
    // 3 KV pages + 3 index pages for the resident request, 5 index pages + 1 seat for the other.
    let want = 2 * (3 * 4 * 656 + 8 * 4 * 132 + 4 * 656);
    assert_eq!(t.bytes_in_use(), want);
    t.release(res).unwrap();
    t.release(hs).unwrap();
    assert_eq!(t.bytes_in_use(), 0);
    t.check().unwrap();
}

#[test]
fn a_failed_grow_or_register_leaks_nothing() {
    let mut t = tier();
    let (a, b, c) = (RequestId(1), RequestId(2), RequestId(3));
    t.register(a, Mode::Resident).unwrap();
    t.grow(a, 20).unwrap(); // 5 KV pages, 5 index pages
    t.register(b, Mode::Resident).unwrap();
    let e = t.grow(b, 8).unwrap_err(); // needs 2 KV pages, 1 free
    assert!(matches!(e, MemoryError::CapacityExhausted { pool: "device KV pages", .. }), "{e}");
    assert_eq!(t.index_pages(b).unwrap().len(), 0, "index pages untouched by the failed grow");
    t.register(c, Mode::HiSparse).unwrap();
    t.register(RequestId(4), Mode::HiSparse).unwrap();
    let e = t.register(RequestId(5), Mode::HiSparse).unwrap_err();
    assert!(matches!(e, MemoryError::CapacityExhausted { pool: "device hot-buffer seats", .. }), "{e}");
    assert!(t.grow(RequestId(5), 1).is_err(), "the refused request holds nothing");
    t.check().unwrap();
}

#[test]
fn hybrid_pages_share_the_seats_rows_and_move_out_of_a_new_seats_way() {
    // 3 seats of 4 rows (3 slots + the reserved one) = 12 rows, pages of 4: 3 pages. One layer
    // of two keeps keys: they keep buffers of their own.
    let cfg = DeviceTierConfig {
        kv_pages: 3,
        seats: 3,
        index_pages: 8,
        index_layers: 1,
        shared_pool: true,
        ..tier().config().clone()
    };
    assert!(!cfg.keys_in_shared_pool());
    let mut t = DeviceTier::new(EmulatedDevice, cfg.clone()).unwrap();
    assert_eq!(cfg.bytes(), 2 * 12 * 656 + 8 * 4 * 132, "no KV buffer beside the seats");
    assert!(t.register(RequestId(9), Mode::HiSparse).is_err(), "a shared pool takes hybrid requests");
    let (a, b) = (RequestId(1), RequestId(2));
    t.register(a, Mode::Hybrid).unwrap();
    assert!(t.seat(a).is_err(), "a hybrid request holds no seat until it leaves the device");
    assert!(t.can_place_pages(12).unwrap() && !t.can_place_pages(13).unwrap(), "no seat is held: 3 pages");
    t.place_pages(a, 6).unwrap();
    assert_eq!(t.kv_pages(a).unwrap(), &[2, 1]);
    assert!(t.holds_pages(a).unwrap());
    assert!(t.take_seat(a).is_err(), "a request in pages takes no seat");
    let row: Vec<u8> = (0..656).map(|i| (i * 7 % 253) as u8).collect();
    t.write_kv_row(a, 1, 5, &row).unwrap();
    assert_eq!(t.kv_row(a, 5).unwrap(), 5, "page 1, row 1");
    // b goes on the last page; the next seat (0, rows 0..4) is page 0, b's.
    t.register(b, Mode::Hybrid).unwrap();
    t.place_pages(b, 2).unwrap();
    assert_eq!(t.kv_pages(b).unwrap(), &[0]);
    assert_eq!(t.parts_over_next_seat().unwrap(), vec![(b, Part::KvPage, 0)]);
    assert!(!t.can_move_page(Part::KvPage).unwrap() && t.move_page(b, Part::KvPage, 0).is_err(), "no page is free");
    // a leaves the device: its pages free, it takes no seat while b's page lies under seat 0.
    t.drop_pages(a).unwrap();
    t.drop_pages(b).unwrap();
    assert_eq!(t.take_seat(a).unwrap(), 0);
    assert!(t.take_seat(a).is_err(), "one seat a request");
    assert_eq!(t.hot_row(a, 3).unwrap(), 3, "seat 0's reserved slot");
    assert!(t.can_place_pages(8).unwrap() && !t.can_place_pages(9).unwrap(), "pages 1 and 2 lie above seat 0");
    t.place_pages(b, 6).unwrap();
    assert_eq!(t.kv_pages(b).unwrap(), &[2, 1]);
    assert_eq!(t.parts_over_next_seat().unwrap(), vec![(b, Part::KvPage, 1)], "seat 1 is rows 4..8, page 1");
    // a comes back: its seat is free again, and no page lies over seat 0.
    t.release_seat(a).unwrap();
    assert!(t.seat(a).is_err());
    assert!(t.can_place_pages(4).unwrap() && !t.can_place_pages(5).unwrap(), "page 0, under no seat now");
    t.check().unwrap();
    t.release(a).unwrap();
    t.release(b).unwrap();
    assert_eq!(t.bytes_in_use(), 0);
    t.check().unwrap();
}

#[test]
fn a_moved_page_keeps_its_rows_in_every_layer() {
    let cfg = DeviceTierConfig {
        kv_pages: 6,
        seats: 6,
        index_pages: 8,
        index_layers: 1,
        shared_pool: true,
        ..tier().config().clone()
    };
    let mut t = DeviceTier::new(EmulatedDevice, cfg).unwrap();
    let a = RequestId(1);
    t.register(a, Mode::Hybrid).unwrap();
    t.place_pages(a, 4).unwrap();
    t.place_pages(RequestId(1), 4).unwrap();
    let rows: Vec<Vec<u8>> = (0..2).map(|l| (0..656).map(|i| ((i + 31 * l) % 251) as u8).collect()).collect();
    for (l, r) in rows.iter().enumerate() {
        t.write_kv_row(a, l, 3, r).unwrap();
    }
    let before = t.kv_pages(a).unwrap()[0];
    // Free a higher page for it to move to: drop and re-place on a lower page first.
    t.drop_pages(a).unwrap();
    t.place_pages(a, 8).unwrap(); // pages 5, 4
    for (l, r) in rows.iter().enumerate() {
        t.write_kv_row(a, l, 7, r).unwrap();
    }
    assert_eq!(before, 5);
    assert_eq!(t.move_page(a, Part::KvPage, 1).unwrap(), 2 * 4 * 656);
    assert_eq!(t.kv_pages(a).unwrap(), &[5, 3]);
    for (l, r) in rows.iter().enumerate() {
        let at = t.kv_row(a, 7).unwrap() * 656;
        assert_eq!(&t.kv(l)[at..at + 656], r.as_slice(), "layer {l}");
    }
    t.check().unwrap();
}

#[test]
fn hybrid_keys_live_in_the_shared_pool_and_move_with_their_bytes() {
    // 2 seats of 4 rows of 656 bytes (2,624 bytes each), KV pages of 4 rows (2,624), 8 key pages
    // of 4 keys of 132 bytes (528): 5,248 rounded up to 10 key pages (5,280) + 8 * 528 = 9,504
    // bytes a layer.
    let cfg = DeviceTierConfig { kv_pages: 0, seats: 2, index_pages: 8, shared_pool: true, ..tier().config().clone() };
    assert!(cfg.keys_in_shared_pool());
    assert_eq!(cfg.bytes(), 2 * 9_504, "keys and rows in one pool a layer");
    let mut t = DeviceTier::new(EmulatedDevice, cfg).unwrap();
    let (a, b) = (RequestId(1), RequestId(2));
    t.register(a, Mode::Hybrid).unwrap();
    t.register(b, Mode::Hybrid).unwrap();
    assert!(t.can_take_keys(a, 4 * 18).unwrap() && !t.can_take_keys(a, 4 * 19).unwrap(), "18 whole key pages");
    t.take_keys(a, 8).unwrap();
    assert_eq!(t.index_pages(a).unwrap(), &[17, 16], "bytes 8,976..9,504 and 8,448..8,976");
    let e = t.grow(a, 9).unwrap_err();
    assert!(matches!(e, MemoryError::CapacityExhausted { pool: "shared pool index-key pages", .. }), "{e}");
    t.grow(a, 8).unwrap();
    t.place_pages(b, 8).unwrap();
    assert_eq!(t.kv_pages(b).unwrap(), &[2, 1], "bytes 5,248..7,872 and 2,624..5,248, under a's keys");
    t.drop_pages(b).unwrap();
    t.place_pages(b, 4).unwrap();
    t.take_keys(b, 16).unwrap();
    assert_eq!(t.index_pages(b).unwrap(), &[15, 8, 7, 6], "beside b's KV page 2 (5,248..7,872)");
    let keys: Vec<Vec<u8>> = (0..2).map(|l| (0..132).map(|i| (i * 3 + 17 * l + 1) as u8).collect()).collect();
    for (l, k) in keys.iter().enumerate() {
        t.write_index_key(b, l, 5, k).unwrap();
    }
    assert!(t.parts_over_next_seat().unwrap().is_empty(), "seat 0 is free bytes");
    t.take_seat(a).unwrap();
    // b leaves the device; its keys under seat 1 (2,624..5,248) move above it.
    t.drop_pages(b).unwrap();
    let over = t.parts_over_next_seat().unwrap();
    assert_eq!(over, vec![(b, Part::KeyPage, 1), (b, Part::KeyPage, 2), (b, Part::KeyPage, 3)]);
    for (owner, part, i) in over {
        assert!(t.can_move_page(part).unwrap());
        assert_eq!(t.move_page(owner, part, i).unwrap(), 2 * 528);
    }
    assert_eq!(t.index_pages(b).unwrap(), &[15, 14, 13, 12]);
    t.take_seat(b).unwrap();
    for (l, k) in keys.iter().enumerate() {
        let at = t.index_key_row(b, 5).unwrap() * 132;
        assert_eq!(&t.keys(l)[at..at + 132], k.as_slice(), "layer {l}");
    }
    assert_eq!(t.bytes_in_use(), 2 * (2 * 2_624 + 6 * 528));
    t.check().unwrap();
    t.release(a).unwrap();
    t.release(b).unwrap();
    assert_eq!(t.bytes_in_use(), 0);
    t.check().unwrap();
}
