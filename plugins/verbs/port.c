/* Device, port and GID selection for the verbs plugin (see port.h): the
 * first device with an active port unless told otherwise, and on Ethernet a
 * RoCE v2 GID. */
#define _GNU_SOURCE
#include "port.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Text that grows by appending, for messages that list what was found. */
struct verbs_text {
	char buf[400];
	size_t len;
};

static void text_add(struct verbs_text *t, const char *fmt, ...) LMT_PRINTF(2, 3);

static void text_add(struct verbs_text *t, const char *fmt, ...)
{
	if (t->len >= sizeof(t->buf) - 1)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(t->buf + t->len, sizeof(t->buf) - t->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->len += (size_t)n < sizeof(t->buf) - t->len ? (size_t)n
		                                              : sizeof(t->buf) - t->len - 1;
}

static const char *gid_type_name(enum ibv_gid_type type)
{
	switch (type) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	}
	return "unknown";
}

static bool gid_is_zero(const union ibv_gid *gid)
{
	static const uint8_t zero[16];
	return memcmp(gid->raw, zero, sizeof(zero)) == 0;
}

static bool gid_is_ipv4(const union ibv_gid *gid)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(gid->raw, prefix, sizeof(prefix)) == 0;
}

static void gid_format(const union ibv_gid *gid, char *buf, size_t size)
{
	if (gid_is_ipv4(gid))
		inet_ntop(AF_INET, gid->raw + 12, buf, (socklen_t)size);
	else
		inet_ntop(AF_INET6, gid->raw, buf, (socklen_t)size);
}

/* The control connection's local address as a GID, when it is numeric. */
static bool host_to_gid(const char *host, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (inet_pton(AF_INET, host, gid->raw + 12) == 1) {
		gid->raw[10] = gid->raw[11] = 0xff;
		return true;
	}
	return inet_pton(AF_INET6, host, gid->raw) == 1;
}

static int query_gid(struct lmt_instance *inst, int index, struct ibv_gid_entry *entry)
{
	memset(entry, 0, sizeof(*entry));
	return ibv_query_gid_ex(inst->ctx, inst->port, (uint32_t)index, entry, 0);
}

/* On Ethernet: the GID given by verbs.gid-index, else the RoCE v2 GID of the
 * control connection's address, else the first RoCE v2 IPv4 GID, else the
 * first RoCE v2 GID. */
static int pick_roce_gid(struct lmt_instance *inst, int want, int table_len)
{
	struct ibv_gid_entry e;
	char text[INET6_ADDRSTRLEN];
	if (want >= 0) {
		if (want >= table_len)
			return putil_error(&inst->base, LMT_ENOTFOUND,
			                   "verbs.gid-index=%d: %s port %u has %d GID entries",
			                   want, inst->device, inst->port, table_len);
		if (query_gid(inst, want, &e) || gid_is_zero(&e.gid))
			return putil_error(&inst->base, LMT_ENOTFOUND,
			                   "verbs.gid-index=%d: entry empty on %s port %u", want,
			                   inst->device, inst->port);
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			putil_log(&inst->base, LMT_LOG_WARN,
			          "verbs.gid-index=%d is a %s GID, not RoCE v2", want,
			          gid_type_name(e.gid_type));
		inst->gid_index = want;
		inst->gid = e.gid;
		return 0;
	}
	union ibv_gid local;
	bool have_local = host_to_gid(inst->base.local_host, &local);
	int match = -1, first_v4 = -1, first_v2 = -1;
	struct verbs_text found = {.len = 0};
	union ibv_gid gids[3];
	for (int i = 0; i < table_len && match < 0; i++) {
		if (query_gid(inst, i, &e))
			continue;
		union ibv_gid gid = e.gid;
		if (gid_is_zero(&gid))
			continue;
		gid_format(&gid, text, sizeof(text));
		text_add(&found, "%s%d %s (%s)", found.len ? ", " : "", i, text,
		         gid_type_name(e.gid_type));
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		if (have_local && memcmp(gid.raw, local.raw, 16) == 0) {
			match = i;
			gids[0] = gid;
		}
		if (gid_is_ipv4(&gid) && first_v4 < 0) {
			first_v4 = i;
			gids[1] = gid;
		}
		if (first_v2 < 0) {
			first_v2 = i;
			gids[2] = gid;
		}
	}
	int pick = match >= 0 ? 0 : first_v4 >= 0 ? 1 : first_v2 >= 0 ? 2 : -1;
	if (pick < 0)
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "%s port %u: no RoCE v2 GID (found: %s); set verbs.gid-index",
		                   inst->device, inst->port, found.len ? found.buf : "none");
	inst->gid_index = pick == 0 ? match : pick == 1 ? first_v4 : first_v2;
	inst->gid = gids[pick];
	return 0;
}

static int pick_gid(struct lmt_instance *inst, const struct ibv_port_attr *pa, int want)
{
	if (pa->link_layer == IBV_LINK_LAYER_ETHERNET) {
		inst->link = VERBS_LINK_ETHERNET;
		return pick_roce_gid(inst, want, pa->gid_tbl_len);
	}
	inst->link = VERBS_LINK_IB;
	if (pa->lid == 0 || pa->lid >= 0xc000u)
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "%s port %u: no unicast LID (%u); is a subnet manager running?",
		                   inst->device, inst->port, pa->lid);
	inst->gid_index = want >= 0 ? want : 0;
	if (inst->gid_index >= pa->gid_tbl_len ||
	    ibv_query_gid(inst->ctx, inst->port, inst->gid_index, &inst->gid))
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "verbs.gid-index=%d: no such GID on %s port %u", inst->gid_index,
		                   inst->device, inst->port);
	return 0;
}

/* Open `dev` and find its port: `want` (0 = the first active one). Returns
 * 1 with inst->ctx open, 0 when it has no active port (noted in `why`), or
 * an error. */
static int try_device(struct lmt_instance *inst, struct ibv_device *dev, int want,
                      struct ibv_port_attr *pa, struct verbs_text *why)
{
	const char *name = ibv_get_device_name(dev);
	snprintf(inst->device, sizeof(inst->device), "%s", name ? name : "?");
	inst->ctx = ibv_open_device(dev);
	if (!inst->ctx) {
		text_add(why, "%s%s cannot be opened (%s)", why->len ? ", " : "", inst->device,
		         strerror(errno));
		return 0;
	}
	struct ibv_device_attr_ex attr;
	memset(&attr, 0, sizeof(attr));
	int rc = ibv_query_device_ex(inst->ctx, NULL, &attr);
	if (rc) {
		text_add(why, "%s%s cannot be queried (%s)", why->len ? ", " : "", inst->device,
		         strerror(rc));
		goto skip;
	}
	unsigned ports = attr.orig_attr.phys_port_cnt;
	if (want > (int)ports) {
		rc = putil_error(&inst->base, LMT_ENOTFOUND, "verbs.port=%d: %s has %u port%s",
		                 want, inst->device, ports, ports == 1 ? "" : "s");
		ibv_close_device(inst->ctx);
		inst->ctx = NULL;
		return rc;
	}
	for (unsigned p = want ? (unsigned)want : 1; p <= (want ? (unsigned)want : ports); p++) {
		memset(pa, 0, sizeof(*pa));
		if ((rc = ibv_query_port(inst->ctx, (uint8_t)p, pa))) {
			text_add(why, "%s%s port %u cannot be queried (%s)", why->len ? ", " : "",
			         inst->device, p, strerror(rc));
			continue;
		}
		if (pa->state != IBV_PORT_ACTIVE) {
			text_add(why, "%s%s port %u %s", why->len ? ", " : "", inst->device, p,
			         ibv_port_state_str(pa->state));
			continue;
		}
		inst->port = (uint8_t)p;
		inst->max_qp_wr =
		        attr.orig_attr.max_qp_wr > 0 ? (uint32_t)attr.orig_attr.max_qp_wr : 1;
		inst->max_cqe = attr.orig_attr.max_cqe;
		inst->odp_general = attr.odp_caps.general_caps;
		inst->odp_rc = attr.odp_caps.per_transport_caps.rc_odp_caps;
		return 1;
	}
	if (ports == 0)
		text_add(why, "%s%s has no ports", why->len ? ", " : "", inst->device);
skip:
	ibv_close_device(inst->ctx);
	inst->ctx = NULL;
	return 0;
}

static int open_port(struct lmt_instance *inst, const char *device, int port,
                     struct ibv_port_attr *pa)
{
	int n = 0;
	errno = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "no RDMA device: ibv_get_device_list failed (%s)",
		                   strerror(errno ? errno : ENODEV));
	if (n <= 0) {
		ibv_free_device_list(list);
		return putil_error(&inst->base, LMT_ENOTFOUND,
		                   "no RDMA device: ibv_get_device_list returned none");
	}
	struct verbs_text why = {.len = 0};
	int rc = 0, named = -1;
	if (device && device[0]) {
		for (int i = 0; i < n && named < 0; i++) {
			const char *name = ibv_get_device_name(list[i]);
			if (name && strcmp(name, device) == 0)
				named = i;
		}
		if (named < 0) {
			for (int i = 0; i < n; i++) {
				const char *name = ibv_get_device_name(list[i]);
				text_add(&why, "%s%s", i ? ", " : "", name ? name : "?");
			}
			rc = putil_error(&inst->base, LMT_ENOTFOUND,
			                 "verbs.device=%s: not found; devices: %s", device,
			                 why.buf);
			ibv_free_device_list(list);
			return rc;
		}
	}
	for (int i = named >= 0 ? named : 0; i < n && rc == 0; i++) {
		rc = try_device(inst, list[i], port, pa, &why);
		if (named >= 0)
			break;
	}
	ibv_free_device_list(list);
	if (rc < 0)
		return rc;
	if (rc == 0)
		return putil_error(&inst->base, LMT_ENOTFOUND, "no active RDMA port: %s",
		                   why.len ? why.buf : "none found");
	return 0;
}

int verbs_port_open(struct lmt_instance *inst, const char *device, int port, int gid_index)
{
	struct ibv_port_attr pa;
	int rc = open_port(inst, device, port, &pa);
	if (rc)
		return rc;
	inst->mtu = pa.active_mtu;
	inst->lid = pa.lid;
	inst->max_msg = pa.max_msg_sz ? pa.max_msg_sz : UINT32_MAX;
	if ((rc = pick_gid(inst, &pa, gid_index))) {
		ibv_close_device(inst->ctx);
		inst->ctx = NULL;
		return rc;
	}
	char text[INET6_ADDRSTRLEN];
	gid_format(&inst->gid, text, sizeof(text));
	putil_log(&inst->base, LMT_LOG_INFO, "verbs: %s port %u (%s), GID %d %s, MTU %d",
	          inst->device, inst->port,
	          inst->link == VERBS_LINK_ETHERNET ? "RoCE" : "InfiniBand", inst->gid_index, text,
	          128 << inst->mtu);
	return 0;
}
