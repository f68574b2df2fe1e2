//! Zeroed atomic words for the index's tables, on transparent huge pages
//! where the kernel offers them.
//!
//! A table of a million entries spans about 46 MB. On 4 KiB pages that is
//! over 11,000 pages, far more than the TLB holds, so nearly every probe of a
//! cold lookup misses the TLB as well as the cache, and the page walk adds to
//! the miss the lookup waits on. On 2 MiB pages the whole table is about 23
//! TLB entries. Linux's default THP mode on many distributions is `madvise`:
//! a region gets huge pages only when asked, before it is first touched.
//! Elsewhere, or when the kernel has none to give, the words are ordinary
//! memory and only the speed differs.

use std::sync::atomic::AtomicU64;

/// Regions smaller than this gain nothing from huge pages.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// `len` zeroed words, advised onto huge pages when they span at least one.
pub(crate) fn zeroed_words(len: usize) -> Box<[AtomicU64]> {
    // `vec![0; n]` allocates zeroed memory (calloc, fresh pages for a large
    // region) without writing it, so the advice comes before the first touch.
    let zeros = vec![0u64; len];
    if len * std::mem::size_of::<u64>() >= HUGE_PAGE_BYTES {
        advise_huge_pages(&zeros);
    }
    // Collecting a mapped `Vec` of a same-sized type reuses its allocation.
    zeros.into_iter().map(AtomicU64::new).collect()
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn advise_huge_pages(words: &[u64]) {
    let page = 4096;
    let start = words.as_ptr().addr().next_multiple_of(page);
    let end = (words.as_ptr().addr() + std::mem::size_of_val(words)) / page * page;
    if end <= start {
        return;
    }
    // SAFETY: the range lies inside `words`, memory this process owns, and
    // MADV_HUGEPAGE is advice only: it changes how the kernel backs the pages,
    // never their contents, and failure (no THP support) leaves them as they were.
    let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_words: &[u64]) {}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn words_are_zeroed_at_every_size() {
        for len in [0, 1, 7, HUGE_PAGE_BYTES / 8 + 3] {
            let words = zeroed_words(len);
            assert_eq!(words.len(), len);
            assert!(words.iter().all(|word| word.load(Ordering::Relaxed) == 0));
        }
    }
}
