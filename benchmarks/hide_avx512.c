/* A process that cannot see AVX-512: every CPUID instruction run after omrt_hide_avx512() traps
 * (Linux's CPUID faulting, arch_prctl ARCH_SET_CPUID) and is answered from a table of this CPU's
 * own answers, read before the trap was set, with the AVX-512 and AMX feature bits (and AVX-VNNI,
 * AVX-IFMA and AVX10, which AVX2-only hosts lack too) cleared. Libraries that pick their kernels
 * by CPUID when they load (numpy's dispatch, OpenBLAS, ONNX Runtime's MLAS, GCC's target_clones
 * and __builtin_cpu_supports in omrt's kernels) then all pick the ones they run on an AVX2 host.
 * For benchmarks only (hide_avx512.py): it changes what the process is told, not what the
 * hardware is (caches, clocks and XGETBV's register state stay this CPU's). */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef ARCH_SET_CPUID
#define ARCH_SET_CPUID 0x1012
#endif

enum { SUBLEAVES = 64, MOST = 16384 };

typedef struct {
    uint32_t leaf, sub, reg[4]; /* eax, ebx, ecx, edx */
} answer;

static answer table[MOST];
static int recorded; /* entries of the table filled */
volatile long omrt_cpuid_answers; /* CPUIDs answered from the table so far */
static struct sigaction previous;

/* Leaf 7's AVX-512 and AMX bits: EBX F DQ IFMA PF ER CD BW VL; ECX VBMI VBMI2 VNNI BITALG
 * VPOPCNTDQ; EDX 4VNNIW 4FMAPS VP2INTERSECT AMX-BF16 FP16 AMX-TILE AMX-INT8. Subleaf 1's EAX:
 * AVX-VNNI, AVX512-BF16, AMX-FP16, AVX-IFMA; its EDX: AVX10. */
#define B(n) (1u << (n))
static const uint32_t LEAF7_EBX = B(16) | B(17) | B(21) | B(26) | B(27) | B(28) | B(30) | B(31);
static const uint32_t LEAF7_ECX = B(1) | B(6) | B(11) | B(12) | B(14);
static const uint32_t LEAF7_EDX = B(2) | B(3) | B(8) | B(22) | B(23) | B(24) | B(25);
static const uint32_t LEAF7_1_EAX = B(4) | B(5) | B(21) | B(23);
static const uint32_t LEAF7_1_EDX = B(19);
/* Leaf 0xd subleaf 0: the XSAVE state components the CPU supports (opmask, ZMM halves, AMX). */
static const uint32_t LEAF13_EAX = B(5) | B(6) | B(7) | B(17) | B(18);

static void hide(uint32_t leaf, uint32_t sub, uint32_t reg[4]) {
    if (leaf == 7 && sub == 0) {
        reg[1] &= ~LEAF7_EBX;
        reg[2] &= ~LEAF7_ECX;
        reg[3] &= ~LEAF7_EDX;
    } else if (leaf == 7 && sub == 1) {
        reg[0] &= ~LEAF7_1_EAX;
        reg[3] &= ~LEAF7_1_EDX;
    } else if (leaf == 0xd && sub == 0) {
        reg[0] &= ~LEAF13_EAX;
    } else if (leaf == 0x24) {
        memset(reg, 0, 4 * sizeof reg[0]); /* AVX10's own leaf */
    }
}

/* This CPU's answers for leaves first..last (capped to the table), every subleaf up to SUBLEAVES. */
static void record(uint32_t first, uint32_t last) {
    for (uint32_t leaf = first; leaf <= last && recorded + SUBLEAVES <= MOST; leaf++) {
        for (uint32_t sub = 0; sub < SUBLEAVES; sub++) {
            answer *a = &table[recorded++];
            a->leaf = leaf;
            a->sub = sub;
            __cpuid_count(leaf, sub, a->reg[0], a->reg[1], a->reg[2], a->reg[3]);
            hide(leaf, sub, a->reg);
        }
    }
}

/* The recorded answer; a subleaf past the table is read as 0 (callers of leaves without subleaves
 * often leave ECX unset), a leaf past the table answers zeros. */
static const uint32_t *lookup(uint32_t leaf, uint32_t sub) {
    static const uint32_t none[4];
    if (sub >= SUBLEAVES) sub = 0;
    for (int i = 0; i < recorded; i += SUBLEAVES)
        if (table[i].leaf == leaf) return table[i + sub].reg;
    return none;
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    greg_t *gregs = ((ucontext_t *)context)->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)gregs[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) { /* a faulting CPUID */
        const uint32_t *reg = lookup((uint32_t)gregs[REG_RAX], (uint32_t)gregs[REG_RCX]);
        gregs[REG_RAX] = reg[0];
        gregs[REG_RBX] = reg[1];
        gregs[REG_RCX] = reg[2];
        gregs[REG_RDX] = reg[3];
        gregs[REG_RIP] += 2;
        omrt_cpuid_answers++;
        return;
    }
    /* Any other fault is not ours: restore what was there and let the instruction fault again. */
    (void)sig;
    sigaction(SIGSEGV, &previous, NULL);
}

/* Record this CPU's answers, install the handler and make CPUID fault in this thread and the
 * threads it starts from now on (exec clears it). 0 on success, -1 when the kernel or the CPU
 * offers no CPUID faulting, -2 when the handler cannot be installed. */
int omrt_hide_avx512(void) {
    uint32_t a, b, c, d;
    __cpuid(0, a, b, c, d);
    record(0, a);
    __cpuid(0x40000000, a, b, c, d);
    if (a >= 0x40000000 && a < 0x40000100) record(0x40000000, a);
    __cpuid(0x80000000, a, b, c, d);
    if (a >= 0x80000000 && a < 0x80000100) record(0x80000000, a);
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO;
    sigemptyset(&act.sa_mask);
    if (sigaction(SIGSEGV, &act, &previous) != 0) return -2;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        sigaction(SIGSEGV, &previous, NULL);
        return -1;
    }
    return 0;
}
