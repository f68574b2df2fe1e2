//! A least-recently-used order over dense ids `0..n`: a doubly linked list threaded through arrays, so
//! that appending, unlinking and taking the least recent id are O(1) and never allocate.
//!
//! The block manager orders its cached pool blocks with it, and the host tier its stored blocks.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Default)]
pub struct LruOrder {
    /// Links of each id; both `NIL` for an id outside the order.
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Least recent.
    head: u32,
    /// Most recent.
    tail: u32,
    len: usize,
}

impl LruOrder {
    /// An empty order over ids `0..ids`.
    pub fn new(ids: usize) -> LruOrder {
        let mut order = LruOrder { head: NIL, tail: NIL, ..LruOrder::default() };
        order.grow(ids);
        order
    }

    /// Makes room for ids up to `ids - 1` (never shrinks).
    pub fn grow(&mut self, ids: usize) {
        let ids = ids.min(NIL as usize);
        if ids > self.prev.len() {
            self.prev.resize(ids, NIL);
            self.next.resize(ids, NIL);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, id: u32) -> bool {
        self.prev.get(id as usize).is_some_and(|&prev| prev != NIL || self.head == id)
    }

    /// Makes `id` the most recent (moving it if it is in the order already).
    pub fn push_back(&mut self, id: u32) {
        if (id as usize) >= self.prev.len() {
            self.grow(id as usize + 1);
        }
        self.remove(id);
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        match self.tail {
            NIL => self.head = id,
            tail => self.next[tail as usize] = id,
        }
        self.tail = id;
        self.len += 1;
    }

    /// Takes `id` out of the order; false when it was not in it.
    pub fn remove(&mut self, id: u32) -> bool {
        if !self.contains(id) {
            return false;
        }
        let i = id as usize;
        let (prev, next) = (self.prev[i], self.next[i]);
        match prev {
            NIL => self.head = next,
            prev => self.next[prev as usize] = next,
        }
        match next {
            NIL => self.tail = prev,
            next => self.prev[next as usize] = prev,
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.len -= 1;
        true
    }

    /// Takes the least recent id out of the order.
    pub fn pop_front(&mut self) -> Option<u32> {
        let head = self.head;
        (head != NIL).then(|| {
            self.remove(head);
            head
        })
    }

    /// Empties the order, keeping its capacity.
    pub fn clear(&mut self) {
        self.prev.fill(NIL);
        self.next.fill(NIL);
        self.head = NIL;
        self.tail = NIL;
        self.len = 0;
    }

    /// Ids from least to most recent.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&id| {
            let next = self.next[id as usize];
            (next != NIL).then_some(next)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn least_recent_goes_first_and_a_push_moves_an_id_to_the_back() {
        let mut order = LruOrder::new(4);
        for id in [2, 0, 3] {
            order.push_back(id);
        }
        order.push_back(2);
        assert_eq!(order.iter().collect::<Vec<_>>(), vec![0, 3, 2]);
        assert!(order.remove(3) && !order.remove(3));
        assert_eq!(order.pop_front(), Some(0));
        assert_eq!(order.pop_front(), Some(2));
        assert_eq!(order.pop_front(), None);
        assert!(order.is_empty());
    }

    proptest! {
        /// Any sequence of operations leaves the same order as a plain vector model.
        #[test]
        fn matches_a_vector_model(ops in proptest::collection::vec((0u8..3, 0u32..12), 0..200)) {
            let mut order = LruOrder::new(6);
            let mut model: Vec<u32> = Vec::new();
            for (op, id) in ops {
                match op {
                    0 => {
                        order.push_back(id);
                        model.retain(|&m| m != id);
                        model.push(id);
                    }
                    1 => {
                        let present = model.contains(&id);
                        prop_assert_eq!(order.remove(id), present);
                        model.retain(|&m| m != id);
                    }
                    _ => {
                        let expected = (!model.is_empty()).then(|| model.remove(0));
                        prop_assert_eq!(order.pop_front(), expected);
                    }
                }
                prop_assert_eq!(order.iter().collect::<Vec<_>>(), model.clone());
                prop_assert_eq!(order.len(), model.len());
            }
        }
    }
}
