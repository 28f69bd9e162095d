// Memory budgets: every command estimates what it will allocate from its flags and refuses,
// before allocating, a run that would not fit (docs/development.md, "Input and output").
//
// The limit is the machine's available memory (MemAvailable in /proc/meminfo) unless the user
// set one with --max-memory (set_memory_limit). Estimates are upper bounds of the dominant
// allocations, not exact counts; a command documents what its estimate covers.
//
// Thread safety: set_memory_limit is called once by the CLI before any work; the other
// functions may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "distca/core/status.h"

namespace distca {

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t available_memory_bytes();

// Overrides the limit (bytes; 0 restores the machine's available memory).
void set_memory_limit(uint64_t bytes);
// The limit in force: the override, or available_memory_bytes() (0 when neither is known,
// which check_memory treats as "no limit").
uint64_t memory_limit_bytes();

// OK when `need_bytes` fits the limit; otherwise an out_of_memory Status of one line:
// "<what> needs about 12.3 GiB, more than the 22.1 GiB available (--max-memory overrides)".
// `what` names the flags that drive the estimate ("--ranks 8192 --tokens-per-rank 16").
[[nodiscard]] Status check_memory(double need_bytes, const std::string& what);

// The process's resident high-water mark (VmHWM), for peak-memory reports: reset_peak_resident
// returns freed heap to the kernel (malloc_trim) and writes 5 to /proc/self/clear_refs, which
// makes VmHWM the current resident size, so that a later peak is the work's since then and
// not earlier freed buffers'; false when clear_refs cannot be written (the mark then keeps the
// process's whole history). peak_resident_bytes: VmHWM in bytes, 0 when unreadable. One mark
// per process: with ranks as threads it is every rank's together. Call from one thread while
// nothing else allocates.
bool reset_peak_resident();
int64_t peak_resident_bytes();

// The heap on transparent huge pages (docs/runtime.md, "Page faults"). On a virtual machine the
// first touch of every 4 KiB page traps to the hypervisor (about 10 us a page on the
// development VM, 70x the write itself), and the trainer's per-step buffers are fresh pages
// whenever a size has not been seen before; with glibc's tunable glibc.malloc.hugetlb=1 malloc
// advises MADV_HUGEPAGE on all of its memory (brk heap, thread arenas, mmap'd chunks), one
// fault per 2 MiB. glibc reads GLIBC_TUNABLES once, at process start, so the CLI sets it and
// re-executes itself (apps/distca/main.cpp).
//
// with_malloc_hugetlb: `tunables` (GLIBC_TUNABLES' value, "name=value" pairs separated by ':')
// with glibc.malloc.hugetlb=1 appended; nullopt when it already names glibc.malloc.hugetlb
// (whatever its value: the user's choice stands).
std::optional<std::string> with_malloc_hugetlb(std::string_view tunables);
// The value GLIBC_TUNABLES gives glibc.malloc.hugetlb ("" when unset or not named).
std::string malloc_hugetlb_tunable();
// Transparent huge pages can be advised: /sys/kernel/mm/transparent_hugepage/enabled selects
// "always" or "madvise".
bool transparent_huge_pages_available();
// This process's malloc advises huge pages: glibc 2.35 or later (the tunable's first release),
// glibc.malloc.hugetlb=1 in its environment, and THP available. For reports ("heap on 2 MiB
// pages" in the benchmark headers).
bool malloc_on_huge_pages();

// "512M", "8G", "1.5GiB", "1048576" -> bytes (binary units; K/M/G/T, optional "iB"/"B").
[[nodiscard]] Result<uint64_t> parse_byte_size(const std::string& text);
// 12345678 -> "11.8 MiB".
std::string format_bytes(double bytes);

}  // namespace distca
