/* The destination engine serving an admitted source (engines room): the
 * blocks it proposes checked, the channels, registrations asked for and
 * made, what landed, the device state, COMPLETE with its checks and
 * acknowledgement. Room: engines; may use: every room below it. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admit.h"
#include "bitmap.h"
#include "error.h"
#include "file.h"
#include "lobby.h"
#include "net.h"
#include "postcopy.h"
#include "uffd.h"
#include "session.h"
#include "control.h"
#include "engines.h"
#include "handover.h"
#include "lazy.h"
#include "restore.h"
#include "transport.h"
#include "destination_engine.h"
#include "verify.h"
#include "tls_session.h"

#define TARGET_SLICE_NS 1000000ull
#define CONTROL_SLICE_MS 50


static int send_status(struct lmt_session *s, uint16_t type, int code, const char *text)
{
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .code = code};
	snprintf(st.text, sizeof(st.text), "%s", text);
	int rc = lmt__enc_status(&s->out, type, &st);
	return rc ? lmt__fail(s, rc, "encoding %s", lmt__msg_name(type)) : lmt__ctrl_send(s);
}

/* Fail, and say why to the source in the reply it waits for. */
static int refuse(struct lmt_session *s, uint16_t type, int code, const char *fmt, ...)
        LMT_PRINTF(4, 5);

static int refuse(struct lmt_session *s, uint16_t type, int code, const char *fmt, ...)
{
	char text[LMT_PROTO_MAX_TEXT + 1];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	send_status(s, type, -code, text);
	return lmt__fail(s, code, "%s", text);
}

int lmt__destination_check_blocks(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, LMT_MSG_BLOCKS, deadline, &h);
	if (rc)
		return rc;
	struct lmt_msg_blocks *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = lmt__dec_blocks(s->in, h.length, m, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	else if (m->count != s->nblocks)
		rc = lmt__fail(s, LMT_EMISMATCH,
		               "RAM blocks: the source has %u, the destination has %u", m->count,
		               s->nblocks);
	for (uint32_t i = 0; i < m->count && !rc; i++) {
		const struct lmt_msg_block *theirs = &m->blocks[i];
		const struct lmt_block *mine = &s->blocks[i];
		if (strcmp(theirs->name, mine->name) != 0)
			rc = lmt__fail(
			        s, LMT_EMISMATCH,
			        "RAM block %u: the source calls it '%s', the destination '%s'", i,
			        theirs->name, mine->name);
		else if (theirs->length != mine->length)
			rc = lmt__fail(
			        s, LMT_EMISMATCH,
			        "RAM block '%s': %llu bytes on the source, %llu on the destination",
			        mine->name, (unsigned long long)theirs->length,
			        (unsigned long long)mine->length);
		else if (theirs->page_size != mine->page_size)
			rc = lmt__fail(
			        s, LMT_EMISMATCH,
			        "RAM block '%s': page size %u on the source, %u on the destination",
			        mine->name, theirs->page_size, mine->page_size);
	}
	free(m);
	return rc;
}

int lmt__destination_open_channels(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, LMT_MSG_EP_ADDRS, deadline, &h);
	if (rc)
		return rc;
	struct lmt_msg_addrs *theirs = malloc(sizeof(*theirs));
	if (!theirs)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = lmt__dec_addrs(s->in, h.length, theirs, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	else if (theirs->count != s->channels)
		rc = lmt__fail(s, LMT_EPROTO, "the source opened %u channels, expected %u",
		               theirs->count, s->channels);
	if (!rc)
		rc = lmt__endpoints_open(s);
	for (uint32_t c = 0; c < s->channels && !rc; c++) {
		rc = s->desc->ops.ep_connect(s->eps[c], &theirs->addrs[c]);
		if (rc)
			rc = lmt__fail(s, rc, "channel %u: the source did not connect", c);
	}
	free(theirs);
	return rc;
}

/* ---- registration ---- */

static int register_window(struct lmt_session *s, uint32_t block, uint64_t offset, uint64_t length,
                           struct lmt_blob *key)
{
	struct lmt_block *b = block < s->nblocks ? &s->blocks[block] : NULL;
	uint64_t w = b ? offset / b->window : 0;
	if (!b || offset % b->window || w >= b->nwindows ||
	    length != (b->length - offset < b->window ? b->length - offset : b->window))
		return lmt__fail(
		        s, LMT_EPROTO,
		        "REG_REQ: block %u offset %llu length %llu is not a window of a RAM "
		        "block",
		        block, (unsigned long long)offset, (unsigned long long)length);
	if (b->handover)
		return lmt__fail(s, LMT_EPROTO,
		                 "REG_REQ: block '%s' is handed over by descriptor, not written",
		                 b->name);
	if (b->mrs[w])
		return lmt__fail(s, LMT_EPROTO, "REG_REQ: block '%s' offset %llu registered twice",
		                 b->name, (unsigned long long)offset);
	key->len = 0;
	int rc = s->desc->ops.mr_register(s->inst, b->host + offset, length, LMT_MR_REMOTE_WRITE,
	                                  &b->mrs[w], key);
	if (rc)
		return lmt__fail(s, rc, "block '%s': cannot register %llu bytes at offset %llu",
		                 b->name, (unsigned long long)length, (unsigned long long)offset);
	if (key->len == 0 || key->len > LMT_BLOB_MAX)
		return lmt__fail(s, LMT_EPROTO, "plugin %s gave a key of %u bytes", s->desc->name,
		                 key->len);
	return 0;
}

static int send_regs(struct lmt_session *s, struct lmt_msg_regs *r)
{
	int rc = lmt__enc_regs(&s->out, LMT_MSG_REG_REPLY, r);
	return rc ? lmt__fail(s, rc, "encoding REG_REPLY") : lmt__ctrl_send(s);
}

int lmt__destination_register_all(struct lmt_session *s)
{
	struct lmt_msg_regs *r = calloc(1, sizeof(*r));
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = 0;
	for (uint32_t i = 0; i < s->nblocks && !rc; i++) {
		if (!lmt__block_copied(&s->blocks[i]))
			continue;
		struct lmt_msg_reg *g = &r->regs[r->count++];
		*g = (struct lmt_msg_reg){.block = i, .offset = 0, .length = s->blocks[i].length};
		rc = register_window(s, i, 0, g->length, &g->key);
		if (!rc && r->count == LMT_PROTO_MAX_REG) {
			rc = send_regs(s, r);
			r->count = 0;
		}
	}
	if (!rc && r->count)
		rc = send_regs(s, r);
	free(r);
	return rc;
}

int lmt__destination_handle_reg_req(struct lmt_session *s, size_t length)
{
	struct lmt_error err = {0};
	if (s->pin_all)
		return lmt__fail(s, LMT_EPROTO, "REG_REQ: every block is registered with pin-all");
	struct lmt_msg_regs *r = malloc(sizeof(*r));
	if (!r)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_regs(s->in, length, LMT_MSG_REG_REQ, r, &err);
	if (rc)
		lmt__fail(s, rc, "%s", err.message);
	for (uint32_t i = 0; i < r->count && !rc; i++)
		rc = register_window(s, r->regs[i].block, r->regs[i].offset, r->regs[i].length,
		                     &r->regs[i].key);
	if (!rc)
		rc = send_regs(s, r);
	free(r);
	return rc;
}

/* ---- what landed ---- */

/* The counts of bytes only grow; they are the statistics' figures. */
static int take_bytes(struct lmt_session *s, const struct lmt_msg_landed *m)
{
	if (m->channels != s->channels)
		return lmt__fail(s, LMT_EPROTO, "LANDED: %u channels, expected %u", m->channels,
		                 s->channels);
	uint64_t total = 0;
	pthread_mutex_lock(&s->lock);
	for (uint32_t c = 0; c < m->channels; c++)
		if (m->bytes[c] < s->stats.channel_bytes[c]) {
			uint64_t had = s->stats.channel_bytes[c];
			pthread_mutex_unlock(&s->lock);
			return lmt__fail(s, LMT_EPROTO,
			                 "LANDED: channel %u went back from %llu to %llu bytes", c,
			                 (unsigned long long)had, (unsigned long long)m->bytes[c]);
		}
	for (uint32_t c = 0; c < m->channels; c++) {
		s->stats.channel_bytes[c] = m->bytes[c];
		total += m->bytes[c];
	}
	s->stats.bytes_received = total;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int lmt__destination_handle_landed(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_error err = {0};
	if (!d->landed && !(d->landed = malloc(sizeof(*d->landed))))
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	struct lmt_msg_landed *m = d->landed;
	int rc = lmt__dec_landed(s->in, length, m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	return take_bytes(s, m);
}

int lmt__destination_no_progress(struct lmt_session *s)
{
	pthread_mutex_lock(&s->lock);
	uint64_t landed = s->stats.bytes_received;
	pthread_mutex_unlock(&s->lock);
	unsigned long long idle_ms = s->idle_timeout_ns / 1000000;
	uint64_t heard = lmt__ctrl_last_heard(s), now = lmt__now();
	if (heard <= s->destination->progress_ns)
		return lmt__fail(s, LMT_ETIMEDOUT,
		                 "the source said nothing for %llu ms (idle-timeout), %llu bytes "
		                 "landed",
		                 idle_ms, (unsigned long long)landed);
	return lmt__fail(s, LMT_ETIMEDOUT,
	                 "the source made no progress for %llu ms (idle-timeout): nothing but "
	                 "keep-alives (the last %llu ms ago), %llu bytes landed",
	                 idle_ms, (unsigned long long)((now - heard) / 1000000),
	                 (unsigned long long)landed);
}

/* ---- device state and completion ---- */

int lmt__destination_handle_state(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_msg_state m;
	struct lmt_error err = {0};
	int rc = lmt__dec_state(s->in, length, &m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (!d->state_len) {
		if (m.offset != 0 || m.total == 0)
			return lmt__fail(s, LMT_EPROTO, "DEVICE_STATE: the first piece is at %llu",
			                 (unsigned long long)m.offset);
		if (m.total > d->state_max)
			return lmt__fail(s, LMT_EOVERFLOW,
			                 "DEVICE_STATE: the source announces %llu bytes, more than "
			                 "max-device-state (%llu)",
			                 (unsigned long long)m.total,
			                 (unsigned long long)d->state_max);
		d->state_len = m.total;
	}
	if (m.total != d->state_len || m.offset != d->state_received)
		return lmt__fail(s, LMT_EPROTO,
		                 "DEVICE_STATE: piece at %llu of %llu, expected at %llu of %llu",
		                 (unsigned long long)m.offset, (unsigned long long)m.total,
		                 (unsigned long long)d->state_received,
		                 (unsigned long long)d->state_len);
	uint64_t need = d->state_received + m.length;
	if (need > d->state_cap) {
		/* Doubling, from what arrived: memory follows the bytes that
		 * came, never the total a peer announced. */
		uint64_t cap = d->state_cap ? 2 * d->state_cap : 64u << 10;
		if (cap < need)
			cap = need;
		if (cap > d->state_len)
			cap = d->state_len;
		uint8_t *buf = malloc(cap);
		if (!buf)
			return lmt__fail(s, LMT_ENOMEM, "device state of %llu bytes: out of memory",
			                 (unsigned long long)cap);
		if (d->state_buf) {
			memcpy(buf, d->state_buf, d->state_received);
			explicit_bzero(d->state_buf, d->state_cap);
			free(d->state_buf);
		}
		d->state_buf = buf;
		d->state_cap = cap;
	}
	memcpy(d->state_buf + m.offset, m.data, m.length);
	d->state_received = need;
	return 0;
}

/* The first block taken by descriptor that was not handed over yet. */
static const char *handover_missing(const struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (s->blocks[i].handover && s->blocks[i].received_fd < 0)
			return s->blocks[i].name;
	return NULL;
}

int lmt__destination_handle_complete(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_error err = {0};
	struct lmt_msg_complete *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	int rc = lmt__dec_complete(s->in, length, m, &err);
	if (rc)
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO, "%s", err.message);
	else if (m->state_length != d->state_received || m->state_length != d->state_len)
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "device state: %llu bytes announced, %llu received",
		            (unsigned long long)m->state_length,
		            (unsigned long long)d->state_received);
	else if (handover_missing(s))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "COMPLETE before block '%s' was handed over", handover_missing(s));
	else if (m->digest_count != (s->verify ? s->nblocks : 0))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "COMPLETE carries %u digests, expected %u", m->digest_count,
		            s->verify ? s->nblocks : 0);
	char why[LMT_PROTO_MAX_TEXT];
	if (!rc && s->verify && (rc = lmt__verify_check(s, m->digests, why, sizeof(why))))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, -rc, "%s", why);
	if (!rc) {
		pthread_mutex_lock(&s->lock);
		s->stats.passes = m->passes;
		pthread_mutex_unlock(&s->lock);
	}
	free(m);
	if (rc)
		return rc;
	rc = send_status(s, LMT_MSG_COMPLETE_ACK, 0, "ok");
	lmt__ctrl_expect_close(s); /* the source is done with it */
	return rc ? rc : 1;
}

