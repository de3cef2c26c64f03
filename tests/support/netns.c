/* Two network namespaces joined by a veth pair (see netns.h). The pair is
 * made with iproute2's `ip`; a namespace is removed as `ip netns del` does
 * it (unmount and unlink its file under /run/netns), and the veth pair
 * goes with it. A guardian process, forked before the test enters any
 * namespace and in a session of its own, removes them once the test's
 * end of a pipe closes: at exit, or when the test is killed, however. */
#define _GNU_SOURCE
#include "netns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NETNS_DIR "/run/netns/"

extern char **environ;

static char ip_path[64];

static bool find_ip(void)
{
	static const char *const candidates[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip",
	                                         "/bin/ip"};
	for (size_t k = 0; k < sizeof(candidates) / sizeof(candidates[0]); k++)
		if (access(candidates[k], X_OK) == 0) {
			snprintf(ip_path, sizeof(ip_path), "%s", candidates[k]);
			return true;
		}
	return false;
}

/* Run `ip` with `args` (NULL-terminated), its output in `out`. 0 when it
 * exits 0. */
static int run_ip(const char *const *args, char *out, size_t size)
{
	char *argv[16] = {(char *)"ip"};
	size_t n = 1;
	for (; args[n - 1] && n < 15; n++)
		argv[n] = (char *)args[n - 1];
	argv[n] = NULL;
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) != 0)
		return -1;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
	pid_t pid;
	int rc = posix_spawn(&pid, ip_path, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(fds[1]);
	size_t used = 0;
	ssize_t got;
	char sink[256];
	while ((got = read(fds[0], used + 1 < size ? out + used : sink,
	                   used + 1 < size ? size - used - 1 : sizeof(sink))) > 0 ||
	       (got < 0 && errno == EINTR))
		if (got > 0 && used + 1 < size)
			used += (size_t)got;
	close(fds[0]);
	if (size)
		out[used] = 0;
	if (rc != 0)
		return -1;
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Remove a namespace as `ip netns del` does. */
static void remove_namespace(const char *name)
{
	char path[96];
	snprintf(path, sizeof(path), NETNS_DIR "%s", name);
	umount2(path, MNT_DETACH);
	unlink(path);
}

/* Start the guardian: it waits for the end of the pipe that `l` keeps to
 * close, then removes the namespaces. 0, or -1. */
static int guard(struct netns_link *l)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) != 0)
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		setsid();
		signal(SIGTERM, SIG_IGN);
		signal(SIGINT, SIG_IGN);
		signal(SIGHUP, SIG_IGN);
		close(fds[1]);
		char c;
		while (read(fds[0], &c, 1) != 0 && (errno == EINTR || errno == EAGAIN))
			;
		remove_namespace(l->ns[NETNS_A]);
		remove_namespace(l->ns[NETNS_B]);
		_exit(0);
	}
	close(fds[0]);
	l->guard_pid = pid;
	l->guard_fd = fds[1];
	return 0;
}

/* Namespaces "lmt-<tag>-<pid>-[ab]" whose process is gone: left by a run
 * that was killed. */
static void remove_stale(const char *tag)
{
	char list[8192], prefix[48];
	const char *args[] = {"netns", "list", NULL};
	if (run_ip(args, list, sizeof(list)) != 0)
		return;
	snprintf(prefix, sizeof(prefix), "lmt-%s-", tag);
	for (char *save = NULL, *line = strtok_r(list, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		char name[64];
		if (sscanf(line, "%63s", name) != 1 || strncmp(name, prefix, strlen(prefix)) != 0)
			continue;
		char *end = NULL;
		long pid = strtol(name + strlen(prefix), &end, 10);
		if (pid <= 0 || *end != '-' || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		remove_namespace(name);
	}
}

/* `what`, then `detail` (ip's output), as the reason; returns rc. */
static int fail(char *why, size_t size, int rc, const char *what, const char *detail)
{
	snprintf(why, size, "%s%s", what, detail);
	size_t n = strlen(why);
	while (n && why[n - 1] == '\n')
		why[--n] = 0;
	return rc;
}

/* Wait until both ends say they are up (carrier on both sides: the
 * kernel tells the far end up to a second later), or both are not. */
static int wait_state(const struct netns_link *l, bool up)
{
	for (int tries = 0; tries < 500; tries++) {
		int agree = 0;
		for (int s = 0; s < 2; s++) {
			char out[1024];
			const char *args[] = {"-n",   l->ns[s], "-o",       "link",
			                      "show", "dev",    l->veth[s], NULL};
			if (run_ip(args, out, sizeof(out)) != 0)
				return -1;
			agree += (strstr(out, "state UP") != NULL) == up;
		}
		if (agree == 2)
			return 0;
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	return -1;
}

int netns_link_create(struct netns_link *l, const char *tag, char *why, size_t size)
{
	memset(l, 0, sizeof(*l));
	if (geteuid() != 0)
		return fail(why, size, -1, "network namespaces need root", "");
	if (!find_ip())
		return fail(why, size, -1, "no `ip` (iproute2) to make network namespaces", "");
	remove_stale(tag);
	pid_t me = getpid();
	for (int s = 0; s < 2; s++) {
		snprintf(l->ns[s], sizeof(l->ns[s]), "lmt-%.16s-%d-%c", tag, (int)me, 'a' + s);
		/* One name on both sides, which no other namespace sees: a
		 * transport told to use one device ("ucx.devices=") finds it
		 * on either side. */
		snprintf(l->veth[s], sizeof(l->veth[s]), NETNS_VETH);
		snprintf(l->addr[s], sizeof(l->addr[s]), "10.231.0.%d", 1 + s);
	}
	if (guard(l) != 0)
		return fail(why, size, -2,
		            "cannot start the namespaces' guardian: ", strerror(errno));
	l->created = true;
	char out[1024];
	const char *add_a[] = {"netns", "add", l->ns[0], NULL};
	if (run_ip(add_a, out, sizeof(out)) != 0)
		return fail(why, size, -1, "cannot make a network namespace here: ", out);
	const char *add_b[] = {"netns", "add", l->ns[1], NULL};
	if (run_ip(add_b, out, sizeof(out)) != 0)
		return fail(why, size, -2, "ip netns add: ", out);
	/* Both ends are made inside their namespaces: nothing is left in this
	 * one if the run dies half way. */
	const char *pair[] = {"-n",   l->ns[0], "link",     "add",   l->veth[0], "type", "veth",
	                      "peer", "name",   l->veth[1], "netns", l->ns[1],   NULL};
	if (run_ip(pair, out, sizeof(out)) != 0)
		return fail(why, size, -2, "ip link add (veth): ", out);
	for (int s = 0; s < 2; s++) {
		char cidr[24];
		snprintf(cidr, sizeof(cidr), "%s/24", l->addr[s]);
		const char *addr[] = {"-n", l->ns[s], "addr", "add", cidr, "dev", l->veth[s], NULL};
		const char *up[] = {"-n", l->ns[s], "link", "set", l->veth[s], "up", NULL};
		const char *lo[] = {"-n", l->ns[s], "link", "set", "lo", "up", NULL};
		if (run_ip(addr, out, sizeof(out)) != 0 || run_ip(up, out, sizeof(out)) != 0 ||
		    run_ip(lo, out, sizeof(out)) != 0)
			return fail(why, size, -2, "ip addr/link: ", out);
	}
	if (wait_state(l, true) != 0)
		return fail(why, size, -2, "the veth pair did not come up within 5 s", "");
	return 0;
}

int netns_enter(const struct netns_link *l, int side)
{
	char path[96];
	snprintf(path, sizeof(path), NETNS_DIR "%s", l->ns[side]);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int rc = setns(fd, CLONE_NEWNET);
	int saved = errno;
	close(fd);
	errno = saved;
	if (rc != 0)
		return -1;
	/* sysfs shows the devices of the namespace it was mounted in: mount
	 * it afresh in a mount namespace of this process's own, as `ip netns
	 * exec` does (UCX lists network devices there). */
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
	    umount2("/sys", MNT_DETACH) != 0 || mount("sysfs", "/sys", "sysfs", 0, NULL) != 0)
		return -1;
	return 0;
}

int netns_link_set(const struct netns_link *l, bool up)
{
	char out[512];
	const char *args[] = {"-n", l->ns[0], "link", "set", l->veth[0], up ? "up" : "down", NULL};
	if (run_ip(args, out, sizeof(out)) != 0) {
		fprintf(stderr, "ip link set %s %s: %s\n", l->veth[0], up ? "up" : "down", out);
		return -1;
	}
	if (wait_state(l, up) != 0) {
		fprintf(stderr, "the veth pair did not go %s within 5 s\n", up ? "up" : "down");
		return -1;
	}
	return 0;
}

void netns_link_destroy(struct netns_link *l)
{
	if (!l->created)
		return;
	close(l->guard_fd);
	while (waitpid(l->guard_pid, NULL, 0) < 0 && errno == EINTR)
		;
	l->created = false;
}
