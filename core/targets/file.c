/* A file: target without a peer. The source engine runs as for a
 * migration, but what a destination would do — lay out its memory, hand
 * out keys, take the device state and the digests, acknowledge — is done
 * here, in the process, by writing the file's metadata through the same
 * storage plugin that writes the pages (docs/file-format.md). Also the
 * transfers both the save and the restore make outside the engine's walk
 * (`lmt__mover`).
 * Room: targets; may use: base, wire, session, control, transport. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "bytes.h"
#include "error.h"
#include "file.h"
#include "session.h"
#include "transport.h"

#define SLOT_BITS 20
#define HARVEST_MAX 64u
#define WAIT_SLICE_NS 10000000ull

struct mover_slot {
	uint64_t cookie; /* 0 when free */
	uint32_t channel;
	uint64_t bytes;
	uint64_t offset; /* in the file, for messages */
};

bool lmt__is_file_uri(const char *uri)
{
	return uri && strncmp(uri, LMT_FILE_URI_PREFIX, strlen(LMT_FILE_URI_PREFIX)) == 0;
}

int lmt__mover_init(struct lmt__mover *m, struct lmt_session *s, bool read, bool stats)
{
	*m = (struct lmt__mover){.s = s, .read = read, .stats = stats};
	pthread_mutex_lock(&s->opts_lock);
	m->depth = (uint32_t)lmt__opt_int(s->opts, "queue-depth");
	pthread_mutex_unlock(&s->opts_lock);
	m->nslots = s->channels * m->depth;
	m->slots = calloc(m->nslots, sizeof(*m->slots));
	m->free_slots = calloc(m->nslots, sizeof(*m->free_slots));
	if (!m->slots || !m->free_slots)
		return lmt__fail(s, LMT_ENOMEM, "out of memory for %u transfer slots", m->nslots);
	for (uint32_t i = 0; i < m->nslots; i++)
		m->free_slots[i] = m->nslots - 1 - i;
	m->nfree = m->nslots;
	if (read && !(m->read_fn = LMT_PLUGIN_READ(s->desc)))
		return lmt__fail(s, LMT_ENOTSUP, "plugin %s cannot read a file", s->desc->name);
	return 0;
}

void lmt__mover_fini(struct lmt__mover *m)
{
	free(m->slots);
	free(m->free_slots);
	m->slots = NULL;
	m->free_slots = NULL;
}

static int mover_complete(struct lmt__mover *m, const struct lmt_completion *cp)
{
	struct lmt_session *s = m->s;
	uint64_t idx = cp->cookie & ((1ull << SLOT_BITS) - 1);
	struct mover_slot *sl = idx < m->nslots ? &m->slots[idx] : NULL;
	if (!sl || !sl->cookie || sl->cookie != cp->cookie)
		return lmt__fail(s, LMT_EPROTO, "plugin %s completed unknown transfer 0x%llx",
		                 s->desc->name, (unsigned long long)cp->cookie);
	if (cp->status)
		return lmt__fail(
		        s, cp->status, "file '%s': %s of %llu bytes at offset %llu failed: %s",
		        s->file_path, m->read ? "read" : "write", (unsigned long long)sl->bytes,
		        (unsigned long long)sl->offset, lmt_strerror(cp->status));
	m->ch_writes[sl->channel]--;
	m->ch_inflight[sl->channel] -= sl->bytes;
	m->ch_progress_ns[sl->channel] = lmt__now();
	m->inflight--;
	m->done_bytes += sl->bytes;
	if (m->stats) {
		pthread_mutex_lock(&s->lock);
		s->stats.bytes_received += sl->bytes;
		s->stats.channel_bytes[sl->channel] += sl->bytes;
		pthread_mutex_unlock(&s->lock);
	}
	sl->cookie = 0;
	m->free_slots[m->nfree++] = (uint32_t)idx;
	return 0;
}

/* Harvest what completed, waiting up to one slice; a channel silent for
 * idle-timeout with transfers in flight has stalled. */
static int mover_harvest(struct lmt__mover *m)
{
	struct lmt_session *s = m->s;
	if (lmt__is_cancelled(s))
		return lmt__fail(s, LMT_ECANCELED, "%s cancelled", m->read ? "restore" : "save");
	struct lmt_completion comps[HARVEST_MAX];
	int n = s->desc->ops.progress(s->inst, comps, HARVEST_MAX, WAIT_SLICE_NS);
	if (n < 0)
		return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
		                 lmt_err_name(n));
	for (int i = 0; i < n; i++) {
		int rc = mover_complete(m, &comps[i]);
		if (rc)
			return rc;
	}
	uint64_t now = lmt__now();
	for (uint32_t ch = 0; ch < s->channels; ch++)
		if (m->ch_writes[ch] && now - m->ch_progress_ns[ch] > s->idle_timeout_ns)
			return lmt__fail(
			        s, LMT_ETIMEDOUT,
			        "file '%s': channel %u: %u transfers in flight and none done "
			        "for %llu ms",
			        s->file_path, ch, m->ch_writes[ch],
			        (unsigned long long)(s->idle_timeout_ns / 1000000));
	if (m->deadline && now >= m->deadline)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "switchover-timeout passed with the guest paused, writing the "
		                 "file's metadata; the source guest may resume");
	return 0;
}

static uint32_t mover_channel(const struct lmt__mover *m)
{
	uint32_t best = UINT32_MAX;
	for (uint32_t ch = 0; ch < m->s->channels; ch++)
		if (m->ch_writes[ch] < m->depth &&
		    (best == UINT32_MAX || m->ch_inflight[ch] < m->ch_inflight[best]))
			best = ch;
	return best;
}

int lmt__mover_post(struct lmt__mover *m, lmt_rkey *rkey, uint64_t key_offset, uint64_t file_offset,
                    void *buf, uint64_t len)
{
	struct lmt_session *s = m->s;
	uint64_t piece = s->chunk_size;
	while (len) {
		uint64_t n = len < piece ? len : piece;
		uint32_t ch = mover_channel(m);
		int rc = 0;
		if (ch == UINT32_MAX || m->nfree == 0) {
			if ((rc = mover_harvest(m)))
				return rc;
			continue;
		}
		uint32_t idx = m->free_slots[m->nfree - 1];
		uint64_t cookie = (++m->generation << SLOT_BITS) | idx;
		if (m->read)
			rc = m->read_fn(s->eps[ch], buf, n, rkey, key_offset, cookie);
		else
			rc = s->desc->ops.write(s->eps[ch], buf, n, NULL, rkey, key_offset, cookie);
		if (rc == -LMT_EAGAIN) {
			if ((rc = mover_harvest(m)))
				return rc;
			continue;
		}
		if (rc)
			return lmt__fail(s, rc,
			                 "file '%s': channel %u: cannot %s %llu bytes at offset "
			                 "%llu",
			                 s->file_path, ch, m->read ? "read" : "write",
			                 (unsigned long long)n, (unsigned long long)file_offset);
		m->nfree--;
		m->slots[idx] = (struct mover_slot){
		        .cookie = cookie, .channel = ch, .bytes = n, .offset = file_offset};
		if (m->ch_writes[ch]++ == 0)
			m->ch_progress_ns[ch] = lmt__now();
		m->ch_inflight[ch] += n;
		m->inflight++;
		buf = (uint8_t *)buf + n;
		key_offset += n;
		file_offset += n;
		len -= n;
	}
	return 0;
}

int lmt__mover_drain(struct lmt__mover *m)
{
	while (m->inflight) {
		int rc = mover_harvest(m);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- opening the file ---- */

int lmt__file_check_uri(struct lmt_session *s, const char *uri, const char *what)
{
	bool file = lmt__is_file_uri(uri), storage = s->caps & LMT_CAP_STORAGE;
	if (file && !storage)
		return lmt__usage(s, LMT_EINVAL,
		                  "%s: '%s' is a file target: create the session with the plugin "
		                  "\"file\" (this one's is \"%s\")",
		                  what, uri, s->wire_name);
	if (!file && storage)
		return lmt__usage(s, LMT_EINVAL,
		                  "%s: plugin \"%s\" saves to and restores from a file: expected "
		                  "file:PATH, got '%s'",
		                  what, s->wire_name, uri);
	if (!file)
		return 0;
	size_t n = strlen(uri + strlen(LMT_FILE_URI_PREFIX));
	if (n == 0 || n > LMT_STORAGE_PATH_MAX)
		return lmt__usage(s, LMT_EINVAL, "%s: '%s': the path must have 1 to %u bytes", what,
		                  uri, LMT_STORAGE_PATH_MAX);
	return 0;
}

int lmt__file_set_path(struct lmt_session *s, const char *uri)
{
	free(s->file_path);
	s->file_path = strdup(uri + strlen(LMT_FILE_URI_PREFIX));
	return s->file_path ? 0 : lmt__usage(s, LMT_ENOMEM, "out of memory");
}

int lmt__file_open(struct lmt_session *s, enum lmt_storage_mode mode, uint64_t size)
{
	int rc = lmt__endpoints_open_local(s);
	for (uint32_t c = 0; c < s->channels && !rc; c++) {
		struct lmt_blob addr;
		enum lmt_storage_mode m =
		        mode == LMT_STORAGE_CREATE && c ? LMT_STORAGE_WRITE : mode;
		if (lmt__file_address(&addr, m, s->file_path, m == LMT_STORAGE_CREATE ? size : 0))
			return lmt__fail(s, LMT_EINVAL, "file '%s': path too long", s->file_path);
		rc = s->desc->ops.ep_connect(s->eps[c], &addr);
		if (rc)
			rc = lmt__fail(s, rc, "file '%s': channel %u cannot open it", s->file_path,
			               c);
	}
	return rc;
}

int lmt__file_import(struct lmt_session *s, uint64_t offset, uint64_t length, lmt_rkey **rkey)
{
	struct lmt_blob key;
	lmt__file_key(&key, offset, length);
	int rc = s->desc->ops.rkey_import(s->inst, &key, rkey);
	return rc ? lmt__fail(s, rc, "file '%s': cannot reach %llu bytes at offset %llu",
	                      s->file_path, (unsigned long long)length, (unsigned long long)offset)
	          : 0;
}

void *lmt__file_buffer(uint64_t length)
{
	void *p = NULL;
	uint64_t n = lmt__file_round(length ? length : 1, LMT_FILE_ALIGN);
	if (n > SIZE_MAX || posix_memalign(&p, LMT_FILE_ALIGN, (size_t)n))
		return NULL;
	memset(p, 0, (size_t)n);
	return p;
}

void lmt__file_free(struct lmt_session *s)
{
	struct lmt__file *f = s->file;
	if (!f)
		return;
	if (f->rkey && s->inst)
		s->desc->ops.rkey_release(s->inst, f->rkey);
	free(f->blocks);
	free(f);
	s->file = NULL;
}

/* ---- the save ---- */

/* Lay the file out for the session's blocks, create it, write the header
 * and the block table, and give every window of every block its key: the
 * engine then writes pages to their fixed places. */
int lmt__file_save_open(struct lmt_session *s)
{
	struct lmt__file *f = calloc(1, sizeof(*f));
	if (!f || !(f->blocks = calloc(s->nblocks, sizeof(*f->blocks)))) {
		free(f);
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	}
	s->file = f;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		lmt__copy(f->blocks[i].name, sizeof(f->blocks[i].name), b->name);
		f->blocks[i].length = b->length;
		f->blocks[i].page_size = b->page_size;
		if (!(b->present = calloc(b->words, sizeof(uint64_t))))
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", b->name);
	}
	lmt__file_layout(&f->h, f->blocks, s->nblocks, s->verify);
	if (getrandom(f->h.save_id, sizeof(f->h.save_id), 0) != sizeof(f->h.save_id))
		return lmt__fail(s, LMT_EIO, "file: no random bytes for the save id");
	uint64_t table_end = lmt__file_round(f->h.table_offset + f->h.table_length, LMT_FILE_ALIGN);
	uint8_t *meta = lmt__file_buffer(table_end);
	if (!meta)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	lmt__file_encode_table(f->blocks, s->nblocks, meta + f->h.table_offset);
	f->h.table_digest = lmt__file_hash(meta + f->h.table_offset, f->h.table_length);
	lmt__file_encode_header(&f->h, meta);
	/* The commit record's place stays a hole: zero until the end. */
	struct lmt__mover m = {0};
	lmt_rkey *head = NULL;
	int rc = lmt__file_open(s, LMT_STORAGE_CREATE, f->h.state_offset);
	if (!rc)
		rc = lmt__mover_init(&m, s, false, false);
	if (!rc && !(rc = lmt__file_import(s, 0, table_end, &head))) {
		if (!(rc = lmt__mover_post(&m, head, 0, 0, meta, LMT_FILE_ALIGN)))
			rc = lmt__mover_post(&m, head, f->h.table_offset, f->h.table_offset,
			                     meta + f->h.table_offset,
			                     table_end - f->h.table_offset);
		if (!rc)
			rc = lmt__mover_drain(&m);
		s->desc->ops.rkey_release(s->inst, head);
	}
	lmt__mover_fini(&m);
	free(meta);
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		struct lmt_block *b = &s->blocks[i];
		for (uint64_t w = 0; w < b->nwindows && !rc; w++) {
			uint64_t off = w * b->window;
			uint64_t len = b->length - off < b->window ? b->length - off : b->window;
			rc = lmt__file_import(s, f->blocks[i].pages_offset + off, len,
			                      &b->rkeys[w]);
		}
	}
	return rc;
}

int lmt__file_sync_ahead(struct lmt_session *s)
{
	struct lmt__file *f = s->file;
	uint64_t t0 = lmt__now();
	int rc = s->desc->ops.flush(s->inst, s->idle_timeout_ns);
	if (rc)
		return lmt__fail(s, rc, "file '%s': flush failed (%s)", s->file_path,
		                 lmt_err_name(rc));
	uint64_t took = lmt__now() - t0;
	f->sync_ns = took > f->sync_ns - f->sync_ns / 8 ? took : f->sync_ns - f->sync_ns / 8;
	return 0;
}

void lmt__file_pause_cost(const struct lmt_session *s, uint64_t *bytes, uint64_t *sync_ns)
{
	const struct lmt__file *f = s->file;
	*bytes = LMT_FILE_ALIGN; /* the commit record */
	for (uint32_t i = 0; i < s->nblocks; i++)
		*bytes += lmt__file_round(f->blocks[i].bitmap_length, LMT_FILE_ALIGN) +
		          lmt__file_round(f->blocks[i].digests_length, LMT_FILE_ALIGN);
	*sync_ns = 2 * f->sync_ns;
}

/* Little-endian 64-bit words of `n` into an aligned buffer of `bytes`. */
static uint8_t *words_buffer(const uint64_t *words, uint64_t n, uint64_t bytes)
{
	uint8_t *p = lmt__file_buffer(bytes);
	for (uint64_t i = 0; p && i < n; i++)
		lmt__put64(p + i * 8, words[i]);
	return p;
}

static int flush(struct lmt_session *s, uint64_t deadline)
{
	uint64_t now = lmt__now();
	uint64_t left = deadline > now ? deadline - now : 0;
	if (!left)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "switchover-timeout passed with the guest paused, before the "
		                 "file's flush; the source guest may resume");
	int rc = s->desc->ops.flush(s->inst, left < s->idle_timeout_ns ? left : s->idle_timeout_ns);
	return rc ? lmt__fail(s, rc, "file '%s': flush failed (%s)", s->file_path, lmt_err_name(rc))
	          : 0;
}

/* The bitmaps, the digests and the device state, each hashed for the
 * commit record as it goes out. */
static int write_tail(struct lmt_session *s, struct lmt__mover *m, const void *state, size_t length,
                      uint8_t **bufs, struct lmt_file_commit *c)
{
	struct lmt__file *f = s->file;
	XXH3_state_t bitmaps, digests;
	XXH3_64bits_reset(&bitmaps);
	XXH3_64bits_reset(&digests);
	uint32_t k = 0;
	int rc = 0;
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		struct lmt_block *b = &s->blocks[i];
		const struct lmt_file_block *fb = &f->blocks[i];
		if (!(bufs[k] = words_buffer(b->present, b->words, fb->bitmap_length)))
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
		XXH3_64bits_update(&bitmaps, bufs[k], fb->bitmap_length);
		rc = lmt__mover_post(m, f->rkey, fb->bitmap_offset, fb->bitmap_offset, bufs[k],
		                     lmt__file_round(fb->bitmap_length, LMT_FILE_ALIGN));
		k++;
		if (rc || !fb->digests_length)
			continue;
		if (!(bufs[k] = words_buffer(b->digests, b->nstripes, fb->digests_length)))
			return lmt__fail(s, LMT_ENOMEM, "out of memory");
		XXH3_64bits_update(&digests, bufs[k], fb->digests_length);
		rc = lmt__mover_post(m, f->rkey, fb->digests_offset, fb->digests_offset, bufs[k],
		                     lmt__file_round(fb->digests_length, LMT_FILE_ALIGN));
		k++;
	}
	if (rc)
		return rc;
	c->bitmaps_digest = XXH3_64bits_digest(&bitmaps);
	c->digests_digest = s->verify ? XXH3_64bits_digest(&digests) : 0;
	c->state_length = length;
	c->state_digest = lmt__file_hash(state ? state : "", length);
	if (!length)
		return 0;
	if (!(bufs[k] = lmt__file_buffer(length)))
		return lmt__fail(s, LMT_ENOMEM, "out of memory for %zu bytes of device state",
		                 length);
	memcpy(bufs[k], state, length);
	return lmt__mover_post(m, f->rkey, f->h.state_offset, f->h.state_offset, bufs[k],
	                       lmt__file_round(length, LMT_FILE_ALIGN));
}

/* The guest is paused and its pages are in the file and flushed: the
 * bitmaps, digests and device state, a flush, then the commit record and
 * a last flush. Only then does the file restore. */
int lmt__file_save_finish(struct lmt_session *s, const void *state, size_t length, uint64_t passes,
                          uint64_t deadline)
{
	struct lmt__file *f = s->file;
	struct lmt_file_commit c = {.passes = passes};
	memcpy(c.save_id, f->h.save_id, sizeof(c.save_id));
	c.file_length = f->h.state_offset + lmt__file_round(length, LMT_FILE_ALIGN);
	uint32_t nbufs = 2 * s->nblocks + 2;
	uint8_t **bufs = calloc(nbufs, sizeof(*bufs));
	struct lmt__mover m = {0};
	int rc = bufs ? lmt__mover_init(&m, s, false, false)
	              : lmt__fail(s, LMT_ENOMEM, "out of memory");
	m.deadline = deadline;
	if (!rc)
		rc = lmt__file_import(s, 0, c.file_length, &f->rkey);
	if (!rc)
		rc = write_tail(s, &m, state, length, bufs, &c);
	if (!rc)
		rc = lmt__mover_drain(&m);
	if (!rc)
		rc = flush(s, deadline);
	if (!rc && !(bufs[nbufs - 1] = lmt__file_buffer(LMT_FILE_ALIGN)))
		rc = lmt__fail(s, LMT_ENOMEM, "out of memory");
	if (!rc) {
		lmt__file_encode_commit(&c, bufs[nbufs - 1]);
		rc = lmt__mover_post(&m, f->rkey, f->h.commit_offset, f->h.commit_offset,
		                     bufs[nbufs - 1], LMT_FILE_ALIGN);
	}
	if (!rc)
		rc = lmt__mover_drain(&m);
	if (!rc)
		rc = flush(s, deadline);
	lmt__mover_fini(&m);
	for (uint32_t i = 0; bufs && i < nbufs; i++)
		free(bufs[i]);
	free(bufs);
	return rc;
}
