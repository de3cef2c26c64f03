/* Postcopy's state (paging room), shared by its two halves and private
 * to them: the destination's (paging/postcopy_destination.c) and the
 * source's (engines/postcopy_source.c), over the start, end and release
 * both make (paging/postcopy.c). */
#ifndef LMT_CORE_POSTCOPY_STATE_H
#define LMT_CORE_POSTCOPY_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "postcopy.h"
#include "sync.h"
#include "uffd.h"

#define FAULT_SLOTS 16u /* slots bulk writes leave for faults */
/* Writes in place (no staging slot) in flight at once, and how many of
 * them bulk writes leave for faults. */
#define IN_PLACE_WRITES 64u
#define FAULT_IN_PLACE 8u
#define REQ_RING 4096u /* faulted pages the source keeps in wait */
#define HARVEST_MAX 64u
#define BUSY_WAIT_NS 200000ull /* a wait with writes in flight */
#define IDLE_WAIT_NS 10000000ull
#define TARGET_SLICE_NS 200000ull
#define SETTLE_PAGES 512u    /* the guest's own pages put back between messages */
#define POPULATE_PAGES 2048u /* second-mapping pages mapped between messages */
#define SLOT_BITS 20

enum slot_state { SLOT_FREE, SLOT_WRITING, SLOT_AT_DESTINATION };

struct pc_slot {
	uint8_t state;
	bool requested;
	uint32_t channel;
	uint64_t cookie;
	struct lmt_msg_page run;
};

struct lmt__postcopy {
	struct lmt_session *s;
	pthread_t thread;
	bool started;
	pthread_mutex_t lock; /* done and rc */
	pthread_cond_t cond;
	bool done;
	int rc;
	uint32_t slot_size;
	uint32_t nslots;
	uint64_t pages;     /* sent (source) or placed (destination) */
	uint64_t requested; /* of them, asked for by a fault */

	/* source */
	lmt_rkey *rkey;
	lmt_rkey **alias_rkeys; /* per block written in place; NULL otherwise */
	/* writes in flight: a staging slot's (index < nslots), or one in
	 * place (nslots and on), each with its free list */
	struct pc_slot *slots;
	uint32_t *free;
	uint32_t nfree;
	uint32_t local_free[IN_PLACE_WRITES];
	uint32_t nlocal_free;
	uint64_t generation;
	struct lmt_msg_page ring[REQ_RING];
	uint32_t ring_head, ring_len;
	uint32_t cur_block;
	uint64_t cur_page;
	uint64_t left; /* pages not sent yet */
	uint32_t writing;
	uint32_t ch_writes[LMT_MAX_CHANNELS];
	uint64_t ch_progress_ns[LMT_MAX_CHANNELS];
	struct lmt_msg_pages *batch;
	double bw_allowance;
	uint64_t bw_refill_ns;
	uint64_t bw_wait_ns; /* max-bandwidth holds the pushes this long */
	uint64_t bw_rate;    /* max-bandwidth, read at each turn of the loop */
	/* The last sign of the destination's progress: a slot back, a write
	 * completed, a request. */
	uint64_t progress_ns;

	/* destination */
	uint64_t **coming; /* per block, until the switch */
	/* per block written in place: the second mapping of its file and
	 * its registration (NULL for a block placed from staging) */
	uint8_t **alias;
	lmt_mr **alias_mrs;
	struct lmt__uffd *u;
	uint8_t *staging;
	size_t staging_len;
	lmt_mr *staging_mr;
	struct lmt_msg_pages *in;
	struct lmt_msg_slots *freed;
	bool settled; /* every local page is back */
	/* The second mappings' coming pages mapped ahead of their writes:
	 * where populate_block/populate_page got to, and whether done. */
	uint32_t populate_block;
	uint64_t populate_page;
	bool populated;
	pthread_mutex_t req_lock; /* the fault thread's requests */
	struct lmt_buf req_buf;
	uint64_t channel_bytes[LMT_MAX_CHANNELS];
};

struct lmt__postcopy *lmt__postcopy_alloc(struct lmt_session *s);
void lmt__postcopy_release(struct lmt__postcopy *pc);
/* The thread's end: its result, for lmt__postcopy_finish. */
void lmt__postcopy_end(struct lmt__postcopy *pc, int rc);
int lmt__postcopy_start_thread(struct lmt__postcopy *pc, void *(*fn)(void *));
/* Whether a run a peer named lies within a block that is copied. */
bool lmt__postcopy_run_is_guests(const struct lmt_session *s, const struct lmt_msg_page *r);
/* The channel faults take: the last, opened for them (docs/engine.md). */
uint32_t lmt__postcopy_priority_channel(const struct lmt_session *s);

#endif
