/* A file: target (file.c, restore.c): the save without a destination,
 * the restore without a source, and the transfers both make through the
 * storage plugin outside the engine's walk.
 * Room: targets; may use: base, wire, session, control, transport. */
#ifndef LMT_CORE_FILE_H
#define LMT_CORE_FILE_H

#include <stdbool.h>
#include <stdint.h>

#include <lmt/lmt.h>

#include "fileformat.h"

#define LMT_FILE_URI_PREFIX "file:"

struct lmt_session;

/* The layout of the file being saved or restored. */
struct lmt__file {
	struct lmt_file_header h;
	struct lmt_file_block *blocks; /* one per session block, in order */
	lmt_rkey *rkey;                /* the whole file, while it is in use */
	/* Saving: how long a flush of the passes' writes took (one that
	 * follows a longer one at once and a shorter one slowly); 0 before
	 * the first (lmt__file_sync_ahead). */
	uint64_t sync_ns;
};

/* Transfers between memory and the file, spread over the channels like
 * the engine's writes: each piece at most chunk-size, at most queue-depth
 * per channel, each cookie accounted for. */
struct lmt__mover {
	struct lmt_session *s;
	bool read;
	bool stats; /* count what arrives as bytes received (restore) */
	lmt_plugin_read_fn read_fn;
	uint32_t depth;
	struct mover_slot *slots;
	uint32_t *free_slots;
	uint32_t nslots;
	uint32_t nfree;
	uint32_t inflight;
	uint64_t generation;
	uint64_t deadline; /* 0: none but idle-timeout per channel */
	uint64_t done_bytes;
	uint32_t ch_writes[LMT_MAX_CHANNELS];
	uint64_t ch_inflight[LMT_MAX_CHANNELS];
	uint64_t ch_progress_ns[LMT_MAX_CHANNELS];
};

int lmt__mover_init(struct lmt__mover *m, struct lmt_session *s, bool read, bool stats);
void lmt__mover_fini(struct lmt__mover *m);
/* Move `len` bytes between `buf` and `key_offset` in the region of `rkey`
 * (`file_offset` names the place in messages); waits for room, not for
 * the transfer. */
int lmt__mover_post(struct lmt__mover *m, lmt_rkey *rkey, uint64_t key_offset, uint64_t file_offset,
                    void *buf, uint64_t len);
/* Wait until every transfer posted is done. */
int lmt__mover_drain(struct lmt__mover *m);

bool lmt__is_file_uri(const char *uri);
/* Refuse (lmt__usage) a file: uri for a plugin that is not a storage one,
 * another uri for one that is, and a path that does not fit. */
int lmt__file_check_uri(struct lmt_session *s, const char *uri, const char *what);
/* Keep the path of a checked file: uri in the session. */
int lmt__file_set_path(struct lmt_session *s, const char *uri);
/* Open the instance and every channel's endpoint on the file. */
int lmt__file_open(struct lmt_session *s, enum lmt_storage_mode mode, uint64_t size);
/* A key for [offset, offset + length) of the file. */
int lmt__file_import(struct lmt_session *s, uint64_t offset, uint64_t length, lmt_rkey **rkey);
/* Zeroed memory of `length` rounded up to LMT_FILE_ALIGN, so aligned for
 * O_DIRECT; free(). NULL when out of memory. */
void *lmt__file_buffer(uint64_t length);
/* Release the file's layout and key. */
void lmt__file_free(struct lmt_session *s);

/* Source: create the file, write its header and block table, and give
 * the engine a key for every window. */
int lmt__file_save_open(struct lmt_session *s);
/* Source, the passes' writes drained as they near convergence: make them
 * durable now, so that the pause's syncs have only the last pass's left,
 * and time it for the estimate. */
int lmt__file_sync_ahead(struct lmt_session *s);
/* What the pause adds for the file besides the pages: the bytes of its
 * metadata (bitmaps, digests, commit record), written at the pages'
 * rate, and its two syncs, each at the cost of the last sync ahead. */
void lmt__file_pause_cost(const struct lmt_session *s, uint64_t *bytes, uint64_t *sync_ns);
/* Source, the pages written and flushed: bitmaps, digests, device state,
 * flush, commit record, flush; all before `deadline`. */
int lmt__file_save_finish(struct lmt_session *s, const void *state, size_t length, uint64_t passes,
                          uint64_t deadline);

#endif
