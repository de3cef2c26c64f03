/* restore=lazy and lmt_load_finish: the guest runs as soon as
 * lmt_load_run returns, threads touch its pages in random order while the
 * rest loads behind them, and every page they see and every page at the
 * end is the saved one, bit for bit; holes, verify, 1 to 4 channels. A
 * file cut short or damaged under a running restore, and a cancel, fail
 * the load and wake the thread waiting on a missing page with SIGSEGV,
 * never hang it or hand it wrong data. Exits 77 where userfaultfd cannot
 * be opened. Where a test needs a fault to wait, the loader is held back
 * by the chaos decorator around the file plugin: its first read stalls
 * (chaos:file, chaos.fault=stall, chaos.at=read:1; docs/testing.md). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (16ull << 20)
#define BIG_RAM_BYTES (64ull << 20)
#define TOUCHERS 2
#define PAGE GUEST_PAGE_SIZE
/* docs/file-format.md: the block table's offset in the header, a block
 * entry's size and its pages' offset. */
#define H_TABLE 40
#define E_SIZE 128u
#define E_PAGES 96

static char test_dir[512];

/* ---- a thread that survives touching a page lmt made inaccessible ---- */

static _Thread_local sigjmp_buf *volatile segv_jump;
static _Thread_local void *volatile segv_addr;

static void on_segv(int sig, siginfo_t *info, void *ctx)
{
	(void)ctx;
	if (!segv_jump) {
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	segv_addr = info->si_addr;
	siglongjmp(*segv_jump, 1);
}

static void catch_segv(void)
{
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO | SA_NODEFER};
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGSEGV, &sa, NULL), 0);
}

/* Read the first byte of `page`: 0, or 1 with *addr where SIGSEGV hit. */
static int touch(const uint8_t *page, uint8_t *byte, void **addr)
{
	sigjmp_buf jump;
	if (sigsetjmp(jump, 1)) {
		segv_jump = NULL;
		*addr = segv_addr;
		return 1;
	}
	segv_jump = &jump;
	*byte = *(const volatile uint8_t *)page;
	segv_jump = NULL;
	return 0;
}

/* ---- saving ---- */

static void path_for(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", test_dir, name);
}

/* Save `ram` (quiet: the guest is paused) to `path`. */
static void save(struct guest_ram *ram, const char *path, const char *opts, const void *state,
                 size_t state_len)
{
	char uri[PATH_MAX + 8];
	lmt_session *s = session_on(LMT_ROLE_SOURCE, ram, "file", opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, ram), 0);
	snprintf(uri, sizeof(uri), "file:%s", path);
	int rc = lmt_save_setup(s, uri);
	for (struct lmt_iterate_result it = {0}; !rc && !it.ready;)
		rc = lmt_save_iterate(s, &it);
	if (!rc)
		rc = lmt_save_complete(s, state, state_len);
	if (rc)
		fail_msg("save with '%s': %s", opts, lmt_session_error(s)->message);
	lmt_session_free(s);
}

/* A guest of `bytes` with random pages, 10% zero, and a run of 1 MiB of
 * zero pages at 2 MiB (a hole run in the file), saved to `name`. */
static void save_guest(struct guest_ram *ram, uint64_t bytes, char *path, size_t size,
                       const char *name, const char *opts)
{
	path_for(path, size, name);
	ram_fill(ram, bytes, 21);
	memset(ram->base + (2 << 20), 0, 1 << 20);
	static const char state[] = "device state saved with the guest";
	save(ram, path, opts, state, sizeof(state));
}

/* The first page at or after `off` that is not all zero (in the file). */
static uint64_t data_page(const struct guest_ram *ram, uint64_t off)
{
	static const uint8_t zero[PAGE];
	while (!memcmp(ram->base + off, zero, PAGE))
		off += PAGE;
	return off;
}

/* ---- the destination ---- */

struct lazy_load {
	lmt_session *d;
	struct guest_ram ram;
	int run_rc;
	char error[600];
};

/* A destination on fresh RAM of `bytes`, listening on the file `path`. */
static lmt_session *listen_on_file_over(struct guest_ram *ram, uint64_t bytes, const char *path,
                                        const char *plugin, const char *opts)
{
	char uri[PATH_MAX + 8];
	guest_ram_layout(ram, ram_map(bytes), bytes);
	lmt_session *d = session_on(LMT_ROLE_DESTINATION, ram, plugin, opts);
	snprintf(uri, sizeof(uri), "file:%s", path);
	assert_int_equal(lmt_load_listen(d, uri, NULL), 0);
	return d;
}

static lmt_session *listen_on_file(struct guest_ram *ram, uint64_t bytes, const char *path,
                                   const char *opts)
{
	return listen_on_file_over(ram, bytes, path, "file", opts);
}

/* What lmt_load_run reads of a file of save_guest's (two blocks, verify
 * off) before the loader's first read: the header with the commit record,
 * the block table, the two page bitmaps and the device state. */
#define RUN_READS 5

/* A lazy restore; with `hold_ms` its loader's first read stalls that
 * long (chaos:file), so that faults wait, or the file changes, before it
 * reads. lmt_load_run itself is not held. */
static void lazy_begin_held(struct lazy_load *l, uint64_t bytes, const char *path, const char *opts,
                            unsigned hold_ms)
{
	char all[512];
	snprintf(all, sizeof(all), "restore=lazy%s%s", opts && *opts ? "," : "", opts ? opts : "");
	if (hold_ms) {
		size_t n = strlen(all);
		snprintf(all + n, sizeof(all) - n,
		         ",chaos.fault=stall,chaos.at=read:%u,chaos.stall=%ums", RUN_READS + 1,
		         hold_ms);
	}
	l->d = listen_on_file_over(&l->ram, bytes, path, hold_ms ? "chaos:file" : "file", all);
	uint64_t t0 = guest_now_ns();
	l->run_rc = lmt_load_run(l->d);
	snprintf(l->error, sizeof(l->error), "%s", lmt_session_error(l->d)->message);
	if (hold_ms && guest_now_ns() - t0 >= hold_ms * 1000000ull / 2)
		fail_msg("lmt_load_run took %llu ms: the stall meant for the loader held it "
		         "(does it read more than %d times now?)",
		         (unsigned long long)((guest_now_ns() - t0) / 1000000), RUN_READS);
}

static void lazy_begin(struct lazy_load *l, uint64_t bytes, const char *path, const char *opts)
{
	lazy_begin_held(l, bytes, path, opts, 0);
}

static void lazy_end(struct lazy_load *l)
{
	lmt_session_free(l->d);
	munmap(l->ram.base, l->ram.bytes);
}

/* The end of a case: the load, the saved guest and its file. */
static void lazy_end_all(struct lazy_load *l, struct guest_ram *saved, const char *path)
{
	lazy_end(l);
	ram_release(saved);
	unlink(path);
}

/* ---- threads touching the guest while it loads ---- */

struct toucher {
	pthread_t thread;
	const struct guest_ram *ram;
	const struct guest_ram *saved;
	uint64_t seed;
	uint64_t pages; /* how many to touch, in random order */
	_Atomic uint64_t touched;
	uint64_t first_wrong; /* offset + 1 of the first page that differed */
	uint64_t segv_offset; /* offset + 1 where SIGSEGV hit */
};

static void *toucher_run(void *arg)
{
	struct toucher *t = arg;
	uint64_t npages = t->ram->bytes / PAGE;
	for (uint64_t i = 0; i < t->pages; i++) {
		uint64_t off = guest_random(&t->seed) % npages * PAGE;
		uint8_t byte;
		void *addr;
		if (touch(t->ram->base + off, &byte, &addr)) {
			t->segv_offset = (uint64_t)((uint8_t *)addr - t->ram->base) + 1;
			break;
		}
		if (t->saved && !t->first_wrong &&
		    memcmp(t->ram->base + off, t->saved->base + off, PAGE))
			t->first_wrong = off + 1;
		atomic_fetch_add(&t->touched, 1);
	}
	return NULL;
}

static void touchers_start(struct toucher *t, int n, const struct guest_ram *ram,
                           const struct guest_ram *saved, uint64_t pages)
{
	for (int i = 0; i < n; i++) {
		t[i] = (struct toucher){
		        .ram = ram, .saved = saved, .seed = 100 + i, .pages = pages};
		assert_int_equal(pthread_create(&t[i].thread, NULL, toucher_run, &t[i]), 0);
	}
}

static void touchers_join(struct toucher *t, int n)
{
	for (int i = 0; i < n; i++)
		assert_int_equal(pthread_join(t[i].thread, NULL), 0);
}

static void assert_same_ram(const struct guest_ram *a, const struct guest_ram *b)
{
	assert_int_equal(a->bytes, b->bytes);
	for (uint64_t off = 0; off < a->bytes; off += PAGE)
		if (memcmp(a->base + off, b->base + off, PAGE))
			fail_msg("restored RAM differs at offset %llu", (unsigned long long)off);
}

/* Whether the thread `tid` waits in the kernel for a page (in
 * handle_userfault), as /proc says. */
static bool waits_on_fault(pid_t tid)
{
	char path[64], wchan[128] = "";
	snprintf(path, sizeof(path), "/proc/self/task/%d/wchan", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(wchan, 1, sizeof(wchan) - 1, f);
	fclose(f);
	wchan[n] = '\0';
	return strstr(wchan, "userfault") != NULL;
}

/* A thread blocked on one page's fault. */
struct waiter {
	pthread_t thread;
	_Atomic pid_t tid;
	const uint8_t *page;
	_Atomic int done;
	int segv;
	void *addr;
};

static void *waiter_run(void *arg)
{
	struct waiter *w = arg;
	uint8_t byte;
	atomic_store(&w->tid, (pid_t)syscall(SYS_gettid));
	w->segv = touch(w->page, &byte, &w->addr);
	atomic_store(&w->done, 1);
	return NULL;
}

/* Start a waiter on `page` and return once it is blocked on its fault. */
static void waiter_start(struct waiter *w, const uint8_t *page)
{
	*w = (struct waiter){.page = page};
	catch_segv(); /* cmocka sets its own handler for each test */
	assert_int_equal(pthread_create(&w->thread, NULL, waiter_run, w), 0);
	for (int i = 0; i < 5000 && !(atomic_load(&w->tid) && waits_on_fault(atomic_load(&w->tid)));
	     i++)
		usleep(1000);
	assert_true(waits_on_fault(atomic_load(&w->tid)));
	assert_int_equal(atomic_load(&w->done), 0);
}

/* The waiter must end (within 5 s) with SIGSEGV on its page. */
static void waiter_expect_segv(struct waiter *w)
{
	for (int i = 0; i < 5000 && !atomic_load(&w->done); i++)
		usleep(1000);
	if (!atomic_load(&w->done))
		fail_msg("the thread waiting on a missing page was not woken");
	assert_int_equal(pthread_join(w->thread, NULL), 0);
	assert_int_equal(w->segv, 1);
	assert_ptr_equal(w->addr, w->page);
}

/* ---- round trips ---- */

static void lazy_round_trip(const char *save_opts, const char *opts)
{
	struct census before = census_take();
	struct guest_ram ram;
	struct lazy_load l;
	char path[PATH_MAX];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "lazy.lmt", save_opts);
	lazy_begin(&l, RAM_BYTES, path, opts);
	if (l.run_rc)
		fail_msg("lazy restore with '%s': %s", opts, l.error);
	struct toucher t[TOUCHERS];
	touchers_start(t, TOUCHERS, &l.ram, &ram, 2000);
	const void *state;
	size_t state_len;
	assert_int_equal(lmt_load_device_state(l.d, &state, &state_len), 0);
	assert_string_equal(state, "device state saved with the guest");
	int rc = lmt_load_finish(l.d);
	if (rc)
		fail_msg("lmt_load_finish with '%s': %s", opts, lmt_session_error(l.d)->message);
	touchers_join(t, TOUCHERS);
	for (int i = 0; i < TOUCHERS; i++) {
		assert_int_equal(t[i].segv_offset, 0);
		if (t[i].first_wrong)
			fail_msg("a toucher saw wrong data at offset %llu",
			         (unsigned long long)(t[i].first_wrong - 1));
		assert_int_equal(atomic_load(&t[i].touched), 2000);
	}
	assert_same_ram(&ram, &l.ram);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(l.d, &st), 0);
	assert_int_equal(st.status, LMT_STATUS_COMPLETED);
	assert_true(st.resume_ns > 0 && st.resume_ns <= st.total_ns);
	assert_true(st.background_pages > 0);
	assert_true(st.fault_max_ns >= st.fault_p99_ns && st.fault_p99_ns >= st.fault_p50_ns);
	assert_true(st.faults == 0 || st.fault_max_ns > 0);
	print_message("    %s: resume %.3f ms, total %.3f ms, %llu faults (p50 %.3f ms, p99 %.3f "
	              "ms), %llu pages in the background\n",
	              opts, st.resume_ns / 1e6, st.total_ns / 1e6, (unsigned long long)st.faults,
	              st.fault_p50_ns / 1e6, st.fault_p99_ns / 1e6,
	              (unsigned long long)st.background_pages);
	char json[2048];
	assert_true(lmt_stats_json(&st, json, sizeof(json)) > 0);
	assert_non_null(strstr(json, "\"resume_ms\":"));
	assert_non_null(strstr(json, "\"fault_p99_ms\":"));
	assert_non_null(strstr(json, "\"background_pages\":"));
	assert_int_equal(lmt_load_finish(l.d), 0); /* done: at once */
	lazy_end_all(&l, &ram, path);
	census_check(before);
}

static void
test_lazy_restore_with_threads_touching_pages_is_bit_for_bit_over_1_2_4_channels(void **unused)
{
	lazy_round_trip("channels=1", "channels=1");
	lazy_round_trip("channels=2", "channels=2,chunk-size=64K");
	lazy_round_trip("channels=4", "channels=4,chunk-size=256K,queue-depth=4");
}

static void test_lazy_restore_with_verify_checks_each_stripe_before_placing_it(void **unused)
{
	lazy_round_trip("channels=2,verify=on", "channels=2,verify=on");
}

/* A fault on a hole is answered with a zero page, and the hole run at
 * 2 MiB reads zero everywhere. */
static void test_holes_fault_in_as_zero_pages(void **unused)
{
	struct guest_ram ram;
	struct lazy_load l;
	char path[PATH_MAX];
	static uint8_t zero[PAGE];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "holes.lmt", "channels=2");
	lazy_begin_held(&l, RAM_BYTES, path, "channels=2", 2000);
	assert_int_equal(l.run_rc, 0);
	/* The loader is held back: these are served by the fault thread. */
	for (uint64_t off = 2 << 20; off < (3 << 20); off += 16 * PAGE)
		assert_memory_equal(l.ram.base + off, zero, PAGE);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(l.d, &st), 0);
	assert_true(st.faults >= 16);
	assert_int_equal(lmt_load_finish(l.d), 0);
	assert_same_ram(&ram, &l.ram);
	lazy_end_all(&l, &ram, path);
}

/* A VMM that never blocks in lmt: the load runs as a job, the guest
 * starts when it ends, and lmt_load_finish ends the load: COMPLETED. */
static void test_lazy_restore_as_a_job_completes_at_lmt_load_finish(void **unused)
{
	struct guest_ram ram, back;
	char path[PATH_MAX];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "job.lmt", "channels=2");
	lmt_session *d = listen_on_file(&back, RAM_BYTES, path, "restore=lazy");
	assert_int_equal(lmt_load_start(d), 0);
	assert_int_equal(lmt_session_wait(d, 30000), 0);
	struct toucher t;
	touchers_start(&t, 1, &back, &ram, 1000);
	struct lmt_event ev = {0};
	bool completed = false;
	while (lmt_session_next_event(d, &ev))
		completed |= ev.type == LMT_EVENT_COMPLETED;
	assert_false(completed); /* not before lmt_load_finish */
	assert_int_equal(lmt_load_finish(d), 0);
	while (lmt_session_next_event(d, &ev))
		completed |= ev.type == LMT_EVENT_COMPLETED;
	assert_true(completed);
	touchers_join(&t, 1);
	assert_int_equal(t.first_wrong, 0);
	assert_same_ram(&ram, &back);
	lmt_session_free(d);
	munmap(back.base, back.bytes);
	ram_release(&ram);
	unlink(path);
}

/* ---- failures ---- */

/* The file is cut short under a running restore: the waiting thread gets
 * SIGSEGV, lmt_load_finish the read's error. */
static void test_truncated_file_fails_the_load_and_wakes_the_waiter(void **unused)
{
	struct census before = census_take();
	struct guest_ram ram;
	struct lazy_load l;
	char path[PATH_MAX];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "cut.lmt", "channels=2");
	lazy_begin_held(&l, RAM_BYTES, path, "channels=2", 2000);
	assert_int_equal(l.run_rc, 0);
	assert_int_equal(truncate(path, 1 << 20), 0);
	struct waiter w;
	waiter_start(&w, l.ram.base + data_page(&ram, l.ram.bytes - 64 * PAGE));
	int rc = lmt_load_finish(l.d);
	const char *msg = lmt_session_error(l.d)->message;
	if (rc != -LMT_EIO || !strstr(msg, "read of"))
		fail_msg("expected LMT_EIO and a file that ends early, got %s: %s",
		         lmt_err_name(rc), msg);
	print_message("    failed: %s\n", msg);
	waiter_expect_segv(&w);
	struct lmt_stats st;
	lmt_session_stats(l.d, &st);
	assert_int_equal(st.status, LMT_STATUS_FAILED);
	assert_int_equal(lmt_load_finish(l.d), -LMT_ESTATE);
	lazy_end_all(&l, &ram, path);
	census_check(before);
}

/* A damaged page with verify=on: it is never placed; whoever touches it
 * gets SIGSEGV, and lmt_load_finish names the bytes. */
static void test_corrupt_page_with_verify_is_never_placed(void **unused)
{
	struct guest_ram ram;
	struct lazy_load l;
	char path[PATH_MAX];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "corrupt.lmt", "verify=on");
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	uint64_t table = 0, pages = 0;
	assert_int_equal(pread(fd, &table, 8, H_TABLE), 8);
	assert_int_equal(pread(fd, &pages, 8, (off_t)(table + E_PAGES)), 8);
	/* A page of ram0 at 5 MiB that is not zero, its first byte flipped. */
	uint64_t off = data_page(&ram, 5 << 20);
	uint8_t b = ram.base[off] ^ 0x5a;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)(pages + off)), 1);
	close(fd);
	lazy_begin(&l, RAM_BYTES, path, "verify=on");
	assert_int_equal(l.run_rc, 0);
	uint8_t byte;
	void *addr = NULL;
	catch_segv();
	assert_int_equal(touch(l.ram.base + off, &byte, &addr), 1);
	assert_ptr_equal(addr, l.ram.base + off);
	int rc = lmt_load_finish(l.d);
	const char *msg = lmt_session_error(l.d)->message;
	if (rc != -LMT_EVERIFY || !strstr(msg, "none of them was placed"))
		fail_msg("expected LMT_EVERIFY, got %s: %s", lmt_err_name(rc), msg);
	print_message("    failed: %s\n", msg);
	lazy_end_all(&l, &ram, path);
}

static void cancel_with_waiter(bool free_only)
{
	struct census before = census_take();
	struct guest_ram ram;
	struct lazy_load l;
	char path[PATH_MAX];
	save_guest(&ram, BIG_RAM_BYTES, path, sizeof(path), "cancel.lmt", "channels=2");
	lazy_begin_held(&l, BIG_RAM_BYTES, path, "channels=2", 60000);
	assert_int_equal(l.run_rc, 0);
	struct waiter w;
	waiter_start(&w, l.ram.base + data_page(&ram, 7 << 20));
	uint64_t t0 = guest_now_ns();
	if (free_only) {
		lmt_session_free(l.d);
		l.d = NULL;
	} else {
		lmt_cancel(l.d);
		/* The failure is posted at once, before lmt_load_finish. */
		struct lmt_event ev = {0};
		for (int i = 0; i < 2000 && ev.type != LMT_EVENT_FAILED; i++)
			if (!lmt_session_next_event(l.d, &ev))
				usleep(1000);
		assert_int_equal(ev.type, LMT_EVENT_FAILED);
		assert_int_equal(ev.code, -LMT_ECANCELED);
		assert_int_equal(lmt_load_finish(l.d), -LMT_ECANCELED);
		struct lmt_stats st;
		lmt_session_stats(l.d, &st);
		assert_int_equal(st.status, LMT_STATUS_CANCELLED);
	}
	waiter_expect_segv(&w);
	assert_true(guest_now_ns() - t0 < 2000000000ull);
	lazy_end_all(&l, &ram, path);
	census_check(before);
}

static void test_cancel_wakes_a_thread_blocked_on_a_fault(void **unused)
{
	cancel_with_waiter(false);
}

static void test_session_free_wakes_a_thread_blocked_on_a_fault(void **unused)
{
	cancel_with_waiter(true);
}

/* Without userfaultfd the load is refused before the blocks are touched. */
static void test_lazy_is_refused_without_userfaultfd_before_touching_memory(void **unused)
{
	struct guest_ram ram;
	struct lazy_load l;
	char path[PATH_MAX];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "no-uffd.lmt", "");
	l.d = listen_on_file(&l.ram, RAM_BYTES, path, "restore=lazy,userfaultfd=off");
	memset(l.ram.base, 0xab, RAM_BYTES);
	int rc = lmt_load_run(l.d);
	const char *msg = lmt_session_error(l.d)->message;
	if (rc != -LMT_ENOTSUP || !strstr(msg, "userfaultfd is not available"))
		fail_msg("expected LMT_ENOTSUP, got %s: %s", lmt_err_name(rc), msg);
	print_message("    refused: %s\n", msg);
	for (uint64_t i = 0; i < RAM_BYTES; i += 4093)
		assert_int_equal(l.ram.base[i], 0xab);
	assert_int_equal(lmt_load_finish(l.d), -LMT_ESTATE);
	lazy_end_all(&l, &ram, path);
}

/* ---- lmt_load_finish elsewhere ---- */

static void test_load_finish_returns_at_once_after_an_eager_restore(void **unused)
{
	struct guest_ram ram, back;
	char path[PATH_MAX];
	save_guest(&ram, RAM_BYTES, path, sizeof(path), "eager.lmt", "");
	lmt_session *d = listen_on_file(&back, RAM_BYTES, path, "restore=eager");
	assert_int_equal(lmt_load_finish(d), -LMT_ESTATE); /* nothing run yet */
	assert_int_equal(lmt_load_run(d), 0);
	assert_int_equal(lmt_load_finish(d), 0);
	assert_same_ram(&ram, &back);
	struct lmt_stats st;
	assert_int_equal(lmt_session_stats(d, &st), 0);
	assert_true(st.resume_ns > 0);
	assert_int_equal(st.faults, 0);
	assert_int_equal(st.background_pages, 0);
	lmt_session_free(d);
	munmap(back.base, back.bytes);
	ram_release(&ram);
	unlink(path);
}

struct dest_thread {
	lmt_session *d;
	int rc;
};

static void *dest_run(void *arg)
{
	struct dest_thread *t = arg;
	t->rc = lmt_load_run(t->d);
	return NULL;
}

static void test_load_finish_returns_at_once_after_a_migration(void **unused)
{
	struct guest_ram ram, back;
	ram_fill(&ram, RAM_BYTES, 5);
	guest_ram_layout(&back, ram_map(RAM_BYTES), RAM_BYTES);
	struct dest_thread t = {.d = session_on(LMT_ROLE_DESTINATION, &back, "tcp", "")};
	uint16_t port = 0;
	assert_int_equal(lmt_load_listen(t.d, "127.0.0.1:0", &port), 0);
	pthread_t thread;
	assert_int_equal(pthread_create(&thread, NULL, dest_run, &t), 0);
	struct source_run r = source_migrate(&ram, "", port, "st", 2, 0, 0, NULL);
	assert_int_equal(pthread_join(thread, NULL), 0);
	if (r.rc || t.rc)
		fail_msg("migration: %s / %s", r.error, lmt_session_error(t.d)->message);
	assert_int_equal(lmt_load_finish(t.d), 0);
	assert_same_ram(&ram, &back);
	/* restore=lazy is no way to ask for postcopy (yet). */
	lmt_session *lazy = session_on(LMT_ROLE_DESTINATION, &back, "tcp", "restore=lazy");
	assert_int_equal(lmt_load_listen(lazy, "127.0.0.1:0", &port), 0);
	assert_int_equal(lmt_load_run(lazy), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(lazy)->message, "file: restore only"));
	lmt_session_free(lazy);
	lmt_session *src = session_on(LMT_ROLE_SOURCE, &ram, "tcp", "");
	assert_int_equal(lmt_load_finish(src), -LMT_ESTATE);
	assert_non_null(strstr(lmt_session_error(src)->message, "source"));
	assert_int_equal(lmt_load_finish(NULL), -LMT_EINVAL);
	lmt_session_free(src);
	lmt_session_free(t.d);
	munmap(back.base, back.bytes);
	ram_release(&ram);
}

/* Whether this process may open a userfaultfd at all. */
static bool userfaultfd_available(char *why, size_t size)
{
	int fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		close(fd);
		return true;
	}
	int dev = errno;
	fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd >= 0) {
		close(fd);
		return true;
	}
	snprintf(why, size, "/dev/userfaultfd: %s; userfaultfd(2): %s", strerror(dev),
	         strerror(errno));
	return false;
}

int main(void)
{
	char why[256];
	if (!userfaultfd_available(why, sizeof(why))) {
		printf("SKIP: userfaultfd cannot be opened here (%s): restore=lazy needs it\n",
		       why);
		return 77;
	}
	const char *dir = getenv("LMT_TEST_FILE_DIR");
	snprintf(test_dir, sizeof(test_dir), "%s", dir && *dir ? dir : "/tmp");
	mkdir(test_dir, 0700);
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(
	                test_lazy_restore_with_threads_touching_pages_is_bit_for_bit_over_1_2_4_channels),
	        cmocka_unit_test(
	                test_lazy_restore_with_verify_checks_each_stripe_before_placing_it),
	        cmocka_unit_test(test_holes_fault_in_as_zero_pages),
	        cmocka_unit_test(test_lazy_restore_as_a_job_completes_at_lmt_load_finish),
	        cmocka_unit_test(test_truncated_file_fails_the_load_and_wakes_the_waiter),
	        cmocka_unit_test(test_corrupt_page_with_verify_is_never_placed),
	        cmocka_unit_test(test_cancel_wakes_a_thread_blocked_on_a_fault),
	        cmocka_unit_test(test_session_free_wakes_a_thread_blocked_on_a_fault),
	        cmocka_unit_test(test_lazy_is_refused_without_userfaultfd_before_touching_memory),
	        cmocka_unit_test(test_load_finish_returns_at_once_after_an_eager_restore),
	        cmocka_unit_test(test_load_finish_returns_at_once_after_a_migration),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
