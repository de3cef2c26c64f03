/* minivmm: one KVM virtual machine with one vCPU thread that can be paused,
 * resumed and saved, and the dirty log of its single RAM slot. */
#ifndef MINIVMM_VM_H
#define MINIVMM_VM_H

#include <linux/kvm.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VM_PAGE_SIZE 4096u
#define VM_RAM_MIN (UINT64_C(1) << 20)
#define VM_RAM_MAX (UINT64_C(3) << 30)

/* vm_open's answer when this host cannot run a VM at all (a test skips). */
#define VM_UNAVAILABLE 1

enum vcpu_state {
	VCPU_NEW,
	VCPU_RUNNING,
	VCPU_PARKED,
	VCPU_HALTED, /* the guest executed hlt: it found bad memory */
	VCPU_FAILED, /* KVM or the guest did something this VMM does not handle */
	VCPU_STOPPED,
};

/* What the guest has said on its ports, and what the vCPU thread is doing. */
struct vm_reports {
	enum vcpu_state state;
	uint64_t events;    /* grows with every report and state change */
	uint64_t passes_ok; /* reports of a full check that succeeded */
	uint32_t first_ok_pass;
	uint32_t last_ok_pass;
	bool bad;
	uint32_t bad_address; /* the first bad word (or the checksum) */
	uint32_t bad_pass;
};

struct vm {
	const char *name; /* "source" or "destination", for messages */
	int kvm_fd;
	int vm_fd;
	int vcpu_fd;
	struct kvm_run *run;
	size_t run_size;
	uint8_t *ram;
	uint64_t ram_size;

	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool pause_requested;
	bool stop_requested;
	struct vm_reports reports;

	/* auto-converge's throttle: a thread holds the vCPU parked for
	 * `throttle` percent of every slice while it is not 0 */
	uint32_t throttle;
	bool throttle_hold;
	bool throttle_quit;
	bool throttle_started;
	pthread_t throttle_thread;
};

/* The device state sent at the end of a migration: the vCPU, and what the
 * destination checks it against. */
#define VM_STATE_MAGIC "MINIVMM"
#define VM_STATE_VERSION 1u

struct vm_state {
	char magic[8];
	uint32_t version;
	uint32_t length; /* sizeof(struct vm_state) */
	uint64_t ram_size;
	uint32_t last_ok_pass; /* the last pass the source guest reported */
	uint32_t reserved;
	struct kvm_regs regs;
	struct kvm_sregs sregs;
};

/* Probe /dev/kvm: 0 when a VM can be created, VM_UNAVAILABLE when it cannot
 * (why in `why`), -1 on any other failure. */
int vm_probe(char *why, size_t size);

/* Create the VM with `ram_size` bytes of zeroed RAM in one slot at guest
 * address 0, dirty-logged when `dirty_log`, and its vCPU. Returns 0,
 * VM_UNAVAILABLE or -1, with the reason printed. */
int vm_open(struct vm *vm, const char *name, uint64_t ram_size, bool dirty_log);
/* Stops the vCPU thread if it runs, then releases everything. */
void vm_close(struct vm *vm);

/* Put the guest code and its parameters in RAM and the vCPU at its first
 * instruction, in 32-bit protected mode. The guest rewrites one word every
 * `stride` bytes (a power of two from 4 to VM_PAGE_SIZE). */
int vm_boot(struct vm *vm, uint32_t stride);

int vm_start(struct vm *vm);
/* Kick the vCPU out of KVM_RUN and wait until it is parked with every I/O
 * completed. Returns 0 when parked, -1 when the vCPU had already stopped. */
int vm_pause(struct vm *vm);
/* Hold the vCPU for `percent` percent of every 10 ms (lmt's throttle
 * callback; 0 lets it run freely). Independent of vm_pause: a paused vCPU
 * stays paused whatever the throttle. */
void vm_throttle(struct vm *vm, uint32_t percent);
void vm_resume(struct vm *vm);
/* Stop and join the vCPU thread (parked or running). */
void vm_stop(struct vm *vm);

/* The vCPU must be parked (or not started). */
int vm_save_state(struct vm *vm, struct vm_state *state);
int vm_load_state(struct vm *vm, const void *data, size_t length);

/* KVM_GET_DIRTY_LOG of the RAM slot into `bitmap` (one bit per page, in
 * 64-bit words), which also clears the log. */
int vm_dirty_log(struct vm *vm, uint64_t *bitmap);

/* A snapshot of the reports; vm_wait also waits until `seen` differs from
 * the current events count or `deadline_ns` (CLOCK_MONOTONIC) passes. */
void vm_get_reports(struct vm *vm, struct vm_reports *out);
void vm_wait(struct vm *vm, uint64_t seen, uint64_t deadline_ns, struct vm_reports *out);

uint64_t vm_now_ns(void);

#endif /* MINIVMM_VM_H */
