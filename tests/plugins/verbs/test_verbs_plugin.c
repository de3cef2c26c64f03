/* The verbs plugin's own tests, with libibverbs replaced at link time
 * (-Wl,--wrap) and the plugin test harness's host: device, port and GID
 * choice, queue pairs, registration, signalling accounting, back-pressure,
 * completion errors and teardown after each failed setup step. What every
 * plugin must do is lmt-plugin-check's, which the rxe suite runs over a
 * soft-RoCE device (rxe-init.sh). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <lmt/plugin.h>

#include "plugin_test.h"
#include "wire.h"

#define SECOND 1000000000ull
#define MS 1000000ull
#define MAX_DEVICES 4
#define MAX_GIDS 8
#define MAX_WRS 4096
#define MAX_WCS 4096
#define MAX_EVENTS 8
#define MAX_MODIFY 64

/* The plugin's descriptor, from plugin.c compiled into this test. */
int lmt_plugin_entry(uint32_t core_abi, const struct lmt_plugin **out);
static const struct lmt_plugin *plugin;
static const struct lmt_plugin_ops *ops;

/* ---- The fake libibverbs ------------------------------------------------ */

/* Which call fails, for the teardown tests. */
enum fail_point {
	FAIL_NONE,
	FAIL_OPEN_DEVICE,
	FAIL_QUERY_DEVICE,
	FAIL_ALLOC_PD,
	FAIL_COMP_CHANNEL,
	FAIL_CREATE_CQ,
	FAIL_CREATE_QP,
	FAIL_MODIFY_INIT,
	FAIL_MODIFY_RTR,
	FAIL_MODIFY_RTS,
	FAIL_REG_MR,
	FAIL_POST_SEND,
	FAIL_POLL_CQ,
};

struct fake_gid {
	uint8_t raw[16];
	enum ibv_gid_type type;
};

struct fake_device {
	struct ibv_device dev;
	int ports;
	enum ibv_port_state state[2];
	uint8_t link_layer;
	uint16_t lid;
	enum ibv_mtu mtu;
	struct fake_gid gids[MAX_GIDS];
	int ngids;
	uint64_t odp_general, odp_rc;
};

struct posted_wr {
	uint32_t qp_num;
	uint64_t wr_id;
	unsigned send_flags;
	int num_sge;
	uint32_t length;
	uint32_t lkey;
	uint32_t rkey;
	uint64_t remote_addr;
};

struct fake_ctx {
	struct verbs_context vctx; /* ends with the struct ibv_context */
	struct fake_device *device;
	int async_pipe[2];
};

static struct {
	struct fake_device devices[MAX_DEVICES];
	int ndevices;
	enum fail_point fail;
	int fail_errno;
	int max_qp_wr;
	/* Live objects: every test ends with all of them at zero. */
	int contexts, pds, channels, cqs, qps, mrs, device_lists;
	uint32_t next_qpn, next_key;
	unsigned last_access;
	struct posted_wr wrs[MAX_WRS];
	int nwrs;
	struct ibv_wc wcs[MAX_WCS];
	int wc_first, nwcs;
	bool auto_complete; /* each signalled request completes at once */
	int post_calls;
	struct ibv_async_event events[MAX_EVENTS];
	int nevents;
	int unacked_async;
	struct {
		uint32_t qp_num;
		int mask;
		struct ibv_qp_attr attr;
	} modify[MAX_MODIFY];
	int nmodify;
	unsigned cq_events_acked;
} fake;

static void queue_wc(uint32_t qp_num, uint64_t wr_id, enum ibv_wc_status status)
{
	assert_true(fake.nwcs < MAX_WCS);
	struct ibv_wc *wc = &fake.wcs[(fake.wc_first + fake.nwcs++) % MAX_WCS];
	memset(wc, 0, sizeof(*wc));
	wc->qp_num = qp_num;
	wc->wr_id = wr_id;
	wc->status = status;
	wc->opcode = IBV_WC_RDMA_WRITE;
	wc->vendor_err = status ? 0x42 : 0;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	fake.post_calls++;
	if (fake.fail == FAIL_POST_SEND) {
		*bad = wr;
		return ENOMEM;
	}
	for (; wr; wr = wr->next) {
		assert_true(fake.nwrs < MAX_WRS);
		assert_int_equal(wr->opcode, IBV_WR_RDMA_WRITE);
		struct posted_wr *p = &fake.wrs[fake.nwrs++];
		*p = (struct posted_wr){.qp_num = qp->qp_num,
		                        .wr_id = wr->wr_id,
		                        .send_flags = wr->send_flags,
		                        .num_sge = wr->num_sge,
		                        .rkey = wr->wr.rdma.rkey,
		                        .remote_addr = wr->wr.rdma.remote_addr};
		if (wr->num_sge) {
			p->length = wr->sg_list[0].length;
			p->lkey = wr->sg_list[0].lkey;
		}
		if (fake.auto_complete && (wr->send_flags & IBV_SEND_SIGNALED))
			queue_wc(qp->qp_num, wr->wr_id, IBV_WC_SUCCESS);
	}
	return 0;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	(void)cq;
	if (fake.fail == FAIL_POLL_CQ)
		return -1;
	int got = 0;
	while (got < n && fake.nwcs) {
		wc[got++] = fake.wcs[fake.wc_first];
		fake.wc_first = (fake.wc_first + 1) % MAX_WCS;
		fake.nwcs--;
	}
	return got;
}

/* A completion channel whose event is one byte in a pipe. */
struct fake_channel {
	struct ibv_comp_channel ch;
	int write_fd;
};

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)solicited_only;
	if (fake.nwcs) {
		char c = 1;
		assert_int_equal(write(((struct fake_channel *)cq->channel)->write_fd, &c, 1), 1);
	}
	return 0;
}

static int fake_query_device_ex(struct ibv_context *context,
                                const struct ibv_query_device_ex_input *input,
                                struct ibv_device_attr_ex *attr, size_t attr_size)
{
	(void)input;
	(void)attr_size;
	struct fake_ctx *fc =
	        (struct fake_ctx *)((char *)context - offsetof(struct fake_ctx, vctx.context));
	if (fake.fail == FAIL_QUERY_DEVICE)
		return EIO;
	memset(attr, 0, sizeof(*attr));
	attr->orig_attr.phys_port_cnt = (uint8_t)fc->device->ports;
	attr->orig_attr.max_qp_wr = fake.max_qp_wr ? fake.max_qp_wr : 16384;
	attr->orig_attr.max_cqe = 65536;
	attr->odp_caps.general_caps = fc->device->odp_general;
	attr->odp_caps.per_transport_caps.rc_odp_caps = (uint32_t)fc->device->odp_rc;
	return 0;
}

struct ibv_device **__wrap_ibv_get_device_list(int *n);
struct ibv_device **__wrap_ibv_get_device_list(int *n)
{
	struct ibv_device **list = calloc((size_t)fake.ndevices + 1, sizeof(*list));
	assert_non_null(list);
	for (int i = 0; i < fake.ndevices; i++)
		list[i] = &fake.devices[i].dev;
	if (n)
		*n = fake.ndevices;
	fake.device_lists++;
	return list;
}

void __wrap_ibv_free_device_list(struct ibv_device **list);
void __wrap_ibv_free_device_list(struct ibv_device **list)
{
	fake.device_lists--;
	free(list);
}

const char *__wrap_ibv_get_device_name(struct ibv_device *dev);
const char *__wrap_ibv_get_device_name(struct ibv_device *dev)
{
	return dev->name;
}

struct ibv_context *__wrap_ibv_open_device(struct ibv_device *dev);
struct ibv_context *__wrap_ibv_open_device(struct ibv_device *dev)
{
	if (fake.fail == FAIL_OPEN_DEVICE) {
		errno = EACCES;
		return NULL;
	}
	struct fake_ctx *fc = calloc(1, sizeof(*fc));
	assert_non_null(fc);
	fc->device = (struct fake_device *)dev;
	fc->vctx.sz = sizeof(fc->vctx);
	fc->vctx.query_device_ex = fake_query_device_ex;
	struct ibv_context *ctx = &fc->vctx.context;
	ctx->device = dev;
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->ops.post_send = fake_post_send;
	ctx->ops.poll_cq = fake_poll_cq;
	ctx->ops.req_notify_cq = fake_req_notify_cq;
	assert_int_equal(pipe2(fc->async_pipe, O_CLOEXEC), 0);
	ctx->async_fd = fc->async_pipe[0];
	ctx->cmd_fd = -1;
	fake.contexts++;
	return ctx;
}

static struct fake_ctx *fake_of(struct ibv_context *ctx)
{
	return (struct fake_ctx *)((char *)ctx - offsetof(struct fake_ctx, vctx.context));
}

int __wrap_ibv_close_device(struct ibv_context *ctx);
int __wrap_ibv_close_device(struct ibv_context *ctx)
{
	struct fake_ctx *fc = fake_of(ctx);
	close(fc->async_pipe[0]);
	close(fc->async_pipe[1]);
	free(fc);
	fake.contexts--;
	return 0;
}

int __wrap_ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr);
int __wrap_ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	struct ibv_device_attr_ex ex;
	int rc = fake_query_device_ex(ctx, NULL, &ex, sizeof(ex));
	*attr = ex.orig_attr;
	return rc;
}

int __wrap_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
int __wrap_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	struct fake_device *d = fake_of(ctx)->device;
	if (port < 1 || port > d->ports)
		return EINVAL;
	memset(attr, 0, sizeof(*attr));
	attr->state = d->state[port - 1];
	attr->link_layer = d->link_layer;
	attr->lid = d->lid;
	attr->active_mtu = d->mtu;
	attr->max_mtu = IBV_MTU_4096;
	attr->gid_tbl_len = MAX_GIDS;
	attr->max_msg_sz = 1u << 31;
	return 0;
}

int __wrap__ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                             struct ibv_gid_entry *entry, uint32_t flags, size_t size);
int __wrap__ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                             struct ibv_gid_entry *entry, uint32_t flags, size_t size)
{
	(void)flags;
	(void)size;
	struct fake_device *d = fake_of(ctx)->device;
	static const uint8_t zero[16];
	if (index >= MAX_GIDS || memcmp(d->gids[index].raw, zero, 16) == 0)
		return ENODATA;
	memset(entry, 0, sizeof(*entry));
	memcpy(entry->gid.raw, d->gids[index].raw, 16);
	entry->gid_index = index;
	entry->port_num = port;
	entry->gid_type = d->gids[index].type;
	return 0;
}

int __wrap_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
int __wrap_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	struct ibv_gid_entry e;
	int rc = __wrap__ibv_query_gid_ex(ctx, port, (uint32_t)index, &e, 0, sizeof(e));
	if (rc == 0)
		*gid = e.gid;
	return rc;
}

/* A protection domain counts its queue pairs and registrations: like the
 * real one, it cannot be freed while any is left. */
struct fake_pd {
	struct ibv_pd pd;
	int users;
};

struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *ctx);
struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *ctx)
{
	if (fake.fail == FAIL_ALLOC_PD) {
		errno = ENOMEM;
		return NULL;
	}
	struct fake_pd *pd = calloc(1, sizeof(*pd));
	assert_non_null(pd);
	pd->pd.context = ctx;
	fake.pds++;
	return &pd->pd;
}

int __wrap_ibv_dealloc_pd(struct ibv_pd *pd);
int __wrap_ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (((struct fake_pd *)pd)->users)
		return EBUSY;
	free(pd);
	fake.pds--;
	return 0;
}

struct ibv_comp_channel *__wrap_ibv_create_comp_channel(struct ibv_context *ctx);
struct ibv_comp_channel *__wrap_ibv_create_comp_channel(struct ibv_context *ctx)
{
	if (fake.fail == FAIL_COMP_CHANNEL) {
		errno = EMFILE;
		return NULL;
	}
	struct fake_channel *ch = calloc(1, sizeof(*ch));
	int fds[2];
	assert_non_null(ch);
	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	ch->ch.context = ctx;
	ch->ch.fd = fds[0];
	ch->write_fd = fds[1];
	fake.channels++;
	return &ch->ch;
}

int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *ch);
int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	close(ch->fd);
	close(((struct fake_channel *)ch)->write_fd);
	free(ch);
	fake.channels--;
	return 0;
}

struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int vector);
struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int vector)
{
	(void)vector;
	if (fake.fail == FAIL_CREATE_CQ) {
		errno = ENOMEM;
		return NULL;
	}
	struct ibv_cq *cq = calloc(1, sizeof(*cq));
	assert_non_null(cq);
	cq->context = ctx;
	cq->channel = channel;
	cq->cq_context = cq_context;
	cq->cqe = cqe;
	fake.cqs++;
	return cq;
}

int __wrap_ibv_destroy_cq(struct ibv_cq *cq);
int __wrap_ibv_destroy_cq(struct ibv_cq *cq)
{
	free(cq);
	fake.cqs--;
	return 0;
}

struct ibv_qp *__wrap_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
struct ibv_qp *__wrap_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	if (fake.fail == FAIL_CREATE_QP) {
		errno = EINVAL;
		return NULL;
	}
	assert_int_equal(attr->qp_type, IBV_QPT_RC);
	assert_int_equal(attr->sq_sig_all, 0);
	struct ibv_qp *qp = calloc(1, sizeof(*qp));
	assert_non_null(qp);
	qp->context = pd->context;
	qp->pd = pd;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->qp_num = ++fake.next_qpn;
	qp->qp_type = IBV_QPT_RC;
	qp->state = IBV_QPS_RESET;
	((struct fake_pd *)pd)->users++;
	fake.qps++;
	return qp;
}

int __wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
int __wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	if ((fake.fail == FAIL_MODIFY_INIT && attr->qp_state == IBV_QPS_INIT) ||
	    (fake.fail == FAIL_MODIFY_RTR && attr->qp_state == IBV_QPS_RTR) ||
	    (fake.fail == FAIL_MODIFY_RTS && attr->qp_state == IBV_QPS_RTS))
		return EINVAL;
	if (fake.nmodify < MAX_MODIFY) {
		fake.modify[fake.nmodify].qp_num = qp->qp_num;
		fake.modify[fake.nmodify].mask = mask;
		fake.modify[fake.nmodify++].attr = *attr;
	}
	qp->state = attr->qp_state;
	return 0;
}

int __wrap_ibv_destroy_qp(struct ibv_qp *qp);
int __wrap_ibv_destroy_qp(struct ibv_qp *qp)
{
	((struct fake_pd *)qp->pd)->users--;
	free(qp);
	fake.qps--;
	return 0;
}

struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned int access);
struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned int access)
{
	fake.last_access = access;
	if (fake.fail == FAIL_REG_MR) {
		errno = fake.fail_errno ? fake.fail_errno : ENOMEM;
		return NULL;
	}
	assert_int_equal(iova, (uintptr_t)addr);
	struct ibv_mr *mr = calloc(1, sizeof(*mr));
	assert_non_null(mr);
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->lkey = ++fake.next_key;
	mr->rkey = 0x1000 + fake.next_key;
	((struct fake_pd *)pd)->users++;
	fake.mrs++;
	return mr;
}

int __wrap_ibv_dereg_mr(struct ibv_mr *mr);
int __wrap_ibv_dereg_mr(struct ibv_mr *mr)
{
	((struct fake_pd *)mr->pd)->users--;
	free(mr);
	fake.mrs--;
	return 0;
}

int __wrap_ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx);
int __wrap_ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx)
{
	char c;
	if (read(ch->fd, &c, 1) != 1)
		return -1;
	*cq = NULL;
	*ctx = NULL;
	return 0;
}

void __wrap_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n);
void __wrap_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	(void)cq;
	fake.cq_events_acked += n;
}

int __wrap_ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev);
int __wrap_ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	(void)ctx;
	if (!fake.nevents) {
		errno = EAGAIN;
		return -1;
	}
	*ev = fake.events[0];
	memmove(&fake.events[0], &fake.events[1], (size_t)--fake.nevents * sizeof(*ev));
	fake.unacked_async++;
	return 0;
}

void __wrap_ibv_ack_async_event(struct ibv_async_event *ev);
void __wrap_ibv_ack_async_event(struct ibv_async_event *ev)
{
	(void)ev;
	fake.unacked_async--;
}

/* ---- The host ------------------------------------------------------------- */

/* The plugin compiled in, with the option values of every host by default
 * (queue-depth 64, verbs.signal-interval 16, the first active port, the
 * GID chosen by address). */
static struct ph_config cfg;
static struct ph_host src_host, dst_host;

/* Option values for one host, over the defaults, before its instance opens. */
static void set_options(struct ph_host *host, const char *list)
{
	struct lmt_error err = {0};
	if (ph_host_set_options(host, list, &err))
		fail_msg("%s: %s", list, err.message);
}

/* The first error the host recorded since the test began (or forgot). */
static const char *first_error(struct ph_host *host)
{
	static char said[512];
	ph_host_first_error(host, said, sizeof(said));
	return said;
}

/* ---- Helpers ------------------------------------------------------------- */

static void set_gid(struct fake_device *d, int index, const char *addr, enum ibv_gid_type type)
{
	uint8_t *raw = d->gids[index].raw;
	memset(raw, 0, 16);
	if (inet_pton(AF_INET, addr, raw + 12) == 1)
		raw[10] = raw[11] = 0xff;
	else
		assert_int_equal(inet_pton(AF_INET6, addr, raw), 1);
	d->gids[index].type = type;
}

static struct fake_device *add_device(const char *name, enum ibv_port_state state)
{
	assert_true(fake.ndevices < MAX_DEVICES);
	struct fake_device *d = &fake.devices[fake.ndevices++];
	memset(d, 0, sizeof(*d));
	snprintf(d->dev.name, sizeof(d->dev.name), "%s", name);
	d->ports = 1;
	d->state[0] = state;
	d->link_layer = IBV_LINK_LAYER_ETHERNET;
	d->mtu = IBV_MTU_1024;
	set_gid(d, 0, "fe80::5054:ff:fe12:3456", IBV_GID_TYPE_ROCE_V2);
	set_gid(d, 1, "10.0.2.15", IBV_GID_TYPE_ROCE_V2);
	return d;
}

static int setup(void **state)
{
	(void)state;
	memset(&fake, 0, sizeof(fake));
	ph_host_init(&src_host, &cfg, "source");
	ph_host_init(&dst_host, &cfg, "destination");
	add_device("rxe0", IBV_PORT_ACTIVE);
	return 0;
}

static void assert_nothing_left(void)
{
	assert_int_equal(fake.contexts, 0);
	assert_int_equal(fake.pds, 0);
	assert_int_equal(fake.channels, 0);
	assert_int_equal(fake.cqs, 0);
	assert_int_equal(fake.qps, 0);
	assert_int_equal(fake.mrs, 0);
	assert_int_equal(fake.device_lists, 0);
	assert_int_equal(fake.unacked_async, 0);
}

static int teardown(void **state)
{
	(void)state;
	ph_host_fini(&src_host);
	ph_host_fini(&dst_host);
	assert_nothing_left();
	return 0;
}

static struct lmt_instance_params params(enum lmt_role role, uint32_t channels, const char *local)
{
	struct lmt_instance_params p = {
	        .struct_size = sizeof(p), .role = role, .channels = channels, .timeout_ns = SECOND};
	snprintf(p.local_host, sizeof(p.local_host), "%s", local);
	snprintf(p.peer_host, sizeof(p.peer_host), "%s", local);
	return p;
}

static int open_instance(enum lmt_role role, uint32_t channels, lmt_instance **inst)
{
	struct lmt_instance_params p = params(role, channels, "10.0.2.15");
	struct ph_host *h = role == LMT_ROLE_SOURCE ? &src_host : &dst_host;
	return ops->instance_open(&ph_host_services, h, &p, inst);
}

/* A connected source and destination with `channels` channels. */
struct pair {
	lmt_instance *src, *dst;
	lmt_endpoint *src_ep[4], *dst_ep[4];
	uint32_t channels;
	uint8_t dst_ram[1 << 16];
	uint8_t src_ram[1 << 16];
	lmt_mr *dst_mr, *src_mr;
	lmt_rkey *rkey;
};

static struct pair *pair_open(uint32_t channels)
{
	struct pair *p = calloc(1, sizeof(*p));
	assert_non_null(p);
	p->channels = channels;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, channels, &p->src), 0);
	assert_int_equal(open_instance(LMT_ROLE_DESTINATION, channels, &p->dst), 0);
	struct lmt_blob src_addr[4], dst_addr[4];
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(ops->ep_open(p->src, c, &p->src_ep[c], &src_addr[c]), 0);
	for (uint32_t c = 0; c < channels; c++)
		assert_int_equal(ops->ep_open(p->dst, c, &p->dst_ep[c], &dst_addr[c]), 0);
	for (uint32_t c = 0; c < channels; c++) {
		assert_int_equal(ops->ep_connect(p->dst_ep[c], &src_addr[c]), 0);
		assert_int_equal(ops->ep_connect(p->src_ep[c], &dst_addr[c]), 0);
	}
	struct lmt_blob key = {0};
	assert_int_equal(ops->mr_register(p->dst, p->dst_ram, sizeof(p->dst_ram),
	                                  LMT_MR_REMOTE_WRITE, &p->dst_mr, &key),
	                 0);
	assert_int_equal(ops->rkey_import(p->src, &key, &p->rkey), 0);
	assert_int_equal(ops->mr_register(p->src, p->src_ram, sizeof(p->src_ram), LMT_MR_LOCAL_READ,
	                                  &p->src_mr, NULL),
	                 0);
	return p;
}

static void pair_close(struct pair *p)
{
	ops->rkey_release(p->src, p->rkey);
	ops->mr_deregister(p->src, p->src_mr);
	ops->mr_deregister(p->dst, p->dst_mr);
	for (uint32_t c = 0; c < p->channels; c++) {
		ops->ep_close(p->src_ep[c]);
		ops->ep_close(p->dst_ep[c]);
	}
	ops->instance_close(p->src);
	ops->instance_close(p->dst);
	free(p);
}

/* Post a 4 KiB write of page `page` with cookie `cookie` on channel `c`. */
static int write_page(struct pair *p, uint32_t c, uint64_t page, uint64_t cookie)
{
	return ops->write(p->src_ep[c], p->src_ram + page * 4096, 4096, p->src_mr, p->rkey,
	                  page * 4096, cookie);
}

/* Harvest everything available now (progress with no wait). */
static int harvest(lmt_instance *inst, struct lmt_completion *out, int max)
{
	int total = 0;
	for (;;) {
		int n = ops->progress(inst, out + total, (uint32_t)(max - total), 0);
		if (n <= 0)
			return total ? total : n;
		total += n;
	}
}

static bool contains(const char *haystack, const char *needle)
{
	if (!strstr(haystack, needle)) {
		print_error("'%s' does not contain '%s'\n", haystack, needle);
		return false;
	}
	return true;
}

/* ---- Device, port and GID ------------------------------------------------ */

static void test_no_device_says_the_list_was_empty(void **state)
{
	(void)state;
	fake.ndevices = 0;
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_null(inst);
	assert_string_equal(first_error(&src_host), "no RDMA device: ibv_get_device_list returned none");
}

static void test_unknown_device_lists_the_devices_found(void **state)
{
	(void)state;
	fake.ndevices = 0;
	add_device("mlx5_0", IBV_PORT_ACTIVE);
	add_device("mlx5_1", IBV_PORT_ACTIVE);
	set_options(&src_host, "verbs.device=mlx5_9");
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_string_equal(first_error(&src_host),
	                    "verbs.device=mlx5_9: not found; devices: mlx5_0, mlx5_1");
}

static void test_first_device_with_an_active_port_is_chosen(void **state)
{
	(void)state;
	fake.ndevices = 0;
	add_device("mlx5_0", IBV_PORT_DOWN);
	add_device("mlx5_1", IBV_PORT_ACTIVE);
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), 0);
	assert_int_equal(fake.contexts, 1); /* mlx5_0 was closed again */
	PH_ASSERT_LOGGED(&src_host, "verbs: mlx5_1 port 1 (RoCE)");
	ops->instance_close(inst);
}

static void test_named_device_is_used_even_when_not_first(void **state)
{
	(void)state;
	add_device("rxe1", IBV_PORT_ACTIVE);
	set_options(&src_host, "verbs.device=rxe1");
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), 0);
	PH_ASSERT_LOGGED(&src_host, "verbs: rxe1 port 1");
	ops->instance_close(inst);
}

static void test_no_active_port_names_each_port_state(void **state)
{
	(void)state;
	fake.devices[0].state[0] = IBV_PORT_DOWN;
	add_device("mlx5_0", IBV_PORT_INIT);
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_string_equal(first_error(&src_host),
	                    "no active RDMA port: rxe0 port 1 down, mlx5_0 port 1 init");
}

static void test_port_beyond_the_device_is_refused(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.port=3");
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_string_equal(first_error(&src_host), "verbs.port=3: rxe0 has 1 port");
}

static void test_roce_gid_matches_the_control_connection_address(void **state)
{
	(void)state;
	set_gid(&fake.devices[0], 2, "192.168.7.5", IBV_GID_TYPE_ROCE_V1);
	set_gid(&fake.devices[0], 3, "192.168.7.5", IBV_GID_TYPE_ROCE_V2);
	struct lmt_instance_params p = params(LMT_ROLE_SOURCE, 1, "192.168.7.5");
	lmt_instance *inst = NULL;
	assert_int_equal(ops->instance_open(&ph_host_services, &src_host, &p, &inst), 0);
	PH_ASSERT_LOGGED(&src_host, "GID 3 192.168.7.5");
	ops->instance_close(inst);
}

static void test_roce_gid_defaults_to_the_first_v2_ipv4_one(void **state)
{
	(void)state;
	struct fake_device *d = &fake.devices[0];
	set_gid(d, 1, "10.0.2.15", IBV_GID_TYPE_ROCE_V1);
	set_gid(d, 2, "fd00::1", IBV_GID_TYPE_ROCE_V2);
	set_gid(d, 4, "10.0.2.15", IBV_GID_TYPE_ROCE_V2);
	struct lmt_instance_params p = params(LMT_ROLE_SOURCE, 1, "127.0.0.1");
	lmt_instance *inst = NULL;
	assert_int_equal(ops->instance_open(&ph_host_services, &src_host, &p, &inst), 0);
	PH_ASSERT_LOGGED(&src_host, "GID 4 10.0.2.15");
	ops->instance_close(inst);
}

static void test_gid_index_option_overrides_the_choice(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.gid-index=0");
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), 0);
	PH_ASSERT_LOGGED(&src_host, "GID 0 fe80::5054:ff:fe12:3456");
	ops->instance_close(inst);
}

static void test_empty_gid_index_is_refused(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.gid-index=5");
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_string_equal(first_error(&src_host), "verbs.gid-index=5: entry empty on rxe0 port 1");
}

static void test_no_roce_v2_gid_lists_what_was_found(void **state)
{
	(void)state;
	struct fake_device *d = &fake.devices[0];
	d->gids[0].type = IBV_GID_TYPE_ROCE_V1;
	d->gids[1].type = IBV_GID_TYPE_ROCE_V1;
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_string_equal(first_error(&src_host),
	                    "rxe0 port 1: no RoCE v2 GID (found: 0 fe80::5054:ff:fe12:3456 "
	                    "(RoCE v1), 1 10.0.2.15 (RoCE v1)); set verbs.gid-index");
}

static void test_infiniband_port_without_lid_is_refused(void **state)
{
	(void)state;
	fake.devices[0].link_layer = IBV_LINK_LAYER_INFINIBAND;
	fake.devices[0].lid = 0;
	lmt_instance *inst = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &inst), -LMT_ENOTFOUND);
	assert_true(contains(first_error(&src_host), "no unicast LID"));
}

/* ---- Teardown after a failure at each setup step ------------------------- */

static const char *const fail_names[] = {
        [FAIL_OPEN_DEVICE] = "no active RDMA port: rxe0 cannot be opened",
        [FAIL_QUERY_DEVICE] = "no active RDMA port: rxe0 cannot be queried",
        [FAIL_ALLOC_PD] = "ibv_alloc_pd failed",
        [FAIL_COMP_CHANNEL] = "ibv_create_comp_channel failed",
        [FAIL_CREATE_CQ] = "ibv_create_cq of 65 entries failed",
        [FAIL_CREATE_QP] = "ibv_create_qp with 65 send requests failed",
        [FAIL_MODIFY_INIT] = "queue pair to INIT failed",
        [FAIL_MODIFY_RTR] = "queue pair to RTR failed",
        [FAIL_MODIFY_RTS] = "queue pair to RTS failed",
        [FAIL_REG_MR] = "ibv_reg_mr of 65536 bytes",
};

/* Runs setup up to the step that fails, checks the message and that
 * closing what the core holds then leaves nothing behind. */
static void fail_setup_at(enum fail_point step)
{
	lmt_instance *src = NULL, *dst = NULL;
	lmt_endpoint *src_ep = NULL, *dst_ep = NULL;
	struct lmt_blob src_addr, dst_addr, key = {0};
	static uint8_t ram[1 << 16];
	lmt_mr *mr = NULL;
	assert_int_equal(open_instance(LMT_ROLE_DESTINATION, 1, &dst), 0);
	fake.fail = step;
	int rc = open_instance(LMT_ROLE_SOURCE, 1, &src);
	if (rc == 0)
		rc = ops->ep_open(src, 0, &src_ep, &src_addr);
	fake.fail = FAIL_NONE;
	if (rc == 0) {
		assert_int_equal(ops->ep_open(dst, 0, &dst_ep, &dst_addr), 0);
		fake.fail = step;
		rc = ops->ep_connect(src_ep, &dst_addr);
	}
	if (rc == 0)
		rc = ops->mr_register(src, ram, sizeof(ram), LMT_MR_LOCAL_READ, &mr, &key);
	fake.fail = FAIL_NONE;
	assert_int_not_equal(rc, 0);
	assert_true(contains(first_error(&src_host), fail_names[step]));
	assert_null(mr);
	if (src_ep)
		ops->ep_close(src_ep);
	if (dst_ep)
		ops->ep_close(dst_ep);
	ops->instance_close(src);
	ops->instance_close(dst);
	assert_nothing_left();
}

#define FAIL_TEST(name, step)                                                                      \
	static void test_teardown_after_##name##_fails(void **state)                               \
	{                                                                                          \
		(void)state;                                                                       \
		fail_setup_at(step);                                                               \
	}
FAIL_TEST(open_device, FAIL_OPEN_DEVICE)
FAIL_TEST(query_device, FAIL_QUERY_DEVICE)
FAIL_TEST(alloc_pd, FAIL_ALLOC_PD)
FAIL_TEST(comp_channel, FAIL_COMP_CHANNEL)
FAIL_TEST(create_cq, FAIL_CREATE_CQ)
FAIL_TEST(create_qp, FAIL_CREATE_QP)
FAIL_TEST(qp_to_init, FAIL_MODIFY_INIT)
FAIL_TEST(qp_to_rtr, FAIL_MODIFY_RTR)
FAIL_TEST(qp_to_rts, FAIL_MODIFY_RTS)
FAIL_TEST(reg_mr, FAIL_REG_MR)

static void test_close_releases_what_the_core_left_behind(void **state)
{
	(void)state;
	struct pair *p = pair_open(2);
	assert_int_equal(write_page(p, 0, 0, 1), 0);
	/* No ep_close, mr_deregister or rkey_release: instance_close alone. */
	ops->instance_close(p->src);
	ops->instance_close(p->dst);
	free(p);
	assert_nothing_left();
}

/* ---- Queue pairs and address blobs --------------------------------------- */

static void test_queue_pairs_connect_with_the_peer_qpn_psn_and_gid(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	/* The source QP's RTR and RTS, and the destination's access flags. */
	const struct ibv_qp_attr *init = NULL, *rtr = NULL, *rts = NULL;
	uint32_t src_qpn = 1, dst_qpn = 2;
	for (int i = 0; i < fake.nmodify; i++) {
		if (fake.modify[i].attr.qp_state == IBV_QPS_INIT &&
		    fake.modify[i].qp_num == dst_qpn)
			init = &fake.modify[i].attr;
		if (fake.modify[i].qp_num != src_qpn)
			continue;
		if (fake.modify[i].attr.qp_state == IBV_QPS_RTR)
			rtr = &fake.modify[i].attr;
		if (fake.modify[i].attr.qp_state == IBV_QPS_RTS)
			rts = &fake.modify[i].attr;
	}
	assert_non_null(init);
	assert_non_null(rtr);
	assert_non_null(rts);
	assert_int_equal(init->qp_access_flags, IBV_ACCESS_REMOTE_WRITE);
	assert_int_equal(rtr->dest_qp_num, dst_qpn);
	assert_int_equal(rtr->path_mtu, IBV_MTU_1024);
	assert_true(rtr->ah_attr.is_global);
	assert_int_equal(rtr->ah_attr.grh.sgid_index, 1);
	assert_memory_equal(rtr->ah_attr.grh.dgid.raw, fake.devices[0].gids[1].raw, 16);
	assert_true(rtr->rq_psn <= 0xffffff);
	assert_true(rts->sq_psn <= 0xffffff);
	assert_int_equal(rts->retry_cnt, 7);
	pair_close(p);
}

/* Sockets this process holds: readlink of each /proc/self/fd entry. */
static int count_sockets(void)
{
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		char path[300], target[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		ssize_t len = readlink(path, target, sizeof(target) - 1);
		if (len > 0) {
			target[len] = 0;
			n += strncmp(target, "socket:", 7) == 0;
		}
	}
	closedir(d);
	return n;
}

/* What a stranger could reach: the plugin opens no socket of its own on
 * either side (a destination listens nowhere: its queue pairs take packets
 * only from the peer QP whose number and PSN came over the control
 * connection) and uses no connection manager (docs/security.md, "What a
 * stranger can make lmt hold"). */
static void test_a_destination_opens_no_socket_and_no_connection_manager(void **state)
{
	(void)state;
	int before = count_sockets();
	struct pair *p = pair_open(4);
	assert_int_equal(count_sockets(), before);
	pair_close(p);
	assert_null(dlopen("librdmacm.so.1", RTLD_NOW | RTLD_NOLOAD));
}

static void test_path_mtu_is_the_smaller_of_both_sides(void **state)
{
	(void)state;
	lmt_instance *src, *dst;
	lmt_endpoint *se, *de;
	struct lmt_blob sa, da;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &src), 0);
	fake.devices[0].mtu = IBV_MTU_4096;
	assert_int_equal(open_instance(LMT_ROLE_DESTINATION, 1, &dst), 0);
	assert_int_equal(ops->ep_open(src, 0, &se, &sa), 0);
	assert_int_equal(ops->ep_open(dst, 0, &de, &da), 0);
	assert_int_equal(ops->ep_connect(de, &sa), 0);
	assert_int_equal(fake.modify[fake.nmodify - 2].attr.path_mtu, IBV_MTU_1024);
	ops->instance_close(src);
	ops->instance_close(dst);
}

/* Blobs of a wrong length are lmt-plugin-check's ("malformed address blob",
 * "malformed key blob"); the fields are verbs'. */
static void test_peer_address_with_a_bad_field_is_refused(void **state)
{
	(void)state;
	lmt_instance *src, *dst;
	lmt_endpoint *se, *de;
	struct lmt_blob sa, da;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 2, &src), 0);
	assert_int_equal(open_instance(LMT_ROLE_DESTINATION, 2, &dst), 0);
	assert_int_equal(ops->ep_open(src, 0, &se, &sa), 0);
	assert_int_equal(ops->ep_open(dst, 0, &de, &da), 0);
	struct {
		size_t at;
		uint8_t value;
		const char *why;
	} cases[] = {
	        {0, 'X', "bad magic"},
	        {4, 9, "unsupported version"},
	        {6, LMT_ROLE_SOURCE, "same role"},
	        {7, 7, "unknown link layer"},
	        {8, 0, "MTU out of range"},
	        {8, 6, "MTU out of range"},
	        {9, 1, "reserved field not zero"},
	        {12, 1, "another channel"},
	        {19, 1, "queue pair number out of range"},
	        {23, 1, "packet sequence number out of range"},
	};
	int modified = fake.nmodify;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct lmt_blob bad = da;
		bad.data[cases[i].at] = cases[i].value;
		ph_host_forget(&src_host);
		assert_int_equal(ops->ep_connect(se, &bad), -LMT_EPROTO);
		assert_true(contains(first_error(&src_host), cases[i].why));
	}
	struct lmt_blob bad = da;
	memset(bad.data + 16, 0, 4); /* QPN 0 */
	ph_host_forget(&src_host);
	assert_int_equal(ops->ep_connect(se, &bad), -LMT_EPROTO);
	bad = da;
	memset(bad.data + 28, 0, 16); /* RoCE without a GID */
	ph_host_forget(&src_host);
	assert_int_equal(ops->ep_connect(se, &bad), -LMT_EPROTO);
	assert_true(contains(first_error(&src_host), "RoCE address without a GID"));
	assert_int_equal(fake.nmodify, modified); /* the queue pair was left alone */
	ops->instance_close(src);
	ops->instance_close(dst);
}

/* ---- Registration -------------------------------------------------------- */

static void test_destination_key_lets_the_peer_write_the_whole_range(void **state)
{
	(void)state;
	lmt_instance *dst;
	static uint8_t ram[8192];
	lmt_mr *mr;
	struct lmt_blob key = {0};
	assert_int_equal(open_instance(LMT_ROLE_DESTINATION, 1, &dst), 0);
	assert_int_equal(ops->mr_register(dst, ram, sizeof(ram), LMT_MR_REMOTE_WRITE, &mr, &key),
	                 0);
	assert_int_equal(fake.last_access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct verbs_key k;
	assert_null(verbs_key_decode(&key, &k));
	assert_int_equal(k.addr, (uintptr_t)ram);
	assert_int_equal(k.len, sizeof(ram));
	assert_int_equal(k.rkey, 0x1001);
	ops->mr_deregister(dst, mr);
	ops->instance_close(dst);
}

static void test_source_registration_asks_for_no_write_access(void **state)
{
	(void)state;
	lmt_instance *src;
	static uint8_t ram[8192];
	lmt_mr *mr;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &src), 0);
	assert_int_equal(ops->mr_register(src, ram, sizeof(ram), LMT_MR_LOCAL_READ, &mr, NULL), 0);
	assert_int_equal(fake.last_access, 0);
	ops->mr_deregister(src, mr);
	ops->instance_close(src);
}

static void test_odp_registers_on_demand_where_supported(void **state)
{
	(void)state;
	fake.devices[0].odp_general = IBV_ODP_SUPPORT;
	fake.devices[0].odp_rc = IBV_ODP_SUPPORT_WRITE;
	set_options(&dst_host, "verbs.odp=on");
	lmt_instance *dst;
	static uint8_t ram[8192];
	lmt_mr *mr;
	struct lmt_blob key = {0};
	assert_int_equal(open_instance(LMT_ROLE_DESTINATION, 1, &dst), 0);
	assert_int_equal(ops->mr_register(dst, ram, sizeof(ram), LMT_MR_REMOTE_WRITE, &mr, &key),
	                 0);
	assert_true(fake.last_access & IBV_ACCESS_ON_DEMAND);
	ops->mr_deregister(dst, mr);
	ops->instance_close(dst);
}

static void test_odp_is_refused_where_the_device_lacks_it(void **state)
{
	(void)state;
	fake.devices[0].odp_general = IBV_ODP_SUPPORT;
	set_options(&src_host, "verbs.odp=on");
	lmt_instance *src = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &src), -LMT_ENOTSUP);
	assert_string_equal(first_error(&src_host),
	                    "verbs.odp=on: rxe0 does not support on-demand paging for RC RDMA "
	                    "writes (ODP caps 0x1, RC caps 0x0); use verbs.odp=off");
}

static void test_registration_failure_points_at_the_memlock_limit(void **state)
{
	(void)state;
	lmt_instance *src;
	static uint8_t ram[8192];
	lmt_mr *mr = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &src), 0);
	fake.fail = FAIL_REG_MR;
	assert_int_equal(ops->mr_register(src, ram, sizeof(ram), LMT_MR_LOCAL_READ, &mr, NULL),
	                 -LMT_ENOMEM);
	assert_true(contains(first_error(&src_host), "ulimit -l"));
	fake.fail = FAIL_NONE;
	ops->instance_close(src);
}

static void test_key_blob_with_a_bad_field_is_refused(void **state)
{
	(void)state;
	lmt_instance *src;
	lmt_rkey *rkey = NULL;
	assert_int_equal(open_instance(LMT_ROLE_SOURCE, 1, &src), 0);
	struct lmt_blob good;
	verbs_key_encode(&(struct verbs_key){.rkey = 7, .addr = 4096, .len = 4096}, &good);
	assert_int_equal(ops->rkey_import(src, &good, &rkey), 0);
	ops->rkey_release(src, rkey);
	struct lmt_blob bad = good;
	bad.data[0] ^= 1;
	assert_int_equal(ops->rkey_import(src, &bad, &rkey), -LMT_EPROTO);
	verbs_key_encode(&(struct verbs_key){.rkey = 7, .addr = 4096, .len = 0}, &bad);
	assert_int_equal(ops->rkey_import(src, &bad, &rkey), -LMT_EPROTO);
	verbs_key_encode(&(struct verbs_key){.rkey = 7, .addr = UINT64_MAX - 10, .len = 4096},
	                 &bad);
	ph_host_forget(&src_host);
	assert_int_equal(ops->rkey_import(src, &bad, &rkey), -LMT_EPROTO);
	assert_true(contains(first_error(&src_host), "wraps around"));
	ops->instance_close(src);
}

/* ---- Posting and signalling accounting ----------------------------------- */

static void test_each_write_has_its_own_wr_id_and_one_in_n_is_signalled(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=4");
	struct pair *p = pair_open(1);
	for (int i = 0; i < 12; i++)
		assert_int_equal(write_page(p, 0, (uint64_t)i, 100 + (uint64_t)i), 0);
	assert_int_equal(fake.nwrs, 12);
	for (int i = 0; i < 12; i++) {
		for (int j = 0; j < i; j++)
			assert_int_not_equal(fake.wrs[i].wr_id, fake.wrs[j].wr_id);
		assert_int_equal(!!(fake.wrs[i].send_flags & IBV_SEND_SIGNALED), i % 4 == 3);
		assert_int_equal(fake.wrs[i].length, 4096);
		assert_int_equal(fake.wrs[i].remote_addr,
		                 (uintptr_t)p->dst_ram + (uint64_t)i * 4096);
	}
	pair_close(p);
}

static void test_signalled_completion_retires_exactly_the_writes_before_it(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=4");
	struct pair *p = pair_open(1);
	for (int i = 0; i < 8; i++)
		assert_int_equal(write_page(p, 0, (uint64_t)i, 100 + (uint64_t)i), 0);
	struct lmt_completion out[32];
	assert_int_equal(harvest(p->src, out, 32), 0);
	queue_wc(fake.wrs[3].qp_num, fake.wrs[3].wr_id, IBV_WC_SUCCESS);
	assert_int_equal(harvest(p->src, out, 32), 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(out[i].cookie, 100 + (uint64_t)i);
		assert_int_equal(out[i].status, 0);
		assert_int_equal(out[i].channel, 0);
	}
	queue_wc(fake.wrs[7].qp_num, fake.wrs[7].wr_id, IBV_WC_SUCCESS);
	/* Handed out two at a time: the rest waits for the next call. */
	assert_int_equal(ops->progress(p->src, out, 2, 0), 2);
	assert_int_equal(out[0].cookie, 104);
	assert_int_equal(out[1].cookie, 105);
	assert_int_equal(ops->progress(p->src, out, 32, 0), 2);
	assert_int_equal(out[0].cookie, 106);
	assert_int_equal(out[1].cookie, 107);
	assert_int_equal(harvest(p->src, out, 32), 0);
	assert_int_equal(ops->flush(p->src, SECOND), 0);
	assert_int_equal(fake.nwrs, 8); /* nothing outstanding: flush posted nothing */
	pair_close(p);
}

static void test_completions_on_two_channels_are_kept_apart(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=2");
	struct pair *p = pair_open(2);
	for (int i = 0; i < 4; i++)
		assert_int_equal(write_page(p, (uint32_t)(i % 2), (uint64_t)i, 10 + (uint64_t)i),
		                 0);
	/* Channel 1's second write (the fourth posted) is its signalled one. */
	queue_wc(fake.wrs[3].qp_num, fake.wrs[3].wr_id, IBV_WC_SUCCESS);
	struct lmt_completion out[8];
	assert_int_equal(harvest(p->src, out, 8), 2);
	assert_int_equal(out[0].cookie, 11);
	assert_int_equal(out[1].cookie, 13);
	assert_int_equal(out[0].channel, 1);
	pair_close(p);
}

static void test_full_queue_answers_eagain_until_a_completion_frees_it(void **state)
{
	(void)state;
	set_options(&src_host, "queue-depth=8");
	struct pair *p = pair_open(1);
	for (int i = 0; i < 8; i++)
		assert_int_equal(write_page(p, 0, (uint64_t)i, (uint64_t)i + 1), 0);
	int posts = fake.post_calls;
	assert_int_equal(write_page(p, 0, 8, 9), -LMT_EAGAIN);
	assert_int_equal(fake.post_calls, posts); /* the queue was never overfilled */
	assert_int_equal(ph_host_errors(&src_host), 0);
	/* Depth 8 caps the interval at 4: the fourth and eighth are signalled. */
	assert_true(fake.wrs[3].send_flags & IBV_SEND_SIGNALED);
	queue_wc(fake.wrs[3].qp_num, fake.wrs[3].wr_id, IBV_WC_SUCCESS);
	struct lmt_completion out[16];
	assert_int_equal(harvest(p->src, out, 16), 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(write_page(p, 0, 8 + (uint64_t)i, 9 + (uint64_t)i), 0);
	assert_int_equal(write_page(p, 0, 12, 13), -LMT_EAGAIN);
	pair_close(p);
}

static void test_unsignalled_tail_is_retired_by_a_marker_when_progress_waits(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=4");
	struct pair *p = pair_open(1);
	for (int i = 0; i < 3; i++)
		assert_int_equal(write_page(p, 0, (uint64_t)i, 50 + (uint64_t)i), 0);
	struct lmt_completion out[8];
	assert_int_equal(ops->progress(p->src, out, 8, 0), 0);
	assert_int_equal(fake.nwrs, 3); /* a poll without waiting posts nothing */
	fake.auto_complete = true;
	assert_int_equal(ops->progress(p->src, out, 8, 200 * MS), 3);
	assert_int_equal(fake.nwrs, 4);
	const struct posted_wr *marker = &fake.wrs[3];
	assert_true(marker->send_flags & IBV_SEND_SIGNALED);
	assert_int_equal(marker->num_sge, 0);
	assert_int_equal(marker->rkey, fake.wrs[2].rkey);
	for (int i = 0; i < 3; i++)
		assert_int_equal(out[i].cookie, 50 + (uint64_t)i);
	/* The marker's own completion reports no cookie. */
	assert_int_equal(ops->progress(p->src, out, 8, 20 * MS), 0);
	pair_close(p);
}

static void test_flush_drains_every_outstanding_write(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=8");
	struct pair *p = pair_open(2);
	for (int i = 0; i < 6; i++)
		assert_int_equal(write_page(p, (uint32_t)(i % 2), (uint64_t)i, 70 + (uint64_t)i),
		                 0);
	fake.auto_complete = true;
	assert_int_equal(ops->flush(p->src, SECOND), 0);
	assert_int_equal(fake.nwrs, 8); /* one marker per channel */
	struct lmt_completion out[16];
	assert_int_equal(harvest(p->src, out, 16), 6);
	uint64_t seen = 0;
	for (int i = 0; i < 6; i++)
		seen |= 1ull << (out[i].cookie - 70);
	assert_int_equal(seen, 0x3f);
	pair_close(p);
}

static void test_flush_times_out_naming_what_is_outstanding(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 1), 0);
	assert_int_equal(ops->flush(p->src, 30 * MS), -LMT_ETIMEDOUT);
	assert_string_equal(first_error(&src_host),
	                    "verbs: flush timed out after 30 ms with 2 work requests outstanding");
	pair_close(p);
}

static void test_cancel_ends_a_waiting_progress(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 1), 0);
	atomic_store(&src_host.cancelled, 1);
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->src, out, 4, SECOND), -LMT_ECANCELED);
	pair_close(p);
}

/* A write past the key is lmt-plugin-check's ("write beyond the key's
 * length"); one past the source's own registration is verbs' to refuse. */
static void test_a_write_outside_its_source_registration_is_refused(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	assert_int_equal(ops->write(p->src_ep[0], p->src_ram + sizeof(p->src_ram) - 4096, 8192,
	                            p->src_mr, p->rkey, 0, 1),
	                 -LMT_EINVAL);
	assert_true(contains(first_error(&src_host), "outside its registration"));
	assert_int_equal(fake.nwrs, 0);
	pair_close(p);
}

/* ---- Completion errors --------------------------------------------------- */

static void test_completion_error_reports_every_outstanding_cookie_once(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=4");
	struct pair *p = pair_open(2);
	for (int i = 0; i < 6; i++)
		assert_int_equal(write_page(p, (uint32_t)(i % 2), (uint64_t)i, 20 + (uint64_t)i),
		                 0);
	queue_wc(fake.wrs[0].qp_num, fake.wrs[0].wr_id, IBV_WC_LOC_PROT_ERR);
	struct lmt_completion out[16];
	assert_int_equal(harvest(p->src, out, 16), 6);
	uint64_t seen = 0;
	for (int i = 0; i < 6; i++) {
		assert_int_equal(out[i].status, -LMT_EIO);
		assert_false(seen & (1ull << (out[i].cookie - 20)));
		seen |= 1ull << (out[i].cookie - 20);
	}
	assert_int_equal(seen, 0x3f);
	assert_string_equal(first_error(&src_host), "verbs channel 0: RDMA write failed: local "
	                                    "protection error (status 4, vendor error 0x42)");
	/* Flushed completions that follow are not reported again. */
	queue_wc(fake.wrs[2].qp_num, fake.wrs[2].wr_id, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(ops->progress(p->src, out, 16, 0), -LMT_EIO);
	assert_int_equal(write_page(p, 0, 9, 99), -LMT_EIO);
	assert_int_equal(ops->flush(p->src, SECOND), -LMT_EIO);
	/* Every queue pair was moved to the error state. */
	int errored = 0;
	for (int i = 0; i < fake.nmodify; i++)
		errored += fake.modify[i].attr.qp_state == IBV_QPS_ERR;
	assert_int_equal(errored, 2);
	pair_close(p);
}

/* A completion with `status` reports its write as LMT_ECONN: the peer is gone. */
static void check_peer_gone(enum ibv_wc_status status, const char *text)
{
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 5), 0);
	queue_wc(fake.wrs[0].qp_num, fake.wrs[0].wr_id, status);
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->src, out, 4, 0), 1);
	assert_int_equal(out[0].cookie, 5);
	assert_int_equal(out[0].status, -LMT_ECONN);
	assert_true(contains(first_error(&src_host), text));
	pair_close(p);
}

static void test_retry_exceeded_means_the_peer_is_gone(void **state)
{
	(void)state;
	check_peer_gone(IBV_WC_RETRY_EXC_ERR, "transport retry counter exceeded");
}

/* The destination's registration went away under a write: it closed, or
 * died and its kernel released the region before the queue pair. */
static void test_remote_access_error_means_the_peer_is_gone(void **state)
{
	(void)state;
	check_peer_gone(IBV_WC_REM_ACCESS_ERR, "remote access error");
}

static void test_completion_for_an_unknown_request_fails_the_instance(void **state)
{
	(void)state;
	set_options(&src_host, "verbs.signal-interval=1");
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 5), 0);
	assert_int_equal(write_page(p, 0, 1, 6), 0);
	queue_wc(fake.wrs[0].qp_num, fake.wrs[0].wr_id, IBV_WC_SUCCESS);
	queue_wc(fake.wrs[0].qp_num, fake.wrs[0].wr_id, IBV_WC_SUCCESS); /* twice */
	struct lmt_completion out[4];
	assert_int_equal(harvest(p->src, out, 4), 2);
	assert_int_equal(out[0].cookie, 5);
	assert_int_equal(out[0].status, 0);
	assert_int_equal(out[1].cookie, 6);
	assert_int_equal(out[1].status, -LMT_EIO);
	assert_true(contains(first_error(&src_host), "completion for unknown work request"));
	pair_close(p);
}

static void test_poll_cq_failure_fails_the_instance(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 5), 0);
	fake.fail = FAIL_POLL_CQ;
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->src, out, 4, 0), 1);
	assert_int_equal(out[0].status, -LMT_EIO);
	assert_int_equal(ops->progress(p->src, out, 4, 0), -LMT_EIO);
	fake.fail = FAIL_NONE;
	pair_close(p);
}

static void test_post_send_failure_fails_the_instance(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 5), 0);
	fake.fail = FAIL_POST_SEND;
	assert_int_equal(write_page(p, 0, 1, 6), -LMT_EIO);
	fake.fail = FAIL_NONE;
	assert_true(contains(first_error(&src_host), "ibv_post_send failed"));
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->src, out, 4, 0), 1); /* the first write's cookie */
	assert_int_equal(out[0].cookie, 5);
	assert_int_equal(out[0].status, -LMT_EIO);
	pair_close(p);
}

static void queue_event(enum ibv_event_type type, struct ibv_qp *qp)
{
	struct ibv_async_event *ev = &fake.events[fake.nevents++];
	memset(ev, 0, sizeof(*ev));
	ev->event_type = type;
	ev->element.qp = qp;
}

static void test_queue_pair_fatal_event_fails_the_source(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	assert_int_equal(write_page(p, 0, 0, 5), 0);
	struct ibv_qp fake_qp = {.qp_num = fake.wrs[0].qp_num};
	queue_event(IBV_EVENT_QP_FATAL, &fake_qp);
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->src, out, 4, 0), 1);
	assert_int_equal(out[0].status, -LMT_EIO);
	assert_string_equal(first_error(&src_host),
	                    "verbs channel 0: queue pair in error: local work queue "
	                    "catastrophic error");
	pair_close(p);
}

static void test_device_fatal_event_fails_the_destination(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->dst, out, 4, 0), 0);
	queue_event(IBV_EVENT_DEVICE_FATAL, NULL);
	assert_int_equal(ops->progress(p->dst, out, 4, 0), -LMT_EIO);
	assert_string_equal(first_error(&dst_host), "verbs: rxe0: local catastrophic error");
	pair_close(p);
}

static void test_harmless_events_are_only_logged(void **state)
{
	(void)state;
	struct pair *p = pair_open(1);
	queue_event(IBV_EVENT_LID_CHANGE, NULL);
	struct lmt_completion out[4];
	assert_int_equal(ops->progress(p->dst, out, 4, 0), 0);
	assert_int_equal(ph_host_errors(&dst_host), 0);
	pair_close(p);
}

/* ---- Wire ---------------------------------------------------------------- */

static void test_address_blob_round_trips(void **state)
{
	(void)state;
	struct verbs_addr a = {.role = LMT_ROLE_DESTINATION,
	                       .link = VERBS_LINK_IB,
	                       .mtu = 5,
	                       .channel = 3,
	                       .qpn = 0xabcdef,
	                       .psn = 0x123456,
	                       .lid = 7};
	memset(a.gid, 0xfe, 16);
	struct lmt_blob b;
	verbs_addr_encode(&a, &b);
	assert_int_equal(b.len, VERBS_ADDR_LEN);
	struct verbs_addr back;
	assert_null(verbs_addr_decode(&b, &back));
	assert_int_equal(back.role, a.role);
	assert_int_equal(back.link, a.link);
	assert_int_equal(back.mtu, a.mtu);
	assert_int_equal(back.channel, a.channel);
	assert_int_equal(back.qpn, a.qpn);
	assert_int_equal(back.psn, a.psn);
	assert_int_equal(back.lid, a.lid);
	assert_memory_equal(back.gid, a.gid, 16);
	b.data[24] = 0; /* LID 0 on InfiniBand */
	b.data[25] = 0;
	assert_string_equal(verbs_addr_decode(&b, &back),
	                    "InfiniBand address without a unicast LID");
}

int main(void)
{
	assert_int_equal(lmt_plugin_entry(LMT_PLUGIN_ABI_VERSION, &plugin), 0);
	ops = &plugin->ops;
	struct lmt_error err = {0};
	if (ph_config_init(&cfg, plugin, "", &err)) {
		fprintf(stderr, "verbs options: %s\n", err.message);
		return 2;
	}
	const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	        T(test_no_device_says_the_list_was_empty),
	        T(test_unknown_device_lists_the_devices_found),
	        T(test_first_device_with_an_active_port_is_chosen),
	        T(test_named_device_is_used_even_when_not_first),
	        T(test_no_active_port_names_each_port_state),
	        T(test_port_beyond_the_device_is_refused),
	        T(test_roce_gid_matches_the_control_connection_address),
	        T(test_roce_gid_defaults_to_the_first_v2_ipv4_one),
	        T(test_gid_index_option_overrides_the_choice),
	        T(test_empty_gid_index_is_refused),
	        T(test_no_roce_v2_gid_lists_what_was_found),
	        T(test_infiniband_port_without_lid_is_refused),
	        T(test_teardown_after_open_device_fails),
	        T(test_teardown_after_query_device_fails),
	        T(test_teardown_after_alloc_pd_fails),
	        T(test_teardown_after_comp_channel_fails),
	        T(test_teardown_after_create_cq_fails),
	        T(test_teardown_after_create_qp_fails),
	        T(test_teardown_after_qp_to_init_fails),
	        T(test_teardown_after_qp_to_rtr_fails),
	        T(test_teardown_after_qp_to_rts_fails),
	        T(test_teardown_after_reg_mr_fails),
	        T(test_close_releases_what_the_core_left_behind),
	        T(test_queue_pairs_connect_with_the_peer_qpn_psn_and_gid),
	        T(test_a_destination_opens_no_socket_and_no_connection_manager),
	        T(test_path_mtu_is_the_smaller_of_both_sides),
	        T(test_peer_address_with_a_bad_field_is_refused),
	        T(test_destination_key_lets_the_peer_write_the_whole_range),
	        T(test_source_registration_asks_for_no_write_access),
	        T(test_odp_registers_on_demand_where_supported),
	        T(test_odp_is_refused_where_the_device_lacks_it),
	        T(test_registration_failure_points_at_the_memlock_limit),
	        T(test_key_blob_with_a_bad_field_is_refused),
	        T(test_each_write_has_its_own_wr_id_and_one_in_n_is_signalled),
	        T(test_signalled_completion_retires_exactly_the_writes_before_it),
	        T(test_completions_on_two_channels_are_kept_apart),
	        T(test_full_queue_answers_eagain_until_a_completion_frees_it),
	        T(test_unsignalled_tail_is_retired_by_a_marker_when_progress_waits),
	        T(test_flush_drains_every_outstanding_write),
	        T(test_flush_times_out_naming_what_is_outstanding),
	        T(test_cancel_ends_a_waiting_progress),
	        T(test_a_write_outside_its_source_registration_is_refused),
	        T(test_completion_error_reports_every_outstanding_cookie_once),
	        T(test_retry_exceeded_means_the_peer_is_gone),
	        T(test_remote_access_error_means_the_peer_is_gone),
	        T(test_completion_for_an_unknown_request_fails_the_instance),
	        T(test_poll_cq_failure_fails_the_instance),
	        T(test_post_send_failure_fails_the_instance),
	        T(test_queue_pair_fatal_event_fails_the_source),
	        T(test_device_fatal_event_fails_the_destination),
	        T(test_harmless_events_are_only_logged),
	        T(test_address_blob_round_trips),
#undef T
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	ph_unload(&cfg);
	return failed;
}
