/* A UCP worker outside any lmt session: what a third party can do against a
 * destination's UCX worker knowing its worker address (the transports'
 * addresses, which are no secret) and lmt's wire format (which is public),
 * but not the address or key blobs that the control connection carried.
 *
 * It connects to the worker and sends write messages (active message id 1,
 * 256 bytes of 0xee) naming region ids 1 to N, the ids lmt handed out before
 * they were random, at small offsets, with tokens it guesses (0, 1, the
 * region id, random); in the current format and in the old one without a
 * token; a few large enough to go by rendezvous; and goodbye notices. Given
 * the guest RAM's address (--ram ADDR), which an attacker might learn
 * elsewhere, it also puts there through UCX's RMA, as a peer could when the
 * destination had UCP_FEATURE_RMA on. Then it reports:
 *
 *     attack: 2003 writes (2000 eager, 3 rendezvous: 3 refused), 8 notices, puts 4: ...
 *
 * With --flood it sends no guesses but floods the worker with messages
 * without the token, as fast as it can and without waiting for each:
 * 20000 eager writes of 256 bytes, 256 of 1 MiB and one of 64 MiB forced
 * eager (UCX then sends each in fragments that the receiver assembles whole
 * before its handler sees it), 256 of 1 MiB by rendezvous, and 2000
 * goodbyes; with
 * --die it then kills itself with SIGKILL while a last burst is in flight,
 * so that its connection breaks without a goodbye. It reports
 *
 *     flood: 20000 eager, 256 eager of 1048576, 1 of 67108864, 256 rendezvous of 1048576
 *            (256 refused), 2000 notices
 *
 * Exit 0 when it ran, 2 when it could not set up. Whether anything landed is
 * for the test to see in the destination's memory. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>
#include <time.h>

#include <ucp/api/ucp.h>

#include "wire.h"

#define SECOND 1000000000ull
#define SMALL 256u
#define LARGE (1u << 20)
#define HUGE (64u << 20)

static const uint64_t offsets[] = {0, 64, 4096};

struct attacker {
	ucp_context_h context;
	ucp_worker_h worker;
	ucp_ep_h ep;
	bool rma;
	ucs_status_t failed; /* what the error handler heard */
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SECOND + (uint64_t)ts.tv_nsec;
}

static int from_hex(const char *hex, uint8_t *out, size_t max, size_t *len)
{
	size_t n = strlen(hex);
	if (n % 2 || n / 2 > max)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	*len = n / 2;
	return 0;
}

static void failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct attacker *a = arg;
	(void)ep;
	a->failed = status;
}

static int open_attacker(struct attacker *a, const char *tls, const uint8_t *address)
{
	ucp_config_t *config;
	if (ucp_config_read(NULL, NULL, &config) != UCS_OK)
		return -1;
	if (tls[0])
		ucp_config_modify(config, "TLS", tls);
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
	                       .features = UCP_FEATURE_AM | UCP_FEATURE_RMA};
	ucs_status_t st = ucp_init(&params, config, &a->context);
	ucp_config_release(config);
	if (st != UCS_OK) {
		fprintf(stderr, "attacker: ucp_init: %s\n", ucs_status_string(st));
		return -1;
	}
	a->rma = true;
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SINGLE};
	if ((st = ucp_worker_create(a->context, &wp, &a->worker)) != UCS_OK) {
		fprintf(stderr, "attacker: ucp_worker_create: %s\n", ucs_status_string(st));
		return -1;
	}
	ucp_ep_params_t ep = {
	        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
	                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
	        .address = (const ucp_address_t *)address,
	        .err_mode = strcmp(tls, "tcp") == 0 ? UCP_ERR_HANDLING_MODE_PEER
	                                            : UCP_ERR_HANDLING_MODE_NONE,
	        .err_handler = {.cb = failed, .arg = a},
	};
	if ((st = ucp_ep_create(a->worker, &ep, &a->ep)) != UCS_OK) {
		fprintf(stderr, "attacker: ucp_ep_create: %s\n", ucs_status_string(st));
		a->ep = NULL;
		return -1;
	}
	return 0;
}

static void close_attacker(struct attacker *a)
{
	/* An orderly close: UCX 1.13 over tcp can abort the other side when a
	 * connection it made for a peer breaks (docs/ucx.md), and this test
	 * is about writes, not about that. */
	if (a->ep) {
		ucp_request_param_t p = {.op_attr_mask = 0};
		void *req = ucp_ep_close_nbx(a->ep, &p);
		uint64_t deadline = now_ns() + 2 * SECOND;
		while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
		       now_ns() < deadline)
			ucp_worker_progress(a->worker);
		if (UCS_PTR_IS_PTR(req))
			ucp_request_free(req);
	}
	if (a->worker)
		ucp_worker_destroy(a->worker);
	if (a->context)
		ucp_cleanup(a->context);
}

/* Wait for a request, at most 2 s: its status, or UCS_ERR_TIMED_OUT. */
static ucs_status_t wait_request(struct attacker *a, void *req)
{
	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	uint64_t deadline = now_ns() + 2 * SECOND;
	while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ns() < deadline)
		ucp_worker_progress(a->worker);
	ucs_status_t st = ucp_request_check_status(req);
	if (st == UCS_INPROGRESS) {
		ucp_request_cancel(a->worker, req);
		st = UCS_ERR_TIMED_OUT;
	}
	ucp_request_free(req);
	return st;
}

static ucs_status_t send_am(struct attacker *a, unsigned id, const void *header, size_t hlen,
                            const void *data, size_t len)
{
	ucp_request_param_t p = {0};
	return wait_request(a, ucp_am_send_nbx(a->ep, id, header, hlen, data, len, &p));
}

/* The old (wire version 1) write header: magic, region, offset, length,
 * slot, generation, and no token. */
static void old_header(uint32_t region, uint64_t offset, uint64_t len, uint8_t *out)
{
	uint8_t *p = out;
	uint32_t magic = UCX_MAGIC_WRITE;
	memcpy(p, &magic, 4);
	memcpy(p + 4, &region, 4);
	memcpy(p + 8, &offset, 8);
	memcpy(p + 16, &len, 8);
	memset(p + 24, 0, 8);
}

/* A put of SMALL bytes at `addr` with an rkey of our own making: UCX's
 * software RMA never checks it. Returns the flush's status. */
static ucs_status_t put_at(struct attacker *a, uint64_t addr, uint8_t *buf)
{
	ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
	                                         UCP_MEM_MAP_PARAM_FIELD_LENGTH,
	                           .address = buf,
	                           .length = SMALL};
	ucp_mem_h memh;
	ucs_status_t st = ucp_mem_map(a->context, &mp, &memh);
	if (st != UCS_OK)
		return st;
	void *packed;
	size_t packed_len;
	ucp_rkey_h rkey = NULL;
	st = ucp_rkey_pack(a->context, memh, &packed, &packed_len);
	if (st == UCS_OK) {
		st = ucp_ep_rkey_unpack(a->ep, packed, &rkey);
		ucp_rkey_buffer_release(packed);
	}
	if (st == UCS_OK) {
		ucp_request_param_t p = {0};
		st = wait_request(a, ucp_put_nbx(a->ep, buf, SMALL, addr, rkey, &p));
		if (st == UCS_OK)
			st = wait_request(a, ucp_ep_flush_nbx(a->ep, &p));
	}
	if (rkey)
		ucp_rkey_destroy(rkey);
	ucp_mem_unmap(a->context, memh);
	return st;
}

/* ---- The flood ------------------------------------------------------------ */

#define FLOOD_WINDOW 64u /* sends in flight at once */

struct flood {
	struct attacker *a;
	void *reqs[FLOOD_WINDOW];
	unsigned used;
	unsigned refused;
};

static void flood_reap(struct flood *f, unsigned keep)
{
	while (f->used > keep && !f->a->failed) {
		ucp_worker_progress(f->a->worker);
		for (unsigned i = 0; i < f->used;) {
			ucs_status_t st = ucp_request_check_status(f->reqs[i]);
			if (st == UCS_INPROGRESS) {
				i++;
				continue;
			}
			f->refused += st == UCS_ERR_REJECTED;
			ucp_request_free(f->reqs[i]);
			f->reqs[i] = f->reqs[--f->used];
		}
	}
}

static void flood_send(struct flood *f, unsigned id, const void *header, size_t hlen,
                       const void *data, size_t len, uint32_t flags)
{
	ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
	void *req = ucp_am_send_nbx(f->a->ep, id, header, hlen, data, len, &p);
	if (UCS_PTR_IS_PTR(req))
		f->reqs[f->used++] = req;
	flood_reap(f, FLOOD_WINDOW - 1);
}

static void flood(struct attacker *a, const uint8_t *data, bool die)
{
	struct flood f = {.a = a};
	uint8_t header[UCX_WRITE_HEADER_LEN];
	unsigned eager = 0, big = 0, huge_sent = 0, rndv = 0, notices = 0;
	for (uint32_t i = 0; i < 20000 && !a->failed; i++, eager++) {
		ucx_write_encode(&(struct ucx_write){.token = i, .region = i, .len = SMALL},
		                 header);
		flood_send(&f, UCX_AM_WRITE, header, sizeof(header), data, SMALL, 0);
	}
	for (uint32_t i = 0; i < 256 && !a->failed; i++, big++) {
		ucx_write_encode(&(struct ucx_write){.token = i, .region = i, .len = LARGE},
		                 header);
		flood_send(&f, UCX_AM_WRITE, header, sizeof(header), data, LARGE,
		           UCP_AM_SEND_FLAG_EAGER);
	}
	/* One eager message as large as a chunk the migration itself moves:
	 * UCX assembles it whole before the handler drops it. */
	uint8_t *huge = malloc(HUGE);
	if (huge && !a->failed) {
		memset(huge, 0xee, HUGE);
		ucx_write_encode(&(struct ucx_write){.token = 1, .region = 1, .len = HUGE}, header);
		flood_send(&f, UCX_AM_WRITE, header, sizeof(header), huge, HUGE,
		           UCP_AM_SEND_FLAG_EAGER);
		flood_reap(&f, 0);
		huge_sent = 1;
	}
	free(huge);
	for (uint32_t i = 0; i < 256 && !a->failed; i++, rndv++) {
		ucx_write_encode(&(struct ucx_write){.token = i, .region = i, .len = LARGE},
		                 header);
		flood_send(&f, UCX_AM_WRITE, header, sizeof(header), data, LARGE,
		           UCP_AM_SEND_FLAG_RNDV);
	}
	for (uint64_t t = 0; t < 2000 && !a->failed; t++, notices++) {
		uint8_t note[UCX_NOTE_HEADER_LEN];
		ucx_note_encode(&(struct ucx_note){.kind = UCX_NOTE_BYE, .token = t}, note);
		flood_send(&f, UCX_AM_NOTE, note, sizeof(note), NULL, 0, 0);
	}
	if (die) {
		/* A last burst, then gone without a word. */
		for (uint32_t i = 0; i < FLOOD_WINDOW / 2 && !a->failed; i++) {
			ucx_write_encode(&(struct ucx_write){.token = i, .region = i, .len = LARGE},
			                 header);
			flood_send(&f, UCX_AM_WRITE, header, sizeof(header), data, LARGE,
			           UCP_AM_SEND_FLAG_EAGER);
		}
		printf("flood: %u eager, %u eager of %u, %u of %u, %u rendezvous of %u, %u "
		       "notices; dying\n",
		       eager, big, LARGE, huge_sent, HUGE, rndv, LARGE, notices);
		fflush(stdout);
		kill(getpid(), SIGKILL);
	}
	flood_reap(&f, 0);
	printf("flood: %u eager, %u eager of %u, %u of %u, %u rendezvous of %u (%u refused), %u "
	       "notices%s%s\n",
	       eager, big, LARGE, huge_sent, HUGE, rndv, LARGE, f.refused, notices,
	       a->failed ? "; endpoint failed: " : "",
	       a->failed ? ucs_status_string(a->failed) : "");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr,
		        "usage: %s TLS WORKER-ADDRESS-HEX [IDS] [--ram ADDR] [--flood [--die]]\n",
		        argv[0]);
		return 2;
	}
	const char *tls = argv[1];
	unsigned ids = 1000;
	uint64_t ram = 0;
	bool flooding = false, die = false;
	for (int i = 3; i < argc; i++) {
		if (strcmp(argv[i], "--ram") == 0 && i + 1 < argc)
			ram = strtoull(argv[++i], NULL, 0);
		else if (strcmp(argv[i], "--flood") == 0)
			flooding = true;
		else if (strcmp(argv[i], "--die") == 0)
			die = true;
		else
			ids = (unsigned)strtoul(argv[i], NULL, 0);
	}
	uint8_t address[4096];
	size_t len;
	if (from_hex(argv[2], address, sizeof(address), &len)) {
		fprintf(stderr, "attacker: bad worker address\n");
		return 2;
	}
	struct attacker a = {0};
	if (open_attacker(&a, tls, address)) {
		close_attacker(&a);
		return 2;
	}
	uint8_t *data = malloc(LARGE);
	if (!data)
		return 2;
	memset(data, 0xee, LARGE);
	if (flooding) {
		flood(&a, data, die);
		free(data);
		close_attacker(&a);
		return 0;
	}
	unsigned eager = 0, rndv = 0, refused = 0, notices = 0, puts = 0, sent_ok = 0;
	unsigned lost = 0;
	for (uint32_t id = 1; id <= ids && !a.failed; id++) {
		uint64_t guess = 0;
		switch (id % 4) {
		case 1:
			guess = 1;
			break;
		case 2:
			guess = id;
			break;
		case 3:
			if (getrandom(&guess, sizeof(guess), 0) != sizeof(guess))
				guess = 7;
			break;
		}
		uint8_t header[UCX_WRITE_HEADER_LEN];
		ucx_write_encode(&(struct ucx_write){.token = guess,
		                                     .region = id,
		                                     .offset = offsets[id % 3],
		                                     .len = SMALL},
		                 header);
		ucs_status_t st = send_am(&a, UCX_AM_WRITE, header, sizeof(header), data, SMALL);
		eager++;
		sent_ok += st == UCS_OK;
		lost += st != UCS_OK;
		uint8_t old[32];
		old_header(id, offsets[id % 3], SMALL, old);
		st = send_am(&a, UCX_AM_WRITE, old, sizeof(old), data, SMALL);
		eager++;
		sent_ok += st == UCS_OK;
		lost += st != UCS_OK;
	}
	/* By rendezvous: the destination's handler answers these itself. */
	for (uint32_t id = 1; id <= 3 && !a.failed; id++) {
		uint8_t header[UCX_WRITE_HEADER_LEN];
		ucx_write_encode(&(struct ucx_write){.token = id, .region = id, .len = LARGE},
		                 header);
		ucs_status_t st = send_am(&a, UCX_AM_WRITE, header, sizeof(header), data, LARGE);
		rndv++;
		refused += st == UCS_ERR_REJECTED;
	}
	for (uint64_t t = 0; t < 8 && !a.failed; t++) {
		uint8_t header[UCX_NOTE_HEADER_LEN];
		ucx_note_encode(&(struct ucx_note){.kind = UCX_NOTE_BYE, .token = t}, header);
		send_am(&a, UCX_AM_NOTE, header, sizeof(header), NULL, 0);
		notices++;
	}
	const char *put_result = "not tried";
	if (ram && !a.failed) {
		ucs_status_t st = UCS_OK;
		for (unsigned i = 0; i < 4 && st != UCS_ERR_TIMED_OUT; i++, puts++)
			st = put_at(&a, ram + offsets[i % 3], data);
		put_result = ucs_status_string(st);
	}
	printf("attack: %u writes (%u eager: %u sent, %u lost; %u rendezvous: %u refused), %u "
	       "notices, %u puts: %s%s%s\n",
	       eager + rndv, eager, sent_ok, lost, rndv, refused, notices, puts, put_result,
	       a.failed ? "; endpoint failed: " : "",
	       a.failed ? ucs_status_string(a.failed) : "");
	fflush(stdout);
	free(data);
	close_attacker(&a);
	return 0;
}
