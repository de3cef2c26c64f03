/* lmt-bench: a small client of QEMU's machine protocol (QMP) over a unix
 * socket: one JSON object a line each way. It connects while QEMU starts,
 * reads the greeting, leaves negotiation mode, and runs one command at a
 * time, skipping the events QEMU sends in between. Replies are bounded and
 * checked before use; every wait has a deadline. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define QMP_LINE_MAX (UINT64_C(4) << 20)

static int qmp_fail(char *err, size_t size, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int qmp_fail(char *err, size_t size, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, size, fmt, ap);
	va_end(ap);
	return -1;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* The next line from QEMU into a malloc'ed string, by `deadline_ns`. */
static int qmp_read_line(struct bench_qmp *q, char **line, uint64_t deadline_ns, char *err,
                         size_t size)
{
	for (;;) {
		char *newline = q->len ? memchr(q->buf, '\n', q->len) : NULL;

		if (newline) {
			size_t n = (size_t)(newline - q->buf);

			*line = strndup(q->buf, n);
			if (!*line)
				return qmp_fail(err, size, "out of memory");
			memmove(q->buf, newline + 1, q->len - n - 1);
			q->len -= n + 1;
			return 0;
		}
		if (q->len >= QMP_LINE_MAX)
			return qmp_fail(err, size, "a QMP message longer than %llu bytes",
			                (unsigned long long)QMP_LINE_MAX);
		if (q->cap - q->len < 65536) {
			size_t cap = q->cap ? q->cap * 2 : 65536;
			char *buf = realloc(q->buf, cap);

			if (!buf)
				return qmp_fail(err, size, "out of memory");
			q->buf = buf;
			q->cap = cap;
		}
		uint64_t now = guest_now_ns();
		if (now >= deadline_ns)
			return qmp_fail(err, size, "QEMU did not answer in time");
		struct pollfd pfd = {.fd = q->fd, .events = POLLIN};
		int ms = (int)((deadline_ns - now) / 1000000u) + 1;
		int rc = poll(&pfd, 1, ms);
		if (rc < 0 && errno != EINTR)
			return qmp_fail(err, size, "poll: %s", strerror(errno));
		if (rc <= 0)
			continue;
		ssize_t got = read(q->fd, q->buf + q->len, q->cap - q->len);
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (got <= 0)
			return qmp_fail(err, size, "QEMU closed its QMP socket%s%s",
			                got < 0 ? ": " : "", got < 0 ? strerror(errno) : "");
		q->len += (size_t)got;
	}
}

static int qmp_write(struct bench_qmp *q, const char *text, char *err, size_t size)
{
	size_t len = strlen(text);

	while (len > 0) {
		ssize_t n = send(q->fd, text, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return qmp_fail(err, size, "writing to QEMU's QMP socket: %s",
			                n < 0 ? strerror(errno) : "closed");
		text += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Connects as soon as QEMU listens, unless it exits first. */
static int qmp_dial(struct bench_qmp *q, const char *path, pid_t pid, uint64_t deadline_ns,
                    char *err, size_t size)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};

	if (strlen(path) >= sizeof(addr.sun_path))
		return qmp_fail(err, size, "QMP socket path too long: %s", path);
	strcpy(addr.sun_path, path);
	for (;;) {
		int status;

		q->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (q->fd < 0)
			return qmp_fail(err, size, "socket: %s", strerror(errno));
		if (connect(q->fd, (struct sockaddr *)&addr, sizeof(addr)) == 0)
			return 0;
		close(q->fd);
		q->fd = -1;
		if (errno != ENOENT && errno != ECONNREFUSED)
			return qmp_fail(err, size, "connecting to %s: %s", path, strerror(errno));
		if (waitpid(pid, &status, WNOHANG) == pid) {
			q->exited = true;
			q->status = status;
			return qmp_fail(err, size, "QEMU exited before it listened on QMP");
		}
		if (guest_now_ns() >= deadline_ns)
			return qmp_fail(err, size, "QEMU did not listen on QMP in time");
		sleep_ms(5);
	}
}

int bench_qmp_connect(struct bench_qmp *q, const char *path, pid_t pid, uint64_t deadline_ns,
                      char *err, size_t size)
{
	char *line = NULL, *reply = NULL;
	int rc;

	memset(q, 0, sizeof(*q));
	q->fd = -1;
	if (qmp_dial(q, path, pid, deadline_ns, err, size) < 0 ||
	    qmp_read_line(q, &line, deadline_ns, err, size) < 0)
		return -1;
	rc = bench_json_valid(line) && bench_json_find(line, "QMP") ? 0 : -1;
	free(line);
	if (rc < 0)
		return qmp_fail(err, size, "QEMU's QMP greeting was not understood");
	rc = bench_qmp_call(q, "qmp_capabilities", NULL, &reply, deadline_ns, err, size);
	free(reply);
	return rc;
}

int bench_qmp_call(struct bench_qmp *q, const char *command, const char *arguments, char **reply,
                   uint64_t deadline_ns, char *err, size_t size)
{
	char *request, *line = NULL, id[32], got_id[32];

	*reply = NULL;
	snprintf(id, sizeof(id), "lmt-bench-%u", ++q->next_id);
	if (asprintf(&request, "{\"execute\":\"%s\"%s%s,\"id\":\"%s\"}\n", command,
	             arguments ? ",\"arguments\":" : "", arguments ? arguments : "", id) < 0)
		return qmp_fail(err, size, "out of memory");
	int rc = qmp_write(q, request, err, size);
	free(request);
	while (rc == 0) {
		char class[64], desc[512];

		rc = qmp_read_line(q, &line, deadline_ns, err, size);
		if (rc < 0)
			break;
		if (!bench_json_valid(line)) {
			rc = qmp_fail(err, size, "%s: QEMU's reply is not JSON", command);
			break;
		}
		/* Events come between replies; a reply carries our id. */
		if (bench_json_find(line, "event") ||
		    bench_json_string(line, "id", got_id, sizeof(got_id)) < 0 ||
		    strcmp(got_id, id) != 0) {
			free(line);
			line = NULL;
			continue;
		}
		if (bench_json_find(line, "error")) {
			if (bench_json_string(line, "error.class", class, sizeof(class)) < 0)
				snprintf(class, sizeof(class), "error");
			if (bench_json_string(line, "error.desc", desc, sizeof(desc)) < 0)
				snprintf(desc, sizeof(desc), "(no description)");
			rc = qmp_fail(err, size, "%s: %s: %s", command, class, desc);
			break;
		}
		if (!bench_json_find(line, "return")) {
			rc = qmp_fail(err, size, "%s: QEMU's reply has no return", command);
			break;
		}
		*reply = line;
		return 0;
	}
	free(line);
	return rc;
}

void bench_qmp_close(struct bench_qmp *q)
{
	if (q->fd >= 0)
		close(q->fd);
	free(q->buf);
	memset(q, 0, sizeof(*q));
	q->fd = -1;
}
