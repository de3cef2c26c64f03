/* The synthetic guest that lmt-bench and the integration tests migrate: RAM
 * blocks full of pseudo-random pages (or of the content guest_content.h
 * describes), a workload thread that dirties them at a set rate, and the
 * dirty-sync callback lmt asks. Test support, not installed; built even
 * without the tests, since lmt-bench links it. */
#ifndef LMT_TESTS_GUEST_H
#define LMT_TESTS_GUEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <lmt/lmt.h>

#define GUEST_PAGE_SIZE 4096u
#define GUEST_MAX_BLOCKS 2u

/* One RAM block of the guest, on either side. */
struct guest_block {
	const char *name;
	uint8_t *host;
	uint64_t length;
	uint64_t npages;
	_Atomic uint64_t *dirty; /* source: pages written since the last sync */
};

struct guest_ram {
	uint8_t *base;
	uint64_t bytes;
	uint32_t nblocks;
	struct guest_block blocks[GUEST_MAX_BLOCKS];
};

/* The monotonic clock in nanoseconds. */
uint64_t guest_now_ns(void);
/* splitmix64 over *state. */
uint64_t guest_random(uint64_t *state);
/* Uniform in [0, bound), bound > 0. */
uint64_t guest_random_below(uint64_t *state, uint64_t bound);
/* FNV-1a, 64-bit. */
uint64_t guest_checksum(const void *data, size_t length);

/* Split [base, base+bytes) into the blocks both sides add: one block up to
 * 64K, else "ram0" (3/4) and "ram1" (the rest). A NULL base gives only the
 * names and sizes. */
void guest_ram_layout(struct guest_ram *ram, uint8_t *base, uint64_t bytes);
/* The source's dirty bitmaps: 0, or -1 when out of memory. */
int guest_ram_alloc_dirty(struct guest_ram *ram);
void guest_ram_free_dirty(struct guest_ram *ram);

/* Fill zero-filled RAM with pseudo-random pages, leaving exactly
 * round(zero_fraction * pages) of them all-zero, spread by the seed.
 * Returns that number. (guest_content_fill is the same for any content.) */
uint64_t guest_ram_fill(struct guest_ram *ram, double zero_fraction, uint64_t seed);

/* lmt_dirty_sync_fn over a struct guest_ram. */
int guest_dirty_sync(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages);

/* A thread that rewrites the first `working_set` bytes of RAM page by page
 * at `rate` bytes per second and marks each page dirty after writing it. */
struct guest_workload;
int guest_workload_start(struct guest_workload **out, struct guest_ram *ram, uint64_t working_set,
                         uint64_t rate, uint64_t seed);
/* Where a workload notes what it wrote, for a check that cannot keep a
 * copy of each page: per page of the working set, the generator state (the
 * recipe) the page was last filled from (guest_page_pattern rebuilds the
 * page from it), 1 once the workload wrote the page at all, and, when
 * `count` is not NULL, how many times. The arrays have a slot per page of
 * the working set and start zeroed. */
struct guest_write_log {
	uint64_t *state;
	uint8_t *written;
	uint32_t *count;
};
/* guest_workload_start, noting every page written in `log` (kept by the
 * caller, read once the workload is stopped). The blocks may have no dirty
 * bitmaps (a destination's RAM): the pages are then only written. */
int guest_workload_start_logged(struct guest_workload **out, struct guest_ram *ram,
                                uint64_t working_set, uint64_t rate, uint64_t seed,
                                const struct guest_write_log *log);

struct guest_content;
struct guest_dirty_pattern;
/* Everything a workload can be asked; NULL pointers are the defaults. */
struct guest_workload_spec {
	uint64_t working_set;
	uint64_t rate;
	uint64_t seed;
	const struct guest_content *content;       /* NULL: random pages */
	const struct guest_dirty_pattern *pattern; /* NULL: uniform */
	const struct guest_write_log *log;         /* NULL: not logged */
};
/* The content and pattern must outlive the workload. */
int guest_workload_start_spec(struct guest_workload **out, struct guest_ram *ram,
                              const struct guest_workload_spec *spec);
/* The page a workload of `content` (NULL for the default random pages)
 * writes from generator state `state`. */
void guest_page_pattern(const struct guest_content *content, void *page, uint64_t state);
/* Hold the "vCPU" for `percent` percent of the time (auto-converge's
 * throttle): the thread dirties that much less. NULL is fine. */
void guest_workload_throttle(struct guest_workload *w, uint32_t percent);
/* Returns once the thread is stopped between pages. */
void guest_workload_pause(struct guest_workload *w);
/* Ends and frees the thread; returns the bytes it wrote. NULL is fine. */
uint64_t guest_workload_stop(struct guest_workload *w);

#endif
