/* The synthetic guest (see guest.h): RAM blocks full of pseudo-random pages,
 * a workload thread that dirties them at a set rate, the dirty-sync
 * callback. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guest.h"

#define WORDS_PER_PAGE (GUEST_PAGE_SIZE / sizeof(uint64_t))
#define SLICE_NS 1000000u /* the workload paces itself every millisecond */

uint64_t guest_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: fast, and every seed gives a full-period stream. */
uint64_t guest_random(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* Uniform in [0, bound) without a division. */
static uint64_t random_below(uint64_t *state, uint64_t bound)
{
	return (uint64_t)(((unsigned __int128)guest_random(state) * bound) >> 64);
}

/* FNV-1a, 64-bit. */
uint64_t guest_checksum(const void *data, size_t length)
{
	const uint8_t *p = data;
	uint64_t hash = UINT64_C(0xcbf29ce484222325);

	for (size_t i = 0; i < length; i++)
		hash = (hash ^ p[i]) * UINT64_C(0x100000001b3);
	return hash;
}

void guest_ram_layout(struct guest_ram *ram, uint8_t *base, uint64_t bytes)
{
	uint64_t pages = bytes / GUEST_PAGE_SIZE;
	uint64_t first = bytes <= 65536 ? pages : pages * 3 / 4;

	memset(ram, 0, sizeof(*ram));
	ram->base = base;
	ram->bytes = bytes;
	ram->nblocks = first == pages ? 1 : 2;
	for (uint32_t i = 0; i < ram->nblocks; i++) {
		struct guest_block *b = &ram->blocks[i];

		b->name = i == 0 ? "ram0" : "ram1";
		b->npages = i == 0 ? first : pages - first;
		b->length = b->npages * GUEST_PAGE_SIZE;
		/* No base: only the names and sizes are wanted. */
		b->host = base ? base + (i == 0 ? 0 : first * GUEST_PAGE_SIZE) : NULL;
	}
}

int guest_ram_alloc_dirty(struct guest_ram *ram)
{
	for (uint32_t i = 0; i < ram->nblocks; i++) {
		struct guest_block *b = &ram->blocks[i];

		b->dirty = calloc((b->npages + 63) / 64, sizeof(*b->dirty));
		if (!b->dirty) {
			guest_ram_free_dirty(ram);
			return -1;
		}
	}
	return 0;
}

void guest_ram_free_dirty(struct guest_ram *ram)
{
	for (uint32_t i = 0; i < ram->nblocks; i++) {
		free(ram->blocks[i].dirty);
		ram->blocks[i].dirty = NULL;
	}
}

static void fill_page(uint64_t *words, uint64_t *rng)
{
	for (size_t i = 0; i < WORDS_PER_PAGE; i++)
		words[i] = guest_random(rng);
}

void guest_page_pattern(void *page, uint64_t state)
{
	fill_page(page, &state);
}

uint64_t guest_ram_fill(struct guest_ram *ram, double zero_fraction, uint64_t seed)
{
	uint64_t pages = ram->bytes / GUEST_PAGE_SIZE;
	uint64_t zero = (uint64_t)llround(zero_fraction * (double)pages);
	uint64_t left = zero, rng = seed;

	/* Selection sampling: page p stays zero with probability
	 * left / (pages - p), which picks exactly `zero` pages, uniformly. */
	for (uint64_t p = 0; p < pages; p++) {
		if (random_below(&rng, pages - p) < left) {
			left--;
			continue;
		}
		fill_page((uint64_t *)(ram->base + p * GUEST_PAGE_SIZE), &rng);
	}
	return zero;
}

int guest_dirty_sync(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages)
{
	struct guest_ram *ram = opaque;
	struct guest_block *b;

	if (block >= ram->nblocks || npages != ram->blocks[block].npages)
		return -LMT_EINVAL;
	b = &ram->blocks[block];
	/* Acquire pairs with the workload's release: a page's new contents
	 * are visible before the core reads it for its bit. */
	for (uint64_t i = 0; i < (npages + 63) / 64; i++)
		bitmap[i] |= atomic_exchange_explicit(&b->dirty[i], 0, memory_order_acquire);
	return 0;
}

/* ---- Workload ----------------------------------------------------------- */

struct guest_workload {
	struct guest_ram *ram;
	struct guest_write_log log; /* NULL arrays: not logged */
	uint64_t rate;
	uint64_t pages;  /* in the working set */
	uint64_t cursor; /* next page to rewrite */
	uint64_t rng;
	uint64_t written;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool pause;
	bool paused;
	bool stop;
	_Atomic uint32_t throttle; /* percent of the time the "vCPU" is held */
};

/* Rewrite the next page of the working set, then say so: a sync that
 * clears the bit before the data lands sees the bit again next time. */
static void workload_dirty_page(struct guest_workload *w)
{
	struct guest_ram *ram = w->ram;
	uint64_t index = w->cursor, page = index;
	struct guest_block *b = &ram->blocks[0];

	w->cursor = page + 1 == w->pages ? 0 : page + 1;
	if (page >= b->npages) {
		page -= b->npages;
		b = &ram->blocks[1];
	}
	/* The state before the fill is what rebuilds the page. */
	if (w->log.state) {
		w->log.state[index] = w->rng;
		w->log.written[index] = 1;
	}
	fill_page((uint64_t *)(b->host + page * GUEST_PAGE_SIZE), &w->rng);
	if (b->dirty)
		atomic_fetch_or_explicit(&b->dirty[page / 64], UINT64_C(1) << (page % 64),
		                         memory_order_release);
	w->written++;
}

/* Blocks while paused; false once asked to stop. */
static bool workload_gate(struct guest_workload *w, uint64_t *last_ns)
{
	bool run;

	pthread_mutex_lock(&w->lock);
	if (w->pause && !w->stop) {
		w->paused = true;
		pthread_cond_broadcast(&w->cond);
		while (w->pause && !w->stop)
			pthread_cond_wait(&w->cond, &w->lock);
		w->paused = false;
		*last_ns = guest_now_ns();
	}
	run = !w->stop;
	pthread_mutex_unlock(&w->lock);
	return run;
}

static void *workload_main(void *arg)
{
	struct guest_workload *w = arg;
	/* A token bucket in bytes, capped at 10 ms of credit so that a late
	 * wake-up does not turn into a burst. */
	uint64_t burst = w->rate / 100 > GUEST_PAGE_SIZE ? w->rate / 100 : GUEST_PAGE_SIZE;
	uint64_t credit = 0, last = guest_now_ns();
	const struct timespec slice = {0, SLICE_NS};

	while (workload_gate(w, &last)) {
		uint64_t now = guest_now_ns();
		/* A vCPU held `throttle` percent of the time dirties that much
		 * less. */
		unsigned __int128 earned = (unsigned __int128)(now - last) * w->rate *
		                           (100u - atomic_load(&w->throttle)) / 100u / 1000000000u;

		last = now;
		credit += earned > burst ? burst : (uint64_t)earned;
		if (credit > burst)
			credit = burst;
		for (; credit >= GUEST_PAGE_SIZE; credit -= GUEST_PAGE_SIZE)
			workload_dirty_page(w);
		nanosleep(&slice, NULL);
	}
	return NULL;
}

int guest_workload_start(struct guest_workload **out, struct guest_ram *ram, uint64_t working_set,
                         uint64_t rate, uint64_t seed)
{
	return guest_workload_start_logged(out, ram, working_set, rate, seed, NULL);
}

int guest_workload_start_logged(struct guest_workload **out, struct guest_ram *ram,
                                uint64_t working_set, uint64_t rate, uint64_t seed,
                                const struct guest_write_log *log)
{
	struct guest_workload *w = calloc(1, sizeof(*w));
	int rc;

	*out = NULL;
	if (!w)
		return -ENOMEM;
	if (log)
		w->log = *log;
	w->ram = ram;
	w->rate = rate;
	w->pages = working_set / GUEST_PAGE_SIZE;
	w->rng = seed ^ UINT64_C(0x5bd1e9955bd1e995);
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	rc = w->pages ? pthread_create(&w->thread, NULL, workload_main, w) : EINVAL;
	if (rc != 0) {
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		free(w);
		return -rc;
	}
	*out = w;
	return 0;
}

void guest_workload_throttle(struct guest_workload *w, uint32_t percent)
{
	if (w)
		atomic_store(&w->throttle, percent > 100 ? 100 : percent);
}

void guest_workload_pause(struct guest_workload *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->pause = true;
	while (!w->paused && !w->stop)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

uint64_t guest_workload_stop(struct guest_workload *w)
{
	uint64_t written;

	if (!w)
		return 0;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	written = w->written * GUEST_PAGE_SIZE;
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
	return written;
}
