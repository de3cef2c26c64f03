/* The transport's lifecycle, the same steps for both roles: the plugin
 * instance, one endpoint per channel with its address sent to the peer,
 * and the release of every key, registration and endpoint.
 * Room: transport; may use: base, wire, session, control. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "error.h"
#include "session.h"
#include "control.h"
#include "transport.h"

/* The numeric IP of a socket's local (peer false) or remote end. Over a
 * unix: target both ends are this host: loopback. */
static void numeric_host(int fd, bool peer, char *buf, size_t size)
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
	else if (rc == 0 && ss.ss_family == AF_UNIX)
		snprintf(buf, size, "127.0.0.1");
}

/* The instance learns both ends' addresses from the control connection. */
static int instance_open(struct lmt_session *s)
{
	struct lmt_instance_params p = {
	        .struct_size = sizeof(p),
	        .role = s->role,
	        .channels = s->channels,
	        .timeout_ns = s->connect_timeout_ns,
	        .channel_secret = s->tls ? s->channel_secret : NULL,
	        .channel_secret_len = s->tls ? (uint32_t)sizeof(s->channel_secret) : 0,
	};
	numeric_host(s->ctrl_fd, false, p.local_host, sizeof(p.local_host));
	numeric_host(s->ctrl_fd, true, p.peer_host, sizeof(p.peer_host));
	int rc = s->desc->ops.instance_open(&lmt__host_services, s, &p, &s->inst);
	if (rc)
		return lmt__fail(s, rc, "plugin %s: cannot open an instance (%s)", s->desc->name,
		                 lmt_err_name(rc));
	return 0;
}

static int open_channels(struct lmt_session *s, struct lmt_msg_addrs *a)
{
	a->count = s->channels;
	for (uint32_t c = 0; c < s->channels; c++) {
		int rc = s->desc->ops.ep_open(s->inst, c, &s->eps[c], &a->addrs[c]);
		if (rc)
			return lmt__fail(s, rc, "channel %u: cannot open an endpoint", c);
		if (a->addrs[c].len == 0 || a->addrs[c].len > LMT_BLOB_MAX)
			return lmt__fail(s, LMT_EPROTO,
			                 "channel %u: plugin gave an address of %u bytes", c,
			                 a->addrs[c].len);
	}
	return 0;
}

int lmt__endpoints_open(struct lmt_session *s)
{
	int rc = instance_open(s);
	if (rc)
		return rc;
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	if (!a)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = open_channels(s, a);
	if (!rc && (rc = lmt__enc_addrs(&s->out, a)))
		lmt__fail(s, rc, "encoding EP_ADDRS");
	free(a);
	return rc ? rc : lmt__ctrl_send(s);
}

int lmt__endpoints_open_local(struct lmt_session *s)
{
	int rc = instance_open(s);
	if (rc)
		return rc;
	struct lmt_msg_addrs *a = calloc(1, sizeof(*a));
	if (!a)
		return lmt__fail(s, LMT_ENOMEM, "out of memory");
	rc = open_channels(s, a);
	free(a);
	return rc;
}

static void release_windows(struct lmt_session *s, struct lmt_block *b)
{
	const struct lmt_plugin_ops *ops = &s->desc->ops;
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

void lmt__transport_close(struct lmt_session *s)
{
	if (!s->inst)
		return;
	for (uint32_t i = 0; i < s->nblocks; i++)
		release_windows(s, &s->blocks[i]);
	for (uint32_t c = 0; c < LMT_MAX_CHANNELS; c++) {
		if (s->eps[c])
			s->desc->ops.ep_close(s->eps[c]);
		s->eps[c] = NULL;
	}
	s->desc->ops.instance_close(s->inst);
	s->inst = NULL;
}
