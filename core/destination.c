/* The destination engine: accept the source, check what it proposes,
 * register RAM for it, drive the plugin, take the device state in, verify
 * and acknowledge. */
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

#define TARGET_SLICE_NS 1000000ull
#define CONTROL_SLICE_MS 50

struct lmt_destination_engine {
	int listen_fd; /* until the source connects */
	char *unix_path; /* a unix: listener's socket file, removed with it */
	/* The device state grows with the pieces that arrived, up to the
	 * total the first piece announced (at most max-device-state). */
	uint8_t *state_buf;
	uint64_t state_cap;
	uint64_t state_len;
	uint64_t state_received;
	uint64_t state_max;
	/* The last sign of the source's progress: a message other than a
	 * keep-alive. idle-timeout without one fails the load. */
	uint64_t progress_ns;
	struct lmt_msg_landed *landed; /* LANDED's, decoded */
};

int lmt__destination_new(struct lmt_destination_engine **out)
{
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return -LMT_ENOMEM;
	(*out)->listen_fd = -1;
	return 0;
}

static void close_listener(struct lmt_destination_engine *d)
{
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	d->listen_fd = -1;
	if (d->unix_path)
		unlink(d->unix_path);
	free(d->unix_path);
	d->unix_path = NULL;
}

void lmt__destination_free(struct lmt_destination_engine *d)
{
	if (!d)
		return;
	close_listener(d);
	if (d->state_buf)
		explicit_bzero(d->state_buf, d->state_cap); /* the guest's device state */
	free(d->state_buf);
	free(d->landed);
	free(d);
}

int lmt_load_listen(lmt_session *s, const char *uri, uint16_t *port)
{
	if (!s)
		return -LMT_EINVAL;
	struct lmt_destination_engine *d = s->destination;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load listen: this session is a source");
	if (!uri)
		return lmt__usage(s, LMT_EINVAL, "load listen: uri is NULL, expected host:port");
	if (s->nblocks == 0)
		return lmt__usage(s, LMT_EINVAL,
		                  "load listen: no RAM blocks: add them before listening");
	int rc = lmt__file_check_uri(s, uri, "load listen");
	if (rc)
		return rc;
	int expected = LMT_STATE_NEW;
	if (!atomic_compare_exchange_strong(&s->state, &expected, LMT_STATE_LISTENING))
		return lmt__usage(s, LMT_ESTATE, "load listen: called twice");
	if (lmt__is_file_uri(uri)) {
		/* Nothing to bind: lmt_load_run reads the file. */
		if ((rc = lmt__file_set_path(s, uri)))
			atomic_store(&s->state, LMT_STATE_NEW);
		else if (port)
			*port = 0;
		return rc;
	}
	struct sockaddr_storage addr;
	socklen_t len;
	struct lmt__net_error e;
	rc = lmt__net_parse(uri, &addr, &len, &e);
	if (!rc)
		rc = lmt__net_listen((struct sockaddr *)&addr, len, LMT_ADMIT_BACKLOG,
		                     &d->listen_fd, &e);
	if (rc) {
		/* Nothing started: the caller may listen again, elsewhere. */
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__usage(s, rc, "load listen: %s", e.msg);
	}
	if (port)
		*port = lmt__net_local_port(d->listen_fd);
	s->ctrl_unix = addr.ss_family == AF_UNIX;
	if (s->ctrl_unix && !(d->unix_path = strdup(uri + 5))) {
		close(d->listen_fd);
		d->listen_fd = -1;
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__usage(s, LMT_ENOMEM, "load listen: out of memory");
	}
	return 0;
}

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

static int check_blocks(struct lmt_session *s, uint64_t deadline)
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

static int open_channels(struct lmt_session *s, uint64_t deadline)
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

static int register_all(struct lmt_session *s)
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

static int handle_reg_req(struct lmt_session *s, size_t length)
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

static int handle_landed(struct lmt_session *s, size_t length)
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

/* A source that made no progress for idle-timeout: it said nothing at all
 * (stopped, frozen, cut off), or nothing but keep-alives (its VMM stopped
 * calling); the message says which. */
static int no_progress(struct lmt_session *s)
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

static int handle_state(struct lmt_session *s, size_t length)
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

/* Returns 1 when the migration completed. */
static int handle_complete(struct lmt_session *s, size_t length)
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

static int handle(struct lmt_session *s, const struct lmt_msg_header *h)
{
	switch (h->type) {
	case LMT_MSG_REG_REQ:
		return handle_reg_req(s, h->length);
	case LMT_MSG_DEVICE_STATE:
		return handle_state(s, h->length);
	case LMT_MSG_COMPLETE:
		return handle_complete(s, h->length);
	case LMT_MSG_LANDED:
		return handle_landed(s, h->length);
	case LMT_MSG_DIGESTS:
		return lmt__verify_receive(s, h->length);
	case LMT_MSG_FD_HANDOVER:
		return lmt__handover_receive(s, h->length);
	case LMT_MSG_POSTCOPY_PAGES:
		return lmt__postcopy_pages(s, h->length);
	case LMT_MSG_POSTCOPY:
		if (s->destination->state_received != s->destination->state_len)
			return lmt__fail(s, LMT_EPROTO,
			                 "POSTCOPY with %llu of %llu bytes of device state",
			                 (unsigned long long)s->destination->state_received,
			                 (unsigned long long)s->destination->state_len);
		return lmt__postcopy_switch(s, h->length, s->destination->state_received);
	default:
		return lmt__fail(s, LMT_EPROTO,
		                 "unexpected %s from the source during the migration",
		                 lmt__msg_name(h->type));
	}
}

/* Drive the plugin and the control connection until COMPLETE. A source
 * whose keep-alives are all that arrives for idle-timeout fails the load:
 * it stalled, or only holds the destination. */
static int load(struct lmt_session *s)
{
	struct lmt_destination_engine *d = s->destination;
	bool target = s->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion comps[16];
	d->progress_ns = lmt__now();
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
		/* Messages waiting are progress not taken yet. */
		if (lmt__now() - d->progress_ns > s->idle_timeout_ns && !lmt__ctrl_queued(s))
			return no_progress(s);
		int n = s->desc->ops.progress(s->inst, comps, 16, target ? TARGET_SLICE_NS : 0);
		if (n < 0)
			return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
			                 lmt_err_name(n));
		/* Without target progress to drive, the wait is for the source. */
		uint64_t wait = target ? 0 : CONTROL_SLICE_MS * 1000000ull;
		if (lmt__ctrl_wait(s, lmt__now() + wait)) {
			struct lmt_msg_header h;
			int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
			if (rc == 0) {
				d->progress_ns = lmt__now();
				rc = handle(s, &h);
			}
			if (rc)
				return rc;
		}
	}
}

/* Find the source among whoever connects (lobby.c), then
 * start the control connection on it. `fd` is an already connected
 * source (lmt__load_connected), or -1 to accept on the listening socket. */
static int accept_source(struct lmt_session *s, int fd)
{
	struct lmt_destination_engine *d = s->destination;
	uint64_t accepted_ns = lmt__now();
	d->state_max = (uint64_t)lmt__opt_int(s->opts, "max-device-state");
	lmt__tls *tls = NULL;
	int rc = lmt__lobby_find_source(s, d->listen_fd, fd >= 0 ? 0 : s->idle_timeout_ns, &fd,
	                                &tls, &accepted_ns);
	close_listener(d);
	if (rc)
		return rc;
	s->ctrl_fd = fd;
	lmt__net_tune(s->ctrl_fd, 1, 0);
	if (s->ctrl_unix && (rc = lmt__handover_check_peer(s)))
		return rc;
	pthread_mutex_lock(&s->lock);
	s->start_ns = accepted_ns;
	pthread_mutex_unlock(&s->lock);
	if (tls && (rc = lmt__tls_session_adopt(s, tls)))
		return rc;
	return lmt__ctrl_start(s);
}

/* Everything after the source was accepted: its HELLO passed (and its
 * proof of the key); setup keeps to connect-timeout from its accept. */
static int serve(struct lmt_session *s)
{
	int rc;
	uint64_t deadline = s->start_ns + s->connect_timeout_ns;
	if ((rc = check_blocks(s, deadline)))
		return rc;
	if (s->ctrl_unix && (rc = lmt__handover_negotiate_destination(s, deadline)))
		return rc;
	if ((rc = open_channels(s, deadline)))
		return rc;
	if (s->pin_all && (rc = register_all(s)))
		return rc;
	if ((rc = lmt__ctrl_send_empty(s, LMT_MSG_READY)))
		return rc;
	atomic_store(&s->state, LMT_STATE_ACTIVE);
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_ACTIVE;
	s->stats.setup_ns = lmt__now() - s->start_ns;
	pthread_mutex_unlock(&s->lock);
	lmt__event_simple(s, LMT_EVENT_SETUP_DONE, 0);
	rc = load(s);
	return rc == 1 ? 0 : rc;
}

static int begin_load(struct lmt_session *s, int from_state)
{
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load run: this session is a source");
	if (!atomic_compare_exchange_strong(&s->state, &from_state, LMT_STATE_SETUP))
		return lmt__usage(s, LMT_ESTATE, "load run: call lmt_load_listen first, once");
	pthread_mutex_lock(&s->lock);
	s->stats.status = LMT_STATUS_SETUP;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static int end_load(struct lmt_session *s, int rc)
{
	if (rc) {
		lmt__postcopy_free(s); /* its thread first: it drives the plugin */
		lmt__handover_undo(s);
		return lmt__abort(s, rc);
	}
	pthread_mutex_lock(&s->lock);
	if (!s->stats.resume_ns)
		s->stats.resume_ns = lmt__now() - s->start_ns;
	bool lazy = s->lazy || s->postcopy;
	pthread_mutex_unlock(&s->lock);
	/* restore=lazy or postcopy: the guest may run; the pages come in
	 * until lmt_load_finish. */
	if (lazy)
		return 0;
	lmt__file_free(s);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	lmt__stats_end(s, LMT_STATUS_COMPLETED);
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

/* restore=lazy is for a file: restore; a migration's load is whole when
 * it returns (postcopy is not there yet). */
static int check_restore_mode(struct lmt_session *s)
{
	pthread_mutex_lock(&s->opts_lock);
	bool lazy = strcmp(lmt__opt_text(s->opts, "restore"), "lazy") == 0;
	bool postcopy = lmt__opt_bool(s->opts, "postcopy");
	bool allowed = lmt__opt_bool(s->opts, "userfaultfd");
	pthread_mutex_unlock(&s->opts_lock);
	/* Postcopy needs userfaultfd here: say so before any source comes. */
	struct lmt__uffd *u = NULL;
	struct lmt_error err = {0};
	if (postcopy && !s->file_path && lmt__uffd_open(&u, 0, allowed, &err))
		return lmt__usage(s, err.code, "load run: postcopy=on: %s", err.message);
	lmt__uffd_close(u);
	if (lazy && !s->file_path)
		return lmt__usage(s, LMT_EINVAL,
		                  "load run: restore=lazy applies to a file: restore only; this "
		                  "session listens for a source");
	return 0;
}

static int load_run(lmt_session *s)
{
	int rc = check_restore_mode(s);
	if (!rc)
		rc = begin_load(s, LMT_STATE_LISTENING);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc && s->file_path)
		return end_load(s, lmt__file_restore(s));
	if (!rc)
		rc = accept_source(s, -1);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}

int lmt_load_run(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (lmt__job_owns(s))
		return lmt__usage(s, LMT_ESTATE,
		                  "load run: a job started with lmt_load_start runs this session");
	lmt__call_enter(s);
	int rc = load_run(s);
	lmt__call_leave(s);
	return rc;
}

int lmt_load_finish(lmt_session *s)
{
	if (!s)
		return -LMT_EINVAL;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load finish: this session is a source");
	int state = atomic_load(&s->state);
	if (state == LMT_STATE_DONE)
		return 0;
	if (state == LMT_STATE_FAILED)
		return lmt__usage(s, LMT_ESTATE, "load finish: the load failed: %s",
		                  lmt_session_error(s)->message);
	pthread_mutex_lock(&s->lock);
	bool lazy = (s->lazy || s->postcopy) && !s->finishing;
	s->finishing = lazy;
	pthread_mutex_unlock(&s->lock);
	if (!lazy)
		return lmt__usage(s, LMT_ESTATE,
		                  "load finish: no load to finish (lmt_load_run must return 0 "
		                  "first, and only one call waits)");
	lmt__call_enter(s);
	int rc = end_load(s, s->lazy ? lmt__lazy_finish(s) : lmt__postcopy_finish(s));
	lmt__call_leave(s);
	return rc;
}

int lmt__load_connected(struct lmt_session *s, int fd)
{
	int rc = begin_load(s, LMT_STATE_NEW);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc)
		rc = accept_source(s, fd);
	else
		close(fd);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}

void lmt__destination_take_state(struct lmt_session *s, uint8_t *buf, uint64_t length)
{
	struct lmt_destination_engine *d = s->destination;
	if (d->state_buf)
		explicit_bzero(d->state_buf, d->state_cap);
	free(d->state_buf);
	d->state_buf = buf;
	d->state_cap = length;
	d->state_len = length;
	d->state_received = length;
}

int lmt_load_device_state(lmt_session *s, const void **data, size_t *length)
{
	if (!s)
		return -LMT_EINVAL;
	if (!data || !length)
		return lmt__usage(s, LMT_EINVAL, "device state: data and length are required");
	struct lmt_destination_engine *d = s->destination;
	pthread_mutex_lock(&s->lock);
	bool resumed = s->lazy != NULL || s->postcopy != NULL;
	pthread_mutex_unlock(&s->lock);
	if (s->role != LMT_ROLE_DESTINATION ||
	    (atomic_load(&s->state) != LMT_STATE_DONE && !resumed))
		return lmt__usage(s, LMT_ESTATE,
		                  "device state: only after a completed load (or, with "
		                  "restore=lazy, once lmt_load_run returned 0)");
	*data = d->state_buf;
	*length = d->state_len;
	return 0;
}
