/* The guest's firmware entry: the reset vector at 0xfffffff0, real mode
 * to flat 32-bit protected mode, then long mode over an identity map of
 * the first 4 GiB in 2 MiB pages (built in the guest's own RAM area, with
 * the stack), then guest_main in 64-bit code. Also the interrupt stubs:
 * the PIT's tick and every exception. */
#include "qemu-guest.h"

#define CODE32_SELECTOR 0x08
#define DATA_SELECTOR 0x10
#define CODE64_SELECTOR 0x18
#define PTE_PRESENT_WRITE 0x3
#define PDE_LARGE 0x80
#define CR4_PAE 0x20
#define EFER_MSR 0xc0000080
#define EFER_LME 0x100
#define CR0_PG 0x80000000

	.code16
	.section .text16, "ax"
	.globl real_start
real_start:
	cli
	cld
	/* Real mode at reset: CS's base is 0xffff0000 and this code is at
	 * 0xfffff000 (guest.ld), so the descriptor is at this offset in CS. */
	lgdtl %cs:(0xf000 + gdt_descriptor - real_start)
	movl %cr0, %eax
	orl $1, %eax
	movl %eax, %cr0
	ljmpl $CODE32_SELECTOR, $start32

	.code32
start32:
	movw $DATA_SELECTOR, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %ss
	movw %ax, %fs
	movw %ax, %gs
	/* The parameters say where the guest's area is (guest_params + 24,
	 * below 4 GiB): the tables go at QG_PAGE_TABLES_OFFSET in it. */
	movl guest_params + 24, %ebx
	leal QG_PAGE_TABLES_OFFSET(%ebx), %edi
	/* Six zeroed pages: PML4, PDPT, four page directories. (No stack
	 * yet: the registers keep what must outlive rep stos.) */
	xorl %eax, %eax
	movl $(6 * 4096 / 4), %ecx
	movl %edi, %edx
	rep stosl
	movl %edx, %edi
	leal 0x1000 + PTE_PRESENT_WRITE(%edi), %eax
	movl %eax, (%edi)                    /* PML4[0] -> PDPT */
	leal 0x2000 + PTE_PRESENT_WRITE(%edi), %eax
	movl %eax, 0x1000(%edi)              /* PDPT[0..3] -> the directories */
	addl $0x1000, %eax
	movl %eax, 0x1008(%edi)
	addl $0x1000, %eax
	movl %eax, 0x1010(%edi)
	addl $0x1000, %eax
	movl %eax, 0x1018(%edi)
	/* 2048 entries of 2 MiB: 0 to 4 GiB, identity. */
	leal 0x2000(%edi), %esi
	movl $(PDE_LARGE | PTE_PRESENT_WRITE), %eax
	movl $2048, %ecx
1:	movl %eax, (%esi)
	movl $0, 4(%esi)
	addl $0x200000, %eax
	addl $8, %esi
	loop 1b
	movl %edi, %cr3
	movl %cr4, %eax
	orl $CR4_PAE, %eax
	movl %eax, %cr4
	movl $EFER_MSR, %ecx
	rdmsr
	orl $EFER_LME, %eax
	wrmsr
	movl %cr0, %eax
	orl $CR0_PG, %eax
	movl %eax, %cr0
	ljmpl $CODE64_SELECTOR, $start64

	.code64
start64:
	movl guest_params + 24(%rip), %esp
	addq $QG_STACK_TOP, %rsp
	xorl %ebp, %ebp
	call guest_main
1:	cli
	hlt
	jmp 1b

	/* Flat segments; the accessed bits are set, so that the CPU never
	 * writes this read-only table. */
	.balign 8
gdt:
	.quad 0
	.quad 0x00cf9b000000ffff /* 32-bit code */
	.quad 0x00cf93000000ffff /* data */
	.quad 0x00af9b000000ffff /* 64-bit code */
gdt_descriptor:
	.word gdt_descriptor - gdt - 1
	.long gdt

	.section .reset, "ax"
	.code16
reset_vector:
	cli
	jmp real_start
	.balign 16, 0xf4

	.code64
	.text
/* The PIT's tick (vector 0x20) only wakes the loop from hlt: interrupts
 * are enabled only for `sti; hlt` (guest.c), so the interrupted
 * instruction is the one after the hlt, and the flags need not come back.
 * The stub returns there with a near ret and interrupts still off, not
 * with iretq: some hypervisors emulate part of a guest instruction by
 * instruction, and not every emulator has every form of iret (Linux's
 * kvm-pvm has not the 32-bit one). The guest is built -mno-red-zone. */
	.globl guest_tick
guest_tick:
	pushq %rax
	movb $0x20, %al
	outb %al, $0x20
	popq %rax
	jmp wake

/* A spurious interrupt from the 8259 or the local APIC: no end of
 * interrupt, and back to the loop as for a tick. */
	.globl guest_spurious
guest_spurious:
wake:
	/* The frame: rip, cs, rflags, rsp, ss. Put rip on the interrupted
	 * stack and return to it from there. */
	pushq %rbx
	pushq %rcx
	movq 40(%rsp), %rbx
	movq 16(%rsp), %rcx
	movq %rcx, -8(%rbx)
	leaq -8(%rbx), %rcx
	movq %rcx, 40(%rsp)
	popq %rcx
	popq %rbx
	movq 24(%rsp), %rsp
	ret

/* Exceptions: the stub pushes its vector (and 0 where the CPU pushes no
 * error code); guest_fault records them and stops. */
#define EXCEPTION(n)                 \
	.globl guest_exception_##n;  \
guest_exception_##n:                 \
	pushq $0;                    \
	pushq $n;                    \
	jmp exception_common
#define EXCEPTION_ERR(n)             \
	.globl guest_exception_##n;  \
guest_exception_##n:                 \
	pushq $n;                    \
	jmp exception_common

EXCEPTION(0)
EXCEPTION(1)
EXCEPTION(2)
EXCEPTION(3)
EXCEPTION(4)
EXCEPTION(5)
EXCEPTION(6)
EXCEPTION(7)
EXCEPTION_ERR(8)
EXCEPTION(9)
EXCEPTION_ERR(10)
EXCEPTION_ERR(11)
EXCEPTION_ERR(12)
EXCEPTION_ERR(13)
EXCEPTION_ERR(14)
EXCEPTION(15)
EXCEPTION(16)
EXCEPTION_ERR(17)
EXCEPTION(18)
EXCEPTION(19)

exception_common:
	/* The stack: vector, error code, rip, cs, rflags, rsp, ss. */
	movq %rsp, %rdi
	andq $-16, %rsp
	call guest_fault
1:	cli
	hlt
	jmp 1b

	.section .rodata
	.balign 8
	.globl guest_exception_stubs
guest_exception_stubs:
	.quad guest_exception_0, guest_exception_1, guest_exception_2, guest_exception_3
	.quad guest_exception_4, guest_exception_5, guest_exception_6, guest_exception_7
	.quad guest_exception_8, guest_exception_9, guest_exception_10, guest_exception_11
	.quad guest_exception_12, guest_exception_13, guest_exception_14, guest_exception_15
	.quad guest_exception_16, guest_exception_17, guest_exception_18, guest_exception_19

	.section .note.GNU-stack, "", @progbits
