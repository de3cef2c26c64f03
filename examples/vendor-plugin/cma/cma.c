/* cma: an lmt transport plugin for two processes on one host. The source copies
 * straight into the destination's memory with process_vm_writev (Cross Memory
 * Attach). Written as an example to start a plugin from; see
 * docs/writing-a-plugin.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <lmt/plugin.h>

#define CMA_MAX_CHANNELS 1024u
#define CMA_MAX_CQ 65536
#define CMA_SLICE_NS 100000000ull /* a waiting progress polls cancelled this often */

/* Blobs are little-endian and start with a magic and a version, so that a
 * blob of another kind or version is refused rather than misread. By offset:
 *   address: 0 magic, 4 version, 5 role, 6 zero[2], 8 channel, 12 pid,
 *            16 token (24 bytes)
 *   key:     0 magic, 4 version, 5 zero[3], 8 pid, 12 zero[4], 16 token,
 *            24 address, 32 length (40 bytes)
 * The token is random per instance: the source takes keys only from the
 * destination instance whose endpoints it connected to. */
#define CMA_ADDR_MAGIC 0x61616d63u /* "cmaa" */
#define CMA_KEY_MAGIC 0x6b616d63u  /* "cmak" */
#define CMA_BLOB_VERSION 1
#define CMA_ADDR_LEN 24u
#define CMA_KEY_LEN 40u

#define cma_log(inst, level, ...) (inst)->host->log((inst)->host_ctx, level, __VA_ARGS__)
#define cma_error(inst, code, ...) (inst)->host->error((inst)->host_ctx, code, __VA_ARGS__)

enum cma_ptracer { CMA_PTRACER_PEER, CMA_PTRACER_ANY, CMA_PTRACER_NONE };

static const char *const cma_ptracer_values[] = {"peer", "any", "none", NULL};

static const struct lmt_option_desc cma_options[] = {
        {.name = "cq-depth",
         .type = LMT_OPT_INT,
         .default_value = "256",
         .min = 1,
         .max = CMA_MAX_CQ,
         .doc = "completions held for progress before write answers EAGAIN"},
        {.name = "ptracer",
         .type = LMT_OPT_ENUM,
         .default_value = "peer",
         .enum_values = cma_ptracer_values,
         .doc = "destination, under Yama ptrace_scope=1: let the source (peer), any "
                "process (any) or nobody new (none) write into this process"},
};

/* Registrations and imported keys sit on a list of their instance, so that
 * instance_close can free whatever the core did not. */
struct cma_node {
	struct cma_node *prev, *next;
};

struct lmt_mr {
	struct cma_node node; /* first: the node's address is the mr's */
	uint8_t *addr;
	size_t len;
};

struct lmt_rkey {
	struct cma_node node;
	uint32_t pid;
	uint64_t token;
	uint64_t addr;
	uint64_t len;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	bool connected;
};

struct lmt_instance {
	const struct lmt_host *host;
	void *host_ctx;
	enum lmt_role role;
	uint32_t channels;
	uint64_t token;
	enum cma_ptracer ptracer;
	bool ptracer_set;
	lmt_endpoint **eps; /* by channel; NULL when closed */

	/* The peer process, from the first ep_connect; every channel must
	 * name the same. The source watches it through a pidfd (-1 where the
	 * kernel has none) to notice when it exits. */
	uint32_t peer_pid;
	uint64_t peer_token;
	int peer_fd;

	/* Completed writes waiting for progress, and the lists. */
	pthread_mutex_t lock;
	struct lmt_completion *ring;
	uint32_t ring_cap, ring_first, ring_count;
	struct cma_node mrs, rkeys;
};

/* ---- Blobs ------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> 8 * i);
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> 8 * i);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << 8 * i;
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << 8 * i;
	return v;
}

static bool all_zero(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

static void addr_encode(const struct lmt_instance *inst, uint32_t channel, struct lmt_blob *b)
{
	memset(b->data, 0, CMA_ADDR_LEN);
	put32(b->data, CMA_ADDR_MAGIC);
	b->data[4] = CMA_BLOB_VERSION;
	b->data[5] = (uint8_t)inst->role;
	put32(b->data + 8, channel);
	put32(b->data + 12, (uint32_t)getpid());
	put64(b->data + 16, inst->token);
	b->len = CMA_ADDR_LEN;
}

/* NULL, or why `b` is not the address of the peer's endpoint `channel`. */
static const char *addr_decode(const struct lmt_blob *b, enum lmt_role peer_role, uint32_t channel,
                               uint32_t *pid, uint64_t *token)
{
	if (b->len != CMA_ADDR_LEN)
		return "wrong length";
	if (get32(b->data) != CMA_ADDR_MAGIC)
		return "not a cma address";
	if (b->data[4] != CMA_BLOB_VERSION)
		return "unknown version";
	if (b->data[5] != (uint8_t)peer_role)
		return peer_role == LMT_ROLE_SOURCE ? "not a source's address"
		                                    : "not a destination's address";
	if (!all_zero(b->data + 6, 2))
		return "reserved bytes set";
	if (get32(b->data + 8) != channel)
		return "address of another channel";
	*pid = get32(b->data + 12);
	if (*pid == 0 || *pid > INT32_MAX)
		return "bad process id";
	*token = get64(b->data + 16);
	return NULL;
}

static void key_encode(const struct lmt_instance *inst, const struct lmt_mr *mr, struct lmt_blob *b)
{
	memset(b->data, 0, CMA_KEY_LEN);
	put32(b->data, CMA_KEY_MAGIC);
	b->data[4] = CMA_BLOB_VERSION;
	put32(b->data + 8, (uint32_t)getpid());
	put64(b->data + 16, inst->token);
	put64(b->data + 24, (uint64_t)(uintptr_t)mr->addr);
	put64(b->data + 32, mr->len);
	b->len = CMA_KEY_LEN;
}

static const char *key_decode(const struct lmt_blob *b, struct lmt_rkey *k)
{
	if (b->len != CMA_KEY_LEN)
		return "wrong length";
	if (get32(b->data) != CMA_KEY_MAGIC)
		return "not a cma key";
	if (b->data[4] != CMA_BLOB_VERSION)
		return "unknown version";
	if (!all_zero(b->data + 5, 3) || !all_zero(b->data + 12, 4))
		return "reserved bytes set";
	k->pid = get32(b->data + 8);
	k->token = get64(b->data + 16);
	k->addr = get64(b->data + 24);
	k->len = get64(b->data + 32);
	if (k->pid == 0 || k->pid > INT32_MAX)
		return "bad process id";
	if (k->addr == 0 || k->len == 0 || k->addr > UINTPTR_MAX - k->len)
		return "bad address range";
	return NULL;
}

/* ---- Lists ------------------------------------------------------------- */

static void node_init(struct cma_node *head)
{
	head->prev = head->next = head;
}

static void node_link(struct lmt_instance *inst, struct cma_node *head, struct cma_node *n)
{
	pthread_mutex_lock(&inst->lock);
	n->next = head->next;
	n->prev = head;
	head->next->prev = n;
	head->next = n;
	pthread_mutex_unlock(&inst->lock);
}

static void node_unlink(struct lmt_instance *inst, struct cma_node *n)
{
	pthread_mutex_lock(&inst->lock);
	n->prev->next = n->next;
	n->next->prev = n->prev;
	pthread_mutex_unlock(&inst->lock);
}

static void node_free_all(struct cma_node *head)
{
	while (head->next != head) {
		struct cma_node *n = head->next;
		head->next = n->next;
		free(n);
	}
	head->prev = head;
}

/* ---- The peer process ---------------------------------------------------- */

/* Under Yama ptrace_scope=1 only a process's ancestors may write into it,
 * unless it names who else may (PR_SET_PTRACER, one value per process).
 * Without Yama the call fails with EINVAL and nothing is needed. */
static int allow_writer(struct lmt_instance *inst, unsigned long who)
{
	if (prctl(PR_SET_PTRACER, who, 0, 0, 0) == 0) {
		inst->ptracer_set = true;
		return 0;
	}
	if (errno == EINVAL)
		return 0;
	return cma_error(inst, LMT_EIO, "cma: prctl(PR_SET_PTRACER): %s", strerror(errno));
}

/* A pidfd turns readable when its process exits, and never names another
 * process once the pid is reused. -1 on kernels without pidfd_open. */
static int watch_process(uint32_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#else
	(void)pid;
	errno = ENOSYS;
	return -1;
#endif
}

static bool peer_exited(const struct lmt_instance *inst, int wait_ms)
{
	struct pollfd p = {.fd = inst->peer_fd, .events = POLLIN};
	return poll(&p, inst->peer_fd >= 0 ? 1 : 0, wait_ms) > 0;
}

/* ---- Instances --------------------------------------------------------- */

static int read_options(struct lmt_instance *inst)
{
	struct lmt_option_value v;
	inst->ring_cap = 256;
	inst->ptracer = CMA_PTRACER_PEER;
	if (inst->host->option(inst->host_ctx, "cma.cq-depth", &v) == 0) {
		if (v.type != LMT_OPT_INT || v.integer < 1 || v.integer > CMA_MAX_CQ)
			return cma_error(inst, LMT_EINVAL,
			                 "cma.cq-depth: expected 1 to %d, got %" PRId64, CMA_MAX_CQ,
			                 v.integer);
		inst->ring_cap = (uint32_t)v.integer;
	}
	if (inst->host->option(inst->host_ctx, "cma.ptracer", &v) == 0) {
		if (v.type != LMT_OPT_ENUM || v.integer < 0 || v.integer > CMA_PTRACER_NONE)
			return cma_error(inst, LMT_EINVAL,
			                 "cma.ptracer: expected peer, any or none");
		inst->ptracer = (enum cma_ptracer)v.integer;
	}
	return 0;
}

static void free_instance(struct lmt_instance *inst)
{
	free(inst->eps);
	free(inst->ring);
	free(inst);
}

static int cma_instance_open(const struct lmt_host *host, void *host_ctx,
                             const struct lmt_instance_params *params, lmt_instance **out)
{
	if (!host || !host->error || !out)
		return -LMT_EINVAL;
	*out = NULL;
	if (host->struct_size < offsetof(struct lmt_host, cancelled) + sizeof(host->cancelled) ||
	    !host->log || !host->now_ns || !host->option || !host->cancelled)
		return host->error(host_ctx, LMT_EABI, "cma: host services incomplete");
	if (!params || params->struct_size < offsetof(struct lmt_instance_params, timeout_ns))
		return host->error(host_ctx, LMT_EABI, "cma: instance parameters too old");
	if (params->role != LMT_ROLE_SOURCE && params->role != LMT_ROLE_DESTINATION)
		return host->error(host_ctx, LMT_EINVAL, "cma: unknown role %d", (int)params->role);
	if (params->channels == 0 || params->channels > CMA_MAX_CHANNELS)
		return host->error(host_ctx, LMT_EINVAL, "cma: %u channels, expected 1 to %u",
		                   params->channels, CMA_MAX_CHANNELS);

	struct lmt_instance *inst = calloc(1, sizeof(*inst));
	if (!inst)
		return host->error(host_ctx, LMT_ENOMEM, "cma: out of memory");
	inst->host = host;
	inst->host_ctx = host_ctx;
	inst->role = params->role;
	inst->channels = params->channels;
	inst->peer_fd = -1;
	node_init(&inst->mrs);
	node_init(&inst->rkeys);
	int rc = read_options(inst);
	if (rc) {
		free(inst);
		return rc;
	}
	if (getrandom(&inst->token, sizeof(inst->token), 0) != (ssize_t)sizeof(inst->token)) {
		free(inst);
		return host->error(host_ctx, LMT_EIO, "cma: getrandom: %s", strerror(errno));
	}
	inst->eps = calloc(inst->channels, sizeof(*inst->eps));
	inst->ring = calloc(inst->ring_cap, sizeof(*inst->ring));
	if (!inst->eps || !inst->ring) {
		free_instance(inst);
		return host->error(host_ctx, LMT_ENOMEM, "cma: out of memory");
	}
	if (pthread_mutex_init(&inst->lock, NULL)) {
		free_instance(inst);
		return host->error(host_ctx, LMT_ENOMEM, "cma: cannot create a lock");
	}
	/* The source may write as soon as it has a key: "any" opens up now,
	 * "peer" waits for the source's address in ep_connect, which comes
	 * before any registration. */
	if (inst->role == LMT_ROLE_DESTINATION && inst->ptracer == CMA_PTRACER_ANY &&
	    (rc = allow_writer(inst, PR_SET_PTRACER_ANY)) != 0) {
		pthread_mutex_destroy(&inst->lock);
		free_instance(inst);
		return rc;
	}
	*out = inst;
	return 0;
}

static void cma_ep_close(lmt_endpoint *ep);

static void cma_instance_close(lmt_instance *inst)
{
	if (!inst)
		return;
	for (uint32_t c = 0; c < inst->channels; c++)
		cma_ep_close(inst->eps[c]);
	node_free_all(&inst->mrs);
	node_free_all(&inst->rkeys);
	if (inst->peer_fd >= 0)
		close(inst->peer_fd);
	if (inst->ptracer_set)
		prctl(PR_SET_PTRACER, 0UL, 0, 0, 0);
	pthread_mutex_destroy(&inst->lock);
	free_instance(inst);
}

/* ---- Endpoints --------------------------------------------------------- */

static int cma_ep_open(lmt_instance *inst, uint32_t channel, lmt_endpoint **out,
                       struct lmt_blob *addr)
{
	if (!inst || !out || !addr)
		return -LMT_EINVAL;
	if (channel >= inst->channels)
		return cma_error(inst, LMT_EINVAL, "cma: channel %u out of range (%u channels)",
		                 channel, inst->channels);
	if (inst->eps[channel])
		return cma_error(inst, LMT_ESTATE, "cma channel %u: already open", channel);
	lmt_endpoint *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return cma_error(inst, LMT_ENOMEM, "cma: out of memory");
	ep->inst = inst;
	ep->channel = channel;
	addr_encode(inst, channel, addr);
	inst->eps[channel] = ep;
	*out = ep;
	return 0;
}

/* Nothing to connect: check the peer's address and remember the peer. */
static int cma_ep_connect(lmt_endpoint *ep, const struct lmt_blob *peer_addr)
{
	if (!ep || !peer_addr)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	bool source = inst->role == LMT_ROLE_SOURCE;
	uint32_t pid;
	uint64_t token;
	const char *why = addr_decode(peer_addr, source ? LMT_ROLE_DESTINATION : LMT_ROLE_SOURCE,
	                              ep->channel, &pid, &token);
	if (!why && inst->peer_pid && (pid != inst->peer_pid || token != inst->peer_token))
		why = "another process than the other channels'";
	if (why)
		return cma_error(inst, LMT_EPROTO,
		                 "cma channel %u: bad address blob from the %s: %s", ep->channel,
		                 source ? "destination" : "source", why);
	if (ep->connected)
		return cma_error(inst, LMT_ESTATE, "cma channel %u: already connected",
		                 ep->channel);

	if (!inst->peer_pid && source) {
		inst->peer_fd = watch_process(pid);
		if (inst->peer_fd < 0 && errno == ESRCH)
			return cma_error(inst, LMT_ECONN,
			                 "cma channel %u: no destination process %u", ep->channel,
			                 pid);
	}
	if (!inst->peer_pid && !source && inst->ptracer == CMA_PTRACER_PEER &&
	    pid != (uint32_t)getpid()) {
		int rc = allow_writer(inst, pid);
		if (rc)
			return rc;
	}
	inst->peer_pid = pid;
	inst->peer_token = token;
	ep->connected = true;
	cma_log(inst, LMT_LOG_DEBUG, "cma channel %u: peer is process %u", ep->channel, pid);
	return 0;
}

/* No completion follows ep_close for the channel's writes (the contract's
 * "Reopening a channel"): those still queued are dropped. */
static void forget_completions(struct lmt_instance *inst, uint32_t channel)
{
	pthread_mutex_lock(&inst->lock);
	uint32_t kept = 0;
	for (uint32_t i = 0; i < inst->ring_count; i++) {
		struct lmt_completion c = inst->ring[(inst->ring_first + i) % inst->ring_cap];
		if (c.channel != channel)
			inst->ring[(inst->ring_first + kept++) % inst->ring_cap] = c;
	}
	inst->ring_count = kept;
	pthread_mutex_unlock(&inst->lock);
}

static void cma_ep_close(lmt_endpoint *ep)
{
	if (!ep)
		return;
	forget_completions(ep->inst, ep->channel);
	ep->inst->eps[ep->channel] = NULL;
	free(ep);
}

/* ---- Registrations ----------------------------------------------------- */

/* Nothing to pin: the kernel faults the destination's pages in as the
 * source writes them. A registration only describes the range. */
static int cma_mr_register(lmt_instance *inst, void *addr, size_t len, uint32_t access,
                           lmt_mr **out, struct lmt_blob *key)
{
	if (!inst || !out)
		return -LMT_EINVAL;
	bool remote = access & LMT_MR_REMOTE_WRITE;
	if (!addr || !len || (uintptr_t)addr > UINTPTR_MAX - len || (remote && !key))
		return cma_error(inst, LMT_EINVAL, "cma: cannot register %zu bytes at %p%s", len,
		                 addr, remote && !key ? " without a key blob" : "");
	struct lmt_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return cma_error(inst, LMT_ENOMEM, "cma: out of memory");
	mr->addr = addr;
	mr->len = len;
	node_link(inst, &inst->mrs, &mr->node);
	if (remote)
		key_encode(inst, mr, key);
	else if (key)
		key->len = 0;
	*out = mr;
	return 0;
}

static void cma_mr_deregister(lmt_instance *inst, lmt_mr *mr)
{
	if (!inst || !mr)
		return;
	node_unlink(inst, &mr->node);
	free(mr);
}

static int cma_rkey_import(lmt_instance *inst, const struct lmt_blob *key, lmt_rkey **out)
{
	if (!inst || !key || !out)
		return -LMT_EINVAL;
	struct lmt_rkey k;
	const char *why = key_decode(key, &k);
	if (!why && inst->peer_pid && (k.pid != inst->peer_pid || k.token != inst->peer_token))
		why = "a key of another process than the connected destination";
	if (why)
		return cma_error(inst, LMT_EPROTO, "cma: bad key blob (%u bytes): %s", key->len,
		                 why);
	struct lmt_rkey *rkey = malloc(sizeof(*rkey));
	if (!rkey)
		return cma_error(inst, LMT_ENOMEM, "cma: out of memory");
	*rkey = k;
	node_link(inst, &inst->rkeys, &rkey->node);
	*out = rkey;
	return 0;
}

static void cma_rkey_release(lmt_instance *inst, lmt_rkey *rkey)
{
	if (!inst || !rkey)
		return;
	node_unlink(inst, &rkey->node);
	free(rkey);
}

/* ---- Data path --------------------------------------------------------- */

/* Copy into the peer. When process_vm_writev returns, the bytes are in the
 * destination's pages: that is the whole completion. */
static int copy_out(lmt_endpoint *ep, const uint8_t *local, size_t len, uint64_t remote)
{
	struct lmt_instance *inst = ep->inst;
	size_t done = 0;
	while (done < len) {
		struct iovec l = {.iov_base = (void *)(local + done), .iov_len = len - done};
		struct iovec r = {.iov_base = (void *)(uintptr_t)(remote + done),
		                  .iov_len = len - done};
		ssize_t n = process_vm_writev((pid_t)inst->peer_pid, &l, 1, &r, 1, 0);
		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		int err = n < 0 ? errno : EFAULT;
		return cma_error(
		        inst, err == ESRCH ? LMT_ECONN : LMT_EIO,
		        "cma channel %u: writing %zu bytes into process %u at 0x%" PRIx64 ": %s%s",
		        ep->channel, len - done, inst->peer_pid, remote + done, strerror(err),
		        err == EPERM ? " (the destination must run as the same user, be "
		                       "dumpable, and under Yama ptrace_scope=1 set "
		                       "cma.ptracer=peer or any)"
		                     : "");
	}
	return 0;
}

static int cma_write(lmt_endpoint *ep, const void *local, size_t len, lmt_mr *local_mr,
                     lmt_rkey *rkey, uint64_t offset, uint64_t cookie)
{
	(void)local_mr; /* no LMT_CAP_LOCAL_MR: always NULL */
	if (!ep)
		return -LMT_EINVAL;
	struct lmt_instance *inst = ep->inst;
	if (inst->role != LMT_ROLE_SOURCE || !ep->connected)
		return cma_error(inst, LMT_ESTATE, "cma channel %u: write on %s", ep->channel,
		                 ep->connected ? "a destination" : "an unconnected endpoint");
	if (!rkey || (!local && len))
		return cma_error(inst, LMT_EINVAL, "cma channel %u: write without %s", ep->channel,
		                 rkey ? "a source buffer" : "a key");
	if (rkey->pid != inst->peer_pid || rkey->token != inst->peer_token)
		return cma_error(inst, LMT_EINVAL, "cma channel %u: the key is another process's",
		                 ep->channel);
	if ((uint64_t)len > rkey->len || offset > rkey->len - len)
		return cma_error(inst, LMT_EINVAL,
		                 "cma channel %u: write of %zu bytes at offset %" PRIu64
		                 " past the end of a %" PRIu64 "-byte region",
		                 ep->channel, len, offset, rkey->len);

	pthread_mutex_lock(&inst->lock);
	bool full = inst->ring_count == inst->ring_cap;
	pthread_mutex_unlock(&inst->lock);
	if (full)
		return -LMT_EAGAIN;
	/* A pid can be reused once its process is gone: never write to it. */
	if (peer_exited(inst, 0))
		return cma_error(inst, LMT_ECONN, "cma channel %u: the destination process exited",
		                 ep->channel);
	int rc = copy_out(ep, local, len, rkey->addr + offset);
	if (rc)
		return rc;

	pthread_mutex_lock(&inst->lock);
	uint32_t at = (inst->ring_first + inst->ring_count++) % inst->ring_cap;
	inst->ring[at] = (struct lmt_completion){.cookie = cookie, .channel = ep->channel};
	pthread_mutex_unlock(&inst->lock);
	return 0;
}

static uint32_t harvest(struct lmt_instance *inst, struct lmt_completion *out, uint32_t max)
{
	pthread_mutex_lock(&inst->lock);
	uint32_t n = 0;
	for (; n < max && inst->ring_count; n++) {
		out[n] = inst->ring[inst->ring_first];
		inst->ring_first = (inst->ring_first + 1) % inst->ring_cap;
		inst->ring_count--;
	}
	pthread_mutex_unlock(&inst->lock);
	return n;
}

/* Completions exist as soon as write returns, so with none queued there is
 * nothing to wait for but the timeout, a cancel, or the peer's exit. */
static int cma_progress(lmt_instance *inst, struct lmt_completion *out, uint32_t max,
                        uint64_t timeout_ns)
{
	if (!inst || (!out && max))
		return -LMT_EINVAL;
	uint64_t start = inst->host->now_ns(inst->host_ctx);
	for (;;) {
		uint32_t n = harvest(inst, out, max);
		if (n || !max)
			return (int)n;
		if (inst->host->cancelled(inst->host_ctx))
			return cma_error(inst, LMT_ECANCELED, "cma: cancelled");
		uint64_t waited = inst->host->now_ns(inst->host_ctx) - start;
		if (waited >= timeout_ns)
			return 0;
		uint64_t slice =
		        timeout_ns - waited < CMA_SLICE_NS ? timeout_ns - waited : CMA_SLICE_NS;
		if (peer_exited(inst, (int)((slice + 999999) / 1000000)))
			return cma_error(inst, LMT_ECONN, "cma: the destination process exited");
	}
}

/* Every write is visible when it returns: there is never anything to flush. */
static int cma_flush(lmt_instance *inst, uint64_t timeout_ns)
{
	(void)timeout_ns;
	return inst ? 0 : -LMT_EINVAL;
}

static const struct lmt_plugin cma_plugin = {
        .abi_version = LMT_PLUGIN_ABI_VERSION,
        .struct_size = sizeof(struct lmt_plugin),
        .name = "cma",
        .version = "0.1.0",
        .description = "same-host copies with process_vm_writev (Cross Memory Attach)",
        .caps = LMT_CAP_ONE_SIDED | LMT_CAP_MULTI_CHANNEL,
        .options = cma_options,
        .option_count = sizeof(cma_options) / sizeof(cma_options[0]),
        .ops =
                {
                        .instance_open = cma_instance_open,
                        .instance_close = cma_instance_close,
                        .ep_open = cma_ep_open,
                        .ep_connect = cma_ep_connect,
                        .ep_close = cma_ep_close,
                        .mr_register = cma_mr_register,
                        .mr_deregister = cma_mr_deregister,
                        .rkey_import = cma_rkey_import,
                        .rkey_release = cma_rkey_release,
                        .write = cma_write,
                        .progress = cma_progress,
                        .flush = cma_flush,
                },
};

LMT_DECLARE_PLUGIN(cma_plugin)
