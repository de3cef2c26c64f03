/* The synthetic guest (see guest.h): RAM blocks, a workload thread that
 * dirties them at a set rate with its content and pattern
 * (guest_content.c), the dirty-sync callback. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guest.h"
#include "guest_content.h"

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
uint64_t guest_random_below(uint64_t *state, uint64_t bound)
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

uint64_t guest_ram_fill(struct guest_ram *ram, double zero_fraction, uint64_t seed)
{
	uint64_t made[GUEST_PAGE_CLASSES];
	struct guest_content content;

	guest_content_random(&content, zero_fraction);
	guest_content_fill(&content, ram, seed, made);
	return made[GUEST_PAGE_ZERO];
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
	const struct guest_content *content;
	struct guest_hot_set hot; /* hot.hot 0: uniform */
	uint64_t rate;
	uint64_t pages;  /* in the working set */
	uint64_t cursor; /* uniform: the next page to rewrite */
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

/* Uniform: the working set page after page; hot: mostly its hot set. */
static uint64_t workload_next_page(struct guest_workload *w)
{
	uint64_t index = w->cursor;

	if (w->hot.hot)
		return guest_hot_set_next(&w->hot, &w->rng);
	w->cursor = index + 1 == w->pages ? 0 : index + 1;
	return index;
}

/* Rewrite the next page of the working set, then say so: a sync that
 * clears the bit before the data lands sees the bit again next time. */
static void workload_dirty_page(struct guest_workload *w)
{
	struct guest_ram *ram = w->ram;
	uint64_t index = workload_next_page(w), page = index;
	struct guest_block *b = &ram->blocks[0];
	uint64_t recipe = guest_content_rewrite(w->content, &w->rng);

	if (page >= b->npages) {
		page -= b->npages;
		b = &ram->blocks[1];
	}
	/* The recipe is what rebuilds the page. */
	if (w->log.state) {
		w->log.state[index] = recipe;
		w->log.written[index] = 1;
		if (w->log.count)
			w->log.count[index]++;
	}
	guest_content_page(w->content, b->host + page * GUEST_PAGE_SIZE, recipe);
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
	const struct guest_workload_spec spec = {
	        .working_set = working_set, .rate = rate, .seed = seed, .log = log};

	return guest_workload_start_spec(out, ram, &spec);
}

int guest_workload_start_spec(struct guest_workload **out, struct guest_ram *ram,
                              const struct guest_workload_spec *spec)
{
	struct guest_workload *w = calloc(1, sizeof(*w));
	int rc;

	*out = NULL;
	if (!w)
		return -ENOMEM;
	if (spec->log)
		w->log = *spec->log;
	w->ram = ram;
	w->content = spec->content;
	w->rate = spec->rate;
	w->pages = spec->working_set / GUEST_PAGE_SIZE;
	w->rng = spec->seed ^ UINT64_C(0x5bd1e9955bd1e995);
	guest_hot_set_init(&w->hot, spec->pattern, w->pages, spec->seed);
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
