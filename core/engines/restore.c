/* Restore from a file: target (docs/file-format.md). Read and check the
 * header, the commit record and the block table against the blocks the
 * VMM registered, then the bitmaps, digests and device state, each
 * against the commit record's checksums, and only then the pages present,
 * in parallel over the channels, straight into the blocks. With
 * verify=on every stripe is hashed and compared with its saved digest.
 * restore=lazy checks the same, then hands the pages to lazy.c.
 * Room: engines; may use: every room below it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "bitmap.h"
#include "bytes.h"
#include "error.h"
#include "file.h"
#include "session.h"
#include "uffd.h"
#include "lazy.h"
#include "restore.h"
#include "verify.h"

/* What a restore holds while it runs. */
struct restore {
	struct lmt_session *s;
	struct lmt__file *f;
	struct lmt_file_commit commit;
	struct lmt__mover m;
	uint64_t **bitmaps; /* per block, as read */
	uint64_t **digests; /* per block with verify=on */
	uint8_t *state;     /* the device state, rounded up */
	bool lazy;          /* restore=lazy */
	struct lmt__uffd *uffd;
};

static int refuse(struct lmt_session *s, int code, const struct lmt_error *err)
{
	return lmt__fail(s, code, "file '%s': %s", s->file_path, err->message);
}

/* Read [offset, offset + length) of the file into `buf` and wait. */
static int read_range(struct restore *r, lmt_rkey *rkey, uint64_t offset, void *buf,
                      uint64_t length)
{
	int rc = lmt__mover_post(&r->m, rkey, offset, offset, buf, length);
	return rc ? rc : lmt__mover_drain(&r->m);
}

/* The header and the commit record, read under a key for just them, so
 * that a file too short for even those is told apart. */
static int read_head(struct restore *r)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	uint8_t *buf = lmt__file_buffer(2 * LMT_FILE_ALIGN);
	lmt_rkey *head = NULL;
	struct lmt_error err = {0};
	if (!buf)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__file_import(s, 0, 2 * LMT_FILE_ALIGN, &head);
	if (!rc)
		rc = read_range(r, head, 0, buf, 2 * LMT_FILE_ALIGN);
	if (head)
		s->desc->ops.rkey_release(s->inst, head);
	if (!rc && (rc = lmt__file_decode_header(buf, LMT_FILE_ALIGN, &f->h, &err)))
		refuse(s, LMT_EPROTO, &err);
	if (!rc && (rc = lmt__file_decode_commit(buf + LMT_FILE_ALIGN, LMT_FILE_ALIGN, &f->h,
	                                         &r->commit, &err)))
		refuse(s, LMT_EPROTO, &err);
	free(buf);
	return rc;
}

/* The file's blocks must be the registered ones, in order. */
static int match_blocks(struct restore *r)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	if (f->h.block_count != s->nblocks)
		return lmt__fail(s, LMT_EMISMATCH,
		                 "file '%s': block table: %u blocks in the file, %u registered",
		                 s->file_path, f->h.block_count, s->nblocks);
	for (uint32_t i = 0; i < s->nblocks; i++) {
		const struct lmt_file_block *fb = &f->blocks[i];
		const struct lmt_block *b = &s->blocks[i];
		if (strcmp(fb->name, b->name) || fb->length != b->length ||
		    fb->page_size != b->page_size)
			return lmt__fail(s, LMT_EMISMATCH,
			                 "file '%s': block table: block %u is '%s' of %llu bytes "
			                 "(%u-byte pages) in the file, '%s' of %llu bytes (%u-byte "
			                 "pages) registered",
			                 s->file_path, i, fb->name, (unsigned long long)fb->length,
			                 fb->page_size, b->name, (unsigned long long)b->length,
			                 b->page_size);
	}
	return 0;
}

static int read_table(struct restore *r)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	struct lmt_error err = {0};
	uint64_t len = lmt__file_round(f->h.table_length, LMT_FILE_ALIGN);
	uint8_t *buf = lmt__file_buffer(len);
	if (!buf || !(f->blocks = calloc(f->h.block_count, sizeof(*f->blocks)))) {
		free(buf);
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	}
	int rc = read_range(r, f->rkey, f->h.table_offset, buf, len);
	if (!rc && (rc = lmt__file_decode_table(buf, len, &f->h, f->blocks, &err)))
		refuse(s, LMT_EPROTO, &err);
	free(buf);
	return rc ? rc : match_blocks(r);
}

/* Words of a little-endian area, in place. */
static void from_le(uint64_t *words, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		words[i] = lmt__get64((const uint8_t *)&words[i]);
}

/* Every bitmap (and the digests with verify=on), checked against the
 * commit record before any page is read. */
static int read_maps(struct restore *r)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	uint32_t n = s->nblocks;
	bool digests = s->verify;
	if (digests && !(f->h.flags & LMT_FILE_DIGESTS))
		return lmt__fail(s, LMT_EINVAL,
		                 "file '%s': verify=on, but the file has no digests (it was saved "
		                 "with verify=off)",
		                 s->file_path);
	r->bitmaps = calloc(n, sizeof(*r->bitmaps));
	r->digests = calloc(n, sizeof(*r->digests));
	if (!r->bitmaps || !r->digests)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = 0;
	for (uint32_t i = 0; i < n && !rc; i++) {
		const struct lmt_file_block *fb = &f->blocks[i];
		if (!(r->bitmaps[i] = lmt__file_buffer(fb->bitmap_length)) ||
		    (digests && !(r->digests[i] = lmt__file_buffer(fb->digests_length))))
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", fb->name);
		rc = lmt__mover_post(&r->m, f->rkey, fb->bitmap_offset, fb->bitmap_offset,
		                     r->bitmaps[i],
		                     lmt__file_round(fb->bitmap_length, LMT_FILE_ALIGN));
		if (!rc && digests)
			rc = lmt__mover_post(&r->m, f->rkey, fb->digests_offset, fb->digests_offset,
			                     r->digests[i],
			                     lmt__file_round(fb->digests_length, LMT_FILE_ALIGN));
	}
	if (rc || (rc = lmt__mover_drain(&r->m)))
		return rc;
	XXH3_state_t bitmaps, sums;
	XXH3_64bits_reset(&bitmaps);
	XXH3_64bits_reset(&sums);
	for (uint32_t i = 0; i < n; i++) {
		XXH3_64bits_update(&bitmaps, r->bitmaps[i], f->blocks[i].bitmap_length);
		if (digests)
			XXH3_64bits_update(&sums, r->digests[i], f->blocks[i].digests_length);
	}
	if (XXH3_64bits_digest(&bitmaps) != r->commit.bitmaps_digest)
		return lmt__fail(
		        s, LMT_EPROTO,
		        "file '%s': the page bitmaps do not match their checksum (corrupt)",
		        s->file_path);
	if (digests && XXH3_64bits_digest(&sums) != r->commit.digests_digest)
		return lmt__fail(
		        s, LMT_EPROTO,
		        "file '%s': the page digests do not match their checksum (corrupt)",
		        s->file_path);
	for (uint32_t i = 0; i < n; i++) {
		struct lmt_error err = {0};
		from_le(r->bitmaps[i], f->blocks[i].bitmap_length / 8);
		if (digests)
			from_le(r->digests[i], f->blocks[i].digests_length / 8);
		if ((rc = lmt__file_check_bitmap(&f->blocks[i], r->bitmaps[i], &err)))
			return refuse(s, LMT_EPROTO, &err);
	}
	return 0;
}

static int read_state(struct restore *r)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	uint64_t len = r->commit.state_length;
	pthread_mutex_lock(&s->opts_lock);
	uint64_t max = (uint64_t)lmt__opt_int(s->opts, "max-device-state");
	pthread_mutex_unlock(&s->opts_lock);
	if (len > max)
		return lmt__fail(
		        s, LMT_EOVERFLOW,
		        "file '%s': device state of %llu bytes, more than max-device-state "
		        "(%llu)",
		        s->file_path, (unsigned long long)len, (unsigned long long)max);
	if (!len)
		return 0;
	if (!(r->state = lmt__file_buffer(len)))
		return lmt__fail(s, LMT_ENOMEM, "out of memory for %llu bytes of device state",
		                 (unsigned long long)len);
	int rc = read_range(r, f->rkey, f->h.state_offset, r->state,
	                    lmt__file_round(len, LMT_FILE_ALIGN));
	if (!rc && lmt__file_hash(r->state, len) != r->commit.state_digest)
		rc = lmt__fail(s, LMT_EPROTO,
		               "file '%s': the device state does not match its checksum (corrupt)",
		               s->file_path);
	return rc;
}

/* Every page present, in runs of up to chunk-size, into its block. */
static int read_pages(struct restore *r)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	uint64_t pages = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		const struct lmt_file_block *fb = &f->blocks[i];
		uint64_t per_chunk =
		        s->chunk_size >> b->page_shift ? s->chunk_size >> b->page_shift : 1;
		uint64_t p = 0;
		while ((p = lmt__bitmap_next(r->bitmaps[i], p, b->npages)) < b->npages) {
			uint64_t end = p + 1;
			while (end < b->npages && end - p < per_chunk &&
			       lmt__bitmap_test(r->bitmaps[i], end))
				end++;
			uint64_t off = p << b->page_shift, len = (end - p) << b->page_shift;
			int rc = lmt__mover_post(&r->m, f->rkey, fb->pages_offset + off,
			                         fb->pages_offset + off, b->host + off, len);
			if (rc)
				return rc;
			pages += end - p;
			p = end;
		}
	}
	int rc = lmt__mover_drain(&r->m);
	pthread_mutex_lock(&s->lock);
	s->stats.normal_pages = pages;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* verify=on: every stripe of every block against its saved digest. */
static int check_digests(struct restore *r)
{
	struct lmt_session *s = r->s;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		for (uint64_t k = 0; k < b->nstripes; k++) {
			if (lmt__is_cancelled(s))
				return lmt__fail(s, LMT_ECANCELED, "restore cancelled");
			lmt__verify_hash(b, k);
			if (b->digests[k] == r->digests[i][k])
				continue;
			uint64_t from = k << b->stripe_shift;
			uint64_t to = from + (1ull << b->stripe_shift);
			return lmt__fail(
			        s, LMT_EVERIFY,
			        "file '%s': verify: block '%s': bytes %llu to %llu differ from "
			        "the digest saved with them",
			        s->file_path, b->name, (unsigned long long)from,
			        (unsigned long long)((to < b->length ? to : b->length) - 1));
		}
	}
	return 0;
}

static void restore_free(struct restore *r)
{
	for (uint32_t i = 0; i < r->s->nblocks; i++) {
		if (r->bitmaps)
			free(r->bitmaps[i]);
		if (r->digests)
			free(r->digests[i]);
	}
	free(r->bitmaps);
	free(r->digests);
	if (r->state)
		explicit_bzero(r->state, lmt__file_round(r->commit.state_length, LMT_FILE_ALIGN));
	free(r->state);
	lmt__mover_fini(&r->m);
	lmt__uffd_close(r->uffd);
}

/* restore=lazy needs userfaultfd: known before the file is read. */
static int open_uffd(struct restore *r)
{
	struct lmt_error err = {0};
	if (lmt__uffd_open(&r->uffd, r->s->nblocks, r->s->userfaultfd, &err))
		return lmt__fail(r->s, err.code, "restore=lazy: %s", err.message);
	return 0;
}

/* Hand the checked file to the lazy restore (lazy.c), which owns the
 * descriptor, the mover and the maps from now on. */
static int start_lazy(struct restore *r)
{
	int rc = lmt__lazy_start(r->s, r->uffd, &r->m, r->bitmaps, r->digests);
	r->uffd = NULL;
	r->bitmaps = r->digests = NULL;
	r->m = (struct lmt__mover){0};
	return rc;
}

static int restore(struct restore *r, uint8_t **state, uint64_t *length)
{
	struct lmt_session *s = r->s;
	struct lmt__file *f = r->f;
	int rc;
	if ((r->lazy && (rc = open_uffd(r))) || (rc = lmt__file_open(s, LMT_STORAGE_READ, 0)) ||
	    (rc = lmt__mover_init(&r->m, s, true, false)) || (rc = read_head(r)))
		return rc;
	/* One key for the whole file as its commit record says it is: a
	 * file cut shorter is refused here, before anything else is read. */
	if ((rc = lmt__file_import(s, 0, r->commit.file_length, &f->rkey)) ||
	    (rc = read_table(r)) || (rc = read_maps(r)) || (rc = read_state(r)))
		return rc;
	atomic_store(&s->state, LMT_STATE_ACTIVE);
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_ACTIVE;
	s->stats.setup_ns = lmt__now() - s->start_ns;
	s->stats.passes = r->commit.passes < UINT32_MAX ? (uint32_t)r->commit.passes : UINT32_MAX;
	pthread_mutex_unlock(&s->lock);
	lmt__event_simple(s, LMT_EVENT_SETUP_DONE, 0);
	r->m.stats = true;
	if (r->lazy)
		rc = start_lazy(r);
	else if (!(rc = read_pages(r)) && s->verify)
		rc = check_digests(r);
	if (rc)
		return rc;
	*state = r->state;
	*length = r->commit.state_length;
	r->state = NULL;
	return 0;
}

int lmt__file_restore(struct lmt_session *s, uint8_t **state, uint64_t *length)
{
	struct restore r = {.s = s};
	pthread_mutex_lock(&s->opts_lock);
	r.lazy = strcmp(lmt__opt_text(s->opts, "restore"), "lazy") == 0;
	pthread_mutex_unlock(&s->opts_lock);
	pthread_mutex_lock(&s->lock);
	s->start_ns = lmt__now();
	pthread_mutex_unlock(&s->lock);
	if (!(r.f = s->file = calloc(1, sizeof(*s->file))))
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = restore(&r, state, length);
	restore_free(&r);
	if (!rc && !r.lazy)
		lmt__file_free(s);
	return rc;
}
