/* Session lifecycle, options and blocks, the host services lent to plugins,
 * the control connection, and teardown shared by both roles. */
#define _GNU_SOURCE
#include "session.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "net.h"

uint64_t lmt__now(void)
{
	return lmt__now_ns();
}

bool lmt__is_cancelled(const struct lmt_session *s)
{
	return atomic_load(&s->cancelled) != 0;
}

static int wait_cancelled(void *ctx)
{
	return lmt__is_cancelled(ctx);
}

/* The first failure of an operation wins; a misuse of the API (usage)
 * is reported but never hides a later real failure. */
static int record(struct lmt_session *s, bool usage, int code, const char *fmt, va_list ap)
        LMT_PRINTF(4, 0);

static int record(struct lmt_session *s, bool usage, int code, const char *fmt, va_list ap)
{
	code = code > 0 ? -code : code;
	pthread_mutex_lock(&s->lock);
	if ((s->error.code == 0 || s->error_is_usage) && atomic_load(&s->state) != LMT_STATE_DONE) {
		lmt__verror(&s->error, code, fmt, ap);
		s->error_is_usage = usage;
	}
	pthread_mutex_unlock(&s->lock);
	return code;
}

int lmt__fail(struct lmt_session *s, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	code = record(s, false, code, fmt, ap);
	va_end(ap);
	return code;
}

int lmt__usage(struct lmt_session *s, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	code = record(s, true, code, fmt, ap);
	va_end(ap);
	return code;
}

/* ---- host services ---- */

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...) LMT_PRINTF(3, 4);
static int host_error(void *ctx, int code, const char *fmt, ...) LMT_PRINTF(3, 4);

static void host_log(void *ctx, enum lmt_log_level level, const char *fmt, ...)
{
	struct lmt_session *s = ctx;
	char msg[900];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	lmt__log(level, "%s: %s", s->desc->name, msg);
}

static int host_error(void *ctx, int code, const char *fmt, ...)
{
	struct lmt_session *s = ctx;
	char msg[480];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if ((code < 0 ? -code : code) >= LMT_ERRC_COUNT || code == 0)
		code = LMT_EIO;
	lmt__log(LMT_LOG_DEBUG, "%s: %s", s->desc->name, msg);
	return lmt__fail(s, code, "%s", msg);
}

static uint64_t host_now(void *ctx)
{
	return lmt__now_ns();
}

static int host_option(void *ctx, const char *name, struct lmt_option_value *out)
{
	struct lmt_session *s = ctx;
	return lmt__optset_get(s->opts, name, out);
}

static int host_cancelled(void *ctx)
{
	return lmt__is_cancelled(ctx);
}

static const struct lmt_plugin *host_inner(void *ctx)
{
	struct lmt_session *s = ctx;
	return s->inner;
}

/* Plugin threads end before the control socket is closed, so a shutdown
 * here never races with a close. */
static void host_inject(void *ctx, enum lmt_fault fault)
{
	struct lmt_session *s = ctx;
	if (fault == LMT_FAULT_DROP_CONTROL && s->ctrl_fd >= 0) {
		lmt__log(LMT_LOG_INFO, "%s: dropping the control connection", s->desc->name);
		shutdown(s->ctrl_fd, SHUT_RDWR);
	}
}

/* Load `spec`: a plugin name or path, or "decorator:plugin". The wrapped
 * plugin decides the capabilities and the name on the wire. */
static int load_plugins(struct lmt_session *s, const char *spec, struct lmt_error *err)
{
	int rc = lmt_plugin_open_spec(spec, &s->plugin, &s->inner_plugin, err);
	if (rc)
		return rc;
	s->desc = lmt_plugin_descriptor(s->plugin);
	s->inner = s->inner_plugin ? lmt_plugin_descriptor(s->inner_plugin) : NULL;
	const struct lmt_plugin *transport = s->inner ? s->inner : s->desc;
	s->caps = transport->caps;
	s->wire_name = transport->name;
	return 0;
}

/* ---- creation, options, blocks ---- */

int lmt_session_new(lmt_session **out, enum lmt_role role, const char *plugin, const char *options,
                    struct lmt_error *err)
{
	*out = NULL;
	if (role != LMT_ROLE_SOURCE && role != LMT_ROLE_DESTINATION)
		return lmt__error(err, LMT_EINVAL, "role: expected source or destination, got %d",
		                  (int)role);
	struct lmt_session *s = calloc(1, sizeof(*s));
	if (!s)
		return lmt__error(err, LMT_ENOMEM, "out of memory creating a session");
	s->role = role;
	s->ctrl_fd = -1;
	s->listen_fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	s->host = (struct lmt_host){
	        .abi_version = LMT_PLUGIN_ABI_VERSION,
	        .struct_size = sizeof(struct lmt_host),
	        .log = host_log,
	        .error = host_error,
	        .now_ns = host_now,
	        .option = host_option,
	        .cancelled = host_cancelled,
	        .inner = host_inner,
	        .inject = host_inject,
	};
	uint32_t ncore;
	const struct lmt_option_desc *core = lmt_core_options(&ncore);
	int rc = load_plugins(s, plugin, err);
	if (!rc) {
		rc = lmt__optset_new(&s->opts);
		if (rc)
			lmt__error(err, rc, "out of memory creating a session");
	}
	if (!rc)
		rc = lmt__optset_add_schema(s->opts, NULL, core, ncore, err);
	if (!rc)
		rc = lmt__optset_add_schema(s->opts, s->desc->name, s->desc->options,
		                            s->desc->option_count, err);
	if (!rc && s->inner)
		rc = lmt__optset_add_schema(s->opts, s->inner->name, s->inner->options,
		                            s->inner->option_count, err);
	if (!rc)
		rc = lmt__optset_load_env(s->opts, err);
	if (!rc)
		rc = lmt__optset_parse(s->opts, options, err);
	if (!rc)
		s->in = malloc(LMT_PROTO_MAX_PAYLOAD);
	if (!rc && !s->in)
		rc = lmt__error(err, LMT_ENOMEM, "out of memory creating a session");
	if (rc) {
		lmt_session_free(s);
		return rc;
	}
	s->stats.status = LMT_STATUS_NEW;
	*out = s;
	return 0;
}

static void blocks_free(struct lmt_session *s)
{
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		free(b->dirty);
		free(b->inflight);
		free(b->sync);
		free(b->rkeys);
		free(b->mrs);
	}
	free(s->blocks);
	s->blocks = NULL;
	s->nblocks = 0;
}

void lmt_session_free(lmt_session *s)
{
	if (!s)
		return;
	lmt_cancel(s);
	lmt__transport_close(s);
	if (s->ctrl_fd >= 0)
		close(s->ctrl_fd);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	blocks_free(s);
	free(s->slots);
	free(s->free_slots);
	free(s->state_buf);
	free(s->passes);
	lmt__auth_key_free(&s->auth);
	free(s->in);
	lmt__buf_free(&s->out);
	lmt__optset_free(s->opts);
	lmt_plugin_close(s->inner_plugin);
	lmt_plugin_close(s->plugin);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

const struct lmt_error *lmt_session_error(const lmt_session *s)
{
	return &s->error;
}

static int require_new(struct lmt_session *s, const char *what)
{
	int st = atomic_load(&s->state);
	if (st != LMT_STATE_NEW && !(st == LMT_STATE_LISTENING && s->role == LMT_ROLE_DESTINATION))
		return lmt__usage(s, LMT_ESTATE, "%s: only before setup", what);
	return 0;
}

int lmt_session_set_options(lmt_session *s, const char *options)
{
	int rc = require_new(s, "options");
	if (rc)
		return rc;
	struct lmt_error err = {0};
	rc = lmt__optset_parse(s->opts, options, &err);
	if (rc)
		lmt__usage(s, rc, "%s", err.message);
	return rc;
}

int lmt_session_set_option(lmt_session *s, const char *name, const char *value)
{
	int rc = require_new(s, "options");
	if (rc)
		return rc;
	struct lmt_error err = {0};
	if (!name || !value)
		return lmt__usage(s, LMT_EINVAL, "option: name and value required");
	rc = lmt__optset_set(s->opts, name, value, LMT_OPT_SRC_EXPLICIT, &err);
	if (rc)
		lmt__usage(s, rc, "%s", err.message);
	return rc;
}

int lmt_session_get_option(lmt_session *s, const char *name, struct lmt_option_value *out)
{
	int rc = lmt__optset_get(s->opts, name, out);
	if (rc)
		return lmt__fail(s, rc, "%s: unknown option", name ? name : "(null)");
	return 0;
}

static bool valid_block_name(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > LMT_BLOCK_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] <= 0x20 || name[i] == 0x7f)
			return false;
	return true;
}

int lmt_session_add_block(lmt_session *s, const char *name, void *host, uint64_t length,
                          uint32_t page_size)
{
	int rc = require_new(s, "add block");
	if (rc)
		return rc;
	if (!valid_block_name(name))
		return lmt__fail(
		        s, LMT_EINVAL,
		        "block name '%s': expected 1 to %u printable characters, no spaces",
		        name ? name : "(null)", LMT_BLOCK_NAME_MAX);
	if (page_size < 4096 || (page_size & (page_size - 1)))
		return lmt__usage(s, LMT_EINVAL,
		                  "block '%s': page size %u is not a power of two >= 4096", name,
		                  page_size);
	if (!host || length == 0 || length % page_size)
		return lmt__fail(
		        s, LMT_EINVAL,
		        "block '%s': length %llu is not a non-zero multiple of the page size %u"
		        " (or no memory given)",
		        name, (unsigned long long)length, page_size);
	if (s->nblocks == LMT_PROTO_MAX_BLOCKS)
		return lmt__usage(s, LMT_EOVERFLOW, "block '%s': at most %u blocks", name,
		                  LMT_PROTO_MAX_BLOCKS);
	for (uint32_t i = 0; i < s->nblocks; i++)
		if (strcmp(s->blocks[i].name, name) == 0)
			return lmt__usage(s, LMT_EINVAL, "block '%s': added twice", name);
	struct lmt_block *nb = realloc(s->blocks, (s->nblocks + 1) * sizeof(*nb));
	if (!nb)
		return lmt__usage(s, LMT_ENOMEM, "out of memory adding block '%s'", name);
	s->blocks = nb;
	struct lmt_block *b = &nb[s->nblocks++];
	memset(b, 0, sizeof(*b));
	snprintf(b->name, sizeof(b->name), "%s", name);
	b->host = host;
	b->length = length;
	b->page_size = page_size;
	b->page_shift = (uint32_t)__builtin_ctz(page_size);
	b->npages = length >> b->page_shift;
	b->words = (b->npages + 63) / 64;
	return 0;
}

int lmt_session_set_dirty_sync(lmt_session *s, lmt_dirty_sync_fn fn, void *opaque)
{
	if (s->role != LMT_ROLE_SOURCE)
		return lmt__usage(s, LMT_ESTATE, "dirty sync: only a source tracks dirty pages");
	s->dirty_fn = fn;
	s->dirty_opaque = opaque;
	return 0;
}

void lmt_cancel(lmt_session *s)
{
	if (s)
		atomic_store(&s->cancelled, 1);
}

/* Read option values and size the per-block state once setup starts. */
int lmt__blocks_prepare(struct lmt_session *s)
{
	const struct lmt_optset *o = s->opts;
	s->channels = (uint32_t)lmt__opt_int(o, "channels");
	s->chunk_size = (uint64_t)lmt__opt_int(o, "chunk-size");
	s->pin_all = lmt__opt_bool(o, "pin-all");
	s->zero_detect = lmt__opt_bool(o, "zero-page-detection");
	s->verify = lmt__opt_bool(o, "verify");
	s->max_bandwidth = (uint64_t)lmt__opt_int(o, "max-bandwidth");
	s->downtime_limit_ns = (uint64_t)lmt__opt_int(o, "downtime-limit");
	s->iterate_ns = (uint64_t)lmt__opt_int(o, "max-iterate-ms");
	s->connect_timeout_ns = (uint64_t)lmt__opt_int(o, "connect-timeout");
	s->idle_timeout_ns = (uint64_t)lmt__opt_int(o, "idle-timeout");
	s->queue_depth = (uint32_t)lmt__opt_int(o, "queue-depth");
	struct lmt_error err = {0};
	lmt__auth_key_free(&s->auth);
	int rc = lmt__auth_key_load(lmt__opt_text(o, "auth-key"), lmt__opt_text(o, "auth-key-file"),
	                            &s->auth, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	if (s->channels > 1 && !(s->caps & LMT_CAP_MULTI_CHANNEL))
		return lmt__fail(s, LMT_ENOTSUP, "channels=%u: plugin '%s' supports one channel",
		                 s->channels, s->wire_name);
	if (s->nblocks == 0)
		return lmt__fail(s, LMT_EINVAL, "no RAM blocks: add them before setup");
	bool source = s->role == LMT_ROLE_SOURCE;
	if (source && !s->dirty_fn)
		return lmt__fail(s, LMT_EINVAL, "no dirty-sync callback: set it before setup");
	uint64_t ram = 0;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		ram += b->length;
		b->window = s->pin_all ? b->length : s->chunk_size;
		if (b->window < b->page_size)
			b->window = b->page_size;
		b->nwindows = (b->length + b->window - 1) / b->window;
		b->mrs = calloc(b->nwindows, sizeof(*b->mrs));
		if (source) {
			b->rkeys = calloc(b->nwindows, sizeof(*b->rkeys));
			b->dirty = calloc(b->words, sizeof(uint64_t));
			b->inflight = calloc(b->words, sizeof(uint64_t));
			b->sync = calloc(b->words, sizeof(uint64_t));
		}
		if (!b->mrs || (source && (!b->rkeys || !b->dirty || !b->inflight || !b->sync)))
			return lmt__fail(s, LMT_ENOMEM, "out of memory for block '%s'", b->name);
	}
	pthread_mutex_lock(&s->lock);
	s->stats.ram_bytes = ram;
	s->stats.channels = s->channels;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ---- control connection ---- */

struct lmt__wait lmt__wait_until(struct lmt_session *s, uint64_t deadline_ns)
{
	return (struct lmt__wait){
	        .deadline_ns = deadline_ns, .cancelled = wait_cancelled, .ctx = s};
}

static int net_fail(struct lmt_session *s, int rc, const char *what, const struct lmt__net_error *e)
{
	const char *peer = s->role == LMT_ROLE_SOURCE ? "destination" : "source";
	if (rc == -LMT_ECANCELED)
		return lmt__fail(s, rc, "%s: cancelled", what);
	if (rc == -LMT_ETIMEDOUT)
		return lmt__fail(s, rc, "%s: the %s said nothing for too long", what, peer);
	return lmt__fail(s, rc, "%s: control connection to the %s: %s", what, peer, e->msg);
}

int lmt__ctrl_send(struct lmt_session *s)
{
	struct lmt__net_error e;
	struct lmt__wait w = lmt__wait_until(s, lmt__now_ns() + s->idle_timeout_ns);
	uint16_t type = (uint16_t)(s->out.data[0] | s->out.data[1] << 8);
	int rc = lmt__net_send_all(s->ctrl_fd, s->out.data, s->out.len, &w, &e);
	if (rc)
		return net_fail(s, rc, lmt__msg_name(type), &e);
	s->last_tx_ns = lmt__now_ns();
	return 0;
}

int lmt__ctrl_recv(struct lmt_session *s, struct lmt_msg_header *h, uint64_t deadline_ns)
{
	uint8_t hdr[LMT_PROTO_HEADER_SIZE];
	struct lmt__net_error e;
	struct lmt__wait w = lmt__wait_until(s, deadline_ns);
	int rc = lmt__net_recv_all(s->ctrl_fd, hdr, sizeof(hdr), &w, &e);
	if (rc)
		return net_fail(s, rc, "waiting for a control message", &e);
	struct lmt_error err = {0};
	rc = lmt__dec_header(hdr, sizeof(hdr), h, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	w.deadline_ns = lmt__now_ns() + s->idle_timeout_ns;
	rc = lmt__net_recv_all(s->ctrl_fd, s->in, h->length, &w, &e);
	if (rc)
		return net_fail(s, rc, lmt__msg_name(h->type), &e);
	s->last_rx_ns = lmt__now_ns();
	if (h->type != LMT_MSG_ERROR)
		return 0;
	struct lmt_msg_status st;
	rc = lmt__dec_status(s->in, h->length, LMT_MSG_ERROR, &st, &err);
	if (rc)
		return lmt__fail(s, rc, "%s", err.message);
	const char *peer = s->role == LMT_ROLE_SOURCE ? "destination" : "source";
	return lmt__fail(s, st.code ? st.code : -LMT_EPROTO, "the %s failed: %s", peer, st.text);
}

bool lmt__ctrl_readable(struct lmt_session *s)
{
	struct pollfd p = {.fd = s->ctrl_fd, .events = POLLIN};
	return poll(&p, 1, 0) > 0;
}

void lmt__numeric_host(int fd, bool peer, char *buf, size_t size)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	int rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &len)
	              : getsockname(fd, (struct sockaddr *)&ss, &len);
	buf[0] = '\0';
	if (rc == 0 && ss.ss_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf, (socklen_t)size);
	else if (rc == 0 && ss.ss_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf, (socklen_t)size);
}

/* ---- transport ---- */

int lmt__transport_open(struct lmt_session *s, const char *local_host, const char *peer_host)
{
	struct lmt_instance_params p = {
	        .struct_size = sizeof(p),
	        .role = s->role,
	        .channels = s->channels,
	        .timeout_ns = s->connect_timeout_ns,
	};
	snprintf(p.local_host, sizeof(p.local_host), "%s", local_host);
	snprintf(p.peer_host, sizeof(p.peer_host), "%s", peer_host);
	int rc = s->desc->ops.instance_open(&s->host, s, &p, &s->inst);
	if (rc)
		return lmt__fail(s, rc, "plugin %s: cannot open an instance (%s)", s->desc->name,
		                 lmt_err_name(rc));
	return 0;
}

void lmt__transport_close(struct lmt_session *s)
{
	if (!s->inst)
		return;
	const struct lmt_plugin_ops *ops = &s->desc->ops;
	for (uint32_t i = 0; i < s->nblocks; i++) {
		struct lmt_block *b = &s->blocks[i];
		for (uint64_t w = 0; w < b->nwindows; w++) {
			if (b->rkeys && b->rkeys[w])
				ops->rkey_release(s->inst, b->rkeys[w]);
			if (b->mrs && b->mrs[w])
				ops->mr_deregister(s->inst, b->mrs[w]);
			if (b->rkeys)
				b->rkeys[w] = NULL;
			if (b->mrs)
				b->mrs[w] = NULL;
		}
	}
	for (uint32_t c = 0; c < LMT_MAX_CHANNELS; c++) {
		if (s->eps[c])
			ops->ep_close(s->eps[c]);
		s->eps[c] = NULL;
	}
	ops->instance_close(s->inst);
	s->inst = NULL;
}

/* Open the plugin instance and every endpoint, and send their addresses
 * to the peer: the same steps on both sides. */
int lmt__endpoints_open(struct lmt_session *s)
{
	char local[64], peer[64];
	lmt__numeric_host(s->ctrl_fd, false, local, sizeof(local));
	lmt__numeric_host(s->ctrl_fd, true, peer, sizeof(peer));
	int rc = lmt__transport_open(s, local, peer);
	if (rc)
		return rc;
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	if (!a)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	a->count = s->channels;
	for (uint32_t c = 0; c < s->channels && !rc; c++) {
		rc = s->desc->ops.ep_open(s->inst, c, &s->eps[c], &a->addrs[c]);
		if (rc)
			rc = lmt__fail(s, rc, "channel %u: cannot open an endpoint", c);
		else if (a->addrs[c].len == 0 || a->addrs[c].len > LMT_BLOB_MAX)
			rc = lmt__fail(s, LMT_EPROTO,
			               "channel %u: plugin gave an address of %u bytes", c,
			               a->addrs[c].len);
	}
	if (!rc && (rc = lmt__enc_addrs(&s->out, a)))
		lmt__fail(s, rc, "encoding EP_ADDRS");
	free(a);
	return rc ? rc : lmt__ctrl_send(s);
}

int lmt__ctrl_expect(struct lmt_session *s, uint16_t want, uint64_t deadline_ns,
                     struct lmt_msg_header *h)
{
	const char *peer = s->role == LMT_ROLE_SOURCE ? "destination" : "source";
	for (;;) {
		int rc = lmt__ctrl_recv(s, h, deadline_ns);
		if (rc)
			return rc;
		if (h->type == want)
			return 0;
		if (h->type == LMT_MSG_PING) {
			if ((rc = lmt__enc_empty(&s->out, LMT_MSG_PONG)) ||
			    (rc = lmt__ctrl_send(s)))
				return rc;
			continue;
		}
		if (h->type != LMT_MSG_PONG)
			return lmt__fail(s, LMT_EPROTO, "expected %s from the %s, got %s",
			                 lmt__msg_name(want), peer, lmt__msg_name(h->type));
	}
}

/* Tell the peer (best effort, briefly), release the transport. */
int lmt__abort(struct lmt_session *s, int code)
{
	pthread_mutex_lock(&s->lock);
	if (s->error.code == 0)
		lmt__error(&s->error, code ? code : LMT_EIO, "%s", lmt_strerror(code));
	code = s->error.code;
	struct lmt_msg_status st = {.code = code};
	lmt__copy(st.text, sizeof(st.text), s->error.message);
	/* Cancelled means lmt_cancel was called, whatever code a plugin chose. */
	s->stats.status = lmt__is_cancelled(s) ? LMT_STATUS_CANCELLED : LMT_STATUS_FAILED;
	pthread_mutex_unlock(&s->lock);
	atomic_store(&s->state, LMT_STATE_FAILED);
	if (s->ctrl_fd >= 0 && lmt__enc_status(&s->out, LMT_MSG_ERROR, &st) == 0) {
		struct lmt__wait w = {.deadline_ns = lmt__now_ns() + 200 * 1000000ull};
		lmt__net_send_all(s->ctrl_fd, s->out.data, s->out.len, &w, NULL);
	}
	lmt__transport_close(s);
	if (s->ctrl_fd >= 0) {
		shutdown(s->ctrl_fd, SHUT_RDWR);
		close(s->ctrl_fd);
		s->ctrl_fd = -1;
	}
	lmt__log(LMT_LOG_INFO, "migration failed: %s", s->error.message);
	return code;
}
