//! Zeroed atomic words for the index's tables, on transparent huge pages
//! where the kernel offers them.
//!
//! A table of a million entries spans about 46 MB. On 4 KiB pages that is
//! over 11,000 pages, far more than the TLB holds, so nearly every probe of a
//! cold lookup misses the TLB as well as the cache, and the page walk adds to
//! the miss the lookup waits on. On 2 MiB pages the whole table is about 23
//! TLB entries. Linux's default THP mode on many distributions is `madvise`:
//! a region gets huge pages at its page faults only when asked before them.
//! Elsewhere, or when the kernel has none to give, the words are ordinary
//! memory and only the speed differs.

use std::sync::atomic::AtomicU64;

/// The huge page size on x86-64 and most arm64 kernels; smaller regions are not advised.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `len` zeroed words, advised onto huge pages when they cover at least one
/// aligned huge page.
pub(crate) fn zeroed_words(len: usize) -> Box<[AtomicU64]> {
    let mut words: Vec<AtomicU64> = Vec::with_capacity(len);
    advise_huge_pages(words.as_ptr().addr(), words.capacity() * std::mem::size_of::<AtomicU64>());
    // The first touch of every page is this write, after the advice: a read
    // first would map the shared zero page, which older kernels split into
    // small pages at the write that follows.
    words.resize_with(len, || AtomicU64::new(0));
    words.into_boxed_slice()
}

/// Advises the whole huge pages inside `bytes` bytes from address `start`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn advise_huge_pages(start: usize, bytes: usize) {
    let first = start.next_multiple_of(HUGE_PAGE_BYTES);
    let end = start.saturating_add(bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end <= first {
        return;
    }
    // SAFETY: `[first, end)` lies inside the allocation the caller owns, and
    // MADV_HUGEPAGE is advice only: it changes how the kernel backs the pages,
    // never their contents, and failure (no THP support) leaves them as they were.
    let _ = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_start: usize, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn words_are_zeroed_at_every_size() {
        // The last size covers at least one aligned huge page wherever it starts.
        for len in [0, 1, 7, 2 * HUGE_PAGE_BYTES / 8 + 3] {
            let words = zeroed_words(len);
            assert_eq!(words.len(), len);
            assert!(words.iter().all(|word| word.load(Ordering::Relaxed) == 0));
        }
    }
}
