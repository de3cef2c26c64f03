/* minivmm guest: 32-bit protected-mode code, no OS, that rewrites the words
 * of its data area (every word, or one every `stride` bytes) pass after pass
 * and checks the whole area after each.
 *
 * Its state lives in registers, so it must travel with the migration:
 *   ebp  pass number p (1 during the first pass)
 *   esi  address of the current word
 *   edi  end of the data area
 *   ebx  running sum while checking; ecx  P(P+1)/2 while checking
 * and in RAM: the checksum word (sum of the data words, mod 2^32).
 *
 * The bytes are assembled into the VMM's read-only data and copied into
 * guest RAM at GUEST_CODE_ADDR. The code is position-independent (relative
 * jumps, constant addresses only), so no relocation touches it. */
#include "guest.h"

	.section .rodata.minivmm_guest, "a"
	.globl minivmm_guest_code
	.globl minivmm_guest_code_end
	.hidden minivmm_guest_code
	.hidden minivmm_guest_code_end
	.code32

minivmm_guest_code:
	xorl	%ebp, %ebp			/* nothing written yet: pass 0 */
next_pass:
	incl	%ebp
	movl	GUEST_PARAM_DATA_START, %esi
	movl	GUEST_PARAM_DATA_END, %edi

	/* word += address * GUEST_HASH + p; checksum += the same amount. */
rewrite:
	imull	$GUEST_HASH, %esi, %eax
	addl	%ebp, %eax
	addl	%eax, (%esi)
	addl	%eax, GUEST_CHECKSUM_ADDR
	addl	GUEST_PARAM_STRIDE, %esi
	cmpl	%edi, %esi
	jb	rewrite

	/* ecx = P(P+1)/2 mod 2^32, from the 64-bit product. */
	movl	%ebp, %eax
	leal	1(%ebp), %ecx
	mull	%ecx				/* edx:eax = P(P+1) */
	shrdl	$1, %edx, %eax
	movl	%eax, %ecx

	/* Each word visited must be address * GUEST_HASH * P + P(P+1)/2. */
	xorl	%ebx, %ebx
	movl	GUEST_PARAM_DATA_START, %esi
check:
	imull	$GUEST_HASH, %esi, %eax
	imull	%ebp, %eax
	addl	%ecx, %eax			/* the expected value */
	movl	(%esi), %edx
	cmpl	%edx, %eax
	jne	bad
	addl	%edx, %ebx
	addl	GUEST_PARAM_STRIDE, %esi
	cmpl	%edi, %esi
	jb	check

	/* And their sum must be the checksum kept word by word. */
	movl	$GUEST_CHECKSUM_ADDR, %esi
	cmpl	GUEST_CHECKSUM_ADDR, %ebx
	jne	bad

	movl	%ebp, %eax
	movw	$GUEST_PORT_PASS_OK, %dx
	outl	%eax, %dx			/* pass P checked */
	jmp	next_pass

bad:
	movl	%esi, %eax
	movw	$GUEST_PORT_BAD, %dx
	outl	%eax, %dx			/* the first bad address */
halt:
	hlt
	jmp	halt

minivmm_guest_code_end:
	.code64

	.section .note.GNU-stack, "", @progbits
