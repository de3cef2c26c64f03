/* The source engine's set-up (engines room): after dial.c's way in, the
 * block list, handover negotiation, the channels, the destination's keys
 * and this side's registrations, the bitmaps and slots; lmt_save_setup. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bitmap.h"
#include "control.h"
#include "dial.h"
#include "engines.h"
#include "error.h"
#include "file.h"
#include "handover.h"
#include "net.h"
#include "session.h"
#include "source_engine.h"
#include "transport.h"
#include "verify.h"

/* ---- setup ---- */

static int send_blocks(struct lmt_session *s)
{
	struct lmt_msg_blocks *bl = calloc(1, sizeof(*bl));
	if (!bl)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	bl->count = s->nblocks;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		snprintf(bl->blocks[i].name, sizeof(bl->blocks[i].name), "%s", s->blocks[i].name);
		bl->blocks[i].length = s->blocks[i].length;
		bl->blocks[i].page_size = s->blocks[i].page_size;
	}
	int rc = lmt__enc_blocks(&s->out, bl);
	free(bl);
	return rc ? lmt__fail(s, rc, "encoding BLOCKS") : lmt__ctrl_send(s);
}

/* After authentication: the block list, and over unix: which blocks are
 * handed over. */
static int handshake(struct lmt_session *s, uint64_t deadline)
{
	int rc = send_blocks(s);
	if (!rc && s->ctrl_unix)
		rc = lmt__handover_negotiate_source(s, deadline);
	return rc;
}

static int open_channels(struct lmt_session *s, uint64_t deadline)
{
	int rc = lmt__endpoints_open(s);
	if (rc)
		return rc;
	struct lmt_msg_addrs *a = malloc(sizeof(*a));
	if (!a)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	rc = lmt__ctrl_expect(s, LMT_MSG_EP_ADDRS, deadline, &h);
	if (!rc && (rc = lmt__dec_addrs(s->in, h.length, a, &err)))
		lmt__fail(s, rc, "%s", err.message);
	if (!rc && a->count != s->channels)
		rc = lmt__fail(s, LMT_EPROTO, "the destination opened %u channels, expected %u",
		               a->count, s->channels);
	for (uint32_t c = 0; c < s->channels && !rc; c++) {
		rc = s->desc->ops.ep_connect(s->eps[c], &a->addrs[c]);
		if (rc)
			rc = lmt__fail(s, rc, "channel %u: cannot connect to the destination", c);
	}
	free(a);
	return rc;
}

int lmt__source_import_keys(struct lmt_session *s, size_t length)
{
	struct lmt_msg_regs *r = malloc(sizeof(*r));
	struct lmt_error err = {0};
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_regs(s->in, length, LMT_MSG_REG_REPLY, r, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < r->count && !rc; i++) {
		const struct lmt_msg_reg *g = &r->regs[i];
		struct lmt_block *b = g->block < s->nblocks ? &s->blocks[g->block] : NULL;
		uint64_t w = b ? g->offset / b->window : 0;
		if (!b || g->offset % b->window || w >= b->nwindows || b->rkeys[w] ||
		    g->length != (b->length - g->offset < b->window ? b->length - g->offset
		                                                    : b->window)) {
			rc = lmt__fail(s, LMT_EPROTO,
			               "REG_REPLY: key for block %u offset %llu length %llu was "
			               "not asked for",
			               g->block, (unsigned long long)g->offset,
			               (unsigned long long)g->length);
			break;
		}
		rc = s->desc->ops.rkey_import(s->inst, &g->key, &b->rkeys[w]);
		if (rc)
			rc = lmt__fail(s, rc, "block '%s': the destination's key is unusable",
			               b->name);
	}
	free(r);
	return rc;
}

int lmt__source_register_local(struct lmt_session *s, struct lmt_block *b, uint64_t w)
{
	uint64_t off = w * b->window;
	uint64_t len = b->length - off < b->window ? b->length - off : b->window;
	lmt_mr *mr = NULL;
	struct lmt_blob key = {0};
	int rc =
	        s->desc->ops.mr_register(s->inst, b->host + off, len, LMT_MR_LOCAL_READ, &mr, &key);
	if (rc)
		return lmt__fail(s, rc, "block '%s': cannot register %llu bytes at offset %llu",
		                 b->name, (unsigned long long)len, (unsigned long long)off);
	b->mrs[w] = mr;
	return 0;
}

int lmt__source_window_mr(struct lmt_session *s, uint32_t block, uint64_t w, lmt_mr **mr)
{
	struct lmt_block *b = &s->blocks[block];
	int rc = 0;
	if ((s->caps & LMT_CAP_LOCAL_MR) && !b->mrs[w])
		rc = lmt__source_register_local(s, b, w);
	*mr = b->mrs[w];
	return rc;
}

/* Wait for READY; with pin-all the keys of every block come first. */
static int wait_ready(struct lmt_session *s)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	for (;;) {
		int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
		if (rc)
			return rc;
		if (h.type == LMT_MSG_READY)
			break;
		if (h.type == LMT_MSG_REG_REPLY && s->pin_all)
			rc = lmt__source_import_keys(s, h.length);
		else
			rc = lmt__fail(s, LMT_EPROTO, "expected READY from the destination, got %s",
			               lmt__msg_name(h.type));
		if (rc)
			return rc;
	}
	int rc = lmt__dec_empty(s->in, h.length, LMT_MSG_READY, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < s->nblocks && s->pin_all; i++)
		if (lmt__block_copied(&s->blocks[i]) && !s->blocks[i].rkeys[0])
			return lmt__fail(s, LMT_EPROTO,
			                 "pin-all: the destination sent no key for '%s'",
			                 s->blocks[i].name);
	return 0;
}

static int alloc_slots(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	e->nslots = s->channels * e->queue_depth;
	e->slots = calloc(e->nslots, sizeof(*e->slots));
	e->free_slots = calloc(e->nslots, sizeof(*e->free_slots));
	if (!e->slots || !e->free_slots)
		return lmt__fail(s, LMT_ENOMEM, "out of memory for %u write slots", e->nslots);
	for (uint32_t i = 0; i < e->nslots; i++)
		e->free_slots[i] = e->nslots - 1 - i;
	e->nfree = e->nslots;
	return 0;
}

static void read_options(struct lmt_session *s)
{
	struct lmt_source_engine *e = s->source;
	const struct lmt_optset *o = s->opts;
	pthread_mutex_lock(&s->opts_lock);
	e->zero_detect = lmt__opt_bool(o, "zero-page-detection");
	e->zero_runs = e->zero_detect && !s->file_path;
	e->max_bandwidth = (uint64_t)lmt__opt_int(o, "max-bandwidth");
	e->switchover.option_bps = (uint64_t)lmt__opt_int(o, "switchover-bandwidth");
	e->downtime_limit_ns = (uint64_t)lmt__opt_int(o, "downtime-limit");
	e->iterate_ns = (uint64_t)lmt__opt_int(o, "max-iterate-ms");
	e->queue_depth = (uint32_t)lmt__opt_int(o, "queue-depth");
	e->switchover_timeout_ns = (uint64_t)lmt__opt_int(o, "switchover-timeout");
	e->postcopy_after = (uint32_t)lmt__opt_int(o, "postcopy-after");
	lmt__converge_configure(&e->converge, o);
	pthread_mutex_unlock(&s->opts_lock);
	e->switchover_deadline = NO_DEADLINE;
}

/* The source's page bitmaps and the destination's keys, per block. */
static int alloc_bitmaps(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		b->rkeys = calloc(b->nwindows, sizeof(*b->rkeys));
		b->dirty = calloc(b->words, sizeof(uint64_t));
		b->inflight = calloc(b->words, sizeof(uint64_t));
		b->sync = calloc(b->words, sizeof(uint64_t));
		if (!b->rkeys || !b->dirty || !b->inflight || !b->sync)
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", b->name);
	}
	return 0;
}

static int prepare(struct lmt_session *s)
{
	int rc = lmt__session_prepare(s);
	if (rc)
		return rc;
	read_options(s);
	s->source->landed = malloc(sizeof(*s->source->landed));
	if (!s->source->landed)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	return alloc_bitmaps(s);
}

/* Connect to `uri`, or with fd >= 0 use that socket (the session owns it
 * from here, whatever happens). */
static int setup(struct lmt_session *s, const char *uri, int fd)
{
	int rc = prepare(s);
	if (!rc && s->file_path) /* no destination: the file is laid out here */
		return (rc = lmt__file_save_open(s)) ? rc : alloc_slots(s);
	uint64_t deadline = s->start_ns + s->connect_timeout_ns;
	if (rc && fd >= 0)
		close(fd);
	if (!rc)
		rc = lmt__source_dial(s, uri, fd, deadline);
	if (rc || (rc = handshake(s, deadline)) || (rc = open_channels(s, deadline)))
		return rc;
	if (s->pin_all && (s->caps & LMT_CAP_LOCAL_MR))
		for (uint32_t i = 0; i < s->nblocks && !rc; i++)
			if (lmt__block_copied(&s->blocks[i]))
				rc = lmt__source_register_local(s, &s->blocks[i], 0);
	if (rc || (rc = wait_ready(s)))
		return rc;
	return alloc_slots(s);
}

int lmt__save_check(struct lmt_session *s, const char *uri, const char *what)
{
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "%s: this session is a destination", what);
	if (!uri)
		return lmt__usage(s, LMT_EINVAL, "%s: uri is NULL, expected host:port", what);
	int rc = lmt__file_check_uri(s, uri, what);
	if (rc)
		return rc;
	if (s->nblocks == 0)
		return lmt__usage(s, LMT_EINVAL, "%s: no RAM blocks: add them before setup", what);
	if (!s->source->dirty_fn)
		return lmt__usage(s, LMT_EINVAL, "%s: no dirty-sync callback: set it before setup",
		                  what);
	char why[160];
	pthread_mutex_lock(&s->opts_lock);
	const char *bad = lmt__converge_check(&s->source->converge, s->opts, why, sizeof(why));
	pthread_mutex_unlock(&s->opts_lock);
	if (bad)
		return lmt__usage(s, LMT_EINVAL, "%s: %s", what, bad);
	return 0;
}

static int save_setup(lmt_session *s, const char *uri, int fd)
{
	int rc = lmt__save_check(s, uri, "save setup");
	int expected = LMT_STATE_NEW;
	if (!rc && !atomic_compare_exchange_strong(&s->state, &expected, LMT_STATE_SETUP))
		rc = lmt__usage(s, LMT_ESTATE, "save setup: called twice");
	else if (!rc && lmt__is_file_uri(uri) && (rc = lmt__file_set_path(s, uri)))
		atomic_store(&s->state, LMT_STATE_NEW);
	if (rc) {
		if (fd >= 0)
			close(fd);
		return rc;
	}
	pthread_mutex_lock(&s->lock);
	s->start_ns = lmt__now();
	s->stats.status = LMT_STATUS_SETUP;
	pthread_mutex_unlock(&s->lock);
	rc = setup(s, uri, fd);
	if (rc)
		return lmt__abort(s, rc);
	atomic_store(&s->state, LMT_STATE_ACTIVE);
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_ACTIVE;
	s->stats.setup_ns = lmt__now() - s->start_ns;
	pthread_mutex_unlock(&s->lock);
	lmt__event_simple(s, LMT_EVENT_SETUP_DONE, 0);
	return 0;
}

int lmt_save_setup(lmt_session *s, const char *uri)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(
		        s, LMT_ESTATE,
		        "save setup: a job started with lmt_save_start runs this session");
	lmt__call_enter(s);
	int rc = save_setup(s, uri, -1);
	lmt__call_leave(s);
	return rc;
}

int lmt__save_connected(struct lmt_session *s, int fd)
{
	lmt__call_enter(s);
	int rc = save_setup(s, "a connected socket", fd);
	lmt__call_leave(s);
	return rc;
}

