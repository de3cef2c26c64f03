/* The TCP plugin's objects: instance, endpoint (one TCP stream per
 * channel), registration and peer key. Types only; every file of the
 * plugin includes it. */
#ifndef LMT_TCP_INSTANCE_H
#define LMT_TCP_INSTANCE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <lmt/plugin.h>

#include "putil_channels.h"
#include "putil_base.h"
#include "putil_registry.h"
#include "tls.h"
#include "wire.h"

#define TCP_QUEUE_DEPTH 256u /* writes per channel, posted and not harvested */
#define TCP_MAX_CHANNELS 1024u

/* A registered range. Destination regions are found by id when a header
 * arrives; `busy` counts receivers placing data into it right now (under
 * the registry's lock). */
struct lmt_mr {
	uint64_t id; /* random (putil_registry), never 0 */
	bool remote_write;
	uint8_t *addr;
	uint64_t len;
	unsigned busy;
};

struct lmt_rkey {
	struct putil_link link; /* released by instance_close if the core did not */
	uint64_t region;
	uint64_t len;
};

/* One posted write on the source: its encoded header and payload. */
struct tcp_slot {
	uint8_t header[TCP_HEADER_LEN];
	const void *local;
	size_t len;
	uint64_t cookie;
};

struct lmt_endpoint {
	struct lmt_instance *inst;
	uint32_t channel;
	int fd;        /* data connection, -1 until connected */
	int listen_fd; /* destination, until the source connected */
	uint64_t token;
	atomic_bool stopping;
	/* tls=on: the channel's context and, once connected, its TLS. */
	lmt__tls_ctx *tls_ctx;
	lmt__tls *tls;

	/* Source. `lock` guards the ring: the sender copies what it sends out
	 * of it, and a slot is reused once its completion was harvested. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool sync_ready;
	struct tcp_slot *ring;
	uint64_t head;  /* writes posted */
	uint64_t taken; /* writes handed to the sender */
	bool connected, sending, sender_done;
	int broken; /* -LMT_E* once the channel is down */
	pthread_t sender, acker;
	bool threads_started;

	/* Destination. */
	pthread_t receiver;
	bool receiver_started;
	struct lmt_mr *busy_region; /* under the registry's lock */
};

struct lmt_instance {
	struct putil_instance base;
	int nodelay;
	int buffer_size;
	char bind_host[256]; /* what destination listeners bind */
	struct putil_channels channels;
	struct putil_registry registry; /* regions by id, peer keys */
	bool tls;                       /* the core gave a channel secret */
	uint8_t tls_secret[LMT_TLS_SECRET_LEN];
};

#endif
