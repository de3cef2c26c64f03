/* minivmm: a tiny VMM on raw KVM that runs a self-checking guest and
 * live-migrates it to another minivmm with lmt, as a real VMM embeds it. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lmt/lmt.h>

#include "guest.h"
#include "vm.h"

#define EXIT_USAGE 2
#define EXIT_SKIP 77
#define MS UINT64_C(1000000)
/* How long the destination waits past --verify-ms for a first full check. */
#define FIRST_CHECK_GRACE_MS 30000u
/* How long the source waits for its guest between two ready iterations. */
#define WAIT_FOR_GUEST_MS 20u
/* Passes listed one by one after a migration; the rest are counted. */
#define PASSES_SHOWN 12
/* A migration that failed in the VMM rather than in lmt (never an LMT_E*). */
#define MIGRATION_EVMM (-1000)

struct config {
	const char *listen;
	const char *migrate_to;
	const char *plugin;
	char *options;
	uint64_t ram_size;
	uint32_t stride;
	uint32_t run_ms;
	uint32_t verify_ms;
	uint32_t timeout_ms;
	bool drop_dirty;
};

/* One migration, driven by its own thread while the main thread watches
 * the clock and cancels it when it runs out. */
struct migration {
	const struct config *cfg;
	struct vm *vm;
	lmt_session *session;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int rc;             /* 0, a negative LMT_E* code, or MIGRATION_EVMM */
	uint64_t drop_page; /* --test-drop-dirty: the page never reported */
	uint64_t pause_ns;  /* how long the vCPU took to park */
	struct vm_state state;
};

/* ---- Command line ---------------------------------------------------------- */

static void usage(FILE *out)
{
	fputs("usage: minivmm --listen HOST:PORT | --migrate-to HOST:PORT [options]\n"
	      "       minivmm --check-kvm\n"
	      "  --plugin NAME      lmt transport plugin, name or path (default tcp)\n"
	      "  -o, --options LIST lmt options key=value,... (repeatable)\n"
	      "  --ram SIZE         guest RAM, K/M/G suffixes (default 64M)\n"
	      "  --stride BYTES     source: the guest rewrites one word every BYTES,\n"
	      "                     a power of two from 4 to 4096 (default 4096)\n"
	      "  --run-ms N         source: run the guest this long, then migrate (1000)\n"
	      "  --verify-ms N      destination: run the resumed guest this long (1000)\n"
	      "  --timeout-ms N     cancel a migration that takes longer (60000)\n"
	      "  --test-drop-dirty  source: never report one data page as dirty\n"
	      "  --check-kvm        exit 0 if a VM can be created here, 77 if not\n",
	      out);
}

/* --ram takes a size as lmt's options do (64M, 1G), through lmt's parser. */
static int parse_ram(const char *text, uint64_t *out)
{
	static const struct lmt_option_desc ram = {
	        .name = "--ram", .type = LMT_OPT_SIZE, .doc = "guest RAM"};
	struct lmt_option_value value;

	if (lmt_option_parse(&ram, text, &value, NULL) != 0)
		return -1;
	*out = (uint64_t)value.integer;
	return 0;
}

static int parse_u32(const char *text, uint32_t *out)
{
	char *end;
	unsigned long value;

	errno = 0;
	value = strtoul(text, &end, 10);
	if (errno || end == text || *end || value > UINT32_MAX)
		return -1;
	*out = (uint32_t)value;
	return 0;
}

static int append_options(struct config *cfg, const char *more)
{
	size_t old = cfg->options ? strlen(cfg->options) : 0;
	char *joined = realloc(cfg->options, old + strlen(more) + 2);

	if (!joined)
		return -1;
	if (old)
		joined[old++] = ',';
	strcpy(joined + old, more);
	cfg->options = joined;
	return 0;
}

static int check_config(const struct config *cfg)
{
	if (!cfg->listen == !cfg->migrate_to) {
		fputs("minivmm: give exactly one of --listen and --migrate-to\n", stderr);
		return -1;
	}
	if (cfg->ram_size < VM_RAM_MIN || cfg->ram_size > VM_RAM_MAX ||
	    cfg->ram_size % VM_PAGE_SIZE) {
		fputs("minivmm: --ram: expected a multiple of 4K from 1M to 3G\n", stderr);
		return -1;
	}
	if (cfg->stride < 4 || cfg->stride > VM_PAGE_SIZE || (cfg->stride & (cfg->stride - 1))) {
		fputs("minivmm: --stride: expected a power of two from 4 to 4096\n", stderr);
		return -1;
	}
	if (cfg->drop_dirty && !cfg->migrate_to) {
		fputs("minivmm: --test-drop-dirty is for the source (--migrate-to)\n", stderr);
		return -1;
	}
	return 0;
}

enum {
	OPT_LISTEN = 256,
	OPT_MIGRATE_TO,
	OPT_PLUGIN,
	OPT_RAM,
	OPT_STRIDE,
	OPT_RUN_MS,
	OPT_VERIFY_MS,
	OPT_TIMEOUT_MS,
	OPT_DROP_DIRTY,
	OPT_CHECK_KVM,
};

/* -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, struct config *cfg)
{
	static const struct option longopts[] = {
	        {"listen", required_argument, NULL, OPT_LISTEN},
	        {"migrate-to", required_argument, NULL, OPT_MIGRATE_TO},
	        {"plugin", required_argument, NULL, OPT_PLUGIN},
	        {"options", required_argument, NULL, 'o'},
	        {"ram", required_argument, NULL, OPT_RAM},
	        {"stride", required_argument, NULL, OPT_STRIDE},
	        {"run-ms", required_argument, NULL, OPT_RUN_MS},
	        {"verify-ms", required_argument, NULL, OPT_VERIFY_MS},
	        {"timeout-ms", required_argument, NULL, OPT_TIMEOUT_MS},
	        {"test-drop-dirty", no_argument, NULL, OPT_DROP_DIRTY},
	        {"check-kvm", no_argument, NULL, OPT_CHECK_KVM},
	        {"help", no_argument, NULL, 'h'},
	        {0},
	};
	char why[160];
	int c, bad = 0;

	while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_LISTEN:
			cfg->listen = optarg;
			break;
		case OPT_MIGRATE_TO:
			cfg->migrate_to = optarg;
			break;
		case OPT_PLUGIN:
			cfg->plugin = optarg;
			break;
		case 'o':
			bad |= append_options(cfg, optarg);
			break;
		case OPT_RAM:
			bad |= parse_ram(optarg, &cfg->ram_size);
			break;
		case OPT_STRIDE:
			bad |= parse_u32(optarg, &cfg->stride);
			break;
		case OPT_RUN_MS:
			bad |= parse_u32(optarg, &cfg->run_ms);
			break;
		case OPT_VERIFY_MS:
			bad |= parse_u32(optarg, &cfg->verify_ms);
			break;
		case OPT_TIMEOUT_MS:
			bad |= parse_u32(optarg, &cfg->timeout_ms);
			break;
		case OPT_DROP_DIRTY:
			cfg->drop_dirty = true;
			break;
		case OPT_CHECK_KVM:
			if (vm_probe(why, sizeof(why)) == 0)
				return printf("minivmm: KVM can create a VM here\n"), EXIT_SUCCESS;
			printf("minivmm: no usable KVM here: %s\n", why);
			return EXIT_SKIP;
		case 'h':
			usage(stdout);
			return EXIT_SUCCESS;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
		if (bad) {
			fprintf(stderr, "minivmm: bad value for %s: '%s'\n", argv[optind - 1],
			        optarg);
			return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "minivmm: unexpected argument '%s'\n", argv[optind]);
		return EXIT_USAGE;
	}
	return check_config(cfg) ? EXIT_USAGE : -1;
}

/* ---- The migration thread and its deadline --------------------------------- */

static void migration_init(struct migration *m, const struct config *cfg, struct vm *vm)
{
	pthread_condattr_t attr;

	memset(m, 0, sizeof(*m));
	m->cfg = cfg;
	m->vm = vm;
	m->drop_page = UINT64_MAX;
	pthread_mutex_init(&m->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&m->cond, &attr);
	pthread_condattr_destroy(&attr);
}

static void migration_destroy(struct migration *m)
{
	lmt_session_free(m->session);
	pthread_cond_destroy(&m->cond);
	pthread_mutex_destroy(&m->lock);
}

static void *migration_finish(struct migration *m, int rc)
{
	pthread_mutex_lock(&m->lock);
	m->rc = rc;
	m->done = true;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

/* Run `fn` in the migration thread; cancel the session at the deadline. */
static int migration_run(struct migration *m, void *(*fn)(void *))
{
	uint64_t deadline = vm_now_ns() + m->cfg->timeout_ms * MS;
	struct timespec ts = {
	        .tv_sec = (time_t)(deadline / 1000000000u),
	        .tv_nsec = (long)(deadline % 1000000000u),
	};
	bool cancelled = false;
	int rc = pthread_create(&m->thread, NULL, fn, m);

	if (rc) {
		fprintf(stderr, "minivmm: migration thread: %s\n", strerror(rc));
		return MIGRATION_EVMM;
	}
	pthread_mutex_lock(&m->lock);
	while (!m->done) {
		if (!cancelled && pthread_cond_timedwait(&m->cond, &m->lock, &ts) == ETIMEDOUT) {
			cancelled = true;
			fprintf(stderr, "minivmm: migration timed out after %u ms\n",
			        m->cfg->timeout_ms);
			lmt_cancel(m->session);
		} else if (cancelled) {
			pthread_cond_wait(&m->cond, &m->lock);
		}
	}
	rc = m->rc;
	pthread_mutex_unlock(&m->lock);
	pthread_join(m->thread, NULL);
	return rc;
}

static int session_open(struct migration *m, enum lmt_role role)
{
	struct lmt_error err = {0};
	int rc = lmt_session_new(&m->session, role, m->cfg->plugin, m->cfg->options, &err);

	if (rc == 0)
		rc = lmt_session_add_block(m->session, "pc.ram", m->vm->ram, m->vm->ram_size,
		                           VM_PAGE_SIZE);
	if (rc < 0) {
		if (!err.message[0] && m->session)
			err = *lmt_session_error(m->session);
		fprintf(stderr, "minivmm: %s\n", err.message[0] ? err.message : lmt_strerror(rc));
		return -1;
	}
	return 0;
}

static void print_lmt_error(struct migration *m, int rc)
{
	const struct lmt_error *err = lmt_session_error(m->session);

	if (rc < 0 && rc != MIGRATION_EVMM)
		fprintf(stderr, "minivmm: migration failed: %s\n",
		        err->message[0] ? err->message : lmt_strerror(rc));
}

/* ---- Source ---------------------------------------------------------------- */

/* lmt's dirty-page callback: KVM fills exactly lmt's bitmap layout. */
static int dirty_sync(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages)
{
	struct migration *m = opaque;

	if (block != 0 || npages != m->vm->ram_size / VM_PAGE_SIZE)
		return -LMT_EINVAL;
	if (vm_dirty_log(m->vm, bitmap))
		return -LMT_EIO;
	if (m->drop_page != UINT64_MAX)
		bitmap[m->drop_page / 64] &= ~(UINT64_C(1) << (m->drop_page % 64));
	return 0;
}

/* Iterate while the guest runs, until lmt says the rest fits in the
 * downtime limit. With --test-drop-dirty, also until the guest has
 * rewritten the dropped page since the bulk pass sent it: two full passes
 * of the guest after that pass ended. */
static int pre_copy(struct migration *m)
{
	struct lmt_iterate_result it = {0};
	struct vm_reports r;
	bool bulk_sent = false;
	uint64_t passes_at_bulk = 0;
	int rc;

	for (;;) {
		rc = lmt_save_iterate(m->session, &it);
		if (rc < 0)
			return rc;
		vm_get_reports(m->vm, &r);
		if (r.state != VCPU_RUNNING) {
			fputs("minivmm: source: the guest stopped during the migration\n", stderr);
			return MIGRATION_EVMM;
		}
		if (!bulk_sent && (it.pass >= 2 || it.ready)) {
			bulk_sent = true;
			passes_at_bulk = r.passes_ok;
		}
		if (!it.ready)
			continue;
		if (m->drop_page == UINT64_MAX || r.passes_ok >= passes_at_bulk + 2)
			return 0;
		/* Nothing worth a pass yet: let the guest get on with its work. */
		vm_wait(m->vm, r.events, vm_now_ns() + WAIT_FOR_GUEST_MS * MS, &r);
	}
}

static void *source_main(void *arg)
{
	struct migration *m = arg;
	bool paused = false;
	int rc = lmt_save_setup(m->session, m->cfg->migrate_to);

	if (rc == 0)
		rc = pre_copy(m);
	if (rc == 0) {
		/* Stop-and-copy: from here the guest's registers and RAM hold still. */
		uint64_t start = vm_now_ns();

		paused = vm_pause(m->vm) == 0;
		m->pause_ns = vm_now_ns() - start;
		if (!paused) {
			fputs("minivmm: source: the guest stopped before it was paused\n", stderr);
			rc = MIGRATION_EVMM;
		}
	}
	if (rc == 0 && vm_save_state(m->vm, &m->state))
		rc = MIGRATION_EVMM;
	if (rc == 0)
		rc = lmt_save_complete(m->session, &m->state, sizeof(m->state));
	if (rc && paused)
		vm_resume(m->vm); /* lmt never wrote its memory: it carries on here */
	return migration_finish(m, rc);
}

static double mib(uint64_t bytes)
{
	return (double)bytes / 1048576.0;
}

static double ms(uint64_t ns)
{
	return (double)ns / 1e6;
}

static void print_stats(lmt_session *session, const char *plugin)
{
	struct lmt_pass_stats *passes;
	struct lmt_stats st;
	int n;

	if (lmt_session_stats(session, &st) < 0 || st.passes == 0)
		return;
	printf("minivmm: migration %s over %s: total %.1f ms, downtime %.1f ms, setup %.1f ms,"
	       " %" PRIu64 " passes, %.1f MiB sent in %" PRIu64 " pages (%" PRIu64
	       " zero pages skipped), %.0f MiB/s\n",
	       lmt_status_name(st.status), plugin, ms(st.total_ns), ms(st.downtime_ns),
	       ms(st.setup_ns), st.passes, mib(st.bytes_sent), st.normal_pages, st.zero_pages,
	       mib(st.throughput_bps));
	n = lmt_session_passes(session, NULL, 0);
	passes = n > 0 ? calloc((size_t)n, sizeof(*passes)) : NULL;
	if (!passes)
		return;
	n = lmt_session_passes(session, passes, (uint32_t)n);
	for (int i = 0; i < n; i++) {
		const struct lmt_pass_stats *p = &passes[i];

		/* Show the first passes and the last one. */
		if (i >= PASSES_SHOWN - 1 && i < n - 1) {
			if (i == PASSES_SHOWN - 1)
				printf("minivmm:   ... %d more passes\n", n - PASSES_SHOWN);
			continue;
		}
		printf("minivmm:   pass %u%s: %.1f ms, %.1f MiB sent at %.0f MiB/s, "
		       "%.1f MiB dirtied at %.0f MiB/s",
		       p->pass, p->final ? " (stop-and-copy)" : "", ms(p->duration_ns),
		       mib(p->bytes), mib(p->bandwidth_bps), mib(p->dirtied_bytes),
		       mib(p->dirty_rate_bps));
		if (p->throttle_percent)
			printf(", vCPU throttled %u%%", (unsigned)p->throttle_percent);
		putchar('\n');
	}
	free(passes);
}

/* Let the guest run for `run_ms`; false if it stopped or found bad memory. */
static bool run_guest(struct vm *vm, uint32_t run_ms, struct vm_reports *r)
{
	uint64_t deadline = vm_now_ns() + run_ms * MS;

	vm_get_reports(vm, r);
	while (r->state == VCPU_RUNNING && !r->bad && vm_now_ns() < deadline)
		vm_wait(vm, r->events, deadline, r);
	return r->state == VCPU_RUNNING && !r->bad;
}

/* lmt_throttle_fn (auto-converge=on): the vCPU is held that share of the
 * time. */
static void throttle_vcpu(void *opaque, uint32_t percent)
{
	struct migration *m = opaque;

	vm_throttle(m->vm, percent);
}

static int source_migrate(const struct config *cfg, struct vm *vm)
{
	struct migration m;
	struct vm_reports r;
	int rc;

	migration_init(&m, cfg, vm);
	if (cfg->drop_dirty) {
		m.drop_page =
		        (GUEST_DATA_ADDR + (vm->ram_size - GUEST_DATA_ADDR) / 2) / VM_PAGE_SIZE;
		printf("minivmm: test: never reporting the page at %#" PRIx64 " as dirty\n",
		       m.drop_page * VM_PAGE_SIZE);
	}
	rc = session_open(&m, LMT_ROLE_SOURCE);
	if (rc == 0)
		rc = lmt_session_set_dirty_sync(m.session, dirty_sync, &m);
	if (rc == 0)
		rc = lmt_session_set_throttle(m.session, throttle_vcpu, &m);
	if (rc == 0)
		rc = migration_run(&m, source_main);
	print_lmt_error(&m, rc);
	if (m.session)
		print_stats(m.session, cfg->plugin);
	if (rc == 0) {
		printf("minivmm: source: handed over the guest at pass %u (eip %#llx, "
		       "word %#llx); pausing its vCPU took %.2f ms\n",
		       (unsigned)m.state.regs.rbp, (unsigned long long)m.state.regs.rip,
		       (unsigned long long)m.state.regs.rsi, ms(m.pause_ns));
	} else if (run_guest(vm, cfg->verify_ms, &r)) {
		printf("minivmm: source: the guest runs on here (%" PRIu64 " passes checked)\n",
		       r.passes_ok);
	}
	migration_destroy(&m);
	return rc ? -1 : 0;
}

static int source(const struct config *cfg)
{
	struct vm_reports r;
	struct vm vm;
	int rc = vm_open(&vm, "source", cfg->ram_size, true);

	if (rc == 0)
		rc = vm_boot(&vm, cfg->stride);
	if (rc == 0)
		rc = vm_start(&vm);
	if (rc == 0) {
		printf("minivmm: source: guest running with %.0f MiB of RAM; migrating to %s in "
		       "%u ms\n",
		       mib(cfg->ram_size), cfg->migrate_to, cfg->run_ms);
		if (!run_guest(&vm, cfg->run_ms, &r)) {
			fputs("minivmm: source: the guest stopped before the migration\n", stderr);
			rc = -1;
		}
	}
	if (rc == 0) {
		printf("minivmm: source: the guest has checked its memory %" PRIu64 " times "
		       "(last in pass %u); migrating\n",
		       r.passes_ok, r.last_ok_pass);
		rc = source_migrate(cfg, &vm);
	}
	vm_get_reports(&vm, &r);
	if (r.bad) {
		fprintf(stderr, "minivmm: source: the guest found a bad word at %#x in pass %u\n",
		        r.bad_address, r.bad_pass);
		rc = -1;
	}
	vm_close(&vm);
	return rc ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- Destination ----------------------------------------------------------- */

static void *destination_main(void *arg)
{
	struct migration *m = arg;

	return migration_finish(m, lmt_load_run(m->session));
}

static int destination_listen(struct migration *m)
{
	const char *uri = m->cfg->listen;
	const char *colon = strrchr(uri, ':');
	uint16_t port = 0;
	int rc = lmt_load_listen(m->session, uri, &port);

	if (rc < 0) {
		fprintf(stderr, "minivmm: %s\n", lmt_session_error(m->session)->message);
		return -1;
	}
	/* The test reads this line for the port, so it must be flushed now. */
	printf("minivmm: destination: listening on %.*s:%u\n", (int)(colon ? colon - uri : 0), uri,
	       (unsigned)port);
	fflush(stdout);
	return 0;
}

/* Take the RAM and the vCPU state in, then put the vCPU where it stopped. */
static int destination_load(struct migration *m)
{
	const void *data;
	size_t length;
	int rc = migration_run(m, destination_main);

	if (rc == 0)
		rc = lmt_load_device_state(m->session, &data, &length);
	print_lmt_error(m, rc);
	if (rc == 0)
		rc = vm_load_state(m->vm, data, length);
	if (rc)
		return -1;
	memcpy(&m->state, data, sizeof(m->state));
	printf("minivmm: destination: resuming the guest at pass %u (eip %#llx, word %#llx);"
	       " the source's guest had checked pass %u\n",
	       (unsigned)m->state.regs.rbp, (unsigned long long)m->state.regs.rip,
	       (unsigned long long)m->state.regs.rsi, m->state.last_ok_pass);
	return 0;
}

/* Run the resumed guest for verify-ms and at least until its first full
 * check; print each check as it comes. */
static void destination_watch(const struct config *cfg, struct vm *vm, struct vm_reports *r)
{
	uint64_t start = vm_now_ns();
	uint64_t until = start + cfg->verify_ms * MS;
	uint64_t give_up = until + FIRST_CHECK_GRACE_MS * MS;
	uint64_t printed = 0;

	vm_get_reports(vm, r);
	while (r->state == VCPU_RUNNING && !r->bad) {
		uint64_t now = vm_now_ns();

		if (r->passes_ok > printed) {
			printf("minivmm: destination: guest checked pass %u, %.0f ms after "
			       "resuming\n",
			       r->last_ok_pass, ms(now - start));
			printed = r->passes_ok;
		}
		if (now >= give_up || (now >= until && r->passes_ok > 0))
			break;
		vm_wait(vm, r->events, r->passes_ok ? until : give_up, r);
	}
}

static int destination_verdict(const struct migration *m, const struct vm_reports *r)
{
	if (r->bad) {
		printf("minivmm: destination: FAILED: the guest found a bad word at %#x in "
		       "pass %u\n",
		       r->bad_address, r->bad_pass);
		return -1;
	}
	if (r->state == VCPU_FAILED || r->state == VCPU_HALTED) {
		printf("minivmm: destination: FAILED: the guest stopped\n");
		return -1;
	}
	if (r->passes_ok == 0) {
		printf("minivmm: destination: FAILED: the guest finished no full check\n");
		return -1;
	}
	if (r->first_ok_pass != m->state.last_ok_pass + 1) {
		printf("minivmm: destination: FAILED: the guest did not carry on where it stopped:"
		       " its first check was pass %u, after pass %u on the source\n",
		       r->first_ok_pass, m->state.last_ok_pass);
		return -1;
	}
	printf("minivmm: destination: OK: the guest checked passes %u to %u after the "
	       "migration, all its memory good\n",
	       r->first_ok_pass, r->last_ok_pass);
	return 0;
}

static int destination(const struct config *cfg)
{
	struct migration m;
	struct vm_reports r;
	struct vm vm;
	int rc = vm_open(&vm, "destination", cfg->ram_size, false);

	migration_init(&m, cfg, &vm);
	if (rc == 0)
		rc = session_open(&m, LMT_ROLE_DESTINATION);
	if (rc == 0)
		rc = destination_listen(&m);
	if (rc == 0)
		rc = destination_load(&m);
	if (rc == 0)
		rc = vm_start(&vm);
	if (rc == 0) {
		destination_watch(cfg, &vm, &r);
		vm_stop(&vm);
		vm_get_reports(&vm, &r);
		rc = destination_verdict(&m, &r);
	}
	migration_destroy(&m);
	vm_close(&vm);
	return rc ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
	struct config cfg = {
	        .plugin = "tcp",
	        .ram_size = UINT64_C(64) << 20,
	        .stride = VM_PAGE_SIZE,
	        .run_ms = 1000,
	        .verify_ms = 1000,
	        .timeout_ms = 60000,
	};
	int rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	rc = parse_args(argc, argv, &cfg);
	if (rc < 0)
		rc = cfg.listen ? destination(&cfg) : source(&cfg);
	free(cfg.options);
	return rc;
}
