//! Where each selected token of a layer is before its swap-in decides — a slot of the hot
//! buffer or only the host tier — without changing anything: what the attention reads with the
//! swap-in deferred (`miss_fill = "deferred"`). The CPU form of the CUDA `locate_in_hot` kernel
//! (`kernels/swap_locate.cu`), which the GPU tests compare against.

use crate::error::{KernelError, Result};

/// Where a selected token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotLocation {
    /// In this slot of the request's hot buffer (`device_buffer_size`: the reserved newest slot).
    Slot(u32),
    /// Only in the host tier: a miss, which the deferred swap-in will bring in.
    Host,
}

/// The location of every position of `selection` (ascending) of a request of `seq_len` tokens,
/// given its buffer's slot table (`slots[s]`: the token in slot `s`, or -1): a token of a
/// request that fits its buffer (`seq_len <= slots.len()`) lives in the slot of its position;
/// otherwise the newest token (`seq_len - 1`) is in the reserved slot, a token the table holds
/// in its slot, any other only in the host tier. A position at or beyond `seq_len` is an error
/// naming it.
pub fn locate_in_hot(slots: &[i32], selection: &[u32], seq_len: usize) -> Result<Vec<HotLocation>> {
    let b = slots.len();
    let reserved = u32::try_from(b).map_err(|_| KernelError::invalid("slots", b, "more than 2^32 - 1 slots"))?;
    let mut slot_of = std::collections::HashMap::with_capacity(if seq_len > b { b } else { 0 });
    if seq_len > b {
        for (s, &t) in slots.iter().enumerate() {
            if t >= 0 {
                // s < b, which fits u32 (checked above).
                slot_of.insert(t as u32, s as u32);
            }
        }
    }
    selection
        .iter()
        .map(|&t| {
            if t as usize >= seq_len {
                return Err(KernelError::invalid("selection", t, format!("beyond the {seq_len} tokens")));
            }
            Ok(if seq_len <= b {
                HotLocation::Slot(t)
            } else if t as usize == seq_len - 1 {
                HotLocation::Slot(reserved)
            } else {
                slot_of.get(&t).map_or(HotLocation::Host, |&s| HotLocation::Slot(s))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
    use super::*;

    #[test]
    fn tokens_are_found_in_their_slots_the_newest_in_the_reserved_one() {
        // A request past its buffer of 4 slots: tokens 7, 2 and 9 are held, 10 is the newest.
        let slots = [7, -1, 2, 9];
        let got = locate_in_hot(&slots, &[1, 2, 7, 8, 10], 11).unwrap();
        use HotLocation::{Host, Slot};
        assert_eq!(got, vec![Host, Slot(2), Slot(0), Host, Slot(4)]);
        // Within its buffer every token is in the slot of its position, whatever the table says.
        assert_eq!(locate_in_hot(&slots, &[0, 3], 4).unwrap(), vec![Slot(0), Slot(3)]);
    }

    #[test]
    fn a_position_beyond_the_sequence_is_named() {
        let e = locate_in_hot(&[0, 1], &[0, 5], 3).unwrap_err().to_string();
        assert!(e.contains("selection") && e.contains('5'), "{e}");
    }
}
