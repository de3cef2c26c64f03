/* chaos: a decorator that wraps any plugin ("chaos:tcp", "chaos:file")
 * through the ABI alone and injects faults from seeded options: delayed
 * and reordered completions, a failed write, a stalled transport (on the
 * destination: an engine that stops making progress), a dropped channel
 * or control connection, a link cut or black-holed under every channel,
 * or the death or stop of its own process. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lmt/plugin.h>
#include <lmt/version.h>

#define CHAOS_HELD_MAX 4096u
#define CHAOS_SLICE_NS 10000000ull
#define CHAOS_RETIRED 256u

enum chaos_fault {
	CHAOS_NONE,
	CHAOS_FAIL_WRITE,
	CHAOS_STALL,
	CHAOS_DROP_CHANNEL,
	CHAOS_DROP_CONTROL,
	CHAOS_KILL,
	CHAOS_STOP,
	CHAOS_CUT,
	CHAOS_BLACKHOLE,
};

static const char *const fault_names[] = {
        "none", "fail-write", "stall", "drop-channel", "drop-control",
        "kill", "stop",       "cut",   "blackhole",    NULL,
};

/* Where the fault strikes: the events a plugin sees in each phase. */
enum chaos_point {
	CHAOS_AT_CONNECT,  /* setup: an endpoint connects */
	CHAOS_AT_WRITE,    /* mid-pass, source: the Nth write */
	CHAOS_AT_PROGRESS, /* mid-pass, destination: the Nth progress call */
	CHAOS_AT_FLUSH,    /* complete, source: the flush */
	CHAOS_AT_REGISTER, /* destination: the Nth registration */
	CHAOS_AT_TIME,     /* either side: N ms after the instance opened */
	CHAOS_AT_READ,     /* a storage plugin's restore: the Nth read */
	CHAOS_AT_BYTES,    /* mid-pass, source: the write that reaches N bytes */
};

static const struct lmt_option_desc chaos_options[] = {
        {.name = "fault",
         .type = LMT_OPT_ENUM,
         .default_value = "none",
         .enum_values = fault_names,
         .doc = "what to break: fail-write, stall, drop-channel, drop-control, cut (every "
                "channel and the control connection at once), blackhole (every channel "
                "goes silent), kill, stop"},
        {.name = "at",
         .type = LMT_OPT_STRING,
         .default_value = "write:1",
         .doc = "when: connect, write:N, bytes:N (K, M, G), progress:N, register:N, read:N, "
                "after-ms:N or flush"},
        {.name = "channel",
         .type = LMT_OPT_INT,
         .default_value = "0",
         .min = 0,
         .max = 63,
         .doc = "the channel drop-channel drops"},
        {.name = "stall",
         .type = LMT_OPT_DURATION,
         .default_value = "60m",
         .min = 1000000,
         .max = 86400000000000ll,
         .doc = "how long stall holds progress and writes still; on the destination "
                "(or a restore) every call its engine makes into the plugin waits it out"},
        {.name = "delay",
         .type = LMT_OPT_DURATION,
         .default_value = "0",
         .min = 0,
         .max = 60000000000ll,
         .doc = "each completion is held back up to this long"},
        {.name = "reorder",
         .type = LMT_OPT_BOOL,
         .default_value = "off",
         .doc = "hand completions back, and send held writes, in random order"},
        {.name = "hold",
         .type = LMT_OPT_DURATION,
         .default_value = "0",
         .min = 0,
         .max = 60000000000ll,
         .doc = "capture each write's data when posted and send it up to this long later, "
                "as a NIC that read memory early would (a bad write then fails late)"},
        {.name = "register-delay",
         .type = LMT_OPT_DURATION,
         .default_value = "0",
         .min = 0,
         .max = 60000000000ll,
         .doc = "each registration of memory for the peer to write takes this much longer, "
                "as pinning a large region can"},
        {.name = "flush-delay",
         .type = LMT_OPT_DURATION,
         .default_value = "0",
         .min = 0,
         .max = 60000000000ll,
         .doc = "each flush takes this much longer, as a disk with much to write back or a "
                "slow cache flush does"},
        {.name = "seed",
         .type = LMT_OPT_INT,
         .default_value = "1",
         .min = 0,
         .max = INT64_MAX,
         .doc = "seed of the delays and the order"},
};

struct held {
	struct lmt_completion c;
	uint64_t release_ns;
};

/* A write whose data was captured when it was posted, sent later. */
struct bounce {
	struct lmt_endpoint *ep;
	uint8_t *data;
	size_t len;
	lmt_mr *mr; /* the inner plugin's registration of data, if it needs one */
	lmt_rkey *rkey;
	uint64_t offset;
	uint64_t cookie;
	uint64_t post_at;
	bool posted;
};

struct lmt_instance {
	const struct lmt_host *host;
	void *ctx;
	const struct lmt_plugin *inner;
	struct lmt_instance *in; /* the wrapped plugin's instance */
	uint32_t channels;
	struct lmt_endpoint **eps;
	enum lmt_role role;

	enum chaos_fault fault;
	enum chaos_point point;
	uint64_t point_n;
	uint32_t drop_channel;
	uint64_t stall_ns;
	uint64_t delay_ns;
	uint64_t hold_ns;
	uint64_t register_delay_ns;
	uint64_t flush_delay_ns;
	bool reorder;
	uint64_t rng;

	uint64_t opened_ns;
	uint64_t writes;
	uint64_t bytes;
	uint64_t reads;
	uint64_t progresses;
	uint64_t registrations;
	bool struck;
	char at[48];      /* chaos.at, for the messages */
	uint32_t nsilent; /* endpoints black-holed and not closed yet */
	uint64_t stall_until;
	struct held *held;
	uint32_t nheld;
	struct lmt_completion *failed; /* completions we owe for faked writes */
	uint32_t nfailed;
	uint32_t failed_cap;
	struct bounce *bounces;
	uint32_t nbounces;
	uint32_t bounces_cap;
	struct bounce retired[CHAOS_RETIRED];
	uint32_t retired_next;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	struct lmt_endpoint *in;
	uint32_t channel;
	bool dropped;
	bool cut;    /* dropped by a cut: its errors say so */
	bool silent; /* black-holed: writes vanish, nothing completes */
};

static uint64_t next_random(struct lmt_instance *i)
{
	uint64_t z = (i->rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A count's K, M or G suffix (bytes:N only): the multiplier, or 0. */
static uint64_t suffix_scale(const char *end, bool sized)
{
	if (!*end)
		return 1;
	if (!sized || end[1])
		return 0;
	switch (*end) {
	case 'K':
		return 1ull << 10;
	case 'M':
		return 1ull << 20;
	case 'G':
		return 1ull << 30;
	default:
		return 0;
	}
}

static int parse_point(struct lmt_instance *i, const char *at)
{
	static const struct {
		const char *name;
		enum chaos_point point;
		bool counted;
	} points[] = {
	        {"connect", CHAOS_AT_CONNECT, false},   {"flush", CHAOS_AT_FLUSH, false},
	        {"write:", CHAOS_AT_WRITE, true},       {"progress:", CHAOS_AT_PROGRESS, true},
	        {"register:", CHAOS_AT_REGISTER, true}, {"after-ms:", CHAOS_AT_TIME, true},
	        {"read:", CHAOS_AT_READ, true},         {"bytes:", CHAOS_AT_BYTES, true},
	};
	for (size_t k = 0; k < sizeof(points) / sizeof(points[0]); k++) {
		size_t n = strlen(points[k].name);
		if (strncmp(at, points[k].name, n) != 0 || (!points[k].counted && at[n]))
			continue;
		char *end = NULL;
		unsigned long long count = points[k].counted ? strtoull(at + n, &end, 10) : 0;
		if (!points[k].counted) {
			i->point = points[k].point;
			i->point_n = 0;
			return 0;
		}
		uint64_t scale = suffix_scale(end, points[k].point == CHAOS_AT_BYTES);
		if (!at[n] || at[n] == '-' || end == at + n || count == 0 || !scale ||
		    count > UINT64_MAX / scale)
			break;
		i->point = points[k].point;
		i->point_n = count * scale;
		return 0;
	}
	return i->host->error(i->ctx, LMT_EINVAL,
	                      "chaos.at: expected connect, write:N, bytes:N (K, M or G), "
	                      "progress:N, register:N, read:N, after-ms:N or flush, got '%s'",
	                      at);
}

static int read_options(struct lmt_instance *i)
{
	struct lmt_option_value v;
	const struct lmt_host *h = i->host;
	if (h->option(i->ctx, "chaos.fault", &v))
		return -LMT_EINVAL;
	i->fault = (enum chaos_fault)v.integer;
	if (h->option(i->ctx, "chaos.at", &v) || parse_point(i, v.text))
		return -LMT_EINVAL;
	snprintf(i->at, sizeof(i->at), "%s", v.text);
	h->option(i->ctx, "chaos.channel", &v);
	i->drop_channel = (uint32_t)v.integer;
	h->option(i->ctx, "chaos.stall", &v);
	i->stall_ns = (uint64_t)v.integer;
	h->option(i->ctx, "chaos.delay", &v);
	i->delay_ns = (uint64_t)v.integer;
	h->option(i->ctx, "chaos.hold", &v);
	i->hold_ns = (uint64_t)v.integer;
	h->option(i->ctx, "chaos.register-delay", &v);
	i->register_delay_ns = (uint64_t)v.integer;
	h->option(i->ctx, "chaos.flush-delay", &v);
	i->flush_delay_ns = (uint64_t)v.integer;
	h->option(i->ctx, "chaos.reorder", &v);
	i->reorder = v.boolean;
	h->option(i->ctx, "chaos.seed", &v);
	i->rng = (uint64_t)v.integer;
	return 0;
}

/* ---- faults ---- */

static void drop_endpoint(struct lmt_endpoint *ep)
{
	if (ep->dropped)
		return;
	ep->dropped = true;
	ep->inst->inner->ops.ep_close(ep->in);
	ep->in = NULL;
}

/* The error of a call on an endpoint this side dropped. */
static int dropped_error(struct lmt_endpoint *ep)
{
	struct lmt_instance *i = ep->inst;
	if (ep->cut)
		return i->host->error(i->ctx, LMT_ECONN, "chaos: channel %u: link cut at %s",
		                      ep->channel, i->at);
	return i->host->error(i->ctx, LMT_ECONN, "chaos: channel %u was dropped", ep->channel);
}

/* The link under every channel breaks, as a pulled cable with the peer
 * told (a reset): each endpoint open now is closed underneath, and the
 * control connection is dropped. The reason is recorded first, so that
 * the session's error names the cut whichever failure the core sees
 * first. Endpoints opened later (a reconnection) work again. */
static void cut_link(struct lmt_instance *i)
{
	i->host->error(i->ctx, LMT_ECONN,
	               "chaos: link cut at %s: every channel and the control connection dropped",
	               i->at);
	for (uint32_t c = 0; c < i->channels; c++)
		if (i->eps[c]) {
			i->eps[c]->cut = true;
			drop_endpoint(i->eps[c]);
		}
	i->host->inject(i->ctx, LMT_FAULT_DROP_CONTROL);
}

/* The link goes silent, as a cable pulled with no reset: writes on the
 * endpoints open now are accepted and vanish (the wrapped plugin never
 * sees them, so nothing touches their memory), and whatever the wrapped
 * plugin completes or reports on those channels is withheld, until the
 * core closes them. The control connection is left alone. */
static void blackhole_link(struct lmt_instance *i)
{
	/* A destination's transport may land and acknowledge writes from
	 * threads of its own, out of this decorator's reach: the source's
	 * black hole silences the data path both ways, a destination's is
	 * none. */
	if (i->role == LMT_ROLE_DESTINATION)
		return;
	for (uint32_t c = 0; c < i->channels; c++)
		if (i->eps[c] && !i->eps[c]->silent && !i->eps[c]->dropped) {
			i->eps[c]->silent = true;
			i->nsilent++;
		}
}

/* The fault strikes now, once, if `point` (and its count) is the one. */
static void strike(struct lmt_instance *i, enum chaos_point point, uint64_t count)
{
	if (i->point == CHAOS_AT_TIME && !i->struck &&
	    i->host->now_ns(i->ctx) - i->opened_ns >= i->point_n * 1000000ull) {
		point = CHAOS_AT_TIME;
		count = i->point_n;
	}
	if (i->struck || i->fault == CHAOS_NONE || point != i->point ||
	    (i->point_n && count != i->point_n))
		return;
	i->struck = true;
	i->host->log(i->ctx, LMT_LOG_INFO, "chaos: %s now", fault_names[i->fault]);
	switch (i->fault) {
	case CHAOS_STALL:
		i->stall_until = i->host->now_ns(i->ctx) + i->stall_ns;
		break;
	case CHAOS_DROP_CHANNEL:
		if (i->drop_channel < i->channels && i->eps[i->drop_channel])
			drop_endpoint(i->eps[i->drop_channel]);
		break;
	case CHAOS_DROP_CONTROL:
		i->host->inject(i->ctx, LMT_FAULT_DROP_CONTROL);
		break;
	case CHAOS_CUT:
		cut_link(i);
		break;
	case CHAOS_BLACKHOLE:
		blackhole_link(i);
		break;
	case CHAOS_KILL:
		raise(SIGKILL);
		break;
	case CHAOS_STOP:
		raise(SIGSTOP);
		break;
	default:
		break;
	}
}

/* Hold still until `until`: 0 then, 1 at `deadline` (0: none) if that
 * comes first, or the error of a cancel. */
static int hold_until(struct lmt_instance *i, uint64_t until, uint64_t deadline)
{
	while (i->host->now_ns(i->ctx) < until) {
		if (i->host->cancelled(i->ctx))
			return i->host->error(i->ctx, LMT_ECANCELED, "chaos: cancelled");
		if (deadline && i->host->now_ns(i->ctx) >= deadline)
			return 1;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return 0;
}

/* Hold still while a stall lasts, as a hung transport would. A source's
 * calls keep their deadline, so that it sees its writes go unanswered; a
 * destination's engine is held for the whole stall whatever the deadline
 * it gave: it stops making progress (registrations, the device state,
 * the completion's acknowledgement all wait), until the stall ends or the
 * session does (the host's cancelled service). */
static int stalled(struct lmt_instance *i, uint64_t deadline)
{
	return hold_until(i, i->stall_until, i->role == LMT_ROLE_DESTINATION ? 0 : deadline);
}

/* ---- instance ---- */

static int chaos_instance_open(const struct lmt_host *host, void *ctx,
                               const struct lmt_instance_params *params, struct lmt_instance **out)
{
	if (host->struct_size < offsetof(struct lmt_host, inject) + sizeof(host->inject) ||
	    !host->inner || !host->inner(ctx))
		return host->error(ctx, LMT_EINVAL,
		                   "chaos: name the plugin to wrap, as in 'chaos:tcp'");
	struct lmt_instance *i = calloc(1, sizeof(*i));
	if (!i)
		return host->error(ctx, LMT_ENOMEM, "chaos: out of memory");
	i->host = host;
	i->ctx = ctx;
	i->inner = host->inner(ctx);
	i->opened_ns = host->now_ns(ctx);
	i->channels = params->channels;
	i->role = params->role;
	i->eps = calloc(params->channels, sizeof(*i->eps));
	i->held = calloc(CHAOS_HELD_MAX, sizeof(*i->held));
	int rc = !i->eps || !i->held ? host->error(ctx, LMT_ENOMEM, "chaos: out of memory")
	                             : read_options(i);
	if (!rc)
		rc = i->inner->ops.instance_open(host, ctx, params, &i->in);
	if (rc) {
		free(i->eps);
		free(i->held);
		free(i);
		return rc;
	}
	*out = i;
	return 0;
}

static void bounce_release(struct lmt_instance *i, struct bounce *b)
{
	if (b->mr)
		i->inner->ops.mr_deregister(i->in, b->mr);
	free(b->data);
	b->data = NULL;
	b->mr = NULL;
}

/* A completed write's buffer is released only CHAOS_RETIRED completions
 * later: a sender thread may still be returning from the system call that
 * copied it (and a sanitizer checks the buffer after that call). */
static void bounce_retire(struct lmt_instance *i, uint32_t k)
{
	struct bounce *slot = &i->retired[i->retired_next++ % CHAOS_RETIRED];
	bounce_release(i, slot);
	*slot = i->bounces[k];
	i->bounces[k] = i->bounces[--i->nbounces];
}

static void chaos_instance_close(struct lmt_instance *i)
{
	if (!i)
		return;
	for (uint32_t c = 0; c < i->channels; c++)
		free(i->eps[c]);
	/* The wrapped instance goes first, with its threads and the
	 * registrations of the held buffers; then the buffers. */
	i->inner->ops.instance_close(i->in);
	for (uint32_t k = 0; k < i->nbounces; k++)
		free(i->bounces[k].data);
	for (uint32_t k = 0; k < CHAOS_RETIRED; k++)
		free(i->retired[k].data);
	free(i->bounces);
	free(i->eps);
	free(i->held);
	free(i->failed);
	free(i);
}

static int chaos_ep_open(struct lmt_instance *i, uint32_t channel, struct lmt_endpoint **ep,
                         struct lmt_blob *addr)
{
	struct lmt_endpoint *e = calloc(1, sizeof(*e));
	if (!e || channel >= i->channels) {
		free(e);
		return i->host->error(i->ctx, LMT_EINVAL, "chaos: cannot open channel %u", channel);
	}
	int rc = i->inner->ops.ep_open(i->in, channel, &e->in, addr);
	if (rc) {
		free(e);
		return rc;
	}
	e->inst = i;
	e->channel = channel;
	i->eps[channel] = e;
	*ep = e;
	return 0;
}

static int chaos_ep_connect(struct lmt_endpoint *ep, const struct lmt_blob *peer)
{
	struct lmt_instance *i = ep->inst;
	int rc = i->inner->ops.ep_connect(ep->in, peer);
	if (rc)
		return rc;
	strike(i, CHAOS_AT_CONNECT, 0);
	if (stalled(i, 0) < 0)
		return -LMT_ECANCELED;
	return ep->dropped ? dropped_error(ep) : 0;
}

/* What this decorator still holds of a closed endpoint: its writes are
 * abandoned (no completion follows, as for any plugin's ep_close), so
 * their captured data and their completions go. The channel's number may
 * be opened again. */
static void forget_endpoint(struct lmt_instance *i, struct lmt_endpoint *ep)
{
	for (uint32_t k = 0; k < i->nbounces;) {
		if (i->bounces[k].ep != ep) {
			k++;
			continue;
		}
		bounce_release(i, &i->bounces[k]);
		i->bounces[k] = i->bounces[--i->nbounces];
	}
	uint32_t keep = 0;
	for (uint32_t k = 0; k < i->nheld; k++)
		if (i->held[k].c.channel != ep->channel)
			i->held[keep++] = i->held[k];
	i->nheld = keep;
	keep = 0;
	for (uint32_t k = 0; k < i->nfailed; k++)
		if (i->failed[k].channel != ep->channel)
			i->failed[keep++] = i->failed[k];
	i->nfailed = keep;
}

static void chaos_ep_close(struct lmt_endpoint *ep)
{
	struct lmt_instance *i = ep->inst;
	if (ep->silent)
		i->nsilent--;
	if (!ep->dropped)
		i->inner->ops.ep_close(ep->in);
	forget_endpoint(i, ep);
	i->eps[ep->channel] = NULL;
	free(ep);
}

static int chaos_mr_register(struct lmt_instance *i, void *addr, size_t len, uint32_t access,
                             lmt_mr **mr, struct lmt_blob *key)
{
	if (access & LMT_MR_REMOTE_WRITE) {
		strike(i, CHAOS_AT_REGISTER, ++i->registrations);
		int rc = hold_until(i, i->host->now_ns(i->ctx) + i->register_delay_ns, 0);
		if (!rc)
			rc = stalled(i, 0);
		if (rc)
			return rc;
	}
	return i->inner->ops.mr_register(i->in, addr, len, access, mr, key);
}

static void chaos_mr_deregister(struct lmt_instance *i, lmt_mr *mr)
{
	i->inner->ops.mr_deregister(i->in, mr);
}

static int chaos_rkey_import(struct lmt_instance *i, const struct lmt_blob *key, lmt_rkey **rkey)
{
	return i->inner->ops.rkey_import(i->in, key, rkey);
}

static void chaos_rkey_release(struct lmt_instance *i, lmt_rkey *rkey)
{
	i->inner->ops.rkey_release(i->in, rkey);
}

/* A write we pretend to post: its completion is an error. */
static int owe_failure(struct lmt_instance *i, uint64_t cookie, uint32_t channel, int status)
{
	if (i->nfailed == i->failed_cap) {
		uint32_t cap = i->failed_cap ? i->failed_cap * 2 : 16;
		struct lmt_completion *f = realloc(i->failed, cap * sizeof(*f));
		if (!f)
			return i->host->error(i->ctx, LMT_ENOMEM, "chaos: out of memory");
		i->failed = f;
		i->failed_cap = cap;
	}
	i->failed[i->nfailed++] = (struct lmt_completion){cookie, status, channel};
	return 0;
}

/* Capture the data now; post_due sends it when its time comes. */
static int hold_write(struct lmt_endpoint *ep, const void *local, size_t len, lmt_rkey *rkey,
                      uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *i = ep->inst;
	if (i->nbounces == i->bounces_cap) {
		uint32_t cap = i->bounces_cap ? i->bounces_cap * 2 : 64;
		struct bounce *b = realloc(i->bounces, cap * sizeof(*b));
		if (!b)
			return i->host->error(i->ctx, LMT_ENOMEM, "chaos: out of memory");
		i->bounces = b;
		i->bounces_cap = cap;
	}
	struct bounce b = {.ep = ep,
	                   .len = len,
	                   .rkey = rkey,
	                   .offset = offset,
	                   .cookie = cookie,
	                   .data = malloc(len ? len : 1)};
	if (!b.data)
		return i->host->error(i->ctx, LMT_ENOMEM, "chaos: out of memory");
	memcpy(b.data, local, len);
	if (i->inner->caps & LMT_CAP_LOCAL_MR) {
		struct lmt_blob unused;
		int rc = i->inner->ops.mr_register(i->in, b.data, len, LMT_MR_LOCAL_READ, &b.mr,
		                                   &unused);
		if (rc) {
			free(b.data);
			return rc;
		}
	}
	b.post_at = i->host->now_ns(i->ctx) + next_random(i) % (i->hold_ns + 1);
	i->bounces[i->nbounces++] = b;
	return 0;
}

/* Send the held writes whose time has come, in random order if asked. */
static int post_due(struct lmt_instance *i)
{
	uint64_t now = i->host->now_ns(i->ctx);
	for (uint32_t left = i->nbounces; left; left--) {
		uint32_t k =
		        i->reorder ? (uint32_t)(next_random(i) % i->nbounces) : i->nbounces - left;
		struct bounce *b = &i->bounces[k];
		if (b->posted || b->post_at > now || b->ep->dropped || b->ep->silent)
			continue;
		int rc = i->inner->ops.write(b->ep->in, b->data, b->len, b->mr, b->rkey, b->offset,
		                             b->cookie);
		if (rc == -LMT_EAGAIN)
			continue;
		if (rc)
			return rc;
		b->posted = true;
	}
	return 0;
}

static int chaos_write(struct lmt_endpoint *ep, const void *local, size_t len, lmt_mr *mr,
                       lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *i = ep->inst;
	if (i->host->now_ns(i->ctx) < i->stall_until)
		return -LMT_EAGAIN;
	if (ep->dropped)
		return dropped_error(ep);
	if (ep->silent)
		return 0; /* gone into the black hole: no completion will follow */
	uint64_t n = i->writes + 1;
	if (i->fault == CHAOS_FAIL_WRITE && !i->struck && i->point == CHAOS_AT_WRITE &&
	    n == i->point_n) {
		i->writes = n;
		i->struck = true;
		i->host->error(i->ctx, LMT_EIO, "chaos: write %llu of %zu bytes failed on purpose",
		               (unsigned long long)n, len);
		return owe_failure(i, cookie, ep->channel, -LMT_EIO);
	}
	int rc = i->hold_ns ? hold_write(ep, local, len, rkey, offset, cookie)
	                    : i->inner->ops.write(ep->in, local, len, mr, rkey, offset, cookie);
	if (rc == 0) {
		i->writes = n;
		i->bytes += len;
		strike(i, CHAOS_AT_WRITE, n);
		if (i->point == CHAOS_AT_BYTES && i->bytes >= i->point_n)
			strike(i, CHAOS_AT_BYTES, i->point_n);
	}
	return rc;
}

/* A storage plugin's read (a restore): the Nth may strike; while a stall
 * lasts nothing is read, and the engine's wait for it (progress) holds. */
static int chaos_read(struct lmt_endpoint *ep, void *local, size_t len, lmt_rkey *rkey,
                      uint64_t offset, uint64_t cookie)
{
	struct lmt_instance *i = ep->inst;
	lmt_plugin_read_fn read = LMT_PLUGIN_READ(i->inner);
	if (!read)
		return i->host->error(i->ctx, LMT_ENOTSUP, "chaos: plugin %s does not read",
		                      i->inner->name);
	strike(i, CHAOS_AT_READ, i->reads + 1);
	if (i->host->now_ns(i->ctx) < i->stall_until)
		return -LMT_EAGAIN;
	if (ep->dropped)
		return dropped_error(ep);
	int rc = read(ep->in, local, len, rkey, offset, cookie);
	if (rc == 0)
		i->reads++;
	return rc;
}

/* Move what the inner plugin completed into the held list. */
static int gather(struct lmt_instance *i, uint64_t timeout_ns)
{
	struct lmt_completion c[64];
	uint32_t room = CHAOS_HELD_MAX - i->nheld;
	int n = i->inner->ops.progress(i->in, c, room < 64 ? room : 64, timeout_ns);
	if (n < 0 && i->nsilent) {
		/* A black hole reports nothing, failures included. */
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
		return 0;
	}
	if (n < 0)
		return n;
	uint64_t now = i->host->now_ns(i->ctx);
	int kept = 0;
	for (int k = 0; k < n; k++) {
		uint32_t ch = c[k].channel;
		if (i->nsilent && ch < i->channels && i->eps[ch] && i->eps[ch]->silent)
			continue;
		kept++;
		for (uint32_t b = 0; b < i->nbounces; b++)
			if (i->bounces[b].posted && i->bounces[b].cookie == c[k].cookie) {
				bounce_retire(i, b);
				break;
			}
		uint64_t delay = i->delay_ns ? next_random(i) % (i->delay_ns + 1) : 0;
		i->held[i->nheld++] = (struct held){c[k], now + delay};
	}
	return kept;
}

/* Hand back the completions whose time has come, shuffled if asked. */
static uint32_t release(struct lmt_instance *i, struct lmt_completion *out, uint32_t max)
{
	uint64_t now = i->host->now_ns(i->ctx);
	uint32_t n = 0;
	while (n < max && i->nfailed)
		out[n++] = i->failed[--i->nfailed];
	for (uint32_t k = i->nheld; i->reorder && k > 1; k--) {
		uint32_t j = (uint32_t)(next_random(i) % k);
		struct held t = i->held[k - 1];
		i->held[k - 1] = i->held[j];
		i->held[j] = t;
	}
	uint32_t keep = 0;
	for (uint32_t k = 0; k < i->nheld; k++) {
		if (n < max && i->held[k].release_ns <= now)
			out[n++] = i->held[k].c;
		else
			i->held[keep++] = i->held[k];
	}
	i->nheld = keep;
	return n;
}

/* A channel this side dropped fails the migration at once. */
static int dropped(struct lmt_instance *i)
{
	for (uint32_t c = 0; c < i->channels; c++)
		if (i->eps[c] && i->eps[c]->dropped)
			return dropped_error(i->eps[c]);
	return 0;
}

static int chaos_progress(struct lmt_instance *i, struct lmt_completion *out, uint32_t max,
                          uint64_t timeout_ns)
{
	uint64_t deadline = i->host->now_ns(i->ctx) + timeout_ns;
	strike(i, CHAOS_AT_PROGRESS, ++i->progresses);
	for (;;) {
		int rc = dropped(i);
		if (rc)
			return rc;
		rc = stalled(i, deadline);
		if (rc < 0)
			return rc;
		if (rc > 0)
			return 0;
		if ((rc = post_due(i)))
			return rc;
		uint64_t now = i->host->now_ns(i->ctx);
		uint64_t left = deadline > now ? deadline - now : 0;
		uint64_t wait = left < CHAOS_SLICE_NS ? left : CHAOS_SLICE_NS;
		rc = gather(i, i->nheld || i->nfailed || i->nbounces ? 0 : wait);
		if (rc < 0)
			return rc;
		uint32_t n = release(i, out, max);
		if (n || i->host->now_ns(i->ctx) >= deadline)
			return (int)n;
		if (i->nheld || i->nbounces) {
			struct timespec ts = {0, 200000};
			nanosleep(&ts, NULL);
		}
	}
}

/* A flush into a black hole is never answered: it waits out its timeout. */
static int silent_flush(struct lmt_instance *i, uint64_t timeout_ns)
{
	uint64_t deadline = i->host->now_ns(i->ctx) + timeout_ns;
	int rc = hold_until(i, deadline, 0);
	return rc ? rc
	          : i->host->error(i->ctx, LMT_ETIMEDOUT,
	                           "chaos: flush unanswered for %llu ms: link black-holed at %s",
	                           (unsigned long long)(timeout_ns / 1000000), i->at);
}

static int chaos_flush(struct lmt_instance *i, uint64_t timeout_ns)
{
	strike(i, CHAOS_AT_FLUSH, 0);
	if (i->nsilent)
		return silent_flush(i, timeout_ns);
	/* Everything posted before the flush must land: send what is held. */
	for (uint32_t k = 0; k < i->nbounces; k++)
		i->bounces[k].post_at = 0;
	uint64_t deadline = i->host->now_ns(i->ctx) + timeout_ns;
	for (;;) {
		bool held = false;
		int rc = post_due(i);
		if (rc)
			return rc;
		for (uint32_t k = 0; k < i->nbounces; k++)
			held |= !i->bounces[k].posted && !i->bounces[k].ep->dropped &&
			        !i->bounces[k].ep->silent;
		if (!held)
			break;
		if (i->host->now_ns(i->ctx) >= deadline)
			return i->host->error(i->ctx, LMT_ETIMEDOUT, "chaos: held writes not sent");
		if ((rc = gather(i, 1000000)) < 0)
			return rc;
	}
	int rc = stalled(i, i->host->now_ns(i->ctx) + timeout_ns);
	if (!rc && i->flush_delay_ns)
		rc = hold_until(i, i->host->now_ns(i->ctx) + i->flush_delay_ns, deadline);
	if (rc)
		return rc < 0 ? rc
		              : i->host->error(i->ctx, LMT_ETIMEDOUT,
		                               "chaos: stalled flush timed out");
	return dropped(i) ? -LMT_ECONN : i->inner->ops.flush(i->in, timeout_ns);
}

static const struct lmt_plugin chaos_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .write_access = "as the plugin it wraps: chaos changes nothing in who may write.",
        .name = "chaos",
        .version = LMT_VERSION,
        .description = "fault injection around another plugin: use as chaos:<plugin>",
        .caps = LMT_CAP_DECORATOR | LMT_CAP_MULTI_CHANNEL,
        .options = chaos_options,
        .option_count = sizeof(chaos_options) / sizeof(chaos_options[0]),
        .ops =
                {
                        .instance_open = chaos_instance_open,
                        .instance_close = chaos_instance_close,
                        .ep_open = chaos_ep_open,
                        .ep_connect = chaos_ep_connect,
                        .ep_close = chaos_ep_close,
                        .mr_register = chaos_mr_register,
                        .mr_deregister = chaos_mr_deregister,
                        .rkey_import = chaos_rkey_import,
                        .rkey_release = chaos_rkey_release,
                        .write = chaos_write,
                        .progress = chaos_progress,
                        .flush = chaos_flush,
                },
        .read = chaos_read,
};

LMT_DECLARE_PLUGIN(chaos_plugin)
