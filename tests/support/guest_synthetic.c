/* Synthetic pools for a mixed guest on a machine without enough files of
 * its own (see guest_pool.h): English-like text from a vocabulary drawn
 * with Zipf's law, and x86-64-like code (functions of common instruction
 * encodings, string, symbol and relocation tables, read-only data). Only
 * integer arithmetic, so that a seed gives the same bytes everywhere. */
#include <stdlib.h>
#include <string.h>

#include "guest_pool.h"

#define VOCABULARY 4096u
#define WORD_MAX 24u
#define LINE 72u
#define REPEAT_PERCENT 57u /* of the text's sentences, seen before */
#define REPEATED 512u
#define FRESH_PERCENT 30u /* of a body's instructions, not an idiom */

struct vocabulary {
	char word[VOCABULARY][WORD_MAX];
	uint8_t length[VOCABULARY];
	uint64_t cumulative[VOCABULARY]; /* Zipf: rank r weighs 2^32 / (r + 1) */
};

struct out {
	uint8_t *p;
	uint64_t at, size;
};

static void put(struct out *o, const void *bytes, uint64_t n)
{
	if (o->at >= o->size)
		return;
	if (n > o->size - o->at)
		n = o->size - o->at;
	memcpy(o->p + o->at, bytes, n);
	o->at += n;
}

static void put_byte(struct out *o, uint8_t b)
{
	put(o, &b, 1);
}

/* `n` little-endian bytes of `value`. */
static void put_le(struct out *o, uint64_t value, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		put_byte(o, (uint8_t)(value >> (8 * i)));
}

static void vocabulary_init(struct vocabulary *v, uint64_t *rng)
{
	static const char *const syllables[] = {
	        "the", "an", "in", "on", "er", "re",  "st",  "th",  "al",  "en",   "ti",   "or",
	        "ma",  "ic", "le", "de", "co", "pro", "con", "ex",  "ing", "tion", "ment", "able",
	        "ly",  "ed", "es", "at", "un", "per", "ver", "com", "ra",  "so",   "li",   "ne",
	        "se",  "ta", "mi", "lo", "ca", "di",  "po",  "ri",  "fa",  "ho",   "we",   "be"};
	const size_t nsyllables = sizeof(syllables) / sizeof(syllables[0]);
	uint64_t total = 0;

	for (uint32_t r = 0; r < VOCABULARY; r++) {
		/* Frequent words are short. */
		uint64_t parts = 1 + guest_random_below(rng, r < 64 ? 1 : r < 1024 ? 3 : 4);
		size_t len = 0;

		for (uint64_t s = 0; s < parts; s++) {
			const char *syl = syllables[guest_random_below(rng, nsyllables)];
			size_t n = strlen(syl);

			if (len + n < WORD_MAX) {
				memcpy(v->word[r] + len, syl, n);
				len += n;
			}
		}
		v->length[r] = (uint8_t)len;
		total += (UINT64_C(1) << 32) / (r + 1);
		v->cumulative[r] = total;
	}
}

static uint32_t vocabulary_pick(const struct vocabulary *v, uint64_t *rng)
{
	uint64_t u = guest_random_below(rng, v->cumulative[VOCABULARY - 1]);
	uint32_t lo = 0, hi = VOCABULARY - 1;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;

		if (u < v->cumulative[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* ---- Text --------------------------------------------------------------- */

static void text_sentence(struct out *o, const struct vocabulary *v, uint64_t *rng,
                          unsigned *column)
{
	uint64_t words = 4 + guest_random_below(rng, 15);

	for (uint64_t i = 0; i < words; i++) {
		uint32_t w = vocabulary_pick(v, rng);
		char word[WORD_MAX + 2];
		size_t len = v->length[w];

		memcpy(word, v->word[w], len);
		if (i == 0)
			word[0] = (char)(word[0] - 'a' + 'A');
		if (i + 1 == words)
			word[len++] = guest_random_below(rng, 8) ? '.' : '?';
		else if (!guest_random_below(rng, 10))
			word[len++] = ',';
		if (*column + len + 1 > LINE) {
			put_byte(o, '\n');
			*column = 0;
		} else if (*column > 0) {
			put_byte(o, ' ');
			(*column)++;
		}
		put(o, word, len);
		*column += (unsigned)len;
	}
}

int guest_synthetic_text(uint8_t *bytes, uint64_t size, uint64_t seed)
{
	struct vocabulary *v = malloc(sizeof(*v));
	struct out o = {bytes, 0, size};
	uint64_t rng = seed, repeated[REPEATED];
	unsigned column = 0;

	if (!v)
		return -1;
	vocabulary_init(v, &rng);
	for (uint32_t i = 0; i < REPEATED; i++)
		repeated[i] = guest_random(&rng);
	while (o.at < o.size) {
		uint64_t sentences = 2 + guest_random_below(&rng, 6);

		for (uint64_t s = 0; s < sentences; s++) {
			/* Documents repeat whole sentences (notices, licenses,
			 * boilerplate): some come again from a table of seeds. */
			uint64_t again = guest_random_below(&rng, 100) < REPEAT_PERCENT;
			uint64_t sentence_rng =
			        again ? repeated[guest_random_below(
			                        &rng, 1 + guest_random_below(&rng, REPEATED))]
			              : guest_random(&rng);

			text_sentence(&o, v, &sentence_rng, &column);
		}
		put(&o, "\n\n", 2);
		column = 0;
	}
	free(v);
	return 0;
}

/* ---- Code --------------------------------------------------------------- */

/* Registers by how often compilers use them: rax, rdi, rsi, rdx, rcx, rbx,
 * r8, rbp, r12 ... (the encoding's number). */
static const uint8_t registers[] = {0, 7, 6, 2, 1, 3, 8, 5, 12, 13, 14, 15, 9, 10, 11, 4};

static uint8_t pick_register(uint64_t *rng)
{
	/* Rank r with a weight about 1 / (r + 1). */
	static const uint8_t ranks[] = {0, 0, 0, 0, 1, 1,  1,  2,  2,  3,  3, 4,
	                                5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
	return registers[ranks[guest_random_below(rng, sizeof(ranks))]];
}

/* REX.W with the two registers' high bits. */
static uint8_t rex(uint8_t reg, uint8_t rm)
{
	return (uint8_t)(0x48 | (reg >> 3) << 2 | (rm >> 3));
}

/* A displacement as compilers make them: mostly small, aligned, negative
 * from rbp. */
static uint8_t small_displacement(uint64_t *rng)
{
	return (uint8_t)(-(int)(8 * (1 + guest_random_below(rng, 12))));
}

static void instruction(struct out *o, uint64_t *rng)
{
	uint8_t a = pick_register(rng), b = pick_register(rng);

	switch (guest_random_below(rng, 16)) {
	case 0:
	case 1:
	case 2: /* mov r64, r64 */
		put_byte(o, rex(b, a)), put_byte(o, 0x89),
		        put_byte(o, 0xc0 | (b & 7) << 3 | (a & 7));
		break;
	case 3:
	case 4: /* mov r64, [rbp - d] */
		put_byte(o, rex(a, 5)), put_byte(o, 0x8b), put_byte(o, 0x45 | (a & 7) << 3);
		put_byte(o, small_displacement(rng));
		break;
	case 5: /* mov [rsp + d], r64 */
		put_byte(o, rex(a, 4)), put_byte(o, 0x89), put_byte(o, 0x44 | (a & 7) << 3);
		put_byte(o, 0x24), put_byte(o, (uint8_t)(8 * guest_random_below(rng, 16)));
		break;
	case 6: /* lea r64, [rip + d32] */
		put_byte(o, rex(a, 0)), put_byte(o, 0x8d), put_byte(o, 0x05 | (a & 7) << 3);
		put_le(o, guest_random_below(rng, 1u << 20), 4);
		break;
	case 7:
	case 8: /* call rel32 */
		put_byte(o, 0xe8);
		put_le(o,
		       (uint64_t)(int64_t)((int32_t)guest_random_below(rng, 1u << 21) - (1 << 20)),
		       4);
		break;
	case 9: /* jcc rel8 */
		put_byte(o, (uint8_t)(0x74 + guest_random_below(rng, 12)));
		put_byte(o, (uint8_t)guest_random_below(rng, 64));
		break;
	case 10: /* test r, r */
		put_byte(o, rex(a, a)), put_byte(o, 0x85),
		        put_byte(o, 0xc0 | (a & 7) << 3 | (a & 7));
		break;
	case 11: /* cmp / add / sub r64, imm8 */
		put_byte(o, rex(0, a)), put_byte(o, 0x83);
		put_byte(o, (uint8_t)(0xc0 | (uint8_t[]){0, 5, 7}[guest_random_below(rng, 3)] << 3 |
		                      (a & 7)));
		put_byte(o, (uint8_t)guest_random_below(rng, 32));
		break;
	case 12: /* mov r32, imm32 */
		if (a & 8)
			put_byte(o, 0x41);
		put_byte(o, 0xb8 | (a & 7));
		put_le(o, guest_random_below(rng, 256), 4);
		break;
	case 13: /* xor r32, r32 */
		put_byte(o, 0x31), put_byte(o, 0xc0 | (a & 7) << 3 | (a & 7));
		break;
	case 14: /* movsd xmm, [rbp - d] */
		put(o, "\xf2\x0f\x10", 3), put_byte(o, 0x45 | (a & 7) << 3);
		put_byte(o, small_displacement(rng));
		break;
	default: /* jcc rel32 */
		put_byte(o, 0x0f), put_byte(o, (uint8_t)(0x84 + guest_random_below(rng, 12)));
		put_le(o, guest_random_below(rng, 4096), 4);
		break;
	}
}

/* push rbp, rbx, r12, r13, r14 and the pops, in the order they come. */
static const char *const pushes[] = {"\x55", "\x53", "\x41\x54", "\x41\x55", "\x41\x56"};
static const char *const pops[] = {"\x5d", "\x5b", "\x41\x5c", "\x41\x5d", "\x41\x5e"};

/* Compilers repeat themselves: most of a body is idioms, a few
 * instructions each, drawn by Zipf's law from a table made once. */
#define IDIOMS 1024u
#define IDIOM_MAX 48u

struct idioms {
	uint8_t bytes[IDIOMS][IDIOM_MAX];
	uint8_t length[IDIOMS];
	uint64_t cumulative[IDIOMS];
};

static void idioms_init(struct idioms *t, uint64_t *rng)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < IDIOMS; i++) {
		uint8_t buf[IDIOM_MAX * 2];
		struct out o = {buf, 0, sizeof(buf)};
		uint64_t n = 1 + guest_random_below(rng, 4);

		for (uint64_t k = 0; k < n && o.at < IDIOM_MAX - 16; k++)
			instruction(&o, rng);
		memcpy(t->bytes[i], buf, o.at);
		t->length[i] = (uint8_t)o.at;
		total += (UINT64_C(1) << 32) / (i + 1);
		t->cumulative[i] = total;
	}
}

static void idiom(struct out *o, const struct idioms *t, uint64_t *rng)
{
	uint64_t u = guest_random_below(rng, t->cumulative[IDIOMS - 1]);
	uint32_t lo = 0, hi = IDIOMS - 1;

	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;

		if (u < t->cumulative[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	put(o, t->bytes[lo], t->length[lo]);
}

static void function(struct out *o, const struct idioms *t, uint64_t *rng)
{
	static const char *const pads[] = {"\x90", "\xcc", "\x0f\x1f\x40\x00",
	                                   "\x66\x0f\x1f\x44\x00\x00"};
	uint64_t saved = guest_random_below(rng, 5), body = 4 + guest_random_below(rng, 60);
	uint8_t frame = (uint8_t)(8 * (1 + guest_random_below(rng, 16)));

	put(o, "\xf3\x0f\x1e\xfa", 4); /* endbr64 */
	for (uint64_t i = 0; i < saved; i++)
		put(o, pushes[i], strlen(pushes[i]));
	put(o, "\x48\x83\xec", 3), put_byte(o, frame);
	for (uint64_t i = 0; i < body; i++) {
		if (guest_random_below(rng, 100) < FRESH_PERCENT)
			instruction(o, rng);
		else
			idiom(o, t, rng);
	}
	put(o, "\x48\x83\xc4", 3), put_byte(o, frame);
	for (uint64_t i = saved; i-- > 0;)
		put(o, pops[i], strlen(pops[i]));
	put_byte(o, 0xc3);
	/* Functions start 16-byte aligned. */
	while (o->at % 16 && o->at < o->size) {
		const char *pad = pads[guest_random_below(rng, 4)];
		size_t n = pad[0] == '\x0f' ? 4 : pad[0] == '\x66' ? 6 : 1;

		put(o, pad, n < 16 - o->at % 16 ? n : 16 - o->at % 16);
	}
}

/* Identifiers joined by underscores, each ending in NUL, as .dynstr. */
static void strings(struct out *o, uint64_t end, const struct vocabulary *v, uint64_t *rng)
{
	while (o->at < end) {
		uint64_t parts = 1 + guest_random_below(rng, 3);

		for (uint64_t i = 0; i < parts; i++) {
			uint32_t w = vocabulary_pick(v, rng);

			if (i)
				put_byte(o, '_');
			put(o, v->word[w], v->length[w]);
		}
		put_byte(o, 0);
	}
}

/* Elf64_Sym or Elf64_Rela records with increasing names and addresses. */
static void records(struct out *o, uint64_t end, uint64_t *rng)
{
	uint64_t name = guest_random_below(rng, 1u << 16),
	         address = 0x1000 * guest_random_below(rng, 256);
	bool symbols = guest_random_below(rng, 2);

	while (o->at < end) {
		address += 8 * (1 + guest_random_below(rng, symbols ? 64 : 2));
		if (symbols) {
			name += 4 + guest_random_below(rng, 24);
			put_le(o, name, 4), put_byte(o, 0x12), put_byte(o, 0);
			put_le(o, 14, 2), put_le(o, address, 8),
			        put_le(o, guest_random_below(rng, 512), 8);
		} else {
			put_le(o, address, 8), put_le(o, 8, 8); /* R_X86_64_RELATIVE */
			put_le(o, address + guest_random_below(rng, 1u << 16), 8);
		}
	}
}

/* Tables of small integers and relative jump offsets, as .rodata. */
static void rodata(struct out *o, uint64_t end, uint64_t *rng)
{
	while (o->at < end) {
		uint64_t bound = guest_random_below(rng, 2) ? 64 : 1u << 16;

		for (int i = 0; i < 16; i++)
			put_le(o, (uint64_t) - (int64_t)guest_random_below(rng, bound), 4);
	}
}

int guest_synthetic_code(uint8_t *bytes, uint64_t size, uint64_t seed)
{
	struct vocabulary *v = malloc(sizeof(*v));
	struct idioms *t = malloc(sizeof(*t));
	struct out o = {bytes, 0, size};
	uint64_t rng = seed;

	if (!v || !t) {
		free(v);
		free(t);
		return -1;
	}
	vocabulary_init(v, &rng);
	idioms_init(t, &rng);
	while (o.at < o.size) {
		/* Sections of 1 to 8 pages: mostly code, then tables. */
		uint64_t kind = guest_random_below(&rng, 100);
		uint64_t end = o.at + GUEST_PAGE_SIZE * (1 + guest_random_below(&rng, 8));

		end = end < o.size ? end : o.size;
		if (kind < 70)
			while (o.at < end)
				function(&o, t, &rng);
		else if (kind < 82)
			strings(&o, end, v, &rng);
		else if (kind < 92)
			records(&o, end, &rng);
		else
			rodata(&o, end, &rng);
	}
	free(t);
	free(v);
	return 0;
}
