//! `SlotTable`: which token sits in which slot of one request's hot buffer for one layer, in
//! both directions: `device_buffer_size` regular slots plus the reserved slot (index
//! `device_buffer_size`) that holds the newest token.
//!
//! Invariant: the map is a bijection between resident tokens and used slots: `slot_of(t) ==
//! Some(s)` exactly when `token_at(s) == Some(t)`; the reserved slot holds at most the newest
//! token, which is in no regular slot.

use crate::error::{MemoryError, Result};

const EMPTY: u32 = u32::MAX;
const NONE: u16 = u16::MAX;

/// Most regular slots a table can have (slot ids are `u16`, one value is "none", one the reserved slot).
pub const MAX_BUFFER_SLOTS: usize = u16::MAX as usize - 1;

/// Slot ↔ token map of one (request, layer) hot buffer. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotTable {
    slot_token: Vec<u32>,
    token_slot: Vec<u16>,
    newest: Option<u32>,
    resident: usize,
}

impl SlotTable {
    /// An empty table of `device_buffer_size` regular slots (1..=65534).
    pub fn new(device_buffer_size: usize) -> Result<Self> {
        if device_buffer_size == 0 || device_buffer_size > MAX_BUFFER_SLOTS {
            return Err(MemoryError::invalid(
                "device_buffer_size",
                device_buffer_size,
                format!("must be in 1..={MAX_BUFFER_SLOTS}"),
            ));
        }
        Ok(Self { slot_token: vec![EMPTY; device_buffer_size], token_slot: Vec::new(), newest: None, resident: 0 })
    }

    /// Regular slots (the reserved slot's index).
    pub fn device_buffer_size(&self) -> usize {
        self.slot_token.len()
    }

    /// Tokens in regular slots.
    pub fn resident(&self) -> usize {
        self.resident
    }

    /// The token in the reserved slot.
    pub fn newest(&self) -> Option<u32> {
        self.newest
    }

    /// The slot of `token` (the reserved slot's index for the newest token), if resident.
    #[inline]
    pub fn slot_of(&self, token: u32) -> Option<u32> {
        match self.token_slot.get(token as usize) {
            Some(&s) if s != NONE => Some(u32::from(s)),
            _ => None,
        }
    }

    /// The token in regular slot `slot`, if any.
    #[inline]
    pub fn token_at(&self, slot: u32) -> Option<u32> {
        match self.slot_token.get(slot as usize) {
            Some(&t) if t != EMPTY => Some(t),
            _ => None,
        }
    }

    /// Slot → token for every regular slot (`None` = empty).
    pub fn slots(&self) -> impl Iterator<Item = Option<u32>> + '_ {
        self.slot_token.iter().map(|&t| (t != EMPTY).then_some(t))
    }

    fn grow_tokens(&mut self, token: u32) {
        let need = token as usize + 1;
        if self.token_slot.len() < need {
            self.token_slot.resize(need.next_power_of_two().max(64), NONE);
        }
    }

    /// Puts `token` into empty regular slot `slot`.
    pub fn place(&mut self, slot: u32, token: u32) -> Result<()> {
        if slot as usize >= self.slot_token.len() {
            return Err(MemoryError::invalid(
                "slot",
                slot,
                format!("the table has {} regular slots", self.slot_token.len()),
            ));
        }
        if token == EMPTY {
            return Err(MemoryError::invalid("token", token, "reserved value"));
        }
        if let Some(t) = self.token_at(slot) {
            return Err(MemoryError::invalid("slot", slot, format!("holds token {t}")));
        }
        if let Some(s) = self.slot_of(token) {
            return Err(MemoryError::invalid("token", token, format!("already resident in slot {s}")));
        }
        self.grow_tokens(token);
        self.slot_token[slot as usize] = token;
        // slot < device_buffer_size <= MAX_BUFFER_SLOTS < u16::MAX.
        self.token_slot[token as usize] = slot as u16;
        self.resident += 1;
        Ok(())
    }

    /// Empties regular slot `slot`, returning the token it held.
    pub fn evict(&mut self, slot: u32) -> Result<u32> {
        let token =
            self.token_at(slot).ok_or_else(|| MemoryError::invalid("slot", slot, "is empty or out of range"))?;
        self.slot_token[slot as usize] = EMPTY;
        self.token_slot[token as usize] = NONE;
        self.resident -= 1;
        Ok(token)
    }

    /// Makes `token` the newest (in the reserved slot); the previous newest stops being
    /// resident and is returned.
    pub fn set_newest(&mut self, token: u32) -> Result<Option<u32>> {
        if let Some(s) = self.slot_of(token).filter(|&s| s as usize != self.slot_token.len()) {
            return Err(MemoryError::invalid("token", token, format!("already resident in slot {s}")));
        }
        let old = self.newest.take();
        if let Some(o) = old {
            self.token_slot[o as usize] = NONE;
        }
        self.grow_tokens(token);
        // device_buffer_size <= MAX_BUFFER_SLOTS < u16::MAX.
        self.token_slot[token as usize] = self.slot_token.len() as u16;
        self.newest = Some(token);
        Ok(old)
    }

    /// Empties every slot (regular and reserved).
    pub fn clear(&mut self) {
        self.slot_token.fill(EMPTY);
        self.token_slot.clear();
        self.newest = None;
        self.resident = 0;
    }

    /// Checks the bijection invariant.
    pub fn check(&self) -> Result<()> {
        let mut count = 0;
        for (s, &t) in self.slot_token.iter().enumerate() {
            if t != EMPTY {
                count += 1;
                if self.token_slot.get(t as usize) != Some(&(s as u16)) {
                    return Err(MemoryError::invalid("slot", s, format!("holds token {t}, which maps elsewhere")));
                }
            }
        }
        let mut mapped = 0;
        for (t, &s) in self.token_slot.iter().enumerate() {
            if s == NONE {
                continue;
            }
            mapped += 1;
            let back = if usize::from(s) == self.slot_token.len() { self.newest } else { self.token_at(u32::from(s)) };
            if back != Some(t as u32) {
                return Err(MemoryError::invalid("token", t, format!("maps to slot {s}, which holds {back:?}")));
            }
        }
        if count != self.resident || mapped != count + usize::from(self.newest.is_some()) {
            return Err(MemoryError::invalid(
                "resident",
                self.resident,
                format!("{count} slots used, {mapped} tokens mapped"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn place_evict_and_newest() {
        let mut t = SlotTable::new(4).unwrap();
        t.place(2, 100).unwrap();
        t.place(0, 7).unwrap();
        assert_eq!((t.slot_of(100), t.token_at(0), t.resident()), (Some(2), Some(7), 2));
        assert!(t.place(2, 5).is_err(), "slot taken");
        assert!(t.place(1, 7).is_err(), "token already resident");
        assert!(t.place(4, 9).is_err(), "the reserved slot is not a regular slot");
        assert_eq!(t.set_newest(101).unwrap(), None);
        assert_eq!(t.slot_of(101), Some(4));
        assert_eq!(t.set_newest(102).unwrap(), Some(101));
        assert_eq!(t.slot_of(101), None, "the previous newest leaves the buffer");
        assert!(t.set_newest(100).is_err(), "a resident token cannot become the newest");
        assert_eq!(t.evict(2).unwrap(), 100);
        assert!(t.evict(2).is_err());
        t.check().unwrap();
        t.clear();
        assert_eq!((t.resident(), t.newest(), t.slot_of(7)), (0, None, None));
        assert!(SlotTable::new(0).is_err() && SlotTable::new(65535).is_err());
    }

    /// An independent model of a slot table: a plain map token -> slot, the slots' contents and
    /// the newest token, with the documented rules written out directly.
    #[derive(Default)]
    struct Model {
        slots: Vec<Option<u32>>,
        where_is: std::collections::HashMap<u32, u32>,
        newest: Option<u32>,
    }

    impl Model {
        fn place(&mut self, slot: u32, token: u32) -> bool {
            let free = self.slots.get(slot as usize).is_some_and(Option::is_none);
            let ok = free && token != u32::MAX && !self.where_is.contains_key(&token) && self.newest != Some(token);
            if ok {
                self.slots[slot as usize] = Some(token);
                self.where_is.insert(token, slot);
            }
            ok
        }
        fn evict(&mut self, slot: u32) -> Option<u32> {
            let t = self.slots.get_mut(slot as usize)?.take()?;
            self.where_is.remove(&t);
            Some(t)
        }
        fn set_newest(&mut self, token: u32) -> Option<Option<u32>> {
            if self.where_is.contains_key(&token) {
                return None;
            }
            Some(self.newest.replace(token))
        }
    }

    proptest! {
        /// Every operation's result and the whole table afterwards equal the model's.
        #[test]
        fn operations_match_an_independent_model(ops in prop::collection::vec((0u8..4, 0u32..10, 0u32..24), 1..400)) {
            let mut t = SlotTable::new(8).unwrap();
            let mut m = Model { slots: vec![None; 8], ..Model::default() };
            for (op, slot, token) in ops {
                match op {
                    0 => prop_assert_eq!(t.place(slot, token).is_ok(), m.place(slot, token), "place({}, {})", slot, token),
                    1 => prop_assert_eq!(t.evict(slot).ok(), m.evict(slot), "evict({})", slot),
                    2 => prop_assert_eq!(t.set_newest(token).ok(), m.set_newest(token), "set_newest({})", token),
                    _ => {
                        t.clear();
                        m = Model { slots: vec![None; 8], ..Model::default() };
                    }
                }
                for s in 0..10u32 {
                    prop_assert_eq!(t.token_at(s), m.slots.get(s as usize).copied().flatten(), "slot {}", s);
                }
                for tok in 0..24u32 {
                    let want = m.where_is.get(&tok).copied().or_else(|| (m.newest == Some(tok)).then_some(8));
                    prop_assert_eq!(t.slot_of(tok), want, "token {}", tok);
                }
                prop_assert_eq!(t.resident(), m.where_is.len());
                prop_assert_eq!(t.newest(), m.newest);
            }
        }

        #[test]
        fn bijection_holds_under_random_operations(ops in prop::collection::vec((0u8..3, 0u32..16, 0u32..200), 1..300)) {
            let mut t = SlotTable::new(16).unwrap();
            for (op, slot, token) in ops {
                let _ = match op {
                    0 => t.place(slot, token),
                    1 => t.evict(slot).map(|_| ()),
                    _ => t.set_newest(token).map(|_| ()),
                };
                prop_assert!(t.check().is_ok(), "{:?}", t.check());
            }
        }
    }
}
