/* Same-host handover over unix:PATH between two processes: blocks mapped
 * from a memfd are handed over by descriptor, anonymous ones copied live
 * by the tcp plugin while the guest dirties them, and the destination's
 * memory is checked bit for bit against the paused source; the received
 * descriptor shares the source's memory; a wrong key is refused; a peer
 * killed at the switchover leaves the source's guest untouched and
 * nothing of the session behind. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define RAM_BYTES (16ull << 20) /* ram0 12 MiB, ram1 4 MiB */
#define FD_RAM0 1u
#define FD_RAM1 2u
#define MARKER 0x0123456789abcdefull
#define MARKER_AT (3 * GUEST_PAGE_SIZE)

/* Guest RAM whose blocks in `fd_mask` are one memfd's, the rest anonymous. */
struct memory {
	struct guest_ram ram;
	int fd;
	unsigned fd_mask;
};

static void memory_map(struct memory *m, unsigned fd_mask)
{
	m->fd_mask = fd_mask;
	m->fd = memfd_create("guest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(m->fd >= 0);
	assert_int_equal(ftruncate(m->fd, (off_t)RAM_BYTES), 0);
	uint8_t *base = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	assert_true(base != MAP_FAILED);
	guest_ram_layout(&m->ram, base, RAM_BYTES);
	for (uint32_t i = 0; i < m->ram.nblocks; i++) {
		struct guest_block *b = &m->ram.blocks[i];
		if (fd_mask & (1u << i))
			continue;
		void *p = mmap(b->host, b->length, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		assert_true(p == b->host);
	}
}

static void memory_release(struct memory *m)
{
	guest_ram_free_dirty(&m->ram);
	munmap(m->ram.base, m->ram.bytes);
	close(m->fd);
}

static lmt_session *session_for(enum lmt_role role, struct memory *m, const char *opts)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	if (lmt_session_new(&s, role, "tcp", opts, &err))
		fail_msg("session with '%s': %s", opts, err.message);
	for (uint32_t i = 0; i < m->ram.nblocks; i++) {
		struct guest_block *b = &m->ram.blocks[i];
		int rc = m->fd_mask & (1u << i)
		                 ? lmt_session_add_block_fd(s, b->name, b->host, b->length,
		                                            GUEST_PAGE_SIZE, m->fd,
		                                            (uint64_t)(b->host - m->ram.base))
		                 : lmt_session_add_block(s, b->name, b->host, b->length,
		                                         GUEST_PAGE_SIZE);
		if (rc)
			fail_msg("block %s: %s", b->name, lmt_session_error(s)->message);
	}
	return s;
}

static void socket_path(char *buf, size_t size)
{
	const char *dir = getenv("TMPDIR");
	snprintf(buf, size, "%s/lmt-handover-%d.sock", dir && *dir ? dir : "/tmp", (int)getpid());
}

/* ---- the destination, in a child ---- */

struct dest_report {
	int rc;
	char error[600];
	uint64_t checksum[GUEST_MAX_BLOCKS];
	int fd_rc[GUEST_MAX_BLOCKS];     /* lmt_load_block_fd */
	int fd_shares[GUEST_MAX_BLOCKS]; /* the fd shows the block's bytes */
	struct lmt_stats stats;
};

struct child {
	pid_t pid;
	int from; /* reports */
	int to;   /* commands */
	char uri[256];
};

static void read_all(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n <= 0)
			fail_msg("the destination child went away (%s)",
			         n ? strerror(errno) : "EOF");
		p += n;
		len -= (size_t)n;
	}
}

/* The descriptor lmt gives for block i maps what the block shows. */
static int check_block_fd(lmt_session *s, struct guest_block *b, uint32_t i, int *shares)
{
	int fd = -1;
	uint64_t offset = 0;
	int rc = lmt_load_block_fd(s, i, &fd, &offset);
	if (rc)
		return rc;
	uint8_t *p = mmap(NULL, b->length, PROT_READ, MAP_SHARED, fd, (off_t)offset);
	*shares = p != MAP_FAILED && memcmp(p, b->host, b->length) == 0;
	if (p != MAP_FAILED)
		munmap(p, b->length);
	close(fd);
	return 0;
}

/* Listens at unix:path, or on a tcp port of loopback without a path. */
static void dest_serve(int from, int to, const char *path, unsigned fd_mask, const char *opts)
{
	struct memory m;
	memory_map(&m, fd_mask);
	lmt_session *s = session_for(LMT_ROLE_DESTINATION, &m, opts);
	char uri[256];
	uint16_t port = 0;
	snprintf(uri, sizeof(uri), path ? "unix:%s" : "127.0.0.1:0", path);
	char ok = lmt_load_listen(s, uri, &port) == 0 ? 'L' : 'E';
	if (write(to, &ok, 1) != 1 || ok != 'L' || write(to, &port, 2) != 2)
		_exit(2);
	struct dest_report r = {0};
	r.rc = lmt_load_run(s);
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	lmt_session_stats(s, &r.stats);
	for (uint32_t i = 0; i < m.ram.nblocks; i++) {
		struct guest_block *b = &m.ram.blocks[i];
		r.checksum[i] = guest_checksum(b->host, b->length);
		r.fd_rc[i] = check_block_fd(s, b, i, &r.fd_shares[i]);
	}
	if (write(to, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(2);
	char cmd;
	while (read(from, &cmd, 1) == 1 && cmd == 'W') {
		uint64_t v = MARKER;
		memcpy(m.ram.blocks[0].host + MARKER_AT, &v, sizeof(v));
		if (write(to, "w", 1) != 1)
			_exit(2);
	}
	lmt_session_free(s);
	_exit(0);
}

static struct child dest_start(const char *path, unsigned fd_mask, const char *opts)
{
	int down[2], up[2];
	assert_int_equal(pipe2(down, O_CLOEXEC), 0);
	assert_int_equal(pipe2(up, O_CLOEXEC), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(down[1]);
		close(up[0]);
		dest_serve(down[0], up[1], path, fd_mask, opts);
	}
	close(down[0]);
	close(up[1]);
	struct child c = {.pid = pid, .from = up[0], .to = down[1]};
	char ok = 0;
	uint16_t port = 0;
	read_all(c.from, &ok, 1);
	assert_int_equal(ok, 'L');
	read_all(c.from, &port, 2);
	if (path)
		snprintf(c.uri, sizeof(c.uri), "unix:%s", path);
	else
		snprintf(c.uri, sizeof(c.uri), "127.0.0.1:%u", port);
	return c;
}

static int child_end(struct child *c)
{
	close(c->to);
	close(c->from);
	int status = 0;
	assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- the source ---- */

struct source_end {
	int rc;
	char error[600];
	struct lmt_stats stats;
	uint64_t checksum[GUEST_MAX_BLOCKS]; /* of the paused guest */
};

/* Migrate `m` to the child at `path` while the guest dirties all of its
 * RAM, at least two passes; `before_complete` runs with the guest paused. */
static struct source_end source_run(struct memory *m, const char *opts,
                                    void (*before_complete)(struct child *), struct child *c)
{
	struct source_end r = {0};
	lmt_session *s = session_for(LMT_ROLE_SOURCE, m, opts);
	assert_int_equal(lmt_session_set_dirty_sync(s, guest_dirty_sync, &m->ram), 0);
	struct guest_workload *w = NULL;
	assert_int_equal(guest_workload_start(&w, &m->ram, RAM_BYTES, 32ull << 20, 11), 0);
	r.rc = lmt_save_setup(s, c->uri);
	uint64_t give_up = guest_now_ns() + 60000000000ull;
	while (r.rc == 0) {
		struct lmt_iterate_result it;
		r.rc = lmt_save_iterate(s, &it);
		if (r.rc || (it.ready && it.pass >= 2))
			break;
		if (guest_now_ns() > give_up)
			fail_msg("the migration did not converge within 60 s");
	}
	guest_workload_pause(w);
	for (uint32_t i = 0; i < m->ram.nblocks; i++)
		r.checksum[i] = guest_checksum(m->ram.blocks[i].host, m->ram.blocks[i].length);
	if (before_complete)
		before_complete(c);
	static const char state[] = "device state of the guest";
	if (r.rc == 0)
		r.rc = lmt_save_complete(s, state, sizeof(state));
	guest_workload_stop(w);
	snprintf(r.error, sizeof(r.error), "%s", lmt_session_error(s)->message);
	lmt_session_stats(s, &r.stats);
	lmt_session_free(s);
	return r;
}

static void source_memory(struct memory *m, unsigned fd_mask)
{
	memory_map(m, fd_mask);
	guest_ram_fill(&m->ram, 0.1, 5);
	assert_int_equal(guest_ram_alloc_dirty(&m->ram), 0);
}

/* A migration that must succeed, with the destination's RAM equal to the
 * paused source's and each handed block's descriptor sharing it. */
/* `handed`: the blocks of fd_mask are expected to be handed over rather
 * than copied. */
static void round_trip(unsigned fd_mask, const char *opts, bool over_unix, bool handed_over)
{
	char path[256];
	socket_path(path, sizeof(path));
	struct child c = dest_start(over_unix ? path : NULL, fd_mask, opts);
	struct memory m;
	source_memory(&m, fd_mask);
	struct source_end src = source_run(&m, opts, NULL, &c);
	struct dest_report d;
	read_all(c.from, &d, sizeof(d));
	if (src.rc || d.rc)
		fail_msg("source %d '%s', destination %d '%s'", src.rc, src.error, d.rc, d.error);
	uint64_t copied = 0;
	for (uint32_t i = 0; i < m.ram.nblocks; i++) {
		bool handed = handed_over && (fd_mask & (1u << i));
		if (d.checksum[i] != src.checksum[i])
			fail_msg("block %s differs on the destination", m.ram.blocks[i].name);
		assert_int_equal(d.fd_rc[i], handed ? 0 : -LMT_ENOTFOUND);
		if (handed)
			assert_true(d.fd_shares[i]);
		else
			copied += m.ram.blocks[i].length;
	}
	/* Nothing of a handed block was copied: only the others' pages,
	 * the first pass's bulk and the guest's rewrites after it. */
	if (copied == 0)
		assert_int_equal(src.stats.bytes_sent, 0);
	else
		assert_true(src.stats.bytes_sent >= copied * 8 / 10);
	if (handed_over && (fd_mask & FD_RAM0)) {
		/* Both processes map the same memory: a write there shows here. */
		uint64_t seen = 0;
		char ack;
		assert_int_equal(write(c.to, "W", 1), 1);
		read_all(c.from, &ack, 1);
		memcpy(&seen, m.ram.blocks[0].host + MARKER_AT, sizeof(seen));
		assert_true(seen == MARKER);
	}
	assert_int_equal(child_end(&c), 0);
	memory_release(&m);
}

static void handover_round_trip(unsigned fd_mask, const char *opts)
{
	round_trip(fd_mask, opts, true, true);
}

static void test_memfd_blocks_are_handed_over_and_never_copied(void **state)
{
	(void)state;
	handover_round_trip(FD_RAM0 | FD_RAM1, "channels=1");
}

static void test_anonymous_blocks_are_copied_over_the_plugin(void **state)
{
	(void)state;
	handover_round_trip(0, "channels=2");
}

static void test_a_mix_hands_over_the_memfd_block_and_copies_the_other(void **state)
{
	(void)state;
	handover_round_trip(FD_RAM0, "channels=2,verify=on");
}

static void test_handover_with_auth_key_and_pin_all(void **state)
{
	(void)state;
	handover_round_trip(FD_RAM0, "auth-key=same-host-key,pin-all=on");
}

/* Descriptors cannot travel inside TLS: with tls=on over unix: every
 * block is copied, through TLS. */
static void test_with_tls_every_block_is_copied(void **state)
{
	(void)state;
	round_trip(FD_RAM0 | FD_RAM1, "tls=on,auth-key=same-host-key", true, false);
}

static void test_a_wrong_auth_key_is_refused(void **state)
{
	(void)state;
	char path[256];
	socket_path(path, sizeof(path));
	struct child c = dest_start(path, FD_RAM0, "auth-key=the-right-key,idle-timeout=2s");
	struct memory m;
	source_memory(&m, FD_RAM0);
	struct source_end src = source_run(&m, "auth-key=a-wrong-key", NULL, &c);
	assert_int_equal(src.rc, -LMT_EAUTH);
	assert_non_null(strstr(src.error, "authentication failed"));
	struct dest_report d;
	read_all(c.from, &d, sizeof(d));
	assert_int_not_equal(d.rc, 0);
	assert_int_equal(d.fd_rc[0], -LMT_ESTATE);
	assert_int_equal(child_end(&c), 0);
	memory_release(&m);
}

static void kill_destination(struct child *c)
{
	kill(c->pid, SIGKILL);
	int status;
	assert_int_equal(waitpid(c->pid, &status, 0), c->pid);
	c->pid = 0;
}

static void test_a_destination_killed_at_the_switchover_leaves_the_source_whole(void **state)
{
	(void)state;
	char path[256];
	socket_path(path, sizeof(path));
	struct census before = census_take();
	struct child c = dest_start(path, FD_RAM0, "");
	struct memory m;
	source_memory(&m, FD_RAM0);
	struct census with_child = census_take();
	struct source_end src = source_run(&m, "channels=2", kill_destination, &c);
	assert_int_not_equal(src.rc, 0);
	for (uint32_t i = 0; i < m.ram.nblocks; i++)
		if (guest_checksum(m.ram.blocks[i].host, m.ram.blocks[i].length) != src.checksum[i])
			fail_msg("block %s changed on the source", m.ram.blocks[i].name);
	census_check(with_child);
	close(c.to);
	close(c.from);
	memory_release(&m);
	census_check(before);
	unlink(path);
}

/* A source in a child that migrates until it is killed. */
static void source_forever(const char *uri)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct memory m;
	source_memory(&m, FD_RAM0);
	lmt_session *s = session_for(LMT_ROLE_SOURCE, &m, "channels=1");
	struct guest_workload *w = NULL;
	if (lmt_session_set_dirty_sync(s, guest_dirty_sync, &m.ram) ||
	    guest_workload_start(&w, &m.ram, RAM_BYTES, 256ull << 20, 3) || lmt_save_setup(s, uri))
		_exit(2);
	struct lmt_iterate_result it;
	while (lmt_save_iterate(s, &it) == 0)
		;
	_exit(1);
}

struct load_thread {
	lmt_session *s;
	int rc;
};

static void *load_main(void *arg)
{
	struct load_thread *t = arg;
	t->rc = lmt_load_run(t->s);
	return NULL;
}

static void test_a_source_killed_while_copying_leaves_the_destination_its_own(void **state)
{
	(void)state;
	char path[100], uri[128];
	socket_path(path, sizeof(path));
	snprintf(uri, sizeof(uri), "unix:%s", path);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		source_forever(uri);
	struct census before = census_take();
	struct memory m;
	memory_map(&m, FD_RAM0);
	struct load_thread t = {.s = session_for(LMT_ROLE_DESTINATION, &m, "channels=1")};
	assert_int_equal(lmt_load_listen(t.s, uri, NULL), 0);
	pthread_t thread;
	assert_int_equal(pthread_create(&thread, NULL, load_main, &t), 0);
	struct lmt_stats st = {0};
	uint64_t give_up = guest_now_ns() + 30000000000ull;
	while (st.bytes_received == 0 && guest_now_ns() < give_up) {
		usleep(10000);
		lmt_session_stats(t.s, &st);
	}
	assert_true(st.bytes_received > 0); /* killed while copying ram1 */
	kill(pid, SIGKILL);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	pthread_join(thread, NULL);
	/* The control connection or a data channel notices first. */
	const char *why = lmt_session_error(t.s)->message;
	if (t.rc == 0 || (!strstr(why, "source") && !strstr(why, "channel")))
		fail_msg("load returned %d: '%s'", t.rc, why);
	print_message("    the destination: %s\n", why);
	uint8_t *own = m.ram.blocks[0].host;
	assert_int_equal(pwrite(m.fd, "own", 3, 0), 3); /* still its own memfd */
	assert_memory_equal(own, "own", 3);
	lmt_session_free(t.s);
	memory_release(&m);
	census_check(before);
	assert_int_equal(access(path, F_OK), -1);
}

/* ---- lmt_session_add_block_fd's checks ---- */

static lmt_session *bare_session(void)
{
	struct lmt_error err = {0};
	lmt_session *s = NULL;
	assert_int_equal(lmt_session_new(&s, LMT_ROLE_SOURCE, "tcp", NULL, &err), 0);
	return s;
}

static void expect_refused(lmt_session *s, int rc, const char *text)
{
	assert_int_equal(rc, -LMT_EINVAL);
	if (!strstr(lmt_session_error(s)->message, text))
		fail_msg("error '%s' does not say '%s'", lmt_session_error(s)->message, text);
}

static void test_add_block_fd_refuses_what_is_not_the_blocks_memory(void **state)
{
	(void)state;
	struct census before = census_take();
	struct memory m;
	memory_map(&m, FD_RAM0);
	struct guest_block *b = &m.ram.blocks[0], *anon = &m.ram.blocks[1];
	lmt_session *s = bare_session();
	int p[2];
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	int other = memfd_create("other", MFD_CLOEXEC);
	assert_int_equal(ftruncate(other, (off_t)RAM_BYTES), 0);
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, 999, 0),
	               "block 'ram0': fd 999 is not an open descriptor");
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, p[0], 0),
	               "is not a memory file");
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, m.fd, 512),
	               "offset 512 is not aligned to the page size 4096");
	expect_refused(s,
	               lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, m.fd,
	                                        RAM_BYTES - 4096),
	               "fewer than offset");
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, other, 0),
	               "is not mapped from this descriptor's file");
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, m.fd, 4096),
	               "maps the file at another offset");
	expect_refused(s,
	               lmt_session_add_block_fd(s, "ram1", anon->host, anon->length, 4096, m.fd,
	                                        (uint64_t)(anon->host - m.ram.base)),
	               "block 'ram1': the memory at");
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", NULL, b->length, 4096, m.fd, 0),
	               "no memory given");
	/* A hugetlbfs file is given with its huge page size (no huge page
	 * is needed for the check: the file is empty). */
	int huge = memfd_create("huge", MFD_CLOEXEC | MFD_HUGETLB);
	if (huge >= 0 && ftruncate(huge, (off_t)b->length) == 0) {
		struct stat st;
		assert_int_equal(fstat(huge, &st), 0);
		char want[128];
		snprintf(want, sizeof(want),
		         "block 'ram0': fd %d is a hugetlbfs file of %ld-byte pages: give that "
		         "page size, not 4096",
		         huge, (long)st.st_blksize);
		expect_refused(s, lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, huge, 0),
		               want);
	} else {
		printf("hugetlbfs page size not checked: no hugetlbfs memfd here (%s)\n",
		       strerror(errno));
	}
	if (huge >= 0)
		close(huge);
	assert_int_equal(lmt_session_add_block_fd(s, "ram0", b->host, b->length, 4096, m.fd, 0), 0);
	lmt_session_free(s);
	close(p[0]);
	close(p[1]);
	close(other);
	memory_release(&m);
	census_check(before); /* lmt's duplicate is closed with the session */
}

static void test_a_private_mapping_of_the_file_is_refused(void **state)
{
	(void)state;
	int fd = memfd_create("guest", MFD_CLOEXEC);
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	void *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	assert_true(p != MAP_FAILED);
	lmt_session *s = bare_session();
	expect_refused(s, lmt_session_add_block_fd(s, "ram0", p, 1 << 20, 4096, fd, 0),
	               "is a private mapping (MAP_PRIVATE), not MAP_SHARED");
	lmt_session_free(s);
	munmap(p, 1 << 20);
	close(fd);
}

/* ---- the unix socket's path ---- */

static void test_listen_refuses_to_replace_a_file_and_replaces_a_stale_socket(void **state)
{
	(void)state;
	char path[100], uri[300];
	socket_path(path, sizeof(path));
	snprintf(uri, sizeof(uri), "unix:%s", path);
	struct memory m;
	memory_map(&m, FD_RAM0);
	int file = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	assert_true(file >= 0);
	close(file);
	lmt_session *d = session_for(LMT_ROLE_DESTINATION, &m, NULL);
	assert_int_equal(lmt_load_listen(d, uri, NULL), -LMT_EINVAL);
	assert_non_null(strstr(lmt_session_error(d)->message, "not a socket"));
	unlink(path);
	/* A socket bound and never listened on: what a killed process leaves. */
	int stale = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	assert_int_equal(bind(stale, (struct sockaddr *)&a, sizeof(a)), 0);
	close(stale);
	assert_int_equal(lmt_load_listen(d, uri, NULL), 0);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0600);
	lmt_session *again = session_for(LMT_ROLE_DESTINATION, &m, NULL);
	assert_int_equal(lmt_load_listen(again, uri, NULL), -LMT_EIO);
	assert_non_null(strstr(lmt_session_error(again)->message, "in use"));
	lmt_session_free(again);
	lmt_session_free(d);
	assert_int_equal(access(path, F_OK), -1); /* removed with the listener */
	memory_release(&m);
}

/* ---- fd-backed blocks over an ordinary target ---- */

static void test_fd_blocks_migrate_over_tcp_like_any_other(void **state)
{
	(void)state;
	round_trip(FD_RAM0 | FD_RAM1, "channels=2,verify=on", false, false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	        cmocka_unit_test(test_memfd_blocks_are_handed_over_and_never_copied),
	        cmocka_unit_test(test_anonymous_blocks_are_copied_over_the_plugin),
	        cmocka_unit_test(test_a_mix_hands_over_the_memfd_block_and_copies_the_other),
	        cmocka_unit_test(test_handover_with_auth_key_and_pin_all),
	        cmocka_unit_test(test_with_tls_every_block_is_copied),
	        cmocka_unit_test(test_a_wrong_auth_key_is_refused),
	        cmocka_unit_test(
	                test_a_destination_killed_at_the_switchover_leaves_the_source_whole),
	        cmocka_unit_test(test_a_source_killed_while_copying_leaves_the_destination_its_own),
	        cmocka_unit_test(test_add_block_fd_refuses_what_is_not_the_blocks_memory),
	        cmocka_unit_test(test_a_private_mapping_of_the_file_is_refused),
	        cmocka_unit_test(test_listen_refuses_to_replace_a_file_and_replaces_a_stale_socket),
	        cmocka_unit_test(test_fd_blocks_migrate_over_tcp_like_any_other),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
