/* lmt-bench --qemu internals shared by bench-qemu*.c: QEMU's command lines
 * and processes (bench-qemu-proc.c). Not installed. */
#ifndef LMT_TOOLS_BENCH_QEMU_H
#define LMT_TOOLS_BENCH_QEMU_H

#include <sys/types.h>

#include "bench.h"

/* A command line, NULL-terminated; `failed` once out of memory. */
struct bench_args {
	char **v;
	size_t n;
	bool failed;
};

void bench_arg(struct bench_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bench_args_free(struct bench_args *a);
/* What every QEMU of lmt-bench's gets: the machine, one vCPU under
 * `accel`, the guest's firmware `rom`, its debug console into `debugcon`. */
void bench_qemu_common_args(struct bench_args *a, const struct bench_qemu_env *env,
                            enum bench_qemu_accel accel, const char *rom, const char *debugcon);
/* Start QEMU with its output in `log`; it is killed if lmt-bench dies.
 * The pid, or -1 with `err`. */
pid_t bench_qemu_spawn(const struct bench_args *a, const char *log, char *err, size_t size);
/* Wait up to `timeout_ns` for it to exit, then kill it. */
void bench_qemu_reap(pid_t pid, uint64_t timeout_ns);
bool bench_qemu_exited(pid_t pid, int *status);
void bench_qemu_describe_status(int status, char *buf, size_t size);
/* The last line of `log`, or "". */
void bench_qemu_log_tail(const char *log, char *buf, size_t size);
/* A small file (a debug console) into buf, "" when absent or empty. */
void bench_qemu_read_small(const char *path, char *buf, size_t size);

#endif
