//! The shared pool's unit and property tests.

use super::*;
use proptest::prelude::*;

/// 4 seats of 6 rows (5 slots + the reserved one) of 1 byte, KV pages of 4 rows.
fn rows_only() -> SharedPool {
    SharedPool::new(SharedPoolShape {
        seats: 4,
        device_buffer_size: 5,
        kv_row_bytes: 1,
        page_tokens: 4,
        key_pages: None,
    })
    .unwrap()
}

#[test]
fn seats_rise_from_the_bottom_and_pages_fall_from_the_top() {
    let mut p = rows_only();
    assert_eq!((p.seat_total(), p.bytes()), (4, 24));
    let (a, b, c) = (RequestId(1), RequestId(2), RequestId(3));
    assert_eq!(p.take_seat(a).unwrap(), 0);
    assert_eq!(p.usable_free(Part::KvPage, 99), 4, "seat 0 covers bytes 0..6: pages 0 and 1");
    assert_eq!(p.take_pages(b, Part::KvPage, 3).unwrap(), &[5, 4, 3]);
    assert_eq!(p.next_seat(), Some(1));
    // Seat 1 covers bytes 6..12: pages 1 and 2, both free.
    assert_eq!(p.take_seat(b).unwrap(), 1);
    // Seat 2 covers bytes 12..18: pages 3 and 4, held by b.
    assert_eq!(p.parts_over_seat(2), vec![(b, Part::KvPage, 1), (b, Part::KvPage, 2)]);
    let e = p.take_seat(c).unwrap_err();
    assert!(matches!(e, MemoryError::CapacityExhausted { needed: 2, .. }), "{e}");
    assert!(p.take_pages(c, Part::KvPage, 1).is_err(), "no usable page is free above seat 1");
    assert!(p.take_pages(c, Part::KeyPage, 1).is_err(), "this pool holds no keys");
    p.check().unwrap();
    assert_eq!(p.release_pages(b, Part::KvPage), 3);
    assert_eq!(p.take_seat(c).unwrap(), 2);
    assert_eq!(p.usable_free(Part::KvPage, 99), 1, "bytes 18..24: page 5 (page 4 holds byte 18 of seat 2)");
    p.release_seat(a);
    assert_eq!(p.next_seat(), Some(0));
    assert_eq!(p.bytes_used(), 12);
    p.check().unwrap();
}

#[test]
fn a_page_moves_to_the_highest_free_slot_above_the_next_seat() {
    let mut p = rows_only();
    let r = RequestId(7);
    assert!(p.take_pages(r, Part::KvPage, 7).unwrap_err().to_string().contains("shared pool KV pages"));
    p.take_pages(r, Part::KvPage, 6).unwrap();
    assert!(!p.can_move(Part::KvPage));
    assert!(p.move_page(r, Part::KvPage, 0).is_err(), "no page free");
    p.release_pages(r, Part::KvPage);
    p.take_pages(r, Part::KvPage, 2).unwrap(); // 5, 4
    assert_eq!(p.move_page(r, Part::KvPage, 1).unwrap(), (16, 12), "page 4 to page 3");
    assert_eq!(p.pages(r, Part::KvPage), &[5, 3]);
    p.check().unwrap();
}

#[test]
fn key_pages_share_the_bytes_and_always_fit_above_the_seats() {
    // 3 seats of 4 rows of 2 bytes (8 bytes each, 24 in all: 8 key pages of 3 bytes), KV pages
    // of 2 rows (4 bytes), and 5 key pages: 24 + 3 * 5 = 39 bytes.
    let shape =
        SharedPoolShape { seats: 3, device_buffer_size: 3, kv_row_bytes: 2, page_tokens: 2, key_pages: Some((3, 5)) };
    assert_eq!(shape.bytes(), Some(39));
    assert_eq!(
        SharedPoolShape { kv_row_bytes: 1, ..shape }.bytes(),
        Some(27),
        "12 bytes of seats round up to 4 key pages"
    );
    let mut p = SharedPool::new(shape).unwrap();
    assert!(p.holds_keys());
    let (a, b, c) = (RequestId(1), RequestId(2), RequestId(3));
    assert_eq!(p.take_pages(a, Part::KeyPage, 2).unwrap(), &[12, 11], "bytes 36..39 and 33..36");
    assert_eq!(p.take_pages(b, Part::KvPage, 2).unwrap(), &[7, 6], "bytes 28..32 and 24..28");
    assert_eq!(p.take_pages(b, Part::KeyPage, 1).unwrap(), &[7], "bytes 21..24, below b's rows");
    p.take_seat(a).unwrap();
    p.take_seat(c).unwrap();
    assert_eq!(p.parts_over_seat(2), vec![(b, Part::KeyPage, 0)], "seat 2 is bytes 16..24");
    assert!(!p.can_move(Part::KeyPage), "b's KV pages hold the bytes above");
    assert_eq!(p.release_pages(b, Part::KvPage), 2);
    assert_eq!(p.move_page(b, Part::KeyPage, 0).unwrap(), (21, 30));
    p.take_seat(b).unwrap();
    assert_eq!(p.take_pages(c, Part::KeyPage, 2).unwrap(), &[9, 8], "5 key pages above 3 seats");
    p.check().unwrap();
    assert_eq!(p.pages_used(Part::KeyPage), 5);
    assert_eq!(p.bytes_used(), 39, "every byte held");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random seats and pages of both kinds taken, moved and freed never break the invariant,
    /// a seat is refused exactly while pages sit over it, and pages are refused exactly when
    /// too few slots are free above the seats.
    #[test]
    fn random_operations_keep_the_invariant(ops in prop::collection::vec((0u8..7, 0u64..6, 0usize..5), 1..80)) {
        let shape = SharedPoolShape { seats: 5, device_buffer_size: 6, kv_row_bytes: 2, page_tokens: 3, key_pages: Some((5, 6)) };
        let mut p = SharedPool::new(shape).unwrap();
        for (op, r, n) in ops {
            let r = RequestId(r);
            let part = if n % 2 == 0 { Part::KvPage } else { Part::KeyPage };
            match op {
                0 => {
                    let over = p.next_seat().map(|s| p.parts_over_seat(s).len());
                    let had = p.seat(r).is_some();
                    prop_assert_eq!(p.take_seat(r).is_ok(), !had && over == Some(0));
                }
                1 | 2 => {
                    let (have, free) = (p.pages(r, part).len(), p.usable_free(part, usize::MAX));
                    prop_assert_eq!(p.take_pages(r, part, have + n).is_ok(), n <= free);
                }
                3 => {
                    let (can, held) = (p.can_move(part), n < p.pages(r, part).len());
                    prop_assert_eq!(p.move_page(r, part, n).is_ok(), can && held);
                }
                4 => { p.release_pages(r, part); }
                _ => p.release_seat(r),
            }
            p.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
}
