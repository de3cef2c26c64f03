/* Postcopy over the plugin under test (LMT_TEST_PLUGIN): a guest that
 * dirties faster than a slow link carries (max-bandwidth in the passes,
 * switchover-bandwidth in the estimate) never becomes ready; with
 * postcopy=on the destination runs it after one pass (postcopy-after) or
 * at once (lmt_save_postcopy), its "vCPUs" touch and write pages while
 * the rest arrives, and at the end every page the destination guest wrote
 * holds what it wrote and every other page is the source's at the pause,
 * bit for bit. A cancel on either side during postcopy ends both with
 * status postcopy-failed, and a thread blocked on a missing page is woken
 * with SIGSEGV rather than left waiting. Exits 77 where userfaultfd
 * cannot be opened. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"
#include "hugepages.h"

#define RAM_BYTES (16ull << 20)
#define HUGE_PAGES (RAM_BYTES / HUGE_PAGE_SIZE)
#define PAGE GUEST_PAGE_SIZE
#define VCPUS 2
#define MARK 0xa5u

/* ---- surviving a page lmt made inaccessible ---- */

static _Thread_local sigjmp_buf *volatile segv_jump;

static void on_segv(int sig, siginfo_t *info, void *ctx)
{
	(void)info;
	(void)ctx;
	if (!segv_jump) {
		signal(sig, SIG_DFL);
		raise(sig);
	}
	siglongjmp(*segv_jump, 1);
}

static void catch_segv(void)
{
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, NULL);
}

/* ---- the destination: lmt_load_run, then "vCPUs" and lmt_load_finish ---- */

struct vcpu {
	pthread_t thread;
	struct guest_ram *ram;
	uint8_t *wrote; /* a byte per page: written by the destination guest */
	uint64_t seed;
	_Atomic bool *stop;
	_Atomic uint64_t touched;
	bool segv;
	_Atomic bool ended;
};

/* Read pages at random and write some, until told to stop or a page
 * turns out inaccessible (a failed postcopy). Every write is the same
 * mark, so vCPUs may write the same page. */
static void *vcpu_run(void *arg)
{
	struct vcpu *v = arg;
	sigjmp_buf jump;
	segv_jump = &jump;
	if (sigsetjmp(jump, 1)) {
		v->segv = true;
		segv_jump = NULL;
		atomic_store(&v->ended, true);
		return NULL;
	}
	uint64_t pages = v->ram->bytes / PAGE;
	while (!atomic_load(v->stop)) {
		uint64_t p = guest_random(&v->seed) % pages;
		volatile uint8_t *at = v->ram->base + p * PAGE;
		(void)at[guest_random(&v->seed) % PAGE];
		if (guest_random(&v->seed) % 4 == 0) {
			memset((uint8_t *)at, MARK, PAGE);
			v->wrote[p] = 1;
		}
		atomic_fetch_add(&v->touched, 1);
	}
	segv_jump = NULL;
	atomic_store(&v->ended, true);
	return NULL;
}

struct dest {
	pthread_t thread;
	struct guest_ram ram;
	lmt_session *s;
	uint16_t port;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool listening;
	int run_rc, finish_rc;
	bool cancel_in_postcopy; /* cancel the destination once its guest runs */
	struct vcpu vcpus[VCPUS];
	_Atomic bool vcpus_started;
	uint8_t *wrote;
	_Atomic bool stop;
	struct lmt_stats stats;
	uint64_t run_returned_ns;
};

static void vcpus_wait_touching(struct dest *d);

/* The destination's load in a thread, its vCPUs running until the load
 * fails (the test kills the source). */
static void *dest_run_until_killed(void *arg)
{
	struct dest *d = arg;
	d->run_rc = lmt_load_run(d->s);
	if (d->run_rc) {
		d->finish_rc = d->run_rc;
		atomic_store(&d->vcpus_started, true);
		return NULL;
	}
	for (int i = 0; i < VCPUS; i++) {
		d->vcpus[i] = (struct vcpu){
		        .ram = &d->ram, .wrote = d->wrote, .seed = 91 + (uint64_t)i, .stop = &d->stop};
		pthread_create(&d->vcpus[i].thread, NULL, vcpu_run, &d->vcpus[i]);
	}
	atomic_store(&d->vcpus_started, true);
	d->finish_rc = lmt_load_finish(d->s);
	if (d->finish_rc == 0)
		atomic_store(&d->stop, true);
	for (int i = 0; i < VCPUS; i++)
		pthread_join(d->vcpus[i].thread, NULL);
	lmt_session_stats(d->s, &d->stats);
	return NULL;
}

/* Until the vCPUs have run into some pages (the guest truly runs). */
static void vcpus_wait_touching(struct dest *d)
{
	for (int i = 0; i < VCPUS; i++)
		while (atomic_load(&d->vcpus[i].touched) < 16 && !atomic_load(&d->vcpus[i].ended))
			usleep(1000);
}

static void *dest_run(void *arg)
{
	struct dest *d = arg;
	pthread_mutex_lock(&d->lock);
	d->listening = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	d->run_rc = lmt_load_run(d->s);
	d->run_returned_ns = guest_now_ns();
	if (d->run_rc) {
		d->finish_rc = d->run_rc;
		return NULL;
	}
	for (int i = 0; i < VCPUS; i++) {
		d->vcpus[i] = (struct vcpu){
		        .ram = &d->ram, .wrote = d->wrote, .seed = 77 + (uint64_t)i, .stop = &d->stop};
		pthread_create(&d->vcpus[i].thread, NULL, vcpu_run, &d->vcpus[i]);
	}
	atomic_store(&d->vcpus_started, true);
	if (d->cancel_in_postcopy) {
		vcpus_wait_touching(d);
		lmt_cancel(d->s);
	}
	d->finish_rc = lmt_load_finish(d->s);
	if (d->finish_rc == 0) {
		/* The guest runs on a little with every page there. */
		usleep(10000);
		atomic_store(&d->stop, true);
	} else {
		/* Failed: pages are missing for good, and each vCPU runs into
		 * one (SIGSEGV) before long; a test that hangs here has found
		 * a vCPU lmt left blocked. */
		for (int i = 0; i < VCPUS; i++)
			while (!atomic_load(&d->vcpus[i].ended))
				usleep(1000);
	}
	for (int i = 0; i < VCPUS; i++)
		pthread_join(d->vcpus[i].thread, NULL);
	lmt_session_stats(d->s, &d->stats);
	return NULL;
}

static _Atomic int in_place_blocks = -1;

/* The destination's switch says how many blocks it writes in place. */
static void on_log(void *opaque, enum lmt_log_level level, const char *msg)
{
	(void)opaque;
	(void)level;
	unsigned n;
	const char *at = strstr(msg, "pages to come, ");
	if (at && sscanf(at, "pages to come, %u", &n) == 1)
		atomic_store(&in_place_blocks, (int)n);
}

/* What the destination's RAM is: private anonymous memory or a memfd, of
 * 4 KiB pages or of 2 MiB huge pages (MAP_HUGETLB, a hugetlbfs memfd);
 * huge pages are migrated as such, blocks of 2 MiB pages on both sides. */
enum memory { ANONYMOUS, MEMFD, HUGE_PRIVATE, HUGE_FILE };

static bool is_file(enum memory m)
{
	return m == MEMFD || m == HUGE_FILE;
}

static bool is_huge(enum memory m)
{
	return m == HUGE_PRIVATE || m == HUGE_FILE;
}

/* RAM at a 2 MiB boundary, as VMMs map it (the switch then moves its
 * pages aside a page table at a time), or a page past one (lmt drops the
 * pages still to come instead): private anonymous memory, or the memfd
 * `fd` shared; of huge pages with `huge` (always aligned). */
static uint8_t *map_at(uint64_t bytes, int fd, bool aligned, bool huge)
{
	const uint64_t table = 2ull << 20;
	uint8_t *area = mmap(NULL, bytes + 2 * table, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(area != MAP_FAILED);
	uint8_t *at = (uint8_t *)(((uintptr_t)area + table - 1) & ~(uintptr_t)(table - 1));
	if (!aligned)
		at += PAGE;
	munmap(area, bytes + 2 * table);
	int flags = fd >= 0 ? MAP_SHARED | MAP_FIXED : MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
	if (huge && fd < 0)
		flags |= MAP_HUGETLB | MAP_HUGE_2MB;
	uint8_t *p = mmap(at, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
	assert_true(p == at);
	return p;
}

/* A session over `ram` in blocks of `page`-byte pages; from the memfd
 * `fd` where it is one (the blocks added by descriptor). */
static lmt_session *paged_session(enum lmt_role role, struct guest_ram *ram, const char *opts,
                                  uint32_t page, int fd)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	if (lmt_session_new(&s, role, test_plugin(), opts, &err))
		fail_msg("session: %s", err.message);
	const char *extra = getenv("LMT_TEST_OPTIONS");
	if (extra && *extra)
		assert_int_equal(lmt_session_set_options(s, extra), 0);
	for (uint32_t i = 0; i < ram->nblocks; i++) {
		struct guest_block *b = &ram->blocks[i];
		int rc = fd >= 0 ? lmt_session_add_block_fd(s, b->name, b->host, b->length, page, fd,
		                                            (uint64_t)(b->host - ram->base))
		                 : lmt_session_add_block(s, b->name, b->host, b->length, page);
		if (rc)
			fail_msg("block '%s': %s", b->name, lmt_session_error(s)->message);
	}
	return s;
}

static void dest_start_on(struct dest *d, const char *opts, enum memory m, bool aligned)
{
	memset(d, 0, sizeof(*d));
	d->wrote = calloc(RAM_BYTES / PAGE, 1);
	assert_non_null(d->wrote);
	int fd = -1;
	if (is_file(m)) {
		fd = memfd_create("postcopy-guest",
		                  MFD_CLOEXEC | (is_huge(m) ? MFD_HUGETLB | MFD_HUGE_2MB : 0));
		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, RAM_BYTES), 0);
	}
	guest_ram_layout(&d->ram, map_at(RAM_BYTES, fd, aligned, is_huge(m)), RAM_BYTES);
	d->s = paged_session(LMT_ROLE_DESTINATION, &d->ram, opts,
	                     is_huge(m) ? HUGE_PAGE_SIZE : PAGE, fd);
	if (fd >= 0)
		close(fd);
	assert_int_equal(lmt_load_listen(d->s, "127.0.0.1:0", &d->port), 0);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	pthread_create(&d->thread, NULL, dest_run, d);
	pthread_mutex_lock(&d->lock);
	while (!d->listening)
		pthread_cond_wait(&d->cond, &d->lock);
	pthread_mutex_unlock(&d->lock);
}

static void dest_start(struct dest *d, const char *opts)
{
	dest_start_on(d, opts, ANONYMOUS, false);
}

static void dest_join(struct dest *d)
{
	pthread_join(d->thread, NULL);
}

static void dest_end(struct dest *d)
{
	lmt_session_free(d->s);
	munmap(d->ram.base, RAM_BYTES);
	free(d->wrote);
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->cond);
}

/* ---- the source ---- */

struct source {
	struct guest_ram ram;
	lmt_session *s;
	struct guest_workload *work;
	uint64_t *sums; /* each page's checksum at the pause */
	struct lmt_stats stats;
};

static void throttle(void *opaque, uint32_t percent)
{
	guest_workload_throttle(opaque, percent);
}

/* The dirty bitmap of a block of 2 MiB pages: a huge page is dirty when
 * any of its 4 KiB pages the workload wrote is. */
static int huge_dirty_sync(void *opaque, uint32_t block, uint64_t *bitmap, uint64_t npages)
{
	struct guest_ram *ram = opaque;
	const uint64_t words = HUGE_PAGE_SIZE / PAGE / 64; /* per huge page */
	if (block >= ram->nblocks || npages != ram->blocks[block].length / HUGE_PAGE_SIZE)
		return -LMT_EINVAL;
	struct guest_block *b = &ram->blocks[block];
	for (uint64_t h = 0; h < npages; h++) {
		uint64_t any = 0;
		for (uint64_t w = h * words; w < (h + 1) * words; w++)
			any |= atomic_exchange_explicit(&b->dirty[w], 0, memory_order_acquire);
		if (any)
			bitmap[h / 64] |= 1ull << (h % 64);
	}
	return 0;
}

/* The source guest: private anonymous RAM in 4 KiB pages, or private huge
 * pages migrated as 2 MiB pages. */
static void source_start_on(struct source *src, const char *opts, uint16_t port, bool huge)
{
	memset(src, 0, sizeof(*src));
	if (huge) {
		guest_ram_layout(&src->ram, map_at(RAM_BYTES, -1, true, true), RAM_BYTES);
		guest_ram_fill(&src->ram, 0.1, 5);
		assert_int_equal(guest_ram_alloc_dirty(&src->ram), 0);
	} else {
		ram_fill(&src->ram, RAM_BYTES, 5);
	}
	/* The guest dirties 128 MiB/s over 8 MiB; the link lets 32 MB/s by. */
	assert_int_equal(guest_workload_start(&src->work, &src->ram, 8u << 20, 128u << 20, 9), 0);
	src->s = paged_session(LMT_ROLE_SOURCE, &src->ram, opts, huge ? HUGE_PAGE_SIZE : PAGE, -1);
	assert_int_equal(lmt_session_set_dirty_sync(src->s,
	                                            huge ? huge_dirty_sync : guest_dirty_sync,
	                                            &src->ram),
	                 0);
	assert_int_equal(lmt_session_set_throttle(src->s, throttle, src->work), 0);
	char uri[64];
	snprintf(uri, sizeof(uri), "127.0.0.1:%u", port);
	if (lmt_save_setup(src->s, uri))
		fail_msg("setup: %s", lmt_session_error(src->s)->message);
}

static void source_start(struct source *src, const char *opts, uint16_t port)
{
	source_start_on(src, opts, port, false);
}

/* Pause the guest and note every page as it is now. */
static void source_pause(struct source *src)
{
	guest_workload_stop(src->work);
	src->work = NULL;
	uint64_t pages = src->ram.bytes / PAGE;
	src->sums = malloc(pages * sizeof(*src->sums));
	assert_non_null(src->sums);
	for (uint64_t p = 0; p < pages; p++)
		src->sums[p] = guest_checksum(src->ram.base + p * PAGE, PAGE);
}

static void source_end(struct source *src)
{
	guest_workload_stop(src->work);
	lmt_session_free(src->s);
	free(src->sums);
	ram_release(&src->ram);
}

/* ---- pushes held back until a fault has been served ---- */

/* The background pushes crawl at CRAWL until the source has sent a page a
 * destination vCPU faulted on, then go at FULL: the assertions that
 * faults were served hold however late the destination's vCPUs get a
 * core (a slow host, a guest under TCG with the sanitizers). The switch
 * to FULL is max-bandwidth changed from another thread while postcopy
 * runs, as a VMM would. */
#define CRAWL "256K"
#define FULL "32M"

struct speed_up {
	pthread_t thread;
	lmt_session *s;
	_Atomic bool stop;
	int rc; /* of the change to FULL; 1: it was not made */
};

static void *speed_up_run(void *arg)
{
	struct speed_up *u = arg;
	struct lmt_stats st;
	u->rc = 1;
	for (;;) {
		lmt_session_stats(u->s, &st);
		if (st.postcopy_requested > 0)
			break;
		/* Ended before any fault was served: the test's own
		 * assertions say what went wrong. */
		if (atomic_load(&u->stop) || st.status == LMT_STATUS_COMPLETED ||
		    st.status == LMT_STATUS_FAILED || st.status == LMT_STATUS_CANCELLED ||
		    st.status == LMT_STATUS_POSTCOPY_FAILED)
			return NULL;
		usleep(1000);
	}
	u->rc = lmt_session_set_option(u->s, "max-bandwidth", FULL);
	return NULL;
}

/* From now on: pushes at CRAWL until a fault has been served. */
static void speed_up_start(struct speed_up *u, lmt_session *s)
{
	memset(u, 0, sizeof(*u));
	u->s = s;
	assert_int_equal(lmt_session_set_option(s, "max-bandwidth", CRAWL), 0);
	assert_int_equal(pthread_create(&u->thread, NULL, speed_up_run, u), 0);
}

/* Once the source has finished: the change to FULL was made. */
static void speed_up_end(struct speed_up *u)
{
	atomic_store(&u->stop, true);
	pthread_join(u->thread, NULL);
	if (u->rc)
		fail_msg("the pushes were never sped up: %s",
		         u->rc == 1 ? "no fault was served" : lmt_session_error(u->s)->message);
}

/* Every page the destination guest wrote holds its mark; every other is
 * the source's at the pause. */
static void assert_guest_moved(const struct source *src, const struct dest *d)
{
	uint64_t pages = src->ram.bytes / PAGE, wrote = 0;
	static uint8_t marked[PAGE];
	memset(marked, MARK, PAGE);
	for (uint64_t p = 0; p < pages; p++) {
		const uint8_t *at = d->ram.base + p * PAGE;
		if (d->wrote[p]) {
			wrote++;
			if (memcmp(at, marked, PAGE))
				fail_msg("page %llu: the destination guest's write was lost",
				         (unsigned long long)p);
		} else if (guest_checksum(at, PAGE) != src->sums[p]) {
			fail_msg("page %llu differs from the source's at the pause",
			         (unsigned long long)p);
		}
	}
	assert_true(wrote > 0);
}

/* A link of 32 MiB/s, in the passes and in the pause. */
#define OPTS                                                                                       \
	"postcopy=on,max-bandwidth=32M,switchover-bandwidth=32M,downtime-limit=10ms,idle-timeout=" \
	"5s"

/* The guest never converges at 32 MB/s; after one pass lmt says to switch. */
static void after_one_pass(enum memory m, bool aligned)
{
	struct dest d;
	struct source src;
	atomic_store(&in_place_blocks, -1);
	dest_start_on(&d, "postcopy=on,idle-timeout=5s", m, aligned);
	source_start_on(&src, OPTS ",postcopy-after=1", d.port, is_huge(m));
	struct lmt_iterate_result it = {0};
	uint32_t calls = 0;
	do {
		assert_int_equal(lmt_save_iterate(src.s, &it), 0);
		assert_true(++calls < 100000);
	} while (!it.ready);
	assert_int_equal(it.postcopy, 1);
	assert_int_equal(it.pass, 1);
	source_pause(&src);
	struct speed_up u;
	speed_up_start(&u, src.s);
	if (lmt_save_complete(src.s, "state", 5))
		fail_msg("switch: %s", lmt_session_error(src.s)->message);
	lmt_session_stats(src.s, &src.stats);
	assert_int_equal(src.stats.status, LMT_STATUS_POSTCOPY);
	if (lmt_save_finish(src.s))
		fail_msg("finish: %s", lmt_session_error(src.s)->message);
	speed_up_end(&u);
	lmt_session_stats(src.s, &src.stats);
	assert_int_equal(src.stats.status, LMT_STATUS_COMPLETED);
	assert_true(src.stats.postcopy_pages > 0);
	assert_true(src.stats.postcopy_requested > 0);
	dest_join(&d);
	assert_int_equal(d.run_rc, 0);
	if (d.finish_rc)
		fail_msg("destination: %s", lmt_session_error(d.s)->message);
	assert_int_equal(d.stats.status, LMT_STATUS_COMPLETED);
	assert_true(d.stats.postcopy_pages > 0);
	assert_true(d.stats.faults > 0);
	const void *state;
	size_t len;
	assert_int_equal(lmt_load_device_state(d.s, &state, &len), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(state, "state", 5);
	assert_guest_moved(&src, &d);
	/* A memfd's pages are written in place, anonymous memory's staged. */
	assert_int_equal(atomic_load(&in_place_blocks), is_file(m) ? (int)d.ram.nblocks : 0);
	source_end(&src);
	dest_end(&d);
}

static void test_postcopy_after_one_pass_moves_the_guest_bit_for_bit(void **unused)
{
	(void)unused;
	after_one_pass(ANONYMOUS, true);
}

/* Destination RAM in a memfd: the source writes the pages through a
 * second mapping of it, and UFFDIO_CONTINUE maps them for the guest. */
static void test_postcopy_into_a_memfd_writes_pages_in_place(void **unused)
{
	(void)unused;
	after_one_pass(MEMFD, true);
}

/* The same where the RAM is not on a 2 MiB boundary: the pages still to
 * come are taken out of the mapping one run at a time instead. */
static void test_postcopy_into_unaligned_memory(void **unused)
{
	(void)unused;
	after_one_pass(MEMFD, false);
	after_one_pass(ANONYMOUS, false);
}

/* Huge pages on both sides, migrated as 2 MiB pages: a hugetlbfs memfd
 * written in place (the kernel cannot move its pages aside: the coming
 * ones leave the mapping), and private huge pages placed from staging
 * slots of a huge page each. Neither has UFFDIO_ZEROPAGE. */
static void test_postcopy_into_huge_pages(void **unused)
{
	(void)unused;
	char why[256];
	if (!huge_pages_take(2 * HUGE_PAGES, why, sizeof(why))) {
		printf("skipped: %s\n", why);
		skip();
	}
	after_one_pass(HUGE_FILE, true);
	after_one_pass(HUGE_PRIVATE, true);
	huge_pages_return();
}

/* The switch at once, before any pass: every page comes after it. */
static void test_postcopy_before_any_pass_sends_every_page_after_the_switch(void **unused)
{
	(void)unused;
	struct dest d;
	struct source src;
	dest_start(&d, "postcopy=on,channels=2,idle-timeout=5s");
	source_start(&src, "postcopy=on,channels=2,idle-timeout=5s", d.port);
	source_pause(&src);
	struct speed_up u;
	speed_up_start(&u, src.s);
	if (lmt_save_postcopy(src.s, NULL, 0))
		fail_msg("switch: %s", lmt_session_error(src.s)->message);
	/* Switched: the passes are over, and a second switch is refused. */
	struct lmt_iterate_result it;
	assert_int_equal(lmt_save_iterate(src.s, &it), -LMT_ESTATE);
	assert_int_equal(lmt_save_postcopy(src.s, NULL, 0), -LMT_ESTATE);
	assert_int_equal(lmt_save_complete(src.s, NULL, 0), -LMT_ESTATE);
	if (lmt_save_finish(src.s))
		fail_msg("finish: %s", lmt_session_error(src.s)->message);
	speed_up_end(&u);
	lmt_session_stats(src.s, &src.stats);
	assert_int_equal(src.stats.channels, 3); /* two, and the faults' own */
	assert_int_equal(src.stats.postcopy_pages, RAM_BYTES / PAGE);
	assert_true(src.stats.postcopy_requested > 0);
	dest_join(&d);
	if (d.finish_rc)
		fail_msg("destination: %s", lmt_session_error(d.s)->message);
	assert_int_equal(d.stats.postcopy_pages, RAM_BYTES / PAGE);
	assert_int_equal(d.stats.bytes_received, src.stats.bytes_sent);
	assert_guest_moved(&src, &d);
	/* A second finish has nothing left to wait for. */
	assert_int_equal(lmt_save_finish(src.s), 0);
	assert_int_equal(lmt_load_finish(d.s), 0);
	source_end(&src);
	dest_end(&d);
}

/* One failure, one code (docs/embedding.md, "Error codes"): the call's,
 * the FAILED event's (exactly one) and lmt_session_error's. */
static void assert_one_code(lmt_session *s, int rc, int want)
{
	const struct lmt_error *e = lmt_session_error(s);
	if (rc != want || e->code != want)
		fail_msg("expected %s, the call gave %s and the error %s: %s", lmt_err_name(want),
		         lmt_err_name(rc), lmt_err_name(e->code), e->message);
	int failed = 0;
	struct lmt_event ev;
	while (lmt_session_next_event(s, &ev) == 1)
		if (ev.type == LMT_EVENT_FAILED && ++failed && ev.code != want)
			fail_msg("the FAILED event has %s, the call %s", lmt_err_name(ev.code),
			         lmt_err_name(want));
	assert_int_equal(failed, 1);
}

/* A cancel in postcopy: both sides end postcopy-failed, and no vCPU of the
 * destination stays blocked on a page that will not come. */
static void cancel_in_postcopy(bool on_source)
{
	struct dest d;
	struct source src;
	catch_segv();
	dest_start(&d, "postcopy=on,idle-timeout=5s");
	d.cancel_in_postcopy = !on_source;
	/* At a crawl, most pages are still to come when the cancel lands,
	 * however late the vCPUs start (faults do not wait for it). */
	source_start(&src, "postcopy=on,max-bandwidth=" CRAWL ",idle-timeout=5s", d.port);
	source_pause(&src);
	if (lmt_save_postcopy(src.s, NULL, 0))
		fail_msg("switch: %s", lmt_session_error(src.s)->message);
	if (on_source) {
		while (!atomic_load(&d.vcpus_started))
			usleep(1000);
		vcpus_wait_touching(&d);
		lmt_cancel(src.s);
	}
	int rc = lmt_save_finish(src.s);
	/* The side that cancelled says so; the other, that its peer did. */
	assert_one_code(src.s, rc, on_source ? -LMT_ECANCELED : -LMT_EPEER);
	lmt_session_stats(src.s, &src.stats);
	assert_int_equal(src.stats.status, LMT_STATUS_POSTCOPY_FAILED);
	dest_join(&d);
	assert_int_equal(d.run_rc, 0);
	assert_one_code(d.s, d.finish_rc, on_source ? -LMT_EPEER : -LMT_ECANCELED);
	assert_int_equal(d.stats.status, LMT_STATUS_POSTCOPY_FAILED);
	bool segv = false;
	for (int i = 0; i < VCPUS; i++)
		segv |= d.vcpus[i].segv;
	if (!segv)
		fail_msg("no vCPU met a missing page after the failure (%llu and %llu touches; "
		         "destination: %s)",
		         (unsigned long long)d.vcpus[0].touched, (unsigned long long)d.vcpus[1].touched,
		         lmt_session_error(d.s)->message);
	source_end(&src);
	dest_end(&d);
}

static void test_source_cancel_in_postcopy_fails_both_and_wakes_vcpus(void **unused)
{
	(void)unused;
	cancel_in_postcopy(true);
}

static void test_destination_cancel_in_postcopy_fails_both_and_wakes_vcpus(void **unused)
{
	(void)unused;
	cancel_in_postcopy(false);
}

/* ---- a peer killed in postcopy ---- */

/* Where a killed peer can leave the survivor inside its transport's lock
 * (docs/testing.md), these cases are skipped, and say why. */
static bool kills_skipped(void)
{
	const char *why = getenv("LMT_TEST_SKIP_PROCESS_FAULTS");
	if (why && *why)
		printf("skipped: %s\n", why);
	return why && *why;
}

static double since_ms(uint64_t t0)
{
	return (double)(guest_now_ns() - t0) / 1e6;
}

/* The source in a child process, killed while the destination's guest
 * runs on half its pages: the destination's load fails at once with
 * postcopy-failed, and its vCPUs get SIGSEGV on the pages that are lost. */
static void test_source_killed_in_postcopy_fails_the_destination_at_once(void **unused)
{
	(void)unused;
	if (kills_skipped())
		skip();
	catch_segv();
	struct dest d;
	memset(&d, 0, sizeof(d));
	d.wrote = calloc(RAM_BYTES / PAGE, 1);
	guest_ram_layout(&d.ram, ram_map(RAM_BYTES), RAM_BYTES);
	d.s = session_with_blocks(LMT_ROLE_DESTINATION, &d.ram, "postcopy=on,idle-timeout=5s");
	assert_int_equal(lmt_load_listen(d.s, "127.0.0.1:0", &d.port), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		struct source src;
		source_start(&src, "postcopy=on,max-bandwidth=2M,idle-timeout=5s", d.port);
		guest_workload_stop(src.work);
		src.work = NULL;
		int rc = lmt_save_postcopy(src.s, NULL, 0);
		if (!rc)
			rc = lmt_save_finish(src.s); /* killed in here */
		_exit(rc ? 1 : 0);
	}
	pthread_mutex_init(&d.lock, NULL);
	pthread_cond_init(&d.cond, NULL);
	pthread_create(&d.thread, NULL, dest_run_until_killed, &d);
	while (!atomic_load(&d.vcpus_started))
		usleep(1000);
	vcpus_wait_touching(&d);
	uint64_t t0 = guest_now_ns();
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	dest_join(&d);
	double ms = since_ms(t0);
	assert_one_code(d.s, d.finish_rc, -LMT_ECONN);
	assert_int_equal(d.stats.status, LMT_STATUS_POSTCOPY_FAILED);
	bool segv = false;
	for (int i = 0; i < VCPUS; i++)
		segv |= d.vcpus[i].segv;
	assert_true(segv);
	/* A dead source closes the control connection: no idle-timeout wait. */
	if (ms > 2000)
		fail_msg("the destination took %.0f ms to notice the killed source", ms);
	printf("destination failed %.1f ms after the source was killed: %s\n", ms,
	       lmt_session_error(d.s)->message);
	dest_end(&d);
}

/* The destination in a child process, killed after the switch: the
 * source's lmt_save_finish fails at once with postcopy-failed. */
static void test_destination_killed_in_postcopy_fails_the_source_at_once(void **unused)
{
	(void)unused;
	if (kills_skipped())
		skip();
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		struct guest_ram ram;
		guest_ram_layout(&ram, ram_map(RAM_BYTES), RAM_BYTES);
		lmt_session *s = session_with_blocks(LMT_ROLE_DESTINATION, &ram,
		                                     "postcopy=on,idle-timeout=5s");
		uint16_t port = 0;
		if (lmt_load_listen(s, "127.0.0.1:0", &port) ||
		    write(pipefd[1], &port, sizeof(port)) != sizeof(port))
			_exit(2);
		int rc = lmt_load_run(s);
		char one = rc ? 'f' : 's';
		if (write(pipefd[1], &one, 1) != 1)
			_exit(2);
		for (;;)
			pause(); /* the guest runs until the kill */
	}
	uint16_t port = 0;
	assert_int_equal(read(pipefd[0], &port, sizeof(port)), sizeof(port));
	struct source src;
	source_start(&src, "postcopy=on,max-bandwidth=2M,idle-timeout=5s", port);
	source_pause(&src);
	if (lmt_save_postcopy(src.s, NULL, 0))
		fail_msg("switch: %s", lmt_session_error(src.s)->message);
	char switched = 0;
	assert_int_equal(read(pipefd[0], &switched, 1), 1);
	assert_int_equal(switched, 's');
	usleep(20000);
	uint64_t t0 = guest_now_ns();
	kill(child, SIGKILL);
	int rc = lmt_save_finish(src.s);
	double ms = since_ms(t0);
	waitpid(child, NULL, 0);
	assert_one_code(src.s, rc, -LMT_ECONN);
	lmt_session_stats(src.s, &src.stats);
	assert_int_equal(src.stats.status, LMT_STATUS_POSTCOPY_FAILED);
	if (ms > 2000)
		fail_msg("the source took %.0f ms to notice the killed destination", ms);
	printf("source failed %.1f ms after the destination was killed: %s\n", ms,
	       lmt_session_error(src.s)->message);
	close(pipefd[0]);
	close(pipefd[1]);
	source_end(&src);
}

static void test_postcopy_is_refused_where_it_cannot_run(void **unused)
{
	(void)unused;
	struct guest_ram ram;
	guest_ram_layout(&ram, ram_map(1u << 20), 1u << 20);
	/* postcopy=off: the explicit switch is refused, the session intact. */
	lmt_session *s = session_with_blocks(LMT_ROLE_SOURCE, &ram, "");
	assert_int_equal(lmt_save_postcopy(s, NULL, 0), -LMT_ESTATE);
	assert_int_equal(lmt_save_finish(s), -LMT_ESTATE);
	lmt_session_free(s);
	/* verify=on cannot cover postcopy yet: said at setup. */
	s = session_with_blocks(LMT_ROLE_DESTINATION, &ram, "postcopy=on,verify=on");
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", NULL), 0);
	assert_true(lmt_load_run(s) < 0);
	assert_non_null(strstr(lmt_session_error(s)->message, "verify=on"));
	lmt_session_free(s);
	/* Pages larger than 2 MiB: said at setup, naming the block. */
	uint8_t *area = mmap(NULL, 8u << 20, PROT_READ | PROT_WRITE,
	                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	assert_true(area != MAP_FAILED);
	uint8_t *big =
	        (uint8_t *)(((uintptr_t)area + (4u << 20) - 1) & ~(uintptr_t)((4u << 20) - 1));
	struct lmt_error err = {0};
	assert_int_equal(
	        lmt_session_new(&s, LMT_ROLE_DESTINATION, test_plugin(), "postcopy=on", &err), 0);
	assert_int_equal(lmt_session_add_block(s, "big", big, 4u << 20, 4u << 20), 0);
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", NULL), 0);
	assert_int_equal(lmt_load_run(s), -LMT_ENOTSUP);
	assert_non_null(strstr(lmt_session_error(s)->message,
	                       "block 'big' has pages of 4194304 bytes; postcopy moves pages of "
	                       "up to 2097152 bytes"));
	lmt_session_free(s);
	munmap(area, 8u << 20);
	/* No userfaultfd: the destination says so before any source comes. */
	s = session_with_blocks(LMT_ROLE_DESTINATION, &ram, "postcopy=on,userfaultfd=off");
	assert_int_equal(lmt_load_listen(s, "127.0.0.1:0", NULL), 0);
	assert_int_equal(lmt_load_run(s), -LMT_ENOTSUP);
	assert_non_null(strstr(lmt_session_error(s)->message,
	                       "postcopy=on: userfaultfd is not available: userfaultfd=off"));
	lmt_session_free(s);
	munmap(ram.base, 1u << 20);
}

static bool userfaultfd_usable(void)
{
	int fd = (int)syscall(SYS_userfaultfd, 0);
	if (fd >= 0) {
		close(fd);
		return true;
	}
	FILE *f = fopen("/dev/userfaultfd", "r+");
	if (f)
		fclose(f);
	return f != NULL;
}

int main(void)
{
	if (!userfaultfd_usable()) {
		printf("SKIP: userfaultfd cannot be opened here (neither /dev/userfaultfd nor the "
		       "system call): postcopy needs it on the destination\n");
		return 77;
	}
	lmt_set_log_handler(on_log, NULL);
	lmt_set_log_level(LMT_LOG_INFO);
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_postcopy_after_one_pass_moves_the_guest_bit_for_bit),
	        cmocka_unit_test(test_postcopy_into_a_memfd_writes_pages_in_place),
	        cmocka_unit_test(test_postcopy_into_unaligned_memory),
	        cmocka_unit_test(test_postcopy_into_huge_pages),
	        cmocka_unit_test(test_postcopy_before_any_pass_sends_every_page_after_the_switch),
	        cmocka_unit_test(test_source_cancel_in_postcopy_fails_both_and_wakes_vcpus),
	        cmocka_unit_test(test_destination_cancel_in_postcopy_fails_both_and_wakes_vcpus),
	        cmocka_unit_test(test_source_killed_in_postcopy_fails_the_destination_at_once),
	        cmocka_unit_test(test_destination_killed_in_postcopy_fails_the_source_at_once),
	        cmocka_unit_test(test_postcopy_is_refused_where_it_cannot_run),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
