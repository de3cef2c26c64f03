/* The contract between lmt-bench and the tiny guest it runs under QEMU
 * (tools/bench/qemu-guest/): the parameters lmt-bench writes into the
 * guest's firmware image, and the status the guest keeps in its own RAM
 * area, which lmt-bench reads back from the destination after a
 * migration. Every field is a uint64_t, so that the guest and the tool
 * lay the structs out alike whatever their compilers. */
#ifndef LMT_BENCH_QEMU_GUEST_H
#define LMT_BENCH_QEMU_GUEST_H

#ifndef __ASSEMBLER__
#include <stdint.h>
#endif

/* The firmware image: 64 KiB mapped at the top of the first 4 GiB, the
 * parameters in its first page, the program after them, the reset vector
 * in its last 16 bytes. */
#define QG_ROM_SIZE 0x10000
#define QG_ROM_BASE 0xffff0000
#define QG_PARAMS_SIZE 0x1000

#define QG_PARAMS_MAGIC UINT64_C(0x316d72617074626c) /* "lbtparm1" */
#define QG_STATUS_MAGIC UINT64_C(0x3174617473746272) /* "rbtstat1" */
#define QG_VERSION 1u

/* The guest's own area, right after the image in guest-physical memory:
 * its status, its stack, the log of its writes and the content's pools. */
#define QG_STATUS_OFFSET 0x0
#define QG_IDT_OFFSET 0x800
#define QG_PAGE_TABLES_OFFSET 0x1000 /* six pages: long mode's identity map */
#define QG_STACK_TOP 0x10000
#define QG_LOG_OFFSET 0x10000

/* The legacy hole of the pc machine, where the guest sees VGA and ROM
 * instead of its RAM: the workload leaves these pages alone. */
#define QG_HOLE_START 0xa0000
#define QG_HOLE_END 0x100000

/* I/O port of QEMU's isa-debugcon, where the guest says what it does. */
#define QG_DEBUGCON_PORT 0xe9u

#ifndef __ASSEMBLER__
enum qg_kind { QG_KIND_RANDOM, QG_KIND_ZERO, QG_KIND_MIXED };
enum qg_pool { QG_POOL_CODE, QG_POOL_TEXT, QG_POOLS };

/* Written by lmt-bench into the image before QEMU starts; read-only to
 * the guest. The workload is lmt-bench's (tests/support/guest.c): the same
 * page order, recipes and pages for the same seed. */
struct qg_params {
	uint64_t magic;
	uint64_t version;
	uint64_t ram_bytes; /* the image: guest-physical [0, ram_bytes) */
	uint64_t area_base; /* the guest's own area */
	uint64_t area_bytes;
	uint64_t log_offset; /* in the area: a recipe per working-set page, 0 = never written */
	uint64_t pool_offset[QG_POOLS]; /* in the area */
	uint64_t pool_pages[QG_POOLS];
	uint64_t kind;               /* enum qg_kind */
	uint64_t write_cut[4];       /* a write's class: cumulative shares of 2^32 */
	uint64_t dirty_rate;         /* bytes per second; 0: idle */
	uint64_t bytes_per_tick_q32; /* dirty_rate / tsc_hz, 32.32 fixed point */
	uint64_t burst;              /* most credit in bytes, as the workload's */
	uint64_t tsc_hz;
	uint64_t pages;                      /* in the working set */
	uint64_t hot, stride, offset, share; /* the hot set; hot 0: uniform */
	uint64_t rng;                        /* the workload's generator state */
	uint64_t pit_reload;                 /* the PIT tick that wakes the loop */
	uint64_t probe_pages;                /* not 0: only time building that many random pages */
};

enum qg_state { QG_BOOTED = 1, QG_IDLE, QG_DIRTYING, QG_FAULT, QG_PROBED };

/* Kept by the guest at the start of its area. */
struct qg_status {
	uint64_t magic;
	uint64_t state;         /* enum qg_state */
	uint64_t pages_written; /* by the workload */
	uint64_t start_tsc;     /* the workload's first slice */
	uint64_t last_tsc;      /* its latest slice */
	uint64_t slices;
	uint64_t busy; /* 1 + the page being written now, or 0 */
	uint64_t fault_vector;
	uint64_t fault_error;
	uint64_t fault_eip;
	uint64_t pages_skipped; /* drawn in the legacy hole, not written */
};

#endif /* !__ASSEMBLER__ */

#endif
