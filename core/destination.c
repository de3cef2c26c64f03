/* The destination engine: accept the source, check what it proposes,
 * register RAM for it, drive the plugin, take the device state in, verify
 * and acknowledge. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "error.h"
#include "net.h"
#include "session.h"

#define TARGET_SLICE_NS 1000000ull
#define CONTROL_SLICE_MS 50

struct lmt_destination_engine {
	int listen_fd; /* until the source connects */
	uint8_t *state_buf;
	uint64_t state_len;
	uint64_t state_received;
};

int lmt__destination_new(struct lmt_destination_engine **out)
{
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return -LMT_ENOMEM;
	(*out)->listen_fd = -1;
	return 0;
}

void lmt__destination_free(struct lmt_destination_engine *d)
{
	if (!d)
		return;
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	free(d->state_buf);
	free(d);
}

int lmt_load_listen(lmt_session *s, const char *uri, uint16_t *port)
{
	struct lmt_destination_engine *d = s->destination;
	if (s->role != LMT_ROLE_DESTINATION)
		return lmt__usage(s, LMT_ESTATE, "load listen: this session is a source");
	int expected = LMT_STATE_NEW;
	if (!atomic_compare_exchange_strong(&s->state, &expected, LMT_STATE_LISTENING))
		return lmt__usage(s, LMT_ESTATE, "load listen: called twice");
	struct sockaddr_storage addr;
	socklen_t len;
	struct lmt__net_error e;
	int rc = lmt__net_parse(uri, &addr, &len, &e);
	if (!rc)
		rc = lmt__net_listen((struct sockaddr *)&addr, len, 4, &d->listen_fd, &e);
	if (rc) {
		atomic_store(&s->state, LMT_STATE_NEW);
		return lmt__fail(s, rc, "%s", e.msg);
	}
	if (port)
		*port = lmt__net_local_port(d->listen_fd);
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

/* ---- handshake ---- */

struct find_option {
	const char *name;
	const struct lmt_option_desc *desc;
};

static int find_option(void *opaque, const char *name, const struct lmt_option_desc *d,
                       const struct lmt_option_value *v, const char *text, enum lmt_opt_source src)
{
	struct find_option *f = opaque;
	if (strcmp(name, f->name) != 0)
		return 0;
	f->desc = d;
	return 1;
}

static int check_option(struct lmt_session *s, const struct lmt_msg_option *o, uint32_t *matched)
{
	struct lmt_option_value v;
	char mine[256];
	if (lmt__optset_get(s->opts, o->name, &v))
		return refuse(s, LMT_MSG_HELLO_REPLY, LMT_EMISMATCH,
		              "%s: the source sets an option this destination does not know",
		              o->name);
	struct find_option find = {.name = o->name};
	lmt__optset_foreach(s->opts, find_option, &find);
	const struct lmt_option_desc *d = find.desc;
	if (!d || !(d->flags & LMT_OPTF_MATCH))
		return refuse(s, LMT_MSG_HELLO_REPLY, LMT_EPROTO,
		              "%s: not an option both sides must agree on", o->name);
	lmt_option_format(d, &v, mine, sizeof(mine));
	if (strcmp(mine, o->value) != 0)
		return refuse(s, LMT_MSG_HELLO_REPLY, LMT_EMISMATCH,
		              "%s: the source has %s, the destination has %s", o->name, o->value,
		              mine);
	(*matched)++;
	return 0;
}

static int count_match(void *opaque, const char *name, const struct lmt_option_desc *d,
                       const struct lmt_option_value *v, const char *text, enum lmt_opt_source src)
{
	if ((d->flags & LMT_OPTF_MATCH) && !(d->flags & LMT_OPTF_SECRET))
		(*(uint32_t *)opaque)++;
	return 0;
}

/* Say yes, with our challenge and proof when we hold a key, and check the
 * source's proof before anything else is exchanged. */
static int accept_hello(struct lmt_session *s, const struct lmt_msg_hello *m, uint64_t deadline)
{
	struct lmt_msg_status st = {.version = LMT_PROTO_VERSION, .auth = s->auth.bytes != NULL};
	snprintf(st.text, sizeof(st.text), "ok");
	int rc = 0;
	if (st.auth && ((rc = lmt__auth_nonce(st.nonce)) ||
	                (rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_DESTINATION, m->nonce,
	                                      st.nonce, st.proof))))
		return lmt__fail(s, rc, "computing the authentication proof");
	if ((rc = lmt__enc_status(&s->out, LMT_MSG_HELLO_REPLY, &st)))
		return lmt__fail(s, rc, "encoding HELLO_REPLY");
	if ((rc = lmt__ctrl_send(s)) || !st.auth)
		return rc;
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	uint8_t got[LMT_AUTH_PROOF], want[LMT_AUTH_PROOF];
	if ((rc = lmt__ctrl_expect(s, LMT_MSG_AUTH, deadline, &h)))
		return rc;
	if ((rc = lmt__dec_auth(s->in, h.length, got, &err)))
		return lmt__fail(s, rc, "%s", err.message);
	if ((rc = lmt__auth_proof(&s->auth, LMT_AUTH_LABEL_SOURCE, st.nonce, m->nonce, want)))
		return lmt__fail(s, rc, "computing the authentication proof");
	if (!lmt__auth_equal(want, got))
		return lmt__fail(s, LMT_EAUTH,
		                 "authentication failed: the source does not hold this key");
	return 0;
}

static int check_hello(struct lmt_session *s, uint64_t deadline)
{
	struct lmt_msg_header h;
	struct lmt_error err = {0};
	int rc = lmt__ctrl_expect(s, LMT_MSG_HELLO, deadline, &h);
	if (rc)
		return rc;
	struct lmt_msg_hello *m = malloc(sizeof(*m));
	if (!m)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = lmt__dec_hello(s->in, h.length, m, &err);
	if (rc)
		rc = refuse(s, LMT_MSG_HELLO_REPLY, LMT_EPROTO, "%s", err.message);
	else if (m->version != LMT_PROTO_VERSION)
		rc = refuse(s, LMT_MSG_HELLO_REPLY, LMT_EPROTO,
		            "protocol version %u is not supported; this destination speaks %u",
		            m->version, LMT_PROTO_VERSION);
	else if (strcmp(m->plugin, s->wire_name) != 0)
		rc = refuse(s, LMT_MSG_HELLO_REPLY, LMT_EMISMATCH,
		            "plugin: the source uses '%s', the destination '%s'", m->plugin,
		            s->wire_name);
	uint32_t matched = 0, wanted = 0;
	for (uint32_t i = 0; i < m->option_count && !rc; i++)
		rc = check_option(s, &m->options[i], &matched);
	lmt__optset_foreach(s->opts, count_match, &wanted);
	if (!rc && matched != wanted)
		rc = refuse(s, LMT_MSG_HELLO_REPLY, LMT_EMISMATCH,
		            "the source sent %u of the %u options both sides must agree on",
		            matched, wanted);
	if (!rc && s->auth.bytes && !m->auth)
		rc = refuse(s, LMT_MSG_HELLO_REPLY, LMT_EAUTH,
		            "authentication required: the source holds no key (set auth-key or "
		            "auth-key-file on the source)");
	if (!rc)
		rc = accept_hello(s, m, deadline);
	free(m);
	return rc;
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

/* ---- device state and completion ---- */

static int handle_state(struct lmt_session *s, size_t length)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt_msg_state m;
	struct lmt_error err = {0};
	int rc = lmt__dec_state(s->in, length, &m, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (!d->state_buf) {
		if (m.offset != 0 || m.total == 0)
			return lmt__fail(s, LMT_EPROTO, "DEVICE_STATE: the first piece is at %llu",
			                 (unsigned long long)m.offset);
		d->state_buf = malloc(m.total);
		if (!d->state_buf)
			return lmt__fail(s, LMT_ENOMEM, "device state of %llu bytes: out of memory",
			                 (unsigned long long)m.total);
		d->state_len = m.total;
	}
	if (m.total != d->state_len || m.offset != d->state_received)
		return lmt__fail(s, LMT_EPROTO,
		                 "DEVICE_STATE: piece at %llu of %llu, expected at %llu of %llu",
		                 (unsigned long long)m.offset, (unsigned long long)m.total,
		                 (unsigned long long)d->state_received,
		                 (unsigned long long)d->state_len);
	memcpy(d->state_buf + m.offset, m.data, m.length);
	d->state_received += m.length;
	return 0;
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
	else if (m->digest_count != (s->verify ? s->nblocks : 0))
		rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EPROTO,
		            "COMPLETE carries %u digests, expected %u", m->digest_count,
		            s->verify ? s->nblocks : 0);
	for (uint32_t i = 0; i < m->digest_count && !rc; i++) {
		const struct lmt_block *b = &s->blocks[i];
		uint64_t mine = XXH3_64bits(b->host, b->length);
		if (mine != m->digests[i])
			rc = refuse(s, LMT_MSG_COMPLETE_ACK, LMT_EVERIFY,
			            "verify: RAM block '%s' differs (xxh3 %016llx on the source, "
			            "%016llx here)",
			            b->name, (unsigned long long)m->digests[i],
			            (unsigned long long)mine);
	}
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
	default:
		return lmt__fail(s, LMT_EPROTO,
		                 "unexpected %s from the source during the migration",
		                 lmt__msg_name(h->type));
	}
}

/* Drive the plugin and the control connection until COMPLETE. */
static int load(struct lmt_session *s)
{
	bool target = s->caps & LMT_CAP_TARGET_PROGRESS;
	struct lmt_completion comps[16];
	for (;;) {
		if (lmt__is_cancelled(s))
			return lmt__fail(s, LMT_ECANCELED, "migration cancelled");
		int n = s->desc->ops.progress(s->inst, comps, 16, target ? TARGET_SLICE_NS : 0);
		if (n < 0)
			return lmt__fail(s, n, "plugin %s: progress failed (%s)", s->desc->name,
			                 lmt_err_name(n));
		/* Without target progress to drive, the wait is for the source. */
		uint64_t wait = target ? 0 : CONTROL_SLICE_MS * 1000000ull;
		if (lmt__ctrl_wait(s, lmt__now() + wait)) {
			struct lmt_msg_header h;
			int rc = lmt__ctrl_recv(s, &h, lmt__now() + s->idle_timeout_ns);
			if (rc == 0)
				rc = handle(s, &h);
			if (rc)
				return rc;
		}
	}
}

static int accept_source(struct lmt_session *s)
{
	struct lmt_destination_engine *d = s->destination;
	struct lmt__net_error e;
	struct lmt__wait w = lmt__wait_until(s, lmt__now() + s->idle_timeout_ns);
	int rc = lmt__net_accept(d->listen_fd, &w, &s->ctrl_fd, &e);
	if (rc == -LMT_ETIMEDOUT)
		return lmt__fail(s, rc, "no source connected within idle-timeout (%llu ms)",
		                 (unsigned long long)(s->idle_timeout_ns / 1000000));
	if (rc)
		return lmt__fail(s, rc, "waiting for the source: %s", e.msg);
	close(d->listen_fd);
	d->listen_fd = -1;
	lmt__net_tune(s->ctrl_fd, 1, 0);
	s->start_ns = lmt__now();
	return lmt__ctrl_start(s);
}

/* Everything after the source connected. */
static int serve(struct lmt_session *s)
{
	int rc;
	uint64_t deadline = s->start_ns + s->connect_timeout_ns;
	if ((rc = check_hello(s, deadline)) || (rc = check_blocks(s, deadline)) ||
	    (rc = open_channels(s, deadline)))
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
	if (rc)
		return lmt__abort(s, rc);
	lmt__transport_close(s);
	lmt__ctrl_close(s);
	pthread_mutex_lock(&s->lock);
	s->stats.total_ns = lmt__now() - s->start_ns;
	s->stats.status = LMT_STATUS_COMPLETED;
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_DONE);
	lmt__event_simple(s, LMT_EVENT_COMPLETED, 0);
	return 0;
}

static int load_run(lmt_session *s)
{
	int rc = begin_load(s, LMT_STATE_LISTENING);
	if (rc)
		return rc;
	rc = lmt__session_prepare(s);
	if (!rc)
		rc = accept_source(s);
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

int lmt__load_connected(struct lmt_session *s, int fd)
{
	int rc = begin_load(s, LMT_STATE_NEW);
	if (rc)
		return rc;
	s->ctrl_fd = fd;
	s->start_ns = lmt__now();
	rc = lmt__ctrl_start(s);
	if (!rc)
		rc = lmt__session_prepare(s);
	if (!rc)
		rc = serve(s);
	return end_load(s, rc);
}

int lmt_load_device_state(lmt_session *s, const void **data, size_t *length)
{
	struct lmt_destination_engine *d = s->destination;
	if (s->role != LMT_ROLE_DESTINATION || atomic_load(&s->state) != LMT_STATE_DONE)
		return lmt__usage(s, LMT_ESTATE, "device state: only after a completed load");
	*data = d->state_buf;
	*length = d->state_len;
	return 0;
}
