/* The UCX settings the plugin makes in its own UCP configuration, so that
 * neither a peer that stops or dies nor a stranger can make UCX 1.13 abort
 * the process (docs/ucx.md, "What the plugin sets in UCX"), and one that
 * makes setup over shared memory cheaper. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#define UCX_MM_RX_BUFS_GROW "64"

static const char *const mm_names[] = {"all", "sm", "shm", "mm", "posix", "sysv", "xpmem", NULL};
static const char *const tcp_names[] = {"all", "tcp", NULL};

/* Whether a UCX transport list may open one of `names`: empty is UCX's
 * choice, and a list starting with '^' names what to leave out. */
static bool may_open(const char *tls, const char *const *names)
{
	if (!tls[0] || tls[0] == '^')
		return true;
	for (const char *at = tls; *at;) {
		size_t len = strcspn(at, ",");
		for (const char *const *n = names; *n; n++)
			if (strlen(*n) == len && strncmp(at, *n, len) == 0)
				return true;
		at += len + (at[len] == ',');
	}
	return false;
}

static int set(struct lmt_instance *inst, ucp_config_t *config, const char *name, const char *value)
{
	ucs_status_t st = ucp_config_modify(config, name, value);
	if (st != UCS_OK)
		return putil_error(&inst->base, LMT_EIO, "ucx: cannot set %s=%s (%s)", name, value,
		                   ucs_status_string(st));
	return 0;
}

/* Each worker of a shared-memory FIFO transport allocates and touches
 * 512 receive buffers of 8 KiB at once (UCX's MM_RX_BUFS_GROW), which
 * made a worker over sm cost 3–4 ms here and a two-channel setup about
 * 25 ms. The pool still grows on demand, so 64 is plenty. Left alone
 * when the user set it. */
static int tune_rx_buffers(struct lmt_instance *inst, ucp_config_t *config)
{
	static const char *const set_by_user[] = {"UCX_MM_RX_BUFS_GROW", "UCX_POSIX_RX_BUFS_GROW",
	                                          "UCX_SYSV_RX_BUFS_GROW",
	                                          "UCX_XPMEM_RX_BUFS_GROW"};
	for (size_t i = 0; i < sizeof(set_by_user) / sizeof(set_by_user[0]); i++)
		if (getenv(set_by_user[i]))
			return 0;
	return set(inst, config, "MM_RX_BUFS_GROW", UCX_MM_RX_BUFS_GROW);
}

int ucx_config_tune(struct lmt_instance *inst, ucp_config_t *config, const char *tls)
{
	int rc = 0;
	if (may_open(tls, mm_names)) {
		rc = tune_rx_buffers(inst, config);
		/* UCX's shared-memory FIFOs (posix, sysv) offer peer failure
		 * handling only when asked to. Without it the endpoints run in
		 * UCP_ERR_HANDLING_MODE_NONE, where UCX 1.13 can neither close
		 * an endpoint by force nor release the writes a stopped or dead
		 * peer never answers (ucp_worker_destroy then aborts on them),
		 * and where a message that a resumed peer sends to an endpoint
		 * already gone aborts on a stale endpoint id. */
		if (!rc)
			rc = set(inst, config, "MM_ERROR_HANDLING", "y");
	}
	/* One socket event per progress call: when a message on one tcp
	 * connection makes UCX 1.13 send on another whose peer went away,
	 * the send fails and closes that connection, and an event of it
	 * already read in the same batch then aborts the process
	 * (tcp_iface.c: "conn_state != CLOSED"), as a stopped peer that is
	 * resumed does. The key has no "TCP_" prefix: UCX applies it to
	 * the tcp interface's own table. */
	if (!rc && may_open(tls, tcp_names))
		rc = set(inst, config, "MAX_POLL", "1");
	return rc;
}
