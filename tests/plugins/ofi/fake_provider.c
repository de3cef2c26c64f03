/* lmtfake: a libfabric provider for the ofi plugin's tests, loaded through
 * FI_PROVIDER_PATH. Endpoints live in one process; it asks for whichever
 * FI_MR_* modes LMT_FAKE_MR_MODE names and checks that they are honoured. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/providers/fi_prov.h>

/*
 * Environment, read when a domain opens (and by getinfo):
 *   LMT_FAKE_MR_MODE      FI_MR_* bits the provider requires (default 0)
 *   LMT_FAKE_NO_DELIVERY  1: refuse FI_DELIVERY_COMPLETE; writes complete at
 *                         once and land only behind a read or 50 ms later
 *   LMT_FAKE_NO_WAIT      1: completion queues have no wait objects
 *   LMT_FAKE_HOLD         1: writes that succeed never complete
 *   LMT_FAKE_MESSAGES     1: claim FI_MSG as well (it implements no message),
 *                         as a provider the plugin has not measured would
 */
#define FAKE_NAME "lmtfake"
#define FAKE_NAME_LEN 16 /* "LMTFAKE\0" and an endpoint id */
#define FAKE_RAW_LEN 24  /* domain id, key, and a check word */
#define FAKE_CQ_SIZE 4096
#define FAKE_TX_SIZE 256
#define FAKE_AV_SIZE 256
#define FAKE_LATE_NS 50000000ull /* deferred writes land after this */
#define FAKE_MR_MAGIC 0x4d52464bu

enum fake_prov_errno {
	FAKE_ERR_NO_KEY = 101,
	FAKE_ERR_RANGE = 102,
	FAKE_ERR_ACCESS = 103,
	FAKE_ERR_NO_PEER = 104,
	FAKE_ERR_UNBOUND = 105,
};

struct fake_cfg {
	uint64_t mr_mode;
	bool no_delivery;
	bool no_wait;
	bool hold;
	unsigned taken; /* requested keys answered FI_ENOKEY first, per domain */
	bool messages;  /* claims FI_MSG */
};

struct fake_domain;
struct fake_ep;

struct fake_mr {
	struct fid_mr mr;
	uint32_t magic;
	struct fake_domain *dom;
	uint8_t *addr;
	size_t len;
	uint64_t access;
	uint64_t key;
	struct fake_ep *bound;
	bool enabled;
	struct fake_mr *next;
};

struct fake_map {
	uint64_t key; /* what the initiator uses */
	uint64_t domain_id, target_key;
	struct fake_map *next;
};

struct fake_domain {
	struct fid_domain domain;
	struct fake_cfg cfg;
	uint64_t id;
	struct fake_mr *mrs;
	struct fake_map *maps;
	uint64_t next_key, next_map;
	unsigned refused; /* requested keys answered FI_ENOKEY so far */
	struct fake_domain *next;
};

struct fake_entry {
	void *context;
	int err;
	int prov_errno;
	char text[160];
};

struct fake_cq {
	struct fid_cq cq;
	struct fake_domain *dom;
	bool wait;
	bool signaled;
	struct fake_entry *ring;
	uint32_t first, count;
	char err_text[160];
};

struct fake_av {
	struct fid_av av;
	uint64_t ids[FAKE_AV_SIZE];
	size_t count;
};

/* A write that completed at its initiator and has not landed yet. */
struct fake_late {
	uint64_t from; /* initiator endpoint id */
	uint64_t domain_id, key, addr;
	size_t len;
	uint64_t posted_ns;
	struct fake_late *next;
	uint8_t data[];
};

struct fake_ep {
	struct fid_ep ep;
	struct fake_domain *dom;
	uint64_t id;
	struct fake_cq *cq;
	struct fake_av *av;
	bool enabled;
	struct fake_late *late;
	struct fake_ep *next;
};

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_cond = PTHREAD_COND_INITIALIZER;
static struct fake_domain *fake_domains;
static struct fake_ep *fake_eps;
static uint64_t fake_next_id = 1;

static struct fake_cfg fake_config(void)
{
	struct fake_cfg c = {0};
	const char *v = getenv("LMT_FAKE_MR_MODE");
	c.mr_mode = v ? strtoull(v, NULL, 0) : 0;
	v = getenv("LMT_FAKE_NO_DELIVERY");
	c.no_delivery = v && v[0] == '1';
	v = getenv("LMT_FAKE_NO_WAIT");
	c.no_wait = v && v[0] == '1';
	v = getenv("LMT_FAKE_HOLD");
	c.hold = v && v[0] == '1';
	v = getenv("LMT_FAKE_TAKEN_KEYS");
	c.taken = v ? (unsigned)strtoul(v, NULL, 0) : 0;
	v = getenv("LMT_FAKE_MESSAGES");
	c.messages = v && v[0] == '1';
	return c;
}

static uint64_t fake_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Stubs ---------------------------------------------------------------- */

static int no_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	return -FI_ENOSYS;
}

static int no_control(struct fid *fid, int command, void *arg)
{
	return -FI_ENOSYS;
}

static int no_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops, void *context)
{
	return -FI_ENOSYS;
}

/* ---- Completion queues ---------------------------------------------------- */

static void cq_push(struct fake_cq *cq, void *context, int err, int prov_errno, const char *text)
{
	if (!cq || cq->count == FAKE_CQ_SIZE)
		return;
	struct fake_entry *e = &cq->ring[(cq->first + cq->count++) % FAKE_CQ_SIZE];
	e->context = context;
	e->err = err;
	e->prov_errno = prov_errno;
	snprintf(e->text, sizeof(e->text), "%s", text ? text : "");
	pthread_cond_broadcast(&fake_cond);
}

static struct fake_domain *domain_by_id(uint64_t id)
{
	for (struct fake_domain *d = fake_domains; d; d = d->next)
		if (d->id == id)
			return d;
	return NULL;
}

static struct fake_ep *ep_by_id(uint64_t id)
{
	for (struct fake_ep *e = fake_eps; e; e = e->next)
		if (e->id == id)
			return e;
	return NULL;
}

static struct fake_mr *mr_by_key(struct fake_domain *d, uint64_t key)
{
	for (struct fake_mr *m = d->mrs; m; m = m->next)
		if (m->key == key && m->enabled)
			return m;
	return NULL;
}

/* The target memory of an access, or NULL with the error's detail. */
static uint8_t *resolve(struct fake_ep *target, uint64_t domain_id, uint64_t key, uint64_t addr,
                        size_t len, uint64_t access, int *perr, char *text, size_t size)
{
	struct fake_domain *d = domain_by_id(domain_id);
	struct fake_mr *mr = d && target ? mr_by_key(d, key) : NULL;
	if (!target || !d) {
		*perr = FAKE_ERR_NO_PEER;
		snprintf(text, size, FAKE_NAME ": the target endpoint is gone");
		return NULL;
	}
	if (!mr) {
		*perr = FAKE_ERR_NO_KEY;
		snprintf(text, size, FAKE_NAME ": key 0x%llx is not registered at the target",
		         (unsigned long long)key);
		return NULL;
	}
	if ((d->cfg.mr_mode & FI_MR_ENDPOINT) && mr->bound != target) {
		*perr = FAKE_ERR_UNBOUND;
		snprintf(text, size, FAKE_NAME ": key 0x%llx is bound to another endpoint",
		         (unsigned long long)key);
		return NULL;
	}
	if (!(mr->access & access)) {
		*perr = FAKE_ERR_ACCESS;
		snprintf(text, size, FAKE_NAME ": key 0x%llx lacks access 0x%llx",
		         (unsigned long long)key, (unsigned long long)access);
		return NULL;
	}
	uint64_t base = d->cfg.mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)mr->addr : 0;
	if (addr < base || len > mr->len || addr - base > mr->len - len) {
		*perr = FAKE_ERR_RANGE;
		snprintf(text, size, FAKE_NAME ": %zu bytes at 0x%llx outside key 0x%llx", len,
		         (unsigned long long)addr, (unsigned long long)key);
		return NULL;
	}
	return mr->addr + (addr - base);
}

/* Land deferred writes: those behind a read from `from` (all of them when
 * `from` is 0 and they are late enough). */
static void land(struct fake_ep *ep, uint64_t from)
{
	uint64_t now = fake_now();
	struct fake_late **link = &ep->late;
	while (*link) {
		struct fake_late *w = *link;
		if (from ? w->from != from : now - w->posted_ns < FAKE_LATE_NS) {
			link = &w->next;
			continue;
		}
		int perr;
		char text[160];
		uint8_t *dst = resolve(ep, w->domain_id, w->key, w->addr, w->len, FI_REMOTE_WRITE,
		                       &perr, text, sizeof(text));
		if (dst)
			memcpy(dst, w->data, w->len);
		*link = w->next;
		free(w);
	}
}

static void progress(struct fake_cq *cq)
{
	for (struct fake_ep *e = fake_eps; e; e = e->next)
		if (e->cq == cq && e->late)
			land(e, 0);
}

static ssize_t cq_read_locked(struct fake_cq *cq, void *buf, size_t count)
{
	progress(cq);
	if (!cq->count)
		return -FI_EAGAIN;
	struct fi_cq_entry *out = buf;
	size_t n = 0;
	while (n < count && cq->count && !cq->ring[cq->first].err) {
		out[n++].op_context = cq->ring[cq->first].context;
		cq->first = (cq->first + 1) % FAKE_CQ_SIZE;
		cq->count--;
	}
	return n ? (ssize_t)n : -FI_EAVAIL;
}

static ssize_t cq_read(struct fid_cq *fid, void *buf, size_t count)
{
	struct fake_cq *cq = (struct fake_cq *)fid;
	pthread_mutex_lock(&fake_lock);
	ssize_t n = cq_read_locked(cq, buf, count);
	pthread_mutex_unlock(&fake_lock);
	return n;
}

static ssize_t cq_readfrom(struct fid_cq *fid, void *buf, size_t count, fi_addr_t *src)
{
	return cq_read(fid, buf, count);
}

static ssize_t cq_readerr(struct fid_cq *fid, struct fi_cq_err_entry *buf, uint64_t flags)
{
	struct fake_cq *cq = (struct fake_cq *)fid;
	pthread_mutex_lock(&fake_lock);
	ssize_t n = -FI_EAGAIN;
	if (cq->count && cq->ring[cq->first].err) {
		struct fake_entry *e = &cq->ring[cq->first];
		memset(buf, 0, sizeof(*buf));
		buf->op_context = e->context;
		buf->err = e->err;
		buf->prov_errno = e->prov_errno;
		snprintf(cq->err_text, sizeof(cq->err_text), "%s", e->text);
		buf->err_data = cq->err_text;
		buf->err_data_size = strlen(cq->err_text) + 1;
		cq->first = (cq->first + 1) % FAKE_CQ_SIZE;
		cq->count--;
		n = 1;
	}
	pthread_mutex_unlock(&fake_lock);
	return n;
}

static ssize_t cq_sread(struct fid_cq *fid, void *buf, size_t count, const void *cond, int timeout)
{
	struct fake_cq *cq = (struct fake_cq *)fid;
	if (!cq->wait)
		return -FI_ENOSYS;
	uint64_t deadline = fake_now() + (uint64_t)(timeout < 0 ? 3600000 : timeout) * 1000000u;
	pthread_mutex_lock(&fake_lock);
	ssize_t n;
	while ((n = cq_read_locked(cq, buf, count)) == -FI_EAGAIN) {
		uint64_t now = fake_now();
		if (cq->signaled || now >= deadline) {
			cq->signaled = false;
			break;
		}
		/* Wake at least every 10 ms: late writes land on their own. */
		uint64_t until = deadline - now < 10000000u ? deadline : now + 10000000u;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
		                      .tv_nsec = (long)(until % 1000000000u)};
		pthread_cond_timedwait(&fake_cond, &fake_lock, &ts);
	}
	pthread_mutex_unlock(&fake_lock);
	return n;
}

static ssize_t cq_sreadfrom(struct fid_cq *fid, void *buf, size_t count, fi_addr_t *src,
                            const void *cond, int timeout)
{
	return cq_sread(fid, buf, count, cond, timeout);
}

static int cq_signal(struct fid_cq *fid)
{
	struct fake_cq *cq = (struct fake_cq *)fid;
	pthread_mutex_lock(&fake_lock);
	cq->signaled = true;
	pthread_cond_broadcast(&fake_cond);
	pthread_mutex_unlock(&fake_lock);
	return 0;
}

static const char *cq_strerror(struct fid_cq *fid, int prov_errno, const void *err_data, char *buf,
                               size_t len)
{
	snprintf(buf, len, "%s", err_data ? (const char *)err_data : "unknown");
	return buf;
}

static int cq_close(struct fid *fid)
{
	struct fake_cq *cq = (struct fake_cq *)fid;
	free(cq->ring);
	free(cq);
	return 0;
}

static struct fi_ops cq_fid_ops = {
        .size = sizeof(struct fi_ops),
        .close = cq_close,
        .bind = no_bind,
        .control = no_control,
        .ops_open = no_ops_open,
};

static struct fi_ops_cq cq_ops = {
        .size = sizeof(struct fi_ops_cq),
        .read = cq_read,
        .readfrom = cq_readfrom,
        .readerr = cq_readerr,
        .sread = cq_sread,
        .sreadfrom = cq_sreadfrom,
        .signal = cq_signal,
        .strerror = cq_strerror,
};

static int cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **out,
                   void *context)
{
	struct fake_domain *d = (struct fake_domain *)domain;
	if (attr->format != FI_CQ_FORMAT_CONTEXT && attr->format != FI_CQ_FORMAT_UNSPEC)
		return -FI_ENOSYS;
	/* A condition variable stands in for the descriptor of FI_WAIT_FD. */
	if (attr->wait_obj != FI_WAIT_NONE &&
	    (d->cfg.no_wait || (attr->wait_obj != FI_WAIT_UNSPEC && attr->wait_obj != FI_WAIT_FD)))
		return -FI_ENOSYS;
	struct fake_cq *cq = calloc(1, sizeof(*cq));
	if (!cq || !(cq->ring = calloc(FAKE_CQ_SIZE, sizeof(*cq->ring)))) {
		free(cq);
		return -FI_ENOMEM;
	}
	cq->cq.fid = (struct fid){.fclass = FI_CLASS_CQ, .context = context, .ops = &cq_fid_ops};
	cq->cq.ops = &cq_ops;
	cq->dom = d;
	cq->wait = attr->wait_obj != FI_WAIT_NONE;
	*out = &cq->cq;
	return 0;
}

/* ---- Address vectors ------------------------------------------------------ */

static int av_insert(struct fid_av *fid, const void *addr, size_t count, fi_addr_t *fi_addr,
                     uint64_t flags, void *context)
{
	struct fake_av *av = (struct fake_av *)fid;
	const uint8_t *p = addr;
	int done = 0;
	pthread_mutex_lock(&fake_lock);
	for (size_t i = 0; i < count; i++, p += FAKE_NAME_LEN) {
		uint64_t id;
		memcpy(&id, p + 8, sizeof(id));
		bool ok = memcmp(p, "LMTFAKE", 8) == 0 && id && av->count < FAKE_AV_SIZE;
		if (ok)
			av->ids[av->count] = id;
		if (fi_addr)
			fi_addr[i] = ok ? av->count++ : FI_ADDR_NOTAVAIL;
		done += ok;
	}
	pthread_mutex_unlock(&fake_lock);
	return done;
}

static int av_close(struct fid *fid)
{
	free(fid);
	return 0;
}

static struct fi_ops av_fid_ops = {
        .size = sizeof(struct fi_ops),
        .close = av_close,
        .bind = no_bind,
        .control = no_control,
        .ops_open = no_ops_open,
};

static struct fi_ops_av av_ops = {.size = sizeof(struct fi_ops_av), .insert = av_insert};

static int av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **out,
                   void *context)
{
	struct fake_av *av = calloc(1, sizeof(*av));
	if (!av)
		return -FI_ENOMEM;
	av->av.fid = (struct fid){.fclass = FI_CLASS_AV, .context = context, .ops = &av_fid_ops};
	av->av.ops = &av_ops;
	*out = &av->av;
	return 0;
}

/* ---- Memory registration -------------------------------------------------- */

static int mr_close(struct fid *fid)
{
	struct fake_mr *mr = (struct fake_mr *)fid;
	pthread_mutex_lock(&fake_lock);
	for (struct fake_mr **link = &mr->dom->mrs; *link; link = &(*link)->next)
		if (*link == mr) {
			*link = mr->next;
			break;
		}
	pthread_mutex_unlock(&fake_lock);
	mr->magic = 0;
	free(mr);
	return 0;
}

static int mr_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	struct fake_mr *mr = (struct fake_mr *)fid;
	if (!(mr->dom->cfg.mr_mode & FI_MR_ENDPOINT) || bfid->fclass != FI_CLASS_EP || mr->bound)
		return -FI_EINVAL;
	mr->bound = (struct fake_ep *)bfid;
	return 0;
}

static int mr_control(struct fid *fid, int command, void *arg)
{
	struct fake_mr *mr = (struct fake_mr *)fid;
	struct fake_domain *d = mr->dom;
	if (command == FI_ENABLE) {
		if (!(d->cfg.mr_mode & FI_MR_ENDPOINT) || !mr->bound)
			return -FI_EINVAL;
		pthread_mutex_lock(&fake_lock);
		mr->enabled = true;
		mr->mr.key = mr->key;
		pthread_mutex_unlock(&fake_lock);
		return 0;
	}
	if (command != FI_GET_RAW_MR || !(d->cfg.mr_mode & FI_MR_RAW))
		return -FI_ENOSYS;
	struct fi_mr_raw_attr *raw = arg;
	if (*raw->key_size < FAKE_RAW_LEN) {
		*raw->key_size = FAKE_RAW_LEN;
		return -FI_ETOOSMALL;
	}
	uint64_t check = d->id ^ mr->key ^ 0x5a5a5a5a5a5a5a5aull;
	memcpy(raw->raw_key, &d->id, 8);
	memcpy(raw->raw_key + 8, &mr->key, 8);
	memcpy(raw->raw_key + 16, &check, 8);
	*raw->key_size = FAKE_RAW_LEN;
	*raw->base_addr = d->cfg.mr_mode & FI_MR_VIRT_ADDR ? (uint64_t)(uintptr_t)mr->addr : 0;
	return 0;
}

static struct fi_ops mr_fid_ops = {
        .size = sizeof(struct fi_ops),
        .close = mr_close,
        .bind = mr_bind,
        .control = mr_control,
        .ops_open = no_ops_open,
};

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
                  uint64_t requested_key, uint64_t flags, struct fid_mr **out, void *context)
{
	struct fake_domain *d = (struct fake_domain *)fid;
	if (!buf || !len || offset || flags)
		return -FI_EINVAL;
	struct fake_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -FI_ENOMEM;
	pthread_mutex_lock(&fake_lock);
	uint64_t key = requested_key;
	if (d->cfg.mr_mode & FI_MR_PROV_KEY) {
		key = (d->id << 40) | (0x9e37ull * ++d->next_key);
	} else {
		/* As if another user of the domain held the first keys asked. */
		if (d->refused < d->cfg.taken) {
			d->refused++;
			pthread_mutex_unlock(&fake_lock);
			free(mr);
			return -FI_ENOKEY;
		}
		for (struct fake_mr *m = d->mrs; m; m = m->next)
			if (m->key == key) {
				pthread_mutex_unlock(&fake_lock);
				free(mr);
				return -FI_ENOKEY;
			}
	}
	mr->mr.fid = (struct fid){.fclass = FI_CLASS_MR, .context = context, .ops = &mr_fid_ops};
	mr->mr.mem_desc = mr;
	mr->magic = FAKE_MR_MAGIC;
	mr->dom = d;
	mr->addr = (uint8_t *)buf;
	mr->len = len;
	mr->access = access;
	mr->key = key;
	/* An endpoint registration has no key until it is enabled. */
	mr->enabled = !(d->cfg.mr_mode & FI_MR_ENDPOINT);
	mr->mr.key = mr->enabled ? key : FI_KEY_NOTAVAIL;
	mr->next = d->mrs;
	d->mrs = mr;
	pthread_mutex_unlock(&fake_lock);
	*out = &mr->mr;
	return 0;
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access,
                   uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr,
                   void *context)
{
	if (count != 1)
		return -FI_EINVAL;
	return mr_reg(fid, iov->iov_base, iov->iov_len, access, offset, requested_key, flags, mr,
	              context);
}

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags,
                      struct fid_mr **mr)
{
	return mr_regv(fid, attr->mr_iov, attr->iov_count, attr->access, attr->offset,
	               attr->requested_key, flags, mr, attr->context);
}

static struct fi_ops_mr mr_ops = {
        .size = sizeof(struct fi_ops_mr),
        .reg = mr_reg,
        .regv = mr_regv,
        .regattr = mr_regattr,
};

/* The target of a key an initiator in `d` uses: mapped with FI_MR_RAW,
 * else its own. */
static bool target_key(struct fake_domain *d, uint64_t target_domain, uint64_t key,
                       uint64_t *domain_id, uint64_t *out)
{
	if (!(d->cfg.mr_mode & FI_MR_RAW)) {
		*domain_id = target_domain;
		*out = key;
		return true;
	}
	for (struct fake_map *m = d->maps; m; m = m->next)
		if (m->key == key) {
			*domain_id = m->domain_id;
			*out = m->target_key;
			return true;
		}
	return false;
}

static int domain_control(struct fid *fid, int command, void *arg)
{
	struct fake_domain *d = (struct fake_domain *)fid;
	if (!(d->cfg.mr_mode & FI_MR_RAW))
		return -FI_ENOSYS;
	if (command == FI_MAP_RAW_MR) {
		struct fi_mr_map_raw *map = arg;
		uint64_t id, key, check;
		if (map->key_size != FAKE_RAW_LEN)
			return -FI_EINVAL;
		memcpy(&id, map->raw_key, 8);
		memcpy(&key, map->raw_key + 8, 8);
		memcpy(&check, map->raw_key + 16, 8);
		if (check != (id ^ key ^ 0x5a5a5a5a5a5a5a5aull))
			return -FI_EINVAL;
		struct fake_map *m = calloc(1, sizeof(*m));
		if (!m)
			return -FI_ENOMEM;
		pthread_mutex_lock(&fake_lock);
		m->key = 0x77000000ull + ++d->next_map;
		m->domain_id = id;
		m->target_key = key;
		m->next = d->maps;
		d->maps = m;
		pthread_mutex_unlock(&fake_lock);
		*map->key = m->key;
		return 0;
	}
	if (command == FI_UNMAP_KEY) {
		uint64_t key = *(uint64_t *)arg;
		pthread_mutex_lock(&fake_lock);
		for (struct fake_map **link = &d->maps; *link; link = &(*link)->next)
			if ((*link)->key == key) {
				struct fake_map *m = *link;
				*link = m->next;
				pthread_mutex_unlock(&fake_lock);
				free(m);
				return 0;
			}
		pthread_mutex_unlock(&fake_lock);
		return -FI_ENOKEY;
	}
	return -FI_ENOSYS;
}

/* ---- Endpoints ------------------------------------------------------------ */

/* Check the local descriptor when FI_MR_LOCAL is required. */
static bool local_ok(struct fake_ep *ep, void *desc, const void *buf, size_t len, uint64_t access)
{
	if (!(ep->dom->cfg.mr_mode & FI_MR_LOCAL))
		return true;
	struct fake_mr *mr = desc;
	const uint8_t *p = buf;
	return mr && mr->magic == FAKE_MR_MAGIC && mr->dom == ep->dom && (mr->access & access) &&
	       mr->enabled && p >= mr->addr && len <= mr->len &&
	       (size_t)(p - mr->addr) <= mr->len - len &&
	       (!(ep->dom->cfg.mr_mode & FI_MR_ENDPOINT) || mr->bound == ep);
}

/* Validate a message and find its peer; fills *target (NULL when gone). */
static int check_msg(struct fake_ep *ep, const struct fi_msg_rma *msg, uint64_t access,
                     struct fake_ep **target)
{
	if (!ep->enabled || msg->iov_count != 1 || msg->rma_iov_count != 1 ||
	    msg->msg_iov[0].iov_len != msg->rma_iov[0].len)
		return -FI_EINVAL;
	if (!local_ok(ep, msg->desc ? msg->desc[0] : NULL, msg->msg_iov[0].iov_base,
	              msg->msg_iov[0].iov_len, access))
		return -FI_EINVAL;
	if (msg->addr >= ep->av->count)
		return -FI_EINVAL;
	if (ep->cq->count >= FAKE_CQ_SIZE - FAKE_TX_SIZE)
		return -FI_EAGAIN;
	*target = ep_by_id(ep->av->ids[msg->addr]);
	return 0;
}

static ssize_t ep_writemsg(struct fid_ep *fid, const struct fi_msg_rma *msg, uint64_t flags)
{
	struct fake_ep *ep = (struct fake_ep *)fid;
	struct fake_ep *target;
	pthread_mutex_lock(&fake_lock);
	int rc = check_msg(ep, msg, FI_WRITE, &target);
	if (!rc && ep->dom->cfg.no_delivery && (flags & FI_DELIVERY_COMPLETE))
		rc = -FI_EINVAL;
	if (rc) {
		pthread_mutex_unlock(&fake_lock);
		return rc;
	}
	size_t len = msg->msg_iov[0].iov_len;
	uint64_t domain_id = 0, key = 0;
	char text[160] = "";
	int perr = 0;
	uint8_t *dst = NULL;
	if (!target ||
	    !target_key(ep->dom, target->dom->id, msg->rma_iov[0].key, &domain_id, &key)) {
		perr = target ? FAKE_ERR_NO_KEY : FAKE_ERR_NO_PEER;
		snprintf(text, sizeof(text), FAKE_NAME ": %s",
		         target ? "key was never mapped" : "the target endpoint is gone");
	} else if (ep->dom->cfg.no_delivery) {
		struct fake_late *w = malloc(sizeof(*w) + len);
		if (!w) {
			pthread_mutex_unlock(&fake_lock);
			return -FI_EAGAIN;
		}
		*w = (struct fake_late){.from = ep->id,
		                        .domain_id = domain_id,
		                        .key = key,
		                        .addr = msg->rma_iov[0].addr,
		                        .len = len,
		                        .posted_ns = fake_now()};
		memcpy(w->data, msg->msg_iov[0].iov_base, len);
		struct fake_late **tail = &target->late;
		while (*tail)
			tail = &(*tail)->next;
		*tail = w;
	} else {
		dst = resolve(target, domain_id, key, msg->rma_iov[0].addr, len, FI_REMOTE_WRITE,
		              &perr, text, sizeof(text));
		if (dst)
			memcpy(dst, msg->msg_iov[0].iov_base, len);
	}
	if (perr || !ep->dom->cfg.hold)
		cq_push(ep->cq, msg->context,
		        perr == FAKE_ERR_NO_PEER ? FI_ECONNREFUSED
		        : perr                   ? EACCES
		                                 : 0,
		        perr, text);
	pthread_mutex_unlock(&fake_lock);
	return 0;
}

static ssize_t ep_readmsg(struct fid_ep *fid, const struct fi_msg_rma *msg, uint64_t flags)
{
	struct fake_ep *ep = (struct fake_ep *)fid;
	struct fake_ep *target;
	pthread_mutex_lock(&fake_lock);
	int rc = check_msg(ep, msg, FI_READ, &target);
	if (rc) {
		pthread_mutex_unlock(&fake_lock);
		return rc;
	}
	uint64_t domain_id = 0, key = 0;
	char text[160] = FAKE_NAME ": the target endpoint is gone";
	int perr = FAKE_ERR_NO_PEER;
	if (target && target_key(ep->dom, target->dom->id, msg->rma_iov[0].key, &domain_id, &key)) {
		/* Reads are ordered behind earlier writes (FI_ORDER_RAW). */
		land(target, ep->id);
		uint8_t *src =
		        resolve(target, domain_id, key, msg->rma_iov[0].addr,
		                msg->msg_iov[0].iov_len, FI_REMOTE_READ, &perr, text, sizeof(text));
		if (src) {
			memcpy(msg->msg_iov[0].iov_base, src, msg->msg_iov[0].iov_len);
			perr = 0;
		}
	}
	cq_push(ep->cq, msg->context, perr ? EACCES : 0, perr, text);
	pthread_mutex_unlock(&fake_lock);
	return 0;
}

static int ep_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	struct fake_ep *ep = (struct fake_ep *)fid;
	if (bfid->fclass == FI_CLASS_CQ)
		ep->cq = (struct fake_cq *)bfid;
	else if (bfid->fclass == FI_CLASS_AV)
		ep->av = (struct fake_av *)bfid;
	else
		return -FI_EINVAL;
	return 0;
}

static int ep_control(struct fid *fid, int command, void *arg)
{
	struct fake_ep *ep = (struct fake_ep *)fid;
	if (command != FI_ENABLE)
		return -FI_ENOSYS;
	if (!ep->cq || !ep->av)
		return -FI_ENOCQ;
	ep->enabled = true;
	return 0;
}

static int ep_close(struct fid *fid)
{
	struct fake_ep *ep = (struct fake_ep *)fid;
	pthread_mutex_lock(&fake_lock);
	for (struct fake_ep **link = &fake_eps; *link; link = &(*link)->next)
		if (*link == ep) {
			*link = ep->next;
			break;
		}
	for (struct fake_mr *m = ep->dom->mrs; m; m = m->next)
		if (m->bound == ep) {
			/* A registration bound to a closing endpoint goes dead. */
			m->bound = NULL;
			m->enabled = false;
		}
	while (ep->late) {
		struct fake_late *w = ep->late;
		ep->late = w->next;
		free(w);
	}
	pthread_mutex_unlock(&fake_lock);
	free(ep);
	return 0;
}

static int ep_getname(fid_t fid, void *addr, size_t *len)
{
	struct fake_ep *ep = (struct fake_ep *)fid;
	if (*len < FAKE_NAME_LEN) {
		*len = FAKE_NAME_LEN;
		return -FI_ETOOSMALL;
	}
	memcpy(addr, "LMTFAKE", 8);
	memcpy((uint8_t *)addr + 8, &ep->id, 8);
	*len = FAKE_NAME_LEN;
	return 0;
}

static struct fi_ops ep_fid_ops = {
        .size = sizeof(struct fi_ops),
        .close = ep_close,
        .bind = ep_bind,
        .control = ep_control,
        .ops_open = no_ops_open,
};
static struct fi_ops_ep ep_ops = {.size = sizeof(struct fi_ops_ep)};
static struct fi_ops_cm ep_cm = {.size = sizeof(struct fi_ops_cm), .getname = ep_getname};
static struct fi_ops_rma ep_rma = {
        .size = sizeof(struct fi_ops_rma),
        .readmsg = ep_readmsg,
        .writemsg = ep_writemsg,
};

static int endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **out,
                    void *context)
{
	struct fake_ep *ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -FI_ENOMEM;
	ep->ep.fid = (struct fid){.fclass = FI_CLASS_EP, .context = context, .ops = &ep_fid_ops};
	ep->ep.ops = &ep_ops;
	ep->ep.cm = &ep_cm;
	ep->ep.rma = &ep_rma;
	ep->dom = (struct fake_domain *)domain;
	pthread_mutex_lock(&fake_lock);
	ep->id = fake_next_id++;
	ep->next = fake_eps;
	fake_eps = ep;
	pthread_mutex_unlock(&fake_lock);
	*out = &ep->ep;
	return 0;
}

/* ---- Domains and fabrics -------------------------------------------------- */

static int domain_close(struct fid *fid)
{
	struct fake_domain *d = (struct fake_domain *)fid;
	pthread_mutex_lock(&fake_lock);
	bool busy = d->mrs || d->maps;
	if (!busy)
		for (struct fake_domain **link = &fake_domains; *link; link = &(*link)->next)
			if (*link == d) {
				*link = d->next;
				break;
			}
	pthread_mutex_unlock(&fake_lock);
	if (busy)
		return -FI_EBUSY;
	free(d);
	return 0;
}

static struct fi_ops domain_fid_ops = {
        .size = sizeof(struct fi_ops),
        .close = domain_close,
        .bind = no_bind,
        .control = domain_control,
        .ops_open = no_ops_open,
};
static struct fi_ops_domain domain_ops = {
        .size = sizeof(struct fi_ops_domain),
        .av_open = av_open,
        .cq_open = cq_open,
        .endpoint = endpoint,
};

static int domain_open(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **out,
                       void *context)
{
	struct fake_domain *d = calloc(1, sizeof(*d));
	if (!d)
		return -FI_ENOMEM;
	d->domain.fid =
	        (struct fid){.fclass = FI_CLASS_DOMAIN, .context = context, .ops = &domain_fid_ops};
	d->domain.ops = &domain_ops;
	d->domain.mr = &mr_ops;
	d->cfg = fake_config();
	pthread_mutex_lock(&fake_lock);
	d->id = fake_next_id++;
	d->next = fake_domains;
	fake_domains = d;
	pthread_mutex_unlock(&fake_lock);
	*out = &d->domain;
	return 0;
}

static int fabric_close(struct fid *fid)
{
	free(fid);
	return 0;
}

static struct fi_ops fabric_fid_ops = {
        .size = sizeof(struct fi_ops),
        .close = fabric_close,
        .bind = no_bind,
        .control = no_control,
        .ops_open = no_ops_open,
};
static struct fi_ops_fabric fabric_ops = {.size = sizeof(struct fi_ops_fabric),
                                          .domain = domain_open};

static int fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **out, void *context)
{
	struct fid_fabric *f = calloc(1, sizeof(*f));
	if (!f)
		return -FI_ENOMEM;
	f->fid =
	        (struct fid){.fclass = FI_CLASS_FABRIC, .context = context, .ops = &fabric_fid_ops};
	f->ops = &fabric_ops;
	*out = f;
	return 0;
}

/* RMA only: it takes no messages, which the plugin's provider policy
 * accepts without measurement. */
#define FAKE_CAPS (FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)

static int getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const struct fi_info *hints, struct fi_info **out)
{
	struct fake_cfg cfg = fake_config();
	if (hints) {
		if (hints->ep_attr && hints->ep_attr->type != FI_EP_UNSPEC &&
		    hints->ep_attr->type != FI_EP_RDM)
			return -FI_ENODATA;
		if (hints->caps & ~(uint64_t)(FAKE_CAPS | (cfg.messages ? FI_MSG : 0)))
			return -FI_ENODATA;
		uint64_t offered = hints->domain_attr ? (uint64_t)hints->domain_attr->mr_mode : 0;
		if (cfg.mr_mode & ~offered)
			return -FI_ENODATA;
		if (cfg.no_delivery && hints->tx_attr &&
		    (hints->tx_attr->op_flags & FI_DELIVERY_COMPLETE))
			return -FI_ENODATA;
		if (hints->domain_attr && hints->domain_attr->name &&
		    strcmp(hints->domain_attr->name, "fake0") != 0)
			return -FI_ENODATA;
	}
	struct fi_info *i = fi_allocinfo();
	if (!i)
		return -FI_ENOMEM;
	i->caps = FAKE_CAPS | (cfg.messages ? FI_MSG : 0);
	i->addr_format = FI_FORMAT_UNSPEC;
	i->ep_attr->type = FI_EP_RDM;
	i->ep_attr->max_msg_size = 1u << 30;
	i->tx_attr->size = FAKE_TX_SIZE;
	i->tx_attr->op_flags = hints && hints->tx_attr ? hints->tx_attr->op_flags : 0;
	i->tx_attr->msg_order = FI_ORDER_RAW | FI_ORDER_WAW | FI_ORDER_RAR | FI_ORDER_WAR;
	i->tx_attr->iov_limit = 1;
	i->tx_attr->rma_iov_limit = 1;
	i->rx_attr->size = FAKE_TX_SIZE;
	i->domain_attr->name = strdup("fake0");
	i->domain_attr->threading = FI_THREAD_SAFE;
	i->domain_attr->control_progress = FI_PROGRESS_MANUAL;
	i->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	i->domain_attr->av_type = FI_AV_TABLE;
	i->domain_attr->mr_mode = (int)cfg.mr_mode;
	i->domain_attr->mr_key_size = 8;
	i->fabric_attr->name = strdup(FAKE_NAME);
	if (!i->domain_attr->name || !i->fabric_attr->name) {
		fi_freeinfo(i);
		return -FI_ENOMEM;
	}
	*out = i;
	return 0;
}

static void cleanup(void)
{
}

static struct fi_provider fake_provider = {
        .version = FI_VERSION(0, 1),
        .fi_version = FI_VERSION(1, 17),
        .name = FAKE_NAME,
        .getinfo = getinfo,
        .fabric = fabric_open,
        .cleanup = cleanup,
};

__attribute__((visibility("default"))) struct fi_provider *fi_prov_ini(void);

__attribute__((visibility("default"))) struct fi_provider *fi_prov_ini(void)
{
	return &fake_provider;
}
