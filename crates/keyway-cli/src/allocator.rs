//! The command's allocator, mimalloc, and the one option its jobs set on it.

/// Thousands of small allocations per batch (strings, JSON values): mimalloc serves them faster
/// than the system allocator to the embedded runtime's millions of records. (A function on Lambda
/// keeps the system's: its batches wait on the network, and mimalloc would weigh in its zip.)
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's options (mimalloc.h), from the library linked in as the allocator.
extern "C" {
    #[cfg(test)]
    fn mi_option_get(option: libc::c_int) -> libc::c_long;
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
}

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_t` (a test checks it against the default
/// mimalloc 3's options.c gives it, 1,000 ms).
const MI_OPTION_PURGE_DELAY: libc::c_int = 15;

/// Keeps freed memory from going back to the operating system for the rest of the run. A job
/// that streams a million records frees and takes back megabytes every batch: returned after
/// mimalloc's second, each came back as fresh pages the kernel had to clear (a fifth of `keyway
/// aggregate`'s time in a profile, 3.1 s against 2.6 s a run). The memory held is the run's
/// largest at once.
pub(crate) fn keep_freed_memory() {
    // SAFETY: mi_option_set takes any option number and value (it checks the number). It writes
    // the option without a lock: a run calls this before it starts its threads.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_mimalloc_documents() {
        // SAFETY: reading an option by its number.
        let delay = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        // Its default, unless the environment set it.
        let set = |name| std::env::var_os(name).is_some();
        if !set("MIMALLOC_PURGE_DELAY") && !set("MIMALLOC_RESET_DELAY") {
            assert_eq!(delay, 1000);
        }
        keep_freed_memory();
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
    }
}
