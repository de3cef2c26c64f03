/* minivmm: the VM on raw KVM ioctls — RAM slot with dirty logging, the vCPU
 * thread, its pause/resume handshake, and the vCPU state that migrates. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "guest.h"
#include "vm.h"

/* Sent to the vCPU thread to interrupt KVM_RUN; its handler does nothing. */
#define VM_KICK_SIGNAL SIGUSR1
/* Three pages KVM needs on Intel for its real-mode TSS: above all RAM. */
#define VM_TSS_ADDR 0xfffbd000u
#define VM_SLOT 0u

extern const uint8_t minivmm_guest_code[];
extern const uint8_t minivmm_guest_code_end[];

uint64_t vm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void kick_handler(int sig)
{
	(void)sig;
}

static int install_kick_handler(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = kick_handler;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: KVM_RUN must come back with EINTR. */
	if (sigaction(VM_KICK_SIGNAL, &sa, NULL) < 0) {
		fprintf(stderr, "minivmm: sigaction: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

/* /dev/kvm and an empty VM, or VM_UNAVAILABLE with the reason. */
static int open_kvm(int *kvm_fd, int *vm_fd, char *why, size_t size)
{
	int version;

	*vm_fd = -1;
	*kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (*kvm_fd < 0) {
		snprintf(why, size, "cannot open /dev/kvm: %s", strerror(errno));
		return VM_UNAVAILABLE;
	}
	version = ioctl(*kvm_fd, KVM_GET_API_VERSION, 0);
	if (version < 0) {
		snprintf(why, size, "/dev/kvm is not KVM: %s", strerror(errno));
		return VM_UNAVAILABLE;
	}
	if (version != KVM_API_VERSION) {
		snprintf(why, size, "/dev/kvm speaks API version %d, not %d", version,
		         KVM_API_VERSION);
		return VM_UNAVAILABLE;
	}
	*vm_fd = ioctl(*kvm_fd, KVM_CREATE_VM, 0);
	if (*vm_fd < 0) {
		snprintf(why, size, "KVM_CREATE_VM: %s", strerror(errno));
		return VM_UNAVAILABLE;
	}
	return 0;
}

int vm_probe(char *why, size_t size)
{
	int kvm_fd, vm_fd;
	int rc = open_kvm(&kvm_fd, &vm_fd, why, size);

	if (vm_fd >= 0)
		close(vm_fd);
	if (kvm_fd >= 0)
		close(kvm_fd);
	return rc;
}

static int vm_fail(const struct vm *vm, const char *what)
{
	fprintf(stderr, "minivmm: %s: %s: %s\n", vm->name, what, strerror(errno));
	return -1;
}

static int check_capabilities(struct vm *vm)
{
	static const struct {
		int cap;
		const char *name;
	} needed[] = {
	        {KVM_CAP_USER_MEMORY, "KVM_CAP_USER_MEMORY"},
	        {KVM_CAP_IMMEDIATE_EXIT, "KVM_CAP_IMMEDIATE_EXIT"},
	        {KVM_CAP_SET_TSS_ADDR, "KVM_CAP_SET_TSS_ADDR"},
	};

	for (size_t i = 0; i < sizeof(needed) / sizeof(needed[0]); i++) {
		if (ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, needed[i].cap) <= 0) {
			fprintf(stderr, "minivmm: %s: KVM lacks %s\n", vm->name, needed[i].name);
			return -1;
		}
	}
	return 0;
}

static int add_ram(struct vm *vm, bool dirty_log)
{
	struct kvm_userspace_memory_region region = {
	        .slot = VM_SLOT,
	        .flags = dirty_log ? KVM_MEM_LOG_DIRTY_PAGES : 0,
	        .guest_phys_addr = 0,
	        .memory_size = vm->ram_size,
	};
	void *ram = mmap(NULL, vm->ram_size, PROT_READ | PROT_WRITE,
	                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (ram == MAP_FAILED)
		return vm_fail(vm, "mapping guest RAM");
	vm->ram = ram;
	region.userspace_addr = (uintptr_t)ram;
	if (ioctl(vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &region) < 0)
		return vm_fail(vm, "KVM_SET_USER_MEMORY_REGION");
	return 0;
}

static int add_vcpu(struct vm *vm)
{
	int size;
	void *run;

	vm->vcpu_fd = ioctl(vm->vm_fd, KVM_CREATE_VCPU, 0);
	if (vm->vcpu_fd < 0)
		return vm_fail(vm, "KVM_CREATE_VCPU");
	size = ioctl(vm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, 0);
	if (size < (int)sizeof(struct kvm_run))
		return vm_fail(vm, "KVM_GET_VCPU_MMAP_SIZE");
	run = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, vm->vcpu_fd, 0);
	if (run == MAP_FAILED)
		return vm_fail(vm, "mapping kvm_run");
	vm->run = run;
	vm->run_size = (size_t)size;
	return 0;
}

static void init_sync(struct vm *vm)
{
	pthread_condattr_t attr;

	pthread_mutex_init(&vm->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&vm->cond, &attr);
	pthread_condattr_destroy(&attr);
}

int vm_open(struct vm *vm, const char *name, uint64_t ram_size, bool dirty_log)
{
	char why[160];
	int rc;

	memset(vm, 0, sizeof(*vm));
	vm->name = name;
	vm->vcpu_fd = -1;
	vm->ram_size = ram_size;
	init_sync(vm);
	rc = open_kvm(&vm->kvm_fd, &vm->vm_fd, why, sizeof(why));
	if (rc) {
		fprintf(stderr, "minivmm: %s: %s\n", name, why);
		return rc;
	}
	if (check_capabilities(vm) || install_kick_handler())
		return -1;
	if (ioctl(vm->vm_fd, KVM_SET_TSS_ADDR, (unsigned long)VM_TSS_ADDR) < 0)
		return vm_fail(vm, "KVM_SET_TSS_ADDR");
	if (add_ram(vm, dirty_log) || add_vcpu(vm))
		return -1;
	return 0;
}

void vm_close(struct vm *vm)
{
	vm_stop(vm);
	if (vm->run)
		munmap(vm->run, vm->run_size);
	if (vm->vcpu_fd >= 0)
		close(vm->vcpu_fd);
	if (vm->vm_fd >= 0)
		close(vm->vm_fd);
	if (vm->kvm_fd >= 0)
		close(vm->kvm_fd);
	if (vm->ram)
		munmap(vm->ram, vm->ram_size);
	pthread_cond_destroy(&vm->cond);
	pthread_mutex_destroy(&vm->lock);
	vm->run = NULL;
	vm->ram = NULL;
	vm->vcpu_fd = vm->vm_fd = vm->kvm_fd = -1;
}

/* ---- Boot ------------------------------------------------------------------ */

static void flat_segment(struct kvm_segment *seg, uint16_t selector, uint8_t type)
{
	memset(seg, 0, sizeof(*seg));
	seg->base = 0;
	seg->limit = 0xffffffffu;
	seg->selector = selector;
	seg->type = type;
	seg->present = 1;
	seg->s = 1;  /* code or data, not system */
	seg->db = 1; /* 32-bit */
	seg->g = 1;  /* limit in pages */
}

int vm_boot(struct vm *vm, uint32_t stride)
{
	size_t code_size = (size_t)(minivmm_guest_code_end - minivmm_guest_code);
	uint32_t params[3] = {GUEST_DATA_ADDR, (uint32_t)vm->ram_size, stride};
	struct kvm_sregs sregs;
	struct kvm_regs regs;

	if (code_size > GUEST_CODE_MAX || vm->ram_size <= GUEST_DATA_ADDR)
		return -1;
	memcpy(vm->ram + GUEST_CODE_ADDR, minivmm_guest_code, code_size);
	memcpy(vm->ram + GUEST_PARAM_DATA_START, params, sizeof(params));

	/* The hidden parts of the segment registers are all the CPU uses, so
	 * protected mode needs no GDT in guest memory. */
	if (ioctl(vm->vcpu_fd, KVM_GET_SREGS, &sregs) < 0)
		return vm_fail(vm, "KVM_GET_SREGS");
	flat_segment(&sregs.cs, 0x08, 0xb); /* execute/read, accessed */
	flat_segment(&sregs.ds, 0x10, 0x3); /* read/write, accessed */
	sregs.es = sregs.fs = sregs.gs = sregs.ss = sregs.ds;
	sregs.cr0 &= ~(uint64_t)0x60000000u; /* caches on: CD and NW off */
	sregs.cr0 |= 1u;                     /* PE */
	if (ioctl(vm->vcpu_fd, KVM_SET_SREGS, &sregs) < 0)
		return vm_fail(vm, "KVM_SET_SREGS");

	memset(&regs, 0, sizeof(regs));
	regs.rflags = 0x2; /* the reserved bit; interrupts off */
	regs.rip = GUEST_CODE_ADDR;
	if (ioctl(vm->vcpu_fd, KVM_SET_REGS, &regs) < 0)
		return vm_fail(vm, "KVM_SET_REGS");
	return 0;
}

/* ---- The vCPU thread ------------------------------------------------------- */

static void set_state(struct vm *vm, enum vcpu_state state)
{
	pthread_mutex_lock(&vm->lock);
	vm->reports.state = state;
	vm->reports.events++;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
}

static void report(struct vm *vm, uint16_t port, uint32_t value)
{
	struct vm_reports *r = &vm->reports;
	struct kvm_regs regs = {0};

	/* The pass that found it is in ebp. */
	if (port == GUEST_PORT_BAD && ioctl(vm->vcpu_fd, KVM_GET_REGS, &regs) < 0)
		vm_fail(vm, "KVM_GET_REGS");

	pthread_mutex_lock(&vm->lock);
	if (port == GUEST_PORT_PASS_OK) {
		if (r->passes_ok++ == 0)
			r->first_ok_pass = value;
		r->last_ok_pass = value;
	} else if (!r->bad) {
		r->bad = true;
		r->bad_address = value;
		r->bad_pass = (uint32_t)regs.rbp;
	}
	r->events++;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
}

static void dump_regs(struct vm *vm)
{
	struct kvm_regs regs;

	if (ioctl(vm->vcpu_fd, KVM_GET_REGS, &regs) == 0)
		fprintf(stderr, "minivmm: %s: eip=%#llx esi=%#llx ebp=%#llx\n", vm->name,
		        (unsigned long long)regs.rip, (unsigned long long)regs.rsi,
		        (unsigned long long)regs.rbp);
}

/* 0 to run on, 1 when the guest halted, -1 on an exit this VMM cannot take. */
static int handle_exit(struct vm *vm)
{
	struct kvm_run *run = vm->run;
	uint32_t value;

	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		if (run->io.direction != KVM_EXIT_IO_OUT || run->io.size != 4 ||
		    run->io.count != 1 ||
		    (run->io.port != GUEST_PORT_PASS_OK && run->io.port != GUEST_PORT_BAD))
			break;
		memcpy(&value, (const uint8_t *)run + run->io.data_offset, sizeof(value));
		report(vm, run->io.port, value);
		return 0;
	case KVM_EXIT_HLT:
		return 1;
	case KVM_EXIT_FAIL_ENTRY:
		fprintf(stderr, "minivmm: %s: KVM_EXIT_FAIL_ENTRY, reason %#llx\n", vm->name,
		        (unsigned long long)run->fail_entry.hardware_entry_failure_reason);
		return -1;
	case KVM_EXIT_INTERNAL_ERROR:
		fprintf(stderr, "minivmm: %s: KVM_EXIT_INTERNAL_ERROR, suberror %u\n", vm->name,
		        run->internal.suberror);
		dump_regs(vm);
		return -1;
	default:
		break;
	}
	fprintf(stderr, "minivmm: %s: unexpected exit %u", vm->name, run->exit_reason);
	if (run->exit_reason == KVM_EXIT_IO)
		fprintf(stderr, " (%s port %#x, %u bytes)",
		        run->io.direction == KVM_EXIT_IO_OUT ? "out to" : "in from", run->io.port,
		        run->io.size);
	fputc('\n', stderr);
	dump_regs(vm);
	return -1;
}

/* KVM_RUN came back with EINTR, so every I/O exit before it is complete and
 * the registers are those of an instruction boundary: park here while a
 * pause is asked for. Returns false when asked to stop. */
static bool park(struct vm *vm)
{
	bool go_on;

	pthread_mutex_lock(&vm->lock);
	while ((vm->pause_requested || vm->throttle_hold) && !vm->stop_requested) {
		if (vm->reports.state != VCPU_PARKED) {
			vm->reports.state = VCPU_PARKED;
			vm->reports.events++;
			pthread_cond_broadcast(&vm->cond);
		}
		pthread_cond_wait(&vm->cond, &vm->lock);
	}
	go_on = !vm->stop_requested;
	if (go_on) {
		__atomic_store_n(&vm->run->immediate_exit, 0, __ATOMIC_SEQ_CST);
		if (vm->reports.state != VCPU_RUNNING) {
			vm->reports.state = VCPU_RUNNING;
			vm->reports.events++;
			pthread_cond_broadcast(&vm->cond);
		}
	}
	pthread_mutex_unlock(&vm->lock);
	return go_on;
}

static void *vcpu_main(void *arg)
{
	struct vm *vm = arg;
	enum vcpu_state end = VCPU_STOPPED;

	for (;;) {
		if (ioctl(vm->vcpu_fd, KVM_RUN, 0) == 0) {
			/* After an I/O exit, always enter again: that completes it. */
			int rc = handle_exit(vm);

			if (rc == 0)
				continue;
			end = rc > 0 ? VCPU_HALTED : VCPU_FAILED;
			break;
		}
		if (errno != EINTR && errno != EAGAIN) {
			vm_fail(vm, "KVM_RUN");
			end = VCPU_FAILED;
			break;
		}
		if (!park(vm))
			break;
	}
	set_state(vm, end);
	return NULL;
}

int vm_start(struct vm *vm)
{
	int rc;

	vm->reports.state = VCPU_RUNNING;
	rc = pthread_create(&vm->thread, NULL, vcpu_main, vm);
	if (rc) {
		fprintf(stderr, "minivmm: %s: vCPU thread: %s\n", vm->name, strerror(rc));
		vm->reports.state = VCPU_NEW;
		return -1;
	}
	vm->thread_started = true;
	return 0;
}

/* Called with the lock held: make KVM_RUN return now or on its next entry. */
static void kick(struct vm *vm)
{
	__atomic_store_n(&vm->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
	pthread_kill(vm->thread, VM_KICK_SIGNAL);
}

int vm_pause(struct vm *vm)
{
	int rc;

	if (!vm->thread_started)
		return -1;
	pthread_mutex_lock(&vm->lock);
	vm->pause_requested = true;
	kick(vm);
	while (vm->reports.state == VCPU_RUNNING)
		pthread_cond_wait(&vm->cond, &vm->lock);
	rc = vm->reports.state == VCPU_PARKED ? 0 : -1;
	pthread_mutex_unlock(&vm->lock);
	return rc;
}

void vm_resume(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	vm->pause_requested = false;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
}

#define THROTTLE_SLICE_NS 10000000ull

/* Wait on the VM's condition until `ns` from now or until the throttle
 * changes or ends; with the lock held. */
static void throttle_wait(struct vm *vm, uint64_t ns, uint32_t percent)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += (time_t)(ns / 1000000000ull);
	until.tv_nsec += (long)(ns % 1000000000ull);
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	while (!vm->throttle_quit && vm->throttle == percent &&
	       pthread_cond_timedwait(&vm->cond, &vm->lock, &until) == 0)
		;
}

/* Park the vCPU for its share of each slice, let it run for the rest. */
static void *throttle_main(void *arg)
{
	struct vm *vm = arg;

	pthread_mutex_lock(&vm->lock);
	while (!vm->throttle_quit) {
		uint32_t percent = vm->throttle;
		if (!percent) {
			pthread_cond_wait(&vm->cond, &vm->lock);
			continue;
		}
		uint64_t hold = THROTTLE_SLICE_NS * percent / 100;
		vm->throttle_hold = true;
		if (vm->thread_started)
			kick(vm);
		throttle_wait(vm, hold, percent);
		vm->throttle_hold = false;
		pthread_cond_broadcast(&vm->cond);
		throttle_wait(vm, THROTTLE_SLICE_NS - hold, percent);
	}
	vm->throttle_hold = false;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
	return NULL;
}

void vm_throttle(struct vm *vm, uint32_t percent)
{
	pthread_mutex_lock(&vm->lock);
	vm->throttle = percent > 99 ? 99 : percent;
	if (percent && !vm->throttle_started) {
		int rc = pthread_create(&vm->throttle_thread, NULL, throttle_main, vm);
		if (rc)
			fprintf(stderr, "minivmm: %s: throttle thread: %s\n", vm->name,
			        strerror(rc));
		vm->throttle_started = rc == 0;
	}
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
}

static void throttle_end(struct vm *vm)
{
	if (!vm->throttle_started)
		return;
	pthread_mutex_lock(&vm->lock);
	vm->throttle_quit = true;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
	pthread_join(vm->throttle_thread, NULL);
	vm->throttle_started = false;
}

void vm_stop(struct vm *vm)
{
	throttle_end(vm);
	if (!vm->thread_started)
		return;
	pthread_mutex_lock(&vm->lock);
	vm->stop_requested = true;
	kick(vm);
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
	pthread_join(vm->thread, NULL);
	vm->thread_started = false;
}

/* ---- State ----------------------------------------------------------------- */

int vm_save_state(struct vm *vm, struct vm_state *state)
{
	memset(state, 0, sizeof(*state));
	memcpy(state->magic, VM_STATE_MAGIC, sizeof(VM_STATE_MAGIC));
	state->version = VM_STATE_VERSION;
	state->length = sizeof(*state);
	state->ram_size = vm->ram_size;
	pthread_mutex_lock(&vm->lock);
	state->last_ok_pass = vm->reports.last_ok_pass;
	pthread_mutex_unlock(&vm->lock);
	if (ioctl(vm->vcpu_fd, KVM_GET_REGS, &state->regs) < 0)
		return vm_fail(vm, "KVM_GET_REGS");
	if (ioctl(vm->vcpu_fd, KVM_GET_SREGS, &state->sregs) < 0)
		return vm_fail(vm, "KVM_GET_SREGS");
	return 0;
}

int vm_load_state(struct vm *vm, const void *data, size_t length)
{
	struct vm_state state;

	if (length != sizeof(state)) {
		fprintf(stderr, "minivmm: %s: device state of %zu bytes, expected %zu\n", vm->name,
		        length, sizeof(state));
		return -1;
	}
	memcpy(&state, data, sizeof(state));
	if (memcmp(state.magic, VM_STATE_MAGIC, sizeof(VM_STATE_MAGIC)) != 0 ||
	    state.version != VM_STATE_VERSION || state.length != sizeof(state)) {
		fprintf(stderr, "minivmm: %s: the device state is not minivmm's version %u\n",
		        vm->name, VM_STATE_VERSION);
		return -1;
	}
	if (state.ram_size != vm->ram_size) {
		fprintf(stderr, "minivmm: %s: the source has %llu bytes of RAM, this VM %llu\n",
		        vm->name, (unsigned long long)state.ram_size,
		        (unsigned long long)vm->ram_size);
		return -1;
	}
	/* Segments and control registers first: they decide how regs apply. */
	if (ioctl(vm->vcpu_fd, KVM_SET_SREGS, &state.sregs) < 0)
		return vm_fail(vm, "KVM_SET_SREGS");
	if (ioctl(vm->vcpu_fd, KVM_SET_REGS, &state.regs) < 0)
		return vm_fail(vm, "KVM_SET_REGS");
	return 0;
}

int vm_dirty_log(struct vm *vm, uint64_t *bitmap)
{
	struct kvm_dirty_log log;

	memset(&log, 0, sizeof(log));
	log.slot = VM_SLOT;
	log.dirty_bitmap = bitmap;
	if (ioctl(vm->vm_fd, KVM_GET_DIRTY_LOG, &log) < 0)
		return vm_fail(vm, "KVM_GET_DIRTY_LOG");
	return 0;
}

/* ---- Reports --------------------------------------------------------------- */

void vm_get_reports(struct vm *vm, struct vm_reports *out)
{
	pthread_mutex_lock(&vm->lock);
	*out = vm->reports;
	pthread_mutex_unlock(&vm->lock);
}

void vm_wait(struct vm *vm, uint64_t seen, uint64_t deadline_ns, struct vm_reports *out)
{
	struct timespec ts = {
	        .tv_sec = (time_t)(deadline_ns / 1000000000u),
	        .tv_nsec = (long)(deadline_ns % 1000000000u),
	};

	pthread_mutex_lock(&vm->lock);
	while (vm->reports.events == seen && vm_now_ns() < deadline_ns)
		pthread_cond_timedwait(&vm->cond, &vm->lock, &ts);
	*out = vm->reports;
	pthread_mutex_unlock(&vm->lock);
}
