/* omrt's native worker threads, built into every native library: a small persistent pool that
 * runs the items of one kernel call (tile chunks, column blocks, planes) on several cores with
 * no Python between them, and the BLAS functions those items call.
 *
 * A call hands the pool a job; the calling thread takes items too and returns once all are done.
 * Each thread owns a consecutive range of the items (thread 0 the first), runs it in order, then
 * helps the others from the backs of their ranges: a layer's thread keeps to the same part of the
 * data from layer to layer, and a worker that comes late loses its items to the others.
 * Idle workers spin for SPIN_NS, so that the layers of one run find them awake (waking a sleeping
 * thread costs tens of microseconds), then sleep on a condition variable. One job runs at a time:
 * a call that finds the pool busy (another thread's run, or a call from inside an item) runs its
 * items itself. A forked child starts with no workers and makes new ones on first use. The
 * library is never unloaded (see omrt.native.loader), so the workers live as long as the process.
 *
 * A worker never shares its caller's core: the scheduler may wake it there and leave both there
 * (seen on a 2-core machine, where runs on 2 threads were then no faster than on 1, for seconds
 * on end), so a worker that finds itself on the core its caller submitted the job from moves to the
 * others the process may use (keep_off). The caller's own thread is never pinned. Workers are
 * named omrt-worker (top -H, perf and /proc show them by that name).
 *
 * Each thread adds the time of its share of a job to a counter of its own (thread 0: the caller;
 * items a call runs alone, without the pool, count for no thread), two clock reads per thread
 * per call, so the counters are always on: a profile reads them between tasks (omrt_pool_busy)
 * to tell how busy each core was during each op.
 */
#define _GNU_SOURCE
#include "omrt_gemm.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define POOL_THREADS OMRT_MAX_THREADS
#define MAX_WORKERS (POOL_THREADS - 1)
#define SPIN_NS 300000
/* Spinning threads yield their core every YIELD_EVERY pauses (tens of microseconds): when more
 * threads are runnable than there are cores (another process's, or a worker that was preempted
 * in the middle of an item), the one whose turn it is gets to run. */
#define YIELD_EVERY 1024

static inline void relax(unsigned k) {
    CPU_RELAX();
    if (k % YIELD_EVERY == 0) sched_yield();
}

/* The items a pool thread has left of its own range of a job: [first, end), one cache line per
 * thread, packed in one word so that taking from the front (the owner) and from the back (another
 * thread) are each one compare-and-swap. */
typedef struct {
    _Alignas(64) _Atomic uint64_t left;
} range_t;

typedef struct {
    omrt_item_fn fn;
    void *ctx;
    int64_t count, width;
    _Alignas(64) _Atomic int64_t done;
    range_t ranges[POOL_THREADS]; /* the first `width` are used */
} job_t;

static struct {
    pthread_mutex_t busy, sleep_lock;
    pthread_cond_t wake;
    _Atomic(job_t *) current;
    _Atomic uint64_t epoch;
    _Atomic int sleepers, active;
    _Atomic int caller_cpu; /* the core the latest job was submitted from, or -1 if unknown */
    int workers;
    uint64_t first_epoch; /* the epoch before the job that made the newest workers: they take part in it */
    pthread_t threads[MAX_WORKERS];
#ifdef __linux__
    cpu_set_t allowed; /* the cores the caller could use when it made the workers */
#endif
} P = {.busy = PTHREAD_MUTEX_INITIALIZER, .sleep_lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* Nanoseconds each pool thread spent on its shares of jobs, one cache line each: each worker
 * writes only its own, and thread 0's only the caller that holds the pool. */
static struct {
    _Alignas(64) _Atomic int64_t ns;
} busy_time[POOL_THREADS];

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t range_of(int64_t first, int64_t end) { return (uint64_t)first << 32 | (uint64_t)end; }

/* Take one item of range r, from its front or its back; -1 when it is empty. */
static int64_t take_from(range_t *r, int front) {
    uint64_t left = atomic_load_explicit(&r->left, memory_order_relaxed);
    for (;;) {
        int64_t first = (int64_t)(left >> 32), end = (int64_t)(left & 0xffffffffu);
        if (first >= end) return -1;
        uint64_t rest = front ? range_of(first + 1, end) : range_of(first, end - 1);
        if (atomic_compare_exchange_weak(&r->left, &left, rest)) return front ? first : end - 1;
    }
}

/* Run items of `j` until none is left (this thread's share), adding its time to the thread's
 * busy counter. A thread runs its own range front to back, then the other ranges' items from
 * their backs. Each thread thus starts on the same part of every layer's output (the items of
 * a kernel follow its output in order), and where the next layer splits the same way it reads
 * that part there: a core keeps reading what it wrote, which matters where two cores share no
 * cache. */
static void take_items(job_t *j, int64_t thread) {
    int64_t t0 = now_ns(), ran = 0, i;
    for (int64_t k = 0; k < j->width; k++) {
        range_t *r = &j->ranges[(thread + k) % j->width];
        while ((i = take_from(r, k == 0)) >= 0) {
            j->fn(j->ctx, i, thread);
            ran++;
        }
    }
    atomic_fetch_add_explicit(&j->done, ran, memory_order_release);
    atomic_fetch_add_explicit(&busy_time[thread].ns, now_ns() - t0, memory_order_relaxed);
}

/* The busy nanoseconds of pool threads 0..n-1 so far (they only grow; a profile subtracts). */
OMRT_EXPORT void omrt_pool_busy(int64_t *ns, int64_t n) {
    for (int64_t t = 0; t < n; t++) ns[t] = atomic_load_explicit(&busy_time[t].ns, memory_order_relaxed);
}

/* A run of native calls in one call from Python: table holds `calls` pairs (thunk address,
 * address of its argument vector), called in order. Python builds the table from calls it
 * checked (omrt.runtime.executor), as it checks every direct call. */
OMRT_EXPORT void omrt_run_calls(const int64_t *table, int64_t calls) {
    for (int64_t c = 0; c < calls; c++)
        ((omrt_thunk)(intptr_t)table[2 * c])((const omrt_arg *)(intptr_t)table[2 * c + 1]);
}

/* Wait until the epoch moves past `seen`: spin first, then sleep. */
static uint64_t wait_for_job(uint64_t seen) {
    int64_t t0 = now_ns();
    uint64_t e;
    for (unsigned k = 1; (e = atomic_load(&P.epoch)) == seen; k++) {
        relax(k);
        if ((k & 255) == 0 && now_ns() - t0 > SPIN_NS) {
            pthread_mutex_lock(&P.sleep_lock);
            atomic_fetch_add(&P.sleepers, 1);
            while ((e = atomic_load(&P.epoch)) == seen) pthread_cond_wait(&P.wake, &P.sleep_lock);
            atomic_fetch_sub(&P.sleepers, 1);
            pthread_mutex_unlock(&P.sleep_lock);
            break;
        }
    }
    return e;
}

/* Move the calling worker off core `cpu` (its caller's) if it is on it, to the other cores the
 * process was allowed when the pool was made; nothing when there is no other. */
static void keep_off(int cpu) {
#ifdef __linux__
    if (cpu < 0 || sched_getcpu() != cpu) return;
    cpu_set_t others = P.allowed;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) > 0) sched_setaffinity(0, sizeof others, &others);
#else
    (void)cpu;
#endif
}

static int current_cpu(void) {
#ifdef __linux__
    return sched_getcpu();
#else
    return -1;
#endif
}

/* A worker registers as active before it looks at the job, and the caller clears the job and
 * waits for the active count to drop before it returns: no worker touches a finished job. */
static void *worker(void *arg) {
    int64_t thread = (int64_t)(intptr_t)arg;
    uint64_t seen = P.first_epoch;
    for (;;) {
        seen = wait_for_job(seen);
        keep_off(atomic_load(&P.caller_cpu));
        atomic_fetch_add(&P.active, 1);
        job_t *j = atomic_load(&P.current);
        if (j != NULL && thread < j->width) take_items(j, thread);
        atomic_fetch_sub(&P.active, 1);
    }
    return NULL;
}

static void reset_in_child(void) {
    pthread_mutex_init(&P.busy, NULL);
    pthread_mutex_init(&P.sleep_lock, NULL);
    pthread_cond_init(&P.wake, NULL);
    atomic_store(&P.current, NULL);
    atomic_store(&P.sleepers, 0);
    atomic_store(&P.active, 0);
    P.workers = 0;
}

__attribute__((constructor)) static void register_fork_handler(void) {
    pthread_atfork(NULL, NULL, reset_in_child);
}

void omrt_parallel(omrt_item_fn fn, void *ctx, int64_t count, int64_t threads) {
    int64_t width = threads < count ? threads : count;
    if (width > MAX_WORKERS + 1) width = MAX_WORKERS + 1;
    /* a range packs its bounds in 32 bits each (range_of) */
    if (width <= 1 || count > INT32_MAX || pthread_mutex_trylock(&P.busy) != 0) {
        for (int64_t i = 0; i < count; i++) fn(ctx, i, 0);
        return;
    }
#ifdef __linux__
    if (P.workers == 0 && sched_getaffinity(0, sizeof P.allowed, &P.allowed) != 0) CPU_ZERO(&P.allowed);
#endif
    P.first_epoch = atomic_load(&P.epoch);
    while (P.workers < width - 1 &&
           pthread_create(&P.threads[P.workers], NULL, worker, (void *)(intptr_t)(P.workers + 1)) == 0) {
#ifdef __linux__
        pthread_setname_np(P.threads[P.workers], "omrt-worker");
#endif
        P.workers++;
    }
    if (P.workers + 1 < width) width = P.workers + 1;
    job_t job, *j = &job; /* not zeroed whole: only `width` ranges are read */
    j->fn = fn;
    j->ctx = ctx;
    j->count = count;
    j->width = width;
    atomic_init(&j->done, 0);
    for (int64_t t = 0; t < width; t++)
        atomic_init(&j->ranges[t].left, range_of(omrt_part(count, width, t), omrt_part(count, width, t + 1)));
    atomic_store(&P.caller_cpu, current_cpu());
    atomic_store(&P.current, j);
    atomic_fetch_add(&P.epoch, 1);
    if (atomic_load(&P.sleepers) > 0) {
        pthread_mutex_lock(&P.sleep_lock);
        pthread_cond_broadcast(&P.wake);
        pthread_mutex_unlock(&P.sleep_lock);
    }
    take_items(j, 0);
    for (unsigned k = 1; atomic_load_explicit(&j->done, memory_order_acquire) < count; k++) relax(k);
    atomic_store(&P.current, NULL);
    for (unsigned k = 1; atomic_load(&P.active) > 0; k++) relax(k);
    pthread_mutex_unlock(&P.busy);
}

/* A cache line passed from the calling thread to a pool worker and back `rounds` times: how far
 * apart the cores that split a layer are. Each side gives up after RALLY_WAIT_NS without an
 * answer (a worker that never came, or one the scheduler took off its core). */
#define RALLY_WAIT_NS 20000000

typedef struct {
    _Alignas(64) _Atomic int64_t ball; /* 2i + 1: the caller's i-th throw; 2i + 2: the return; -1: off */
    _Atomic int joined;                /* 1 once a worker took its part, -1 once the caller gave up */
    int64_t rounds, ns;
} rally_t;

/* Spin until *ball is `want` or -1; false if RALLY_WAIT_NS pass first. */
static int await_ball(_Atomic int64_t *ball, int64_t want) {
    int64_t t0 = now_ns(), b;
    for (unsigned k = 1; (b = atomic_load(ball)) != want; k++) {
        if (b == -1 || ((k & 255) == 0 && now_ns() - t0 > RALLY_WAIT_NS)) return 0;
        relax(k);
    }
    return 1;
}

/* Thread 0 throws and times; any other thread returns. Run by one thread alone (both items on
 * it), the throwing part waits RALLY_WAIT_NS for a partner and calls the rally off; the other
 * part then finds it off and returns at once. */
static void rally_part(void *p, int64_t item, int64_t thread) {
    rally_t *r = p;
    (void)item;
    if (thread != 0) {
        int idle = 0;
        if (!atomic_compare_exchange_strong(&r->joined, &idle, 1)) return;
        for (int64_t i = 0; i < r->rounds; i++) {
            if (!await_ball(&r->ball, 2 * i + 1)) return;
            atomic_store(&r->ball, 2 * i + 2);
        }
        return;
    }
    int64_t t0 = now_ns();
    int joined;
    for (unsigned k = 1; (joined = atomic_load(&r->joined)) == 0; k++) {
        if (now_ns() - t0 > RALLY_WAIT_NS && atomic_compare_exchange_strong(&r->joined, &joined, -1)) return;
        relax(k);
    }
    if (joined != 1) return;
    t0 = now_ns();
    for (int64_t i = 0; i < r->rounds; i++) {
        atomic_store(&r->ball, 2 * i + 1);
        if (!await_ball(&r->ball, 2 * i + 2)) {
            atomic_store(&r->ball, -1);
            return;
        }
    }
    r->ns = now_ns() - t0;
}

/* ns[0] = the nanoseconds `rounds` round trips of a cache line between the calling thread and
 * pool worker 1 took, or -1 when no worker took part in time (the pool busy with another run,
 * or no CPU for a worker). */
OMRT_EXPORT void omrt_pool_round_trip(int64_t rounds, int64_t *ns) {
    rally_t r = {.rounds = rounds, .ns = -1};
    atomic_init(&r.ball, 0);
    atomic_init(&r.joined, 0);
    omrt_parallel(rally_part, &r, 2, 2);
    ns[0] = r.ns;
}

typedef void (*sgemm_ilp64)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                            const float *, int64_t, float, float *, int64_t);
typedef void (*sgemm_lp64)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                           float, float *, int);
typedef void (*sgemv_ilp64)(int, int, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                            float, float *, int64_t);
typedef void (*sgemv_lp64)(int, int, int, int, float, const float *, int, const float *, int, float, float *,
                           int);
static void *sgemm_fn, *sgemv_fn;
static int blas_is_ilp64;

/* The CBLAS sgemm and sgemv the kernels call (those of the BLAS numpy uses, found by omrt at
 * load), and whether they take 64-bit sizes. */
OMRT_EXPORT void omrt_use_blas(void *sgemm, void *sgemv, int64_t ilp64) {
    sgemm_fn = sgemm;
    sgemv_fn = sgemv;
    blas_is_ilp64 = ilp64 != 0;
}

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

void omrt_sgemm_t(int64_t ta, int64_t tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc) {
    int oa = ta ? TRANS : NO_TRANS, ob = tb ? TRANS : NO_TRANS;
    if (blas_is_ilp64)
        ((sgemm_ilp64)sgemm_fn)(ROW_MAJOR, oa, ob, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    else
        ((sgemm_lp64)sgemm_fn)(ROW_MAJOR, oa, ob, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, c,
                               (int)ldc);
}

void omrt_sgemv(int64_t ta, int64_t m, int64_t n, const float *a, int64_t lda, const float *x, int64_t incx,
                float *y, int64_t incy) {
    int oa = ta ? TRANS : NO_TRANS;
    if (blas_is_ilp64)
        ((sgemv_ilp64)sgemv_fn)(ROW_MAJOR, oa, m, n, 1.0f, a, lda, x, incx, 0.0f, y, incy);
    else
        ((sgemv_lp64)sgemv_fn)(ROW_MAJOR, oa, (int)m, (int)n, 1.0f, a, (int)lda, x, (int)incx, 0.0f, y, (int)incy);
}

/* level[0] = the widest tile of omrt's GEMM (omrt_gemm.h) on this CPU: 2 AVX-512, 1 AVX2, 0 plain C. */
OMRT_EXPORT void omrt_gemm_tile(int64_t *level) { level[0] = omrt_gemm_level(); }
