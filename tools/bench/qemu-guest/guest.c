/* The tiny guest lmt-bench migrates with QEMU: 64-bit code over an
 * identity map (entry.S), no firmware before it. Idle, it halts; given a dirty rate, it
 * runs lmt-bench's own workload (tests/support/guest.c and
 * guest_content.c) on its RAM: the same pages in the same order with the
 * same bytes for the same seed, paced by the TSC, sleeping on the PIT's
 * 1 kHz tick between slices, and logging each page's recipe so that
 * lmt-bench can rebuild every page it wrote. Built freestanding, without
 * a red zone (interrupts land on the same stack). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qemu-guest.h"

#define PAGE_SIZE 4096u
#define WORDS_PER_PAGE (PAGE_SIZE / 8u)
#define VARIATION_MASK ((UINT64_C(1) << 61) - 1)
#define REWRITE_BIT (UINT64_C(1) << 61)
#define MAX_EDITS 8u
#define CLASS_ZERO 0u
#define CLASS_RANDOM 1u
#define TICK_VECTOR 0x20u
#define APIC_SPURIOUS_VECTOR 0x2fu
#define IDT_ENTRIES 0x30u
#define LAPIC_BASE 0xfee00000u
#define LAPIC_SVR 0xf0u
#define LAPIC_LVT0 0x350u
#define LAPIC_ENABLE 0x100u
#define LVT_EXTINT 0x700u
#define EXCEPTIONS 20u

/* Position-independent code addresses these directly, not through a GOT. */
#pragma GCC visibility push(hidden)
extern const struct qg_params guest_params;
extern const uint64_t guest_exception_stubs[EXCEPTIONS];
void guest_tick(void);
void guest_spurious(void);
void guest_main(void);
void guest_fault(const uint64_t *frame);
#pragma GCC visibility pop

/* The compiler may call these for copies and clears. */
void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);

/* Plain loops of quadwords, not rep movs or stos: an emulator (TCG) runs
 * a rep string instruction an element at a time, several times slower.
 * The empty asm keeps the compiler from turning a loop back into a call
 * of itself. The guest copies whole pages and words only. */
void *memcpy(void *dst, const void *src, size_t n)
{
	uint64_t *d = dst;
	const uint64_t *s = src;
	size_t quads = n / 8, i = 0;

	for (; i + 4 <= quads; i += 4) {
		__asm__("" : "+r"(d), "+r"(s));
		d[i] = s[i];
		d[i + 1] = s[i + 1];
		d[i + 2] = s[i + 2];
		d[i + 3] = s[i + 3];
	}
	for (; i < quads; i++) {
		__asm__("" : "+r"(d), "+r"(s));
		d[i] = s[i];
	}
	return dst;
}

void *memset(void *dst, int c, size_t n)
{
	uint64_t *d = dst;
	uint64_t pattern = (uint8_t)c * UINT64_C(0x0101010101010101);

	for (size_t i = 0; i < n / 8; i++) {
		__asm__("" : "+r"(d));
		d[i] = pattern;
	}
	return dst;
}

static inline void outb(uint16_t port, uint8_t value)
{
	__asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port));
}

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
}

static inline void barrier(void)
{
	__asm__ volatile("" : : : "memory");
}

static void say(const char *text)
{
	while (*text)
		outb(QG_DEBUGCON_PORT, (uint8_t)*text++);
}

static void *area(uint64_t offset)
{
	return (void *)(uintptr_t)(guest_params.area_base + offset);
}

static struct qg_status *status(void)
{
	return area(QG_STATUS_OFFSET);
}

/* ---- guest.c's arithmetic ------------------------------------------------- */

/* splitmix64, as guest_random(). */
static uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* The high 64 bits of a * b. */
static uint64_t mulhi64(uint64_t a, uint64_t b)
{
	return (uint64_t)(((unsigned __int128)a * b) >> 64);
}

static uint64_t random_below(uint64_t *state, uint64_t bound)
{
	return mulhi64(next_random(state), bound);
}

/* ---- The workload: guest_workload's pages and recipes --------------------- */

struct workload {
	const struct qg_params *p;
	uint64_t rng;
	uint64_t cursor;
	uint64_t *log;
};

static uint64_t hot_order(const struct qg_params *p, uint64_t i)
{
	/* i and stride are below pages, at most 2^20: no overflow. */
	return (i * p->stride + p->offset) % p->pages;
}

/* guest_hot_set_next, or the working set page after page. */
static uint64_t next_page(struct workload *w)
{
	const struct qg_params *p = w->p;
	uint64_t index = w->cursor;

	if (p->hot) {
		bool hot = p->hot == p->pages || (next_random(&w->rng) >> 32) < p->share;

		if (hot)
			return hot_order(p, random_below(&w->rng, p->hot));
		return hot_order(p, p->hot + random_below(&w->rng, p->pages - p->hot));
	}
	w->cursor = index + 1 == p->pages ? 0 : index + 1;
	return index;
}

/* guest_content_rewrite. */
static uint64_t next_recipe(struct workload *w)
{
	uint64_t draw = next_random(&w->rng) >> 32, variation = next_random(&w->rng);
	uint64_t cls = 0;

	while (cls < 3 && draw >= w->p->write_cut[cls])
		cls++;
	return cls << 62 | REWRITE_BIT | (variation & VARIATION_MASK);
}

/* guest_content_page for a rewrite's recipe. */
static void build_page(const struct qg_params *p, uint64_t *page, uint64_t recipe)
{
	uint64_t cls = recipe >> 62, rng = recipe;

	if (cls == CLASS_RANDOM || (p->kind != QG_KIND_MIXED && cls != CLASS_ZERO)) {
		for (uint32_t i = 0; i < WORDS_PER_PAGE; i++)
			page[i] = next_random(&rng);
		return;
	}
	uint64_t pool = cls - 2, npages = cls == CLASS_ZERO ? 0 : p->pool_pages[pool];
	if (npages == 0) {
		memset(page, 0, PAGE_SIZE);
		return;
	}
	const uint8_t *bytes = area(p->pool_offset[pool]);
	uint64_t at_page = mulhi64((recipe & VARIATION_MASK) << 3, npages);
	memcpy(page, bytes + at_page * PAGE_SIZE, PAGE_SIZE);
	uint64_t edits = 1 + (next_random(&rng) & (MAX_EDITS - 1));
	uint64_t pool_words = npages * WORDS_PER_PAGE;
	for (uint64_t i = 0; i < edits; i++) {
		uint64_t at = random_below(&rng, WORDS_PER_PAGE);
		uint64_t from = random_below(&rng, pool_words);

		memcpy(&page[at], bytes + from * 8u, 8);
	}
}

/* Note the page as being written, log its recipe, write it. A pause may
 * stop the vCPU between any two instructions: `busy` names the one page
 * that may then be half written. A page of the legacy hole is drawn as
 * the workload draws it but left alone: false. */
static bool dirty_page(struct workload *w, struct qg_status *st)
{
	volatile uint32_t *busy = (volatile uint32_t *)&st->busy;
	uint64_t index = next_page(w);
	uint64_t recipe = next_recipe(w);

	/* QEMU's pc machine shows the VGA window and the option and BIOS
	 * ROMs there, not RAM: writes would not reach the RAM block. */
	if (index >= QG_HOLE_START / PAGE_SIZE && index < QG_HOLE_END / PAGE_SIZE) {
		st->pages_skipped++;
		return false;
	}
	*busy = (uint32_t)index + 1;
	barrier();
	w->log[index] = recipe;
	build_page(w->p, (uint64_t *)(index * PAGE_SIZE), recipe);
	st->pages_written++;
	barrier();
	*busy = 0;
	return true;
}

/* ---- Interrupts ----------------------------------------------------------- */

#define CODE64_SELECTOR 0x18u

static void set_gate(uint64_t *idt, uint32_t vector, uint64_t handler)
{
	/* A 64-bit interrupt gate: present, ring 0, no IST. */
	idt[2 * vector] = (handler & 0xffff0000u) << 32 | (uint64_t)0x8e00 << 32 |
	                  (uint64_t)CODE64_SELECTOR << 16 | (handler & 0xffffu);
	idt[2 * vector + 1] = handler >> 32;
}

static void setup_interrupts(void)
{
	uint64_t *idt = area(QG_IDT_OFFSET);
	struct {
		uint16_t limit;
		uint64_t base;
	} __attribute__((packed)) descriptor = {IDT_ENTRIES * 16 - 1, (uint64_t)idt};

	for (uint32_t v = 0; v < IDT_ENTRIES; v++)
		set_gate(idt, v, (uint64_t)guest_spurious);
	for (uint32_t v = 0; v < EXCEPTIONS; v++)
		set_gate(idt, v, guest_exception_stubs[v]);
	set_gate(idt, TICK_VECTOR, (uint64_t)guest_tick);
	__asm__ volatile("lidt %0" : : "m"(descriptor));
	/* The 8259s: IRQ 0-7 at vectors 0x20-0x27, 8-15 at 0x28; only the
	 * PIT's IRQ 0 unmasked. */
	outb(0x20, 0x11);
	outb(0xa0, 0x11);
	outb(0x21, TICK_VECTOR);
	outb(0xa1, TICK_VECTOR + 8);
	outb(0x21, 0x04);
	outb(0xa1, 0x02);
	outb(0x21, 0x01);
	outb(0xa1, 0x01);
	outb(0x21, 0xfe);
	outb(0xa1, 0xff);
	/* No firmware ran: the local APIC's LINT0 is still masked. Enable
	 * the APIC and take the 8259's output through LINT0 (ExtINT), as a
	 * BIOS leaves it. */
	*(volatile uint32_t *)(uintptr_t)(LAPIC_BASE + LAPIC_SVR) =
	        LAPIC_ENABLE | APIC_SPURIOUS_VECTOR;
	*(volatile uint32_t *)(uintptr_t)(LAPIC_BASE + LAPIC_LVT0) = LVT_EXTINT;
	/* PIT channel 0, rate generator. */
	outb(0x43, 0x34);
	outb(0x40, (uint8_t)guest_params.pit_reload);
	outb(0x40, (uint8_t)(guest_params.pit_reload >> 8));
}

void guest_fault(const uint64_t *frame)
{
	struct qg_status *st = status();

	st->fault_vector = frame[0];
	st->fault_error = frame[1];
	st->fault_eip = frame[2];
	st->state = QG_FAULT;
	say("lmt-guest: fault\n");
}

/* ---- Main ----------------------------------------------------------------- */

/* The token bucket of guest_workload: credit in bytes earned from the TSC,
 * capped at the burst, spent a page at a time; then sleep to the tick. */
static void run_workload(const struct qg_params *p, struct qg_status *st)
{
	struct workload w = {.p = p, .rng = p->rng, .log = area(p->log_offset)};
	uint64_t credit = 0, last = rdtsc();

	st->start_tsc = last;
	st->last_tsc = last;
	st->state = QG_DIRTYING;
	say("lmt-guest: dirtying\n");
	for (;;) {
		uint64_t now = rdtsc(), elapsed = now - last;

		if (elapsed > UINT32_MAX)
			elapsed = UINT32_MAX;
		credit += ((uint64_t)(uint32_t)elapsed * (uint32_t)p->bytes_per_tick_q32) >> 32;
		if (credit > p->burst)
			credit = p->burst;
		last = now;
		while (credit >= PAGE_SIZE)
			if (dirty_page(&w, st))
				credit -= PAGE_SIZE;
		st->last_tsc = now;
		st->slices++;
		/* Interrupts only while halted: the tick returns to the
		 * next instruction (entry.S). */
		__asm__ volatile("sti\n\thlt" : : : "memory", "cc");
	}
}

static void say_hex(uint64_t value)
{
	char text[19] = "0x";

	for (int i = 0; i < 16; i++)
		text[2 + i] = "0123456789abcdef"[(value >> (60 - 4 * i)) & 15];
	text[18] = '\0';
	say(text);
}

/* How fast this guest builds random pages here, the slowest kind it
 * writes: "lmt-guest: probe PAGES pages in CYCLES cycles". */
static void probe(const struct qg_params *p, struct qg_status *st)
{
	uint64_t *page = area(p->log_offset);
	uint64_t start;

	/* Once untimed: a TCG translates the code on its first run. */
	build_page(p, page, (uint64_t)CLASS_RANDOM << 62 | REWRITE_BIT);
	start = rdtsc();
	for (uint64_t i = 0; i < p->probe_pages; i++)
		build_page(p, page, (uint64_t)CLASS_RANDOM << 62 | REWRITE_BIT | i);
	uint64_t cycles = rdtsc() - start;
	st->state = QG_PROBED;
	say("lmt-guest: probe ");
	say_hex(p->probe_pages);
	say(" pages in ");
	say_hex(cycles);
	say(" cycles\n");
}

void guest_main(void)
{
	const struct qg_params *p = &guest_params;
	struct qg_status *st;

	if (p->magic != QG_PARAMS_MAGIC || p->version != QG_VERSION) {
		say("lmt-guest: no parameters in the image\n");
		return;
	}
	st = status();
	memset(st, 0, sizeof(*st));
	st->magic = QG_STATUS_MAGIC;
	st->state = QG_BOOTED;
	if (p->probe_pages) {
		probe(p, st);
		return;
	}
	setup_interrupts();
	if (p->dirty_rate == 0) {
		st->state = QG_IDLE;
		say("lmt-guest: idle\n");
		return;
	}
	run_workload(p, st);
}
