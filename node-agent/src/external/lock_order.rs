//! The engine-mode agent's locks, taken in one fixed order.
//!
//! Two locks are shared between the request path and the events feed: the translator's (the engine's
//! blocks in kvroute's chain) and the ledger's (the requests in flight). The feed publishes events under the
//! translator's lock, and publishing reads the ledger, so the translator's lock always comes first. A path
//! that took them the other way round deadlocked both threads under load, and a load test finds that only
//! sometimes; here every lock has a rank, and in debug builds taking a lock while holding one of equal or
//! higher rank on the same thread panics at once, naming both, whichever thread interleaving runs.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// A lock's place in the order: a lock may be taken only while every lock the thread holds ranks lower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank(pub u8, pub &'static str);

/// The translator's lock: first.
pub const TRANSLATOR: Rank = Rank(1, "translator");
/// The ledger's lock: after the translator's.
pub const LEDGER: Rank = Rank(2, "ledger");

thread_local! {
    /// The ranks of the ordered locks this thread holds, in the order taken.
    static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
}

/// A mutex with a [`Rank`]; a poisoned lock is taken as it is (every holder leaves its data whole).
#[derive(Debug)]
pub struct OrderedMutex<T> {
    rank: Rank,
    inner: Mutex<T>,
}

impl<T> OrderedMutex<T> {
    pub fn new(rank: Rank, value: T) -> OrderedMutex<T> {
        OrderedMutex { rank, inner: Mutex::new(value) }
    }

    /// Locks it. In debug builds, panics when this thread holds a lock of this rank or a later one.
    pub fn lock(&self) -> OrderedGuard<'_, T> {
        if cfg!(debug_assertions) {
            HELD.with(|held| {
                let mut held = held.borrow_mut();
                if let Some(later) = held.iter().find(|taken| **taken >= self.rank) {
                    panic!("lock order: the {} lock taken while holding the {} lock", self.rank.1, later.1);
                }
                held.push(self.rank);
            });
        }
        let guard = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        OrderedGuard { guard, rank: self.rank }
    }
}

/// A held [`OrderedMutex`].
pub struct OrderedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    rank: Rank,
}

impl<T> Drop for OrderedGuard<'_, T> {
    fn drop(&mut self) {
        if cfg!(debug_assertions) {
            HELD.with(|held| {
                let mut held = held.borrow_mut();
                if let Some(at) = held.iter().rposition(|taken| *taken == self.rank) {
                    held.remove(at);
                }
            });
        }
    }
}

impl<T> Deref for OrderedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for OrderedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_rank_order_are_granted_and_released() {
        let translator = OrderedMutex::new(TRANSLATOR, 1);
        let ledger = OrderedMutex::new(LEDGER, 2);
        {
            let first = translator.lock();
            let second = ledger.lock();
            assert_eq!(*first + *second, 3);
        }
        // Both released: the ledger alone, then the translator alone, are fine.
        drop(ledger.lock());
        *translator.lock() += 1;
        assert_eq!(*translator.lock(), 2);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order: the translator lock taken while holding the ledger lock")]
    fn the_translator_taken_with_the_ledger_held_panics() {
        let translator = OrderedMutex::new(TRANSLATOR, ());
        let ledger = OrderedMutex::new(LEDGER, ());
        let _ledger = ledger.lock();
        let _translator = translator.lock();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "lock order: the ledger lock taken while holding the ledger lock")]
    fn a_lock_taken_twice_on_one_thread_panics_instead_of_hanging() {
        let ledger = OrderedMutex::new(LEDGER, ());
        let _first = ledger.lock();
        let _second = ledger.lock();
    }

    #[test]
    #[cfg(debug_assertions)]
    fn the_order_is_per_thread() {
        let translator = std::sync::Arc::new(OrderedMutex::new(TRANSLATOR, ()));
        let ledger = OrderedMutex::new(LEDGER, ());
        let _ledger = ledger.lock();
        let other = translator.clone();
        std::thread::spawn(move || drop(other.lock())).join().expect("another thread may take the translator");
    }
}
