// The emulator's runtime: runs a kernel launch's blocks on host threads and each block's GPU threads as
// fibers (runner_abi.h says how), with real barriers and warp operations, and reports what a GPU would
// leave undefined (a barrier some threads never reach, a warp operation whose mask names lanes that do not
// arrive, a crash) as a fault naming kernel, block and threads.
//
// Built three ways: as a shared library that Python loads (kernel_runner.py), and into the ThreadSanitizer
// and AddressSanitizer drivers (runner_driver.cpp, with LF_EMU_SANITIZE and LF_EMU_TSAN or LF_EMU_ASAN).
// The runtime itself is never instrumented: a sanitizer sees only the kernel's own accesses, and the
// runtime tells it about fibers and barriers through its annotation calls.
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runner_abi.h"

#if defined(LF_EMU_ASAN)
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
#endif
#if defined(LF_EMU_TSAN)
extern "C" void* __tsan_get_current_fiber(void);
extern "C" void* __tsan_create_fiber(unsigned flags);
extern "C" void __tsan_destroy_fiber(void* fiber);
extern "C" void __tsan_switch_to_fiber(void* fiber, unsigned flags);
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void __tsan_set_fiber_name(void* fiber, const char* name);
#endif
#if defined(LF_EMU_SANITIZE)
extern "C" void __sanitizer_set_death_callback(void (*callback)(void));
#endif

namespace lf_emu {

struct Fiber {
    void* sp = nullptr;
    char* stack_lo = nullptr;  // usable stack [stack_lo, stack_lo + STACK_BYTES); a guard region below it
    Runner runner{};
    Thread* owner = nullptr;  // the thread whose stack this is (after its runner was demoted)
    void* asan_fake = nullptr;
    Fiber* next_free = nullptr;
};

namespace {

// ---------------------------------------------------------------------------------------------------------
// Context switch: save the callee-saved registers on the current stack, swap stack pointers, restore. The
// floating-point control words (rounding, exception masks) are not switched: kernel code never changes them.
#if defined(__x86_64__) && !defined(LF_EMU_UCONTEXT)
extern "C" void lf_emu_switch_context(void** save_sp, void* new_sp);
extern "C" void lf_emu_fiber_trampoline();
asm(R"(
    .text
    .globl lf_emu_switch_context
    .type lf_emu_switch_context, @function
lf_emu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lf_emu_switch_context, .-lf_emu_switch_context

    .globl lf_emu_fiber_trampoline
    .type lf_emu_fiber_trampoline, @function
lf_emu_fiber_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size lf_emu_fiber_trampoline, .-lf_emu_fiber_trampoline
)");

// A new fiber's first switch "returns" into the trampoline, which calls entry(arg) with an aligned stack.
void* initial_stack(char* top, void (*entry)(void*), void* arg) {
    uintptr_t aligned = reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(aligned - 16 - 56);  // after the 7 pops rsp % 16 == 0, as a call needs
    sp[0] = 0;                                                      // r15
    sp[1] = 0;                                                      // r14
    sp[2] = reinterpret_cast<uint64_t>(entry);                      // r13
    sp[3] = reinterpret_cast<uint64_t>(arg);                        // r12
    sp[4] = 0;                                                      // rbx
    sp[5] = 0;                                                      // rbp
    sp[6] = reinterpret_cast<uint64_t>(&lf_emu_fiber_trampoline);  // return address
    return sp;
}
#define LF_EMU_SWITCH(save, to) lf_emu_switch_context((save), (to))
#else
}  // namespace
}  // namespace lf_emu
#include <ucontext.h>
namespace lf_emu {
namespace {
struct UContextFiber {
    ucontext_t context;
};
void* initial_stack_ucontext(char* lo, size_t size, void (*entry)(void*), void* arg) {
    UContextFiber* u = new UContextFiber;
    getcontext(&u->context);
    u->context.uc_stack.ss_sp = lo;
    u->context.uc_stack.ss_size = size;
    u->context.uc_link = nullptr;
    uintptr_t a = reinterpret_cast<uintptr_t>(arg), e = reinterpret_cast<uintptr_t>(entry);
    makecontext(&u->context, reinterpret_cast<void (*)()>(+[](unsigned ah, unsigned al, unsigned eh, unsigned el) {
                    void* a2 = reinterpret_cast<void*>((uintptr_t(ah) << 32) | al);
                    auto e2 = reinterpret_cast<void (*)(void*)>((uintptr_t(eh) << 32) | el);
                    e2(a2);
                }),
                4, unsigned(a >> 32), unsigned(a), unsigned(e >> 32), unsigned(e));
    return u;
}
void ucontext_switch(void** save, void* to) {
    UContextFiber* self = static_cast<UContextFiber*>(*save);
    if (!self) *save = self = new UContextFiber;
    swapcontext(&self->context, &static_cast<UContextFiber*>(to)->context);
}
#define LF_EMU_SWITCH(save, to) ucontext_switch((save), (to))
#endif

// ---------------------------------------------------------------------------------------------------------
#if defined(LF_EMU_SANITIZE)
const size_t STACK_BYTES = 128u << 10;  // sanitized frames are larger, and a kernel's are small
#else
const size_t STACK_BYTES = 256u << 10;
#endif
const size_t GUARD_BYTES = 16u << 10;

struct Launch {
    const char* name;
    void (*run)(Runner*);
    void* const* args;
    dim3 grid, block;
    size_t dynamic_shared;
    unsigned long long nblocks;
    void (*touch_shared)();
    std::atomic<unsigned long long> next_block{0};
    std::atomic<bool> failed{false};
    std::mutex fault_mutex;
    std::string fault;
    unsigned char tsan_done;  // ThreadSanitizer: every GPU thread's end happens before the launch returns
};

struct PendingWarpOp {
    unsigned mask, arrived;
    int op, size, line, width;
};

struct WarpState {
    PendingWarpOp ops[WARP];
    int count;
    unsigned generation;
};

// Everything one host thread needs to run blocks. Launches are serialised, so one set serves any launch.
struct Host {
    Block block{};
    Thread threads[MAX_THREADS];
    WarpState warps[MAX_WARPS] = {};
    bool warps_used = false;
    Fiber host;
    Fiber* current = nullptr;
    Fiber* switch_from = nullptr;
    const void* host_stack_lo = nullptr;  // AddressSanitizer's view of the host stack
    size_t host_stack_size = 0;
    Fiber* zombie = nullptr;  // a fiber that ended; released by whoever runs next
    Fiber* free_fibers = nullptr;
    std::vector<Fiber*> all_fibers;
    Thread* queue[MAX_THREADS];
    unsigned queue_head = 0, queue_count = 0;
    unsigned bar_arrived = 0, bar_generation = 0;
    int bar_line = 0, bar_op = 0, bar_value = 0;
    // ThreadSanitizer: the addresses its barrier and __syncwarp orderings are kept at, by generation. They lie
    // in the block's stack region, mapped fresh for each block, so no ordering carries over to the next block
    char* sync_objects = nullptr;
    Launch* launch = nullptr;
    bool faulted = false;
    std::string fault;
    std::vector<char> shared_storage;
    sigjmp_buf crash_jump;
    volatile sig_atomic_t in_blocks = 0;
    volatile int crash_signal = 0;
    void* volatile crash_address = nullptr;
    void* tsan_host = nullptr;
    std::vector<void*> tsan_previous_block;  // the fibers of the block run before, not yet destroyed
    unsigned long long tsan_blocks = 0;
};

thread_local Host* tls_host = nullptr;

void as_host() {
#if defined(LF_EMU_TSAN)
    if (tls_host && tls_host->tsan_host) __tsan_switch_to_fiber(tls_host->tsan_host, 1);
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Messages. They are made only when a launch fails; under ThreadSanitizer the making is the block host
// thread's (the GPU thread that found the fault never runs again), so the caller reading them races with
// nobody.
void as_host();

std::string format(const char* fmt, ...) {
    as_host();
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

std::string index3(uint3 v) { return format("(%u,%u,%u)", v.x, v.y, v.z); }

// "(0,0,0)-(127,0,0), (200,0,0)": threads in runs of consecutive linear index, at most a few runs
std::string thread_list(Host* h, const std::vector<unsigned>& linear) {
    std::string out;
    size_t runs = 0, i = 0;
    while (i < linear.size()) {
        size_t j = i;
        while (j + 1 < linear.size() && linear[j + 1] == linear[j] + 1) ++j;
        if (runs == 6) {
            out += format(", ... (%zu threads in all)", linear.size());
            break;
        }
        if (runs) out += ", ";
        out += index3(h->threads[linear[i]].thread_idx);
        if (j > i) out += "-" + index3(h->threads[linear[j]].thread_idx);
        ++runs;
        i = j + 1;
    }
    return out;
}

const char* barrier_name(int op) {
    static const char* names[] = {"__syncthreads()", "__syncthreads_count()", "__syncthreads_and()",
                                  "__syncthreads_or()"};
    return op >= 0 && op < 4 ? names[op] : "barrier";
}

const char* warp_name(int op) {
    switch (op) {
        case SHFL_IDX: return "__shfl_sync";
        case SHFL_UP: return "__shfl_up_sync";
        case SHFL_DOWN: return "__shfl_down_sync";
        case SHFL_XOR: return "__shfl_xor_sync";
        case SYNCWARP: return "__syncwarp";
        case BALLOT: return "__ballot_sync";
        case ALL: return "__all_sync";
        case ANY: return "__any_sync";
        case MATCH_ANY: return "__match_any_sync";
        case MATCH_ALL: return "__match_all_sync";
        case REDUCE_ADD: return "__reduce_add_sync";
        case REDUCE_MIN: case REDUCE_UMIN: return "__reduce_min_sync";
        case REDUCE_MAX: case REDUCE_UMAX: return "__reduce_max_sync";
        case REDUCE_AND: return "__reduce_and_sync";
        case REDUCE_OR: return "__reduce_or_sync";
        case REDUCE_XOR: return "__reduce_xor_sync";
    }
    return "warp operation";
}

std::string where(Host* h) {
    return format("kernel %s, block %s: ", h->launch->name, index3(h->block.block_idx).c_str());
}

// ---------------------------------------------------------------------------------------------------------
// Fibers. A fiber and its stack stay with the host thread and are reused, except under ThreadSanitizer: it
// keeps what it saw on a stack's addresses, so another GPU thread's frames there would look like racing
// accesses. There every block maps one region for all its threads' stacks, fresh, and unmaps it at its end
// (the Fiber records themselves are still reused, never freed, as freeing memory a fiber has read is a race
// to it).
#if defined(LF_EMU_TSAN)
const bool REUSE_STACKS = false;
#else
const bool REUSE_STACKS = true;
#endif

char* map_stacks(size_t count) {
    size_t span = count * (STACK_BYTES + GUARD_BYTES);
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "layerforge emulated GPU: cannot map fiber stacks: %s\n", strerror(errno));
        abort();
    }
    char* base = static_cast<char*>(m);
    for (size_t i = 0; i < count; ++i) mprotect(base + i * (STACK_BYTES + GUARD_BYTES), GUARD_BYTES, PROT_NONE);
    return base;
}

void fiber_entry(void* arg);

// A fiber record from the pool, with `stack` as its stack if given, else the one it has or a new one
Fiber* take_fiber(Host* h, char* stack = nullptr) {
    Fiber* f;
    if (h->free_fibers) {
        f = h->free_fibers;
        h->free_fibers = f->next_free;
    } else {
        f = new Fiber;
        h->all_fibers.push_back(f);
    }
    if (stack) f->stack_lo = stack;
    if (!f->stack_lo) f->stack_lo = map_stacks(1) + GUARD_BYTES;
    f->owner = nullptr;
    f->runner = Runner{&h->block, nullptr, 0, h->launch->args};
    f->asan_fake = nullptr;
#if defined(__x86_64__) && !defined(LF_EMU_UCONTEXT)
    f->sp = initial_stack(f->stack_lo + STACK_BYTES, fiber_entry, f);
#else
    f->sp = initial_stack_ucontext(f->stack_lo, STACK_BYTES, fiber_entry, f);
#endif
    return f;
}

void release_fiber(Host* h, Fiber* f) {
    if (!REUSE_STACKS) f->stack_lo = nullptr;  // its block's region is unmapped at the block's end
    f->next_free = h->free_fibers;
    h->free_fibers = f;
}

#if defined(LF_EMU_TSAN)
void* tsan_identity(Host* h, Fiber* f) {
    return f == &h->host ? h->tsan_host : (f->owner ? f->owner->tsan_fiber : nullptr);
}
#endif

inline __attribute__((always_inline)) void after_switch(Host* h, Fiber* self) {
#if defined(LF_EMU_ASAN)
    const void* old_lo;
    size_t old_size;
    __sanitizer_finish_switch_fiber(self->asan_fake, &old_lo, &old_size);
    if (h->switch_from == &h->host) {
        h->host_stack_lo = old_lo;
        h->host_stack_size = old_size;
    }
#endif
    if (h->zombie && h->zombie != self) {
        release_fiber(h, h->zombie);
        h->zombie = nullptr;
    }
}

// Switch from `from` (the running fiber) to `to`; returns when `from` is resumed, unless it is dying.
inline __attribute__((always_inline)) void switch_fiber(Host* h, Fiber* from, Fiber* to, bool dying) {
    (void)dying;
    h->current = to;
    h->switch_from = from;
#if defined(LF_EMU_ASAN)
    bool to_host = to == &h->host;
    __sanitizer_start_switch_fiber(dying ? nullptr : &from->asan_fake, to_host ? h->host_stack_lo : to->stack_lo,
                                   to_host ? h->host_stack_size : STACK_BYTES);
#endif
#if defined(LF_EMU_TSAN)
    __tsan_switch_to_fiber(tsan_identity(h, to), 1 /* no synchronisation: the barriers say what orders */);
#endif
    LF_EMU_SWITCH(&from->sp, to->sp);
    after_switch(h, from);
}

// ---------------------------------------------------------------------------------------------------------
// Scheduling. A thread that cannot go on hands over to the first ready thread, else to a new runner for the
// threads not started yet, else (nothing can run) back to the host: the block is done, or stuck.
[[noreturn]] void stop_block(Host* h, Fiber* from, const std::string& what);
__attribute__((noinline, cold)) void diagnose_stuck(Host* h);

Fiber* new_runner(Host* h) {
#if defined(LF_EMU_SANITIZE)
    // the next thread's own fiber, made at the block's start
    Thread* t = &h->threads[h->block.next_unstarted++];
    t->state = RUNNING;
    return t->fiber;
#else
    return take_fiber(h);
#endif
}

inline __attribute__((always_inline)) Fiber* pick_next(Host* h) {
    Block& b = h->block;
    if (h->queue_count) {
        Thread* t = h->queue[h->queue_head];
        h->queue_head = (h->queue_head + 1) % MAX_THREADS;
        --h->queue_count;
        t->state = RUNNING;
        if (h->queue_count) {
            // the thread after this one: its saved registers and frames start coming into the cache now
            const char* sp = static_cast<const char*>(h->queue[h->queue_head]->fiber->sp);
            for (int line = 0; line < 8; ++line) __builtin_prefetch(sp + 64 * line);
        }
        return t->fiber;
    }
    if (b.next_unstarted < b.nthreads) return new_runner(h);
    if (b.finished < b.nthreads) diagnose_stuck(h);
    return &h->host;
}

inline __attribute__((always_inline)) void make_ready(Host* h, Thread* t) {
    t->state = READY;
    h->queue[(h->queue_head + h->queue_count) % MAX_THREADS] = t;
    ++h->queue_count;
}

// The running thread waits: its runner becomes its own fiber if it ran on one, and the next context runs.
inline __attribute__((always_inline)) void wait_here(Host* h, Thread* t) {
    Fiber* f = h->current;
    if (t->fiber == nullptr) {
        f->runner.demoted = 1;
        f->owner = t;
        t->fiber = f;
    }
    Fiber* next = pick_next(h);
    switch_fiber(h, f, next, false);
}

[[noreturn]] void end_fiber(Host* h, Fiber* f) {
    h->zombie = f;
    Fiber* next = pick_next(h);
    switch_fiber(h, f, next, true);
    __builtin_unreachable();
}

void fiber_entry(void* arg) {
    Fiber* f = static_cast<Fiber*>(arg);
    Host* h = tls_host;
    after_switch(h, f);
    h->launch->run(&f->runner);
#if defined(LF_EMU_SANITIZE)
    Thread* t = f->owner;
    t->state = DONE;
    ++h->block.finished;
#endif
#if defined(LF_EMU_TSAN)
    __tsan_release(&h->launch->tsan_done);
#endif
    end_fiber(h, f);
}

[[noreturn]] void stop_block(Host* h, Fiber* from, const std::string& what) {
    if (!h->faulted) {
        h->faulted = true;
        h->fault = where(h) + what;
    }
    switch_fiber(h, from, &h->host, true);
    __builtin_unreachable();
}

void diagnose_stuck(Host* h) {
    as_host();
    Block& b = h->block;
    std::vector<unsigned> exited, at_barrier, at_warp;
    for (unsigned i = 0; i < b.nthreads; ++i) {
        int s = h->threads[i].state;
        if (s == DONE) exited.push_back(i);
        else if (s == WAIT_BARRIER) at_barrier.push_back(i);
        else if (s == WAIT_WARP) at_warp.push_back(i);
    }
    std::string what;
    if (!at_barrier.empty()) {
        what = format("%s at line %d is reached by %zu of the block's %u threads: %s. ", barrier_name(h->bar_op),
                      h->bar_line, at_barrier.size(), b.nthreads, thread_list(h, at_barrier).c_str());
        if (!exited.empty())
            what += format("%zu exited without reaching it: %s. ", exited.size(), thread_list(h, exited).c_str());
    }
    // warp operations that cannot complete, one line each
    for (unsigned w = 0; w < (b.nthreads + WARP - 1) / WARP; ++w) {
        WarpState& ws = h->warps[w];
        for (int k = 0; k < ws.count; ++k) {
            PendingWarpOp& p = ws.ops[k];
            std::vector<unsigned> arrived, missing_exited, missing_barrier, missing_other;
            for (unsigned lane = 0; lane < WARP; ++lane) {
                if (!((p.mask >> lane) & 1u)) continue;
                unsigned i = w * WARP + lane;
                if ((p.arrived >> lane) & 1u) arrived.push_back(i);
                else if (h->threads[i].state == DONE) missing_exited.push_back(i);
                else if (h->threads[i].state == WAIT_BARRIER) missing_barrier.push_back(i);
                else missing_other.push_back(i);
            }
            what += format("%s at line %d with mask 0x%08x in warp %u: lanes %s arrived", warp_name(p.op), p.line,
                           p.mask, w, thread_list(h, arrived).c_str());
            if (!missing_exited.empty()) what += "; " + thread_list(h, missing_exited) + " exited";
            if (!missing_barrier.empty()) what += "; " + thread_list(h, missing_barrier) + " wait at a barrier";
            if (!missing_other.empty()) what += "; " + thread_list(h, missing_other) + " wait at another warp operation";
            what += ". ";
        }
    }
    if (what.empty()) what = "the block's threads wait for each other and none can go on. ";
    what.pop_back();
    if (!h->faulted) {
        h->faulted = true;
        h->fault = where(h) + what + " (on a GPU: undefined behaviour, often a hang)";
    }
}

// ---------------------------------------------------------------------------------------------------------
// The runtime functions a module calls (Api)
int sync_block(Thread* t, int op, int predicate, int line) {
    Host* h = tls_host;
    Block& b = h->block;
    if (h->bar_arrived == 0) {
        h->bar_line = line;
        h->bar_op = op;
        h->bar_value = op == BAR_AND ? 1 : 0;
    } else if (line != h->bar_line || op != h->bar_op) {
        as_host();
        std::vector<unsigned> waiting;
        for (unsigned i = 0; i < b.nthreads; ++i)
            if (h->threads[i].state == WAIT_BARRIER) waiting.push_back(i);
        stop_block(h, h->current,
                   format("threads wait at different barriers: %s at line %d (threads %s) and %s at line %d "
                          "(thread %s) (on a GPU: undefined behaviour, often a hang)",
                          barrier_name(h->bar_op), h->bar_line, thread_list(h, waiting).c_str(), barrier_name(op),
                          line, index3(t->thread_idx).c_str()));
    }
    int p = predicate != 0;
    if (op == BAR_COUNT) h->bar_value += p;
    else if (op == BAR_AND) h->bar_value &= p;
    else if (op == BAR_OR) h->bar_value |= p;
    t->state = WAIT_BARRIER;
    t->wait_line = line;
#if defined(LF_EMU_TSAN)
    unsigned generation = h->bar_generation;
    __tsan_release(h->sync_objects + (generation & 1));
#endif
    if (++h->bar_arrived == b.nthreads) {
        int result = op == BAR_SYNC ? 0 : h->bar_value;
        h->bar_arrived = 0;
        ++h->bar_generation;
        for (unsigned i = 0; i < b.nthreads; ++i) {
            Thread* o = &h->threads[i];
            o->sync_result = result;
            if (o != t) make_ready(h, o);
        }
        t->state = RUNNING;
    } else {
        wait_here(h, t);
    }
#if defined(LF_EMU_TSAN)
    __tsan_acquire(h->sync_objects + (generation & 1));
#endif
    return t->sync_result;
}

uint64_t warp_result(Host* h, unsigned w, const PendingWarpOp& p, unsigned lane, std::string* error) {
    Thread* lanes = &h->threads[w * WARP];
    Thread& x = lanes[lane];
    unsigned seg = lane & ~unsigned(p.width - 1);
    unsigned src = lane;
    switch (p.op) {
        case SHFL_IDX: src = seg + (unsigned(x.warp_arg) & unsigned(p.width - 1)); break;
        case SHFL_UP: src = int(lane) - x.warp_arg < int(seg) ? lane : lane - unsigned(x.warp_arg); break;
        case SHFL_DOWN: src = lane + unsigned(x.warp_arg) >= seg + unsigned(p.width) ? lane : lane + unsigned(x.warp_arg); break;
        case SHFL_XOR: src = (lane ^ unsigned(x.warp_arg)) >= seg + unsigned(p.width) ? lane : lane ^ unsigned(x.warp_arg); break;
        default: break;
    }
    if (p.op >= SHFL_IDX && p.op <= SHFL_XOR) {
        if (!((p.mask >> src) & 1u)) {
            *error = format("%s at line %d: lane %u reads lane %u, which is not in the mask 0x%08x (its value is "
                            "undefined on a GPU)", warp_name(p.op), p.line, lane, src, p.mask);
            return 0;
        }
        return lanes[src].warp_value;
    }
    uint64_t out = 0;
    bool first = true, all_equal = true;
    for (unsigned l = 0; l < WARP; ++l) {
        if (!((p.mask >> l) & 1u)) continue;
        uint64_t v = lanes[l].warp_value;
        int32_t sv = int32_t(uint32_t(v));
        uint32_t uv = uint32_t(v);
        switch (p.op) {
            case BALLOT: if (v) out |= 1ull << l; break;
            case ALL: out = first ? (v != 0) : (out && v != 0); break;
            case ANY: out = out || v != 0; break;
            case MATCH_ANY: if (v == x.warp_value) out |= 1ull << l; break;
            case MATCH_ALL: if (v != x.warp_value) all_equal = false; break;
            case REDUCE_ADD: out = uint32_t(uint32_t(out) + uv); break;
            case REDUCE_MIN: out = first ? uv : uint32_t(sv < int32_t(uint32_t(out)) ? sv : int32_t(uint32_t(out))); break;
            case REDUCE_MAX: out = first ? uv : uint32_t(sv > int32_t(uint32_t(out)) ? sv : int32_t(uint32_t(out))); break;
            case REDUCE_UMIN: out = first ? uv : (uv < uint32_t(out) ? uv : uint32_t(out)); break;
            case REDUCE_UMAX: out = first ? uv : (uv > uint32_t(out) ? uv : uint32_t(out)); break;
            case REDUCE_AND: out = first ? uv : (uint32_t(out) & uv); break;
            case REDUCE_OR: out = uint32_t(out) | uv; break;
            case REDUCE_XOR: out = uint32_t(out) ^ uv; break;
        }
        first = false;
    }
    if (p.op == MATCH_ALL) out = all_equal ? p.mask : 0;
    return out;
}

uint64_t sync_warp(Thread* t, int op, unsigned mask, uint64_t value, int arg, int width, int size, int line) {
    Host* h = tls_host;
    Block& b = h->block;
    unsigned w = t->warp, lane = t->lane;
    unsigned lanes_here = b.nthreads - w * WARP < unsigned(WARP) ? b.nthreads - w * WARP : unsigned(WARP);
    unsigned existing = lanes_here == WARP ? 0xffffffffu : (1u << lanes_here) - 1u;
    auto me = [&] {
        return format("%s at line %d, thread %s (lane %u)", warp_name(op), line, index3(t->thread_idx).c_str(), lane);
    };
    if (!((mask >> lane) & 1u))
        stop_block(h, h->current, me() + format(": the mask 0x%08x does not name the calling lane", mask));
    if (mask & ~existing)
        stop_block(h, h->current, me() + format(": the mask 0x%08x names lanes that do not exist (warp %u has %u "
                                                "lanes in a block of %u threads)", mask, w, lanes_here, b.nthreads));
    if (op >= SHFL_IDX && op <= SHFL_XOR && (width < 1 || width > WARP || (width & (width - 1))))
        stop_block(h, h->current, me() + format(": width %d is not a power of 2 up to 32", width));
    if (!h->warps_used) {
        for (unsigned i = 0; i < MAX_WARPS; ++i) h->warps[i].count = 0;
        h->warps_used = true;
    }
    WarpState& ws = h->warps[w];
    int slot = -1;
    for (int k = 0; k < ws.count; ++k) {
        PendingWarpOp& p = ws.ops[k];
        if (!(p.mask & mask)) continue;
        if (p.mask != mask || p.op != op || p.size != size || (op <= SHFL_XOR && p.width != width))
            stop_block(h, h->current,
                       me() + format(" with mask 0x%08x meets %s at line %d with mask 0x%08x: lanes named by both "
                                   "masks must make the same call with the same mask", mask, warp_name(p.op),
                                   p.line, p.mask));
        slot = k;
        break;
    }
    if (slot < 0) {
        slot = ws.count++;
        ws.ops[slot] = PendingWarpOp{mask, 0u, op, size, line, width};
    }
    PendingWarpOp& p = ws.ops[slot];
    p.arrived |= 1u << lane;
    t->warp_value = value;
    t->warp_arg = arg;
    t->warp_slot = slot;
    t->state = WAIT_WARP;
    t->wait_line = line;
#if defined(LF_EMU_TSAN)
    unsigned generation = ws.generation;
    if (op == SYNCWARP) __tsan_release(h->sync_objects + 2 + 2 * w + (generation & 1));
#endif
    if (p.arrived == p.mask) {
        Thread* lanes = &h->threads[w * WARP];
        std::string error;
        uint64_t results[WARP];
        for (unsigned l = 0; l < WARP; ++l)
            if ((p.mask >> l) & 1u) results[l] = warp_result(h, w, p, l, &error);
        if (!error.empty()) stop_block(h, h->current, error);
        for (unsigned l = 0; l < WARP; ++l) {
            if (!((p.mask >> l) & 1u)) continue;
            lanes[l].warp_result = results[l];
            if (&lanes[l] != t) make_ready(h, &lanes[l]);
        }
        ws.ops[slot] = ws.ops[--ws.count];
        for (unsigned l = 0; l < WARP && w * WARP + l < b.nthreads; ++l)  // a moved op's lanes follow it
            if (lanes[l].state == WAIT_WARP && lanes[l].warp_slot == ws.count) lanes[l].warp_slot = slot;
        ++ws.generation;
        t->state = RUNNING;
    } else {
        wait_here(h, t);
    }
#if defined(LF_EMU_TSAN)
    if (op == SYNCWARP) __tsan_acquire(h->sync_objects + 2 + 2 * w + (generation & 1));
#endif
    return t->warp_result;
}

unsigned active_mask(Thread* t) {
    Host* h = tls_host;
    unsigned out = 0;
    for (unsigned l = 0; l < WARP; ++l) {
        unsigned i = t->warp * WARP + l;
        if (i < h->block.nthreads && h->threads[i].state != DONE) out |= 1u << l;
    }
    return out;
}

void kernel_fault(Thread* t, const char* what, const char* file, int line) {
    Host* h = tls_host;
    std::string at = file && *file ? format(" (%s:%d)", file, line) : format(" (line %d)", line);
    stop_block(h, h->current, format("thread %s: %s%s", index3(t->thread_idx).c_str(), what, at.c_str()));
}

void retire(Runner* r, Thread* t) {
    Host* h = tls_host;
    (void)r;
    t->state = DONE;
    ++h->block.finished;
    end_fiber(h, h->current);
}

Thread* current_thread() {
    Host* h = tls_host;
    return h->current->owner ? h->current->owner : h->current->runner.current;
}

const Api API = {ABI_VERSION, sync_block, sync_warp, active_mask, kernel_fault, retire, current_thread};

// ---------------------------------------------------------------------------------------------------------
// Blocks
void prepare_host(Host* h, Launch* L) {
    h->launch = L;
    Block& b = h->block;
    b.block_dim = L->block;
    b.grid_dim = L->grid;
    b.nthreads = L->block.x * L->block.y * L->block.z;
    b.threads = h->threads;
    for (unsigned i = 0; i < b.nthreads; ++i) {
        Thread& t = h->threads[i];
        t.thread_idx = uint3{i % L->block.x, (i / L->block.x) % L->block.y, i / (L->block.x * L->block.y)};
        t.block = &b;
        t.linear = i;
        t.warp = i / WARP;
        t.lane = i % WARP;
    }
#if !defined(LF_EMU_SANITIZE)
    if (h->shared_storage.size() < L->dynamic_shared + 16) h->shared_storage.resize(L->dynamic_shared + 16);
    b.dynamic_shared = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(h->shared_storage.data()) + 15) & ~uintptr_t(15));
#endif
}

// Run block `index` to its end; false when it faulted (h->fault says why).
bool run_block(Host* h, unsigned long long index) {
    Launch* L = h->launch;
    Block& b = h->block;
    b.block_idx = uint3{unsigned(index % L->grid.x), unsigned((index / L->grid.x) % L->grid.y),
                        unsigned(index / (unsigned long long)(L->grid.x * L->grid.y))};
    b.next_unstarted = 0;
    b.finished = 0;
    for (unsigned i = 0; i < b.nthreads; ++i) {
        h->threads[i].state = NOT_STARTED;
        h->threads[i].fiber = nullptr;
    }
    h->queue_head = h->queue_count = 0;
    h->bar_arrived = 0;
    if (h->warps_used) {
        for (unsigned i = 0; i < MAX_WARPS; ++i) h->warps[i].count = 0;
    }
    h->faulted = false;
#if defined(LF_EMU_SANITIZE)
    // the dynamic shared memory of this block alone, exactly as large as the launch asked: AddressSanitizer
    // reports an access past it; ThreadSanitizer sees a fresh mapping
    void* dyn = nullptr;
    size_t dyn_bytes = L->dynamic_shared ? L->dynamic_shared : 1;
#if defined(LF_EMU_ASAN)
    dyn = malloc(dyn_bytes);
#else
    dyn = mmap(nullptr, dyn_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
#endif
    b.dynamic_shared = static_cast<char*>(dyn);
#endif
#if defined(LF_EMU_TSAN)
    char* stacks = map_stacks(b.nthreads);
    h->sync_objects = stacks;  // the first guard region: never accessed, only named
#endif
#if defined(LF_EMU_SANITIZE)
    // Every thread's fiber before any runs: ThreadSanitizer then orders all the runtime's allocations before
    // every thread, and nothing else the runtime does between them
    for (unsigned i = 0; i < b.nthreads; ++i) {
#if defined(LF_EMU_TSAN)
        Fiber* f = take_fiber(h, stacks + i * (STACK_BYTES + GUARD_BYTES) + GUARD_BYTES);
#else
        Fiber* f = take_fiber(h);
#endif
        f->owner = &h->threads[i];
        f->runner.current = &h->threads[i];
        h->threads[i].fiber = f;
    }
#endif
#if defined(LF_EMU_TSAN)
    // ThreadSanitizer (GCC's) takes two accesses by one thread id for one thread's, and gives the ids of
    // destroyed fibers to new ones. So a block's fibers are destroyed only at the end of the next block (new
    // ids then come from two blocks back, and a report can still name the previous block's threads), and each
    // block makes its fibers in a rotated order, so that threads of equal index in blocks two apart do not
    // share an id either. A report names a GPU thread by its fiber's name.
    h->tsan_host = __tsan_get_current_fiber();
    unsigned rotation = unsigned(h->tsan_blocks++ * 37 % b.nthreads);
    std::vector<std::string> names(b.nthreads);
    for (unsigned j = 0; j < b.nthreads; ++j) {
        unsigned i = (j + rotation) % b.nthreads;
        h->threads[i].tsan_fiber = __tsan_create_fiber(0);
        names[i] = "block " + index3(b.block_idx) + " thread " + index3(h->threads[i].thread_idx);
        __tsan_set_fiber_name(h->threads[i].tsan_fiber, names[i].c_str());
    }
#endif
    h->current = &h->host;
    Fiber* first = new_runner(h);
    switch_fiber(h, &h->host, first, false);
    bool ok = !h->faulted;
    if (!ok) {
        // the block's fibers stop where they are; their stacks go back to the pool
        h->zombie = nullptr;
        h->free_fibers = nullptr;
        for (Fiber* f : h->all_fibers) {
            f->next_free = h->free_fibers;
            h->free_fibers = f;
        }
    }
#if defined(LF_EMU_TSAN)
    for (void* old : h->tsan_previous_block) __tsan_destroy_fiber(old);
    h->tsan_previous_block.clear();
    for (unsigned i = 0; i < b.nthreads; ++i) h->tsan_previous_block.push_back(h->threads[i].tsan_fiber);
    munmap(dyn, dyn_bytes);
    munmap(stacks, b.nthreads * (STACK_BYTES + GUARD_BYTES));
    for (Fiber* f : h->all_fibers) f->stack_lo = nullptr;
#elif defined(LF_EMU_ASAN)
    free(dyn);
#endif
    return ok;
}

#if defined(LF_EMU_SANITIZE)
// A sanitizer ends the process at its first report: name the GPU thread that was running
Host* sanitized_host = nullptr;
void name_the_running_thread() {
    Host* h = sanitized_host;
    if (!h || !h->launch || !h->current || h->current == &h->host) return;
    Thread* t = h->current->owner;
    if (t)
        fprintf(stderr, "layerforge emulated GPU: the report's access was made by kernel %s, block %s, thread %s\n",
                h->launch->name, index3(h->block.block_idx).c_str(), index3(t->thread_idx).c_str());
}
#endif

void record_fault(Launch* L, const std::string& what) {
    std::lock_guard<std::mutex> lock(L->fault_mutex);
    if (!L->failed.load()) {
        L->fault = what;
        L->failed.store(true);
    }
}

#if !defined(LF_EMU_SANITIZE)
const char* signal_name(int sig) {
    switch (sig) {
        case SIGSEGV: return "SIGSEGV (invalid memory access)";
        case SIGBUS: return "SIGBUS (misaligned or invalid memory access)";
        case SIGFPE: return "SIGFPE (integer division by zero or overflow)";
        case SIGILL: return "SIGILL (illegal instruction)";
    }
    return "signal";
}
#endif

// Run blocks of L on this host thread until none are left or the launch failed.
void host_work(Host* h, Launch* L) {
    prepare_host(h, L);
    tls_host = h;
#if defined(LF_EMU_SANITIZE)
    sanitized_host = h;
    __sanitizer_set_death_callback(name_the_running_thread);
#endif
#if !defined(LF_EMU_SANITIZE)
    if (sigsetjmp(h->crash_jump, 1)) {
        h->in_blocks = 0;
        Fiber* f = h->current;
        Thread* t = f && f != &h->host ? (f->owner ? f->owner : f->runner.current) : nullptr;
        std::string what = where(h);
        if (t) what += "thread " + index3(t->thread_idx) + ": ";
        char* a = static_cast<char*>(h->crash_address);
        if (h->crash_signal == SIGSEGV && f && f != &h->host && a >= f->stack_lo - GUARD_BYTES && a < f->stack_lo)
            what += format("stack overflow (a GPU thread has %zu KiB of stack here)", STACK_BYTES >> 10);
        else
            what += format("%s at address %p", signal_name(h->crash_signal), h->crash_address);
        record_fault(L, what);
        h->current = &h->host;
        h->zombie = nullptr;
        h->free_fibers = nullptr;
        for (Fiber* g : h->all_fibers) {
            g->next_free = h->free_fibers;
            h->free_fibers = g;
        }
        tls_host = nullptr;
        return;
    }
    h->in_blocks = 1;
#endif
    for (;;) {
        if (L->failed.load(std::memory_order_relaxed)) break;
        unsigned long long index = L->next_block.fetch_add(1, std::memory_order_relaxed);
        if (index >= L->nblocks) break;
#if defined(LF_EMU_TSAN)
        // a fresh host thread for every block: its thread-local __shared__ variables are new to the sanitizer
        bool ok = true;
        std::thread block_thread([&] {
            tls_host = h;
            if (L->touch_shared) L->touch_shared();
            ok = run_block(h, index);
        });
        block_thread.join();
#else
        bool ok = run_block(h, index);
#endif
        if (!ok) {
            record_fault(L, h->fault);
            break;
        }
    }
    h->in_blocks = 0;
    tls_host = nullptr;
}

// ---------------------------------------------------------------------------------------------------------
// Host threads: the caller and a pool of workers, all taking blocks from the launch
struct Pool {
    std::mutex launch_mutex;  // one launch at a time
    std::mutex m;
    std::condition_variable wake, done;
    Launch* job = nullptr;
    unsigned long long generation = 0;
    int wanted = 0;  // workers 1..wanted take part in the current job
    int running = 0;
    std::vector<Host*> hosts;  // hosts[0]: the caller's
    int started = 0;
};

Pool* the_pool = nullptr;  // never destroyed: workers outlive static destructors

Pool& pool() {
    static bool once = [] {
        the_pool = new Pool;
        // a forked child has none of the workers (nor, perhaps, the locks' owners): it starts a pool of its own
        pthread_atfork(nullptr, nullptr, [] { the_pool = new Pool; });
        return true;
    }();
    (void)once;
    return *the_pool;
}

#if !defined(LF_EMU_SANITIZE)
// Crashes inside a kernel: a fault of the launch, not of the process. The handler runs on an alternate signal
// stack (a fiber's own may be what overflowed) and jumps back to the host thread's loop over blocks.
struct sigaction previous_actions[NSIG];
const int CRASH_SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
const size_t ALTSTACK_BYTES = 64u << 10;

void crash_handler(int sig, siginfo_t* info, void* context) {
    Host* h = tls_host;
    if (h && h->in_blocks) {
        h->crash_signal = sig;
        h->crash_address = info->si_addr;
        siglongjmp(h->crash_jump, 1);
    }
    // not a kernel's: whatever handled it before us
    struct sigaction& old = previous_actions[sig];
    if (old.sa_flags & SA_SIGINFO) {
        old.sa_sigaction(sig, info, context);
    } else if (old.sa_handler == SIG_DFL || old.sa_handler == SIG_IGN) {
        sigaction(sig, &old, nullptr);  // the instruction faults again, with the default action
    } else {
        old.sa_handler(sig);
    }
}

void install_altstack(void* memory) {
    stack_t ss;
    ss.ss_size = ALTSTACK_BYTES;
    ss.ss_sp = memory;
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
}
#endif

void worker_main(int index) {
#if !defined(LF_EMU_SANITIZE)
    install_altstack(malloc(ALTSTACK_BYTES));
#endif
    Pool& p = pool();
    unsigned long long seen = 0;
    for (;;) {
        Launch* L;
        {
            std::unique_lock<std::mutex> lock(p.m);
            p.wake.wait(lock, [&] { return p.generation != seen && index <= p.wanted; });
            seen = p.generation;
            L = p.job;
        }
        host_work(p.hosts[index], L);
        {
            std::lock_guard<std::mutex> lock(p.m);
            if (--p.running == 0) p.done.notify_all();
        }
    }
}

}  // namespace
}  // namespace lf_emu

// ---------------------------------------------------------------------------------------------------------
// C interface

extern "C" __attribute__((visibility("default"))) const lf_emu::Api* lf_emu_api() { return &lf_emu::API; }

// Run a launch to its end. 0: done; 1: a fault, described in `error`.
extern "C" __attribute__((visibility("default"))) int lf_emu_launch(const lf_emu_launch_desc* d, char* error,
                                                                  size_t error_size) {
    using namespace lf_emu;
    Pool& p = pool();
    std::lock_guard<std::mutex> serial(p.launch_mutex);
    Launch L;
    L.name = d->name;
    L.run = d->run;
    L.args = d->args;
    L.grid = dim3(d->grid[0], d->grid[1], d->grid[2]);
    L.block = dim3(d->block[0], d->block[1], d->block[2]);
    L.dynamic_shared = d->dynamic_shared;
    L.nblocks = (unsigned long long)L.grid.x * L.grid.y * L.grid.z;
    L.touch_shared = d->touch_shared;
    int hosts = 1;
#if !defined(LF_EMU_SANITIZE)
    // small launches stay on the caller: waking workers costs more than they save
    unsigned long long threads = L.nblocks * L.block.x * L.block.y * L.block.z;
    if (d->host_threads > 1 && L.nblocks > 1 && threads >= 8192)
        hosts = (int)(L.nblocks < (unsigned long long)d->host_threads ? L.nblocks : d->host_threads);
#endif
    while ((int)p.hosts.size() < hosts || p.hosts.empty()) p.hosts.push_back(new Host);
    while (p.started < hosts - 1) {
        ++p.started;
        std::thread(worker_main, p.started).detach();
    }

#if !defined(LF_EMU_SANITIZE)
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = crash_handler;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (int sig : CRASH_SIGNALS) sigaction(sig, &action, &previous_actions[sig]);
    stack_t old_stack;
    sigaltstack(nullptr, &old_stack);
    static thread_local void* caller_altstack = nullptr;
    if (old_stack.ss_flags & SS_DISABLE) {
        if (!caller_altstack) caller_altstack = malloc(ALTSTACK_BYTES);
        install_altstack(caller_altstack);
    }
#endif
    if (hosts > 1) {
        std::lock_guard<std::mutex> lock(p.m);
        p.job = &L;
        p.wanted = hosts - 1;
        p.running = hosts - 1;
        ++p.generation;
        p.wake.notify_all();
    }
    host_work(p.hosts[0], &L);
    if (hosts > 1) {
        std::unique_lock<std::mutex> lock(p.m);
        p.done.wait(lock, [&] { return p.running == 0; });
        p.job = nullptr;
    }
#if !defined(LF_EMU_SANITIZE)
    for (int sig : CRASH_SIGNALS) sigaction(sig, &previous_actions[sig], nullptr);
    if (old_stack.ss_flags & SS_DISABLE) sigaltstack(&old_stack, nullptr);
#endif
#if defined(LF_EMU_TSAN)
    __tsan_acquire(&L.tsan_done);  // the caller reads what the kernel wrote
#endif
    if (L.failed.load()) {
        snprintf(error, error_size, "%s", L.fault.c_str());
        return 1;
    }
    return 0;
}
