/* lmt-bench --qemu: the QEMU processes: their command lines, started with
 * their output in a log and dying with lmt-bench, waited for with a
 * deadline, and what they said when they failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-qemu.h"
#include "qemu-guest/qemu-guest.h"

static int proc_fail(char *err, size_t size, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int proc_fail(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
	return -1;
}

void bench_arg(struct bench_args *a, const char *fmt, ...)
{
	char **v = realloc(a->v, (a->n + 2) * sizeof(*v));
	va_list ap;

	if (!v) {
		a->failed = true;
		return;
	}
	a->v = v;
	va_start(ap, fmt);
	if (vasprintf(&a->v[a->n], fmt, ap) < 0)
		a->failed = true;
	else
		a->n++;
	va_end(ap);
	a->v[a->n] = NULL;
}

void bench_args_free(struct bench_args *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
	memset(a, 0, sizeof(*a));
}

/* QEMU with its output in `log`; it dies with lmt-bench. */
pid_t bench_qemu_spawn(const struct bench_args *a, const char *log, char *err, size_t size)
{
	pid_t parent = getpid(), pid;

	if (a->failed)
		return proc_fail(err, size, "out of memory"), -1;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return proc_fail(err, size, "fork: %s", strerror(errno)), -1;
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int null = open("/dev/null", O_RDONLY);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent || fd < 0 || null < 0)
			_exit(127);
		dup2(null, STDIN_FILENO);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		signal(SIGPIPE, SIG_DFL);
		execvp(a->v[0], a->v);
		dprintf(STDERR_FILENO, "exec %s: %s\n", a->v[0], strerror(errno));
		_exit(127);
	}
	return pid;
}

/* The last line QEMU wrote, for a message. */
void bench_qemu_log_tail(const char *log, char *buf, size_t size)
{
	char text[4096];
	int fd = open(log, O_RDONLY | O_CLOEXEC);
	off_t end = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
	ssize_t n =
	        end > 0 ? pread(fd, text, sizeof(text) - 1,
	                        end > (off_t)sizeof(text) - 1 ? end - (off_t)sizeof(text) + 1 : 0)
	                : 0;

	if (fd >= 0)
		close(fd);
	buf[0] = '\0';
	if (n <= 0)
		return;
	text[n] = '\0';
	while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
		text[--n] = '\0';
	char *line = strrchr(text, '\n');
	snprintf(buf, size, "%s", line ? line + 1 : text);
}

/* Ends QEMU: waits `timeout_ns` for it to exit, then kills it. */
void bench_qemu_reap(pid_t pid, uint64_t timeout_ns)
{
	uint64_t deadline = guest_now_ns() + timeout_ns;
	int status;

	if (pid <= 0)
		return;
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (guest_now_ns() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return;
		}
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
	}
}

/* Reads `path` (a debugcon file) into buf; "" while it is empty. */
void bench_qemu_read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, size - 1) : 0;

	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = '\0';
}

bool bench_qemu_exited(pid_t pid, int *status)
{
	return waitpid(pid, status, WNOHANG) == pid;
}

void bench_qemu_describe_status(int status, char *buf, size_t size)
{
	/* With -no-reboot, a guest that resets (a triple fault) ends QEMU
	 * with status 0. */
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		snprintf(buf, size, "exited with status 0 (its guest reset itself)");
	else if (WIFEXITED(status))
		snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, size, "was killed by signal %d", WTERMSIG(status));
	else
		snprintf(buf, size, "ended");
}

void bench_qemu_common_args(struct bench_args *a, const struct bench_qemu_env *env,
                            enum bench_qemu_accel accel, const char *rom, const char *debugcon)
{
	bench_arg(a, "%s", env->binary);
	bench_arg(a, "-nodefaults");
	bench_arg(a, "-no-user-config");
	bench_arg(a, "-machine");
	bench_arg(a, "pc,accel=%s", bench_qemu_accel_name(accel));
	bench_arg(a, "-smp");
	bench_arg(a, "1");
	bench_arg(a, "-display");
	bench_arg(a, "none");
	bench_arg(a, "-no-reboot");
	bench_arg(a, "-bios");
	bench_arg(a, "%s", rom);
	bench_arg(a, "-chardev");
	bench_arg(a, "file,id=lmt-debugcon,path=%s", debugcon);
	bench_arg(a, "-device");
	bench_arg(a, "isa-debugcon,chardev=lmt-debugcon,iobase=%#x", QG_DEBUGCON_PORT);
}
