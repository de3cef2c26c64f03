/* verbs-probe: lists RDMA devices, their ports and GIDs; exits 0 when one
 * port is active, 77 (meson's "skipped") with the reason otherwise. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>

static const char *gid_type(uint32_t type)
{
	return type == IBV_GID_TYPE_ROCE_V2   ? "RoCE v2"
	       : type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
	                                      : "IB";
}

static void print_gids(struct ibv_context *ctx, uint8_t port, int table_len)
{
	for (int i = 0; i < table_len; i++) {
		struct ibv_gid_entry e;
		char text[INET6_ADDRSTRLEN];
		static const uint8_t zero[16];
		if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0) ||
		    memcmp(e.gid.raw, zero, 16) == 0)
			continue;
		inet_ntop(AF_INET6, e.gid.raw, text, sizeof(text));
		printf("    GID %d: %s (%s)\n", i, text, gid_type(e.gid_type));
	}
}

/* Prints a device's ports; returns how many are active. */
static int probe_device(struct ibv_device *dev)
{
	const char *name = ibv_get_device_name(dev);
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx) {
		printf("%s: cannot be opened\n", name);
		return 0;
	}
	struct ibv_device_attr attr;
	int active = 0;
	if (ibv_query_device(ctx, &attr) == 0) {
		for (uint8_t p = 1; p <= attr.phys_port_cnt; p++) {
			struct ibv_port_attr pa;
			if (ibv_query_port(ctx, p, &pa))
				continue;
			printf("%s port %u: %s, %s, MTU %d\n", name, p,
			       ibv_port_state_str(pa.state),
			       pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
			       128 << pa.active_mtu);
			print_gids(ctx, p, pa.gid_tbl_len);
			active += pa.state == IBV_PORT_ACTIVE;
		}
	}
	ibv_close_device(ctx);
	return active;
}

int main(void)
{
	int n = 0, active = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		printf("SKIP: no RDMA device: ibv_get_device_list returned none\n");
		if (list)
			ibv_free_device_list(list);
		return 77;
	}
	for (int i = 0; i < n; i++)
		active += probe_device(list[i]);
	ibv_free_device_list(list);
	if (!active) {
		printf("SKIP: no RDMA device has an active port\n");
		return 77;
	}
	return 0;
}
