/* minivmm guest: the guest-physical layout and I/O ports that the guest code
 * (guest.S) and the VMM (vm.c, minivmm.c) agree on. Included from both. */
#ifndef MINIVMM_GUEST_H
#define MINIVMM_GUEST_H

/* The code runs from here, in 32-bit protected mode with flat segments. */
#define GUEST_CODE_ADDR 0x1000
#define GUEST_CODE_MAX 0x1000

/* Words the VMM writes before the first instruction: the data area, and
 * the distance between the words the guest rewrites (4: every word; 4096:
 * one word a page, which still dirties every page). */
#define GUEST_PARAM_DATA_START 0x2000
#define GUEST_PARAM_DATA_END 0x2004
#define GUEST_PARAM_STRIDE 0x2008

/* The running checksum, alone on its page: sum(data words) mod 2^32. */
#define GUEST_CHECKSUM_ADDR 0x3000

/* The data area starts here and ends at the end of RAM. */
#define GUEST_DATA_ADDR 0x10000

/* Pass p adds (address * GUEST_HASH + p) to each word it visits, so after
 * pass P it holds address * GUEST_HASH * P + P(P+1)/2, which the guest can
 * check word by word. */
#define GUEST_HASH 0x9e3779b1

/* out %eax: the number of a pass whose full check succeeded. */
#define GUEST_PORT_PASS_OK 0x510
/* out %eax: the first bad address (a data word, or the checksum), then hlt. */
#define GUEST_PORT_BAD 0x511

#endif /* MINIVMM_GUEST_H */
