// The contract between a compiled kernel module (its CUDA text + cuda_runtime.h) and the emulator's runtime
// (runner_runtime.cpp): the structures both read, and the table of runtime functions a module calls.
//
// A block's GPU threads run as fibers on one host thread. A "runner" fiber starts threads one after another
// as plain calls; a thread that reaches a barrier or a warp operation keeps the runner's stack as its own
// (the runner is "demoted") and a new runner goes on with the next thread. So a kernel without barriers
// runs as a loop, and one with barriers gets one stack per thread, switched only at the barriers.
#ifndef LF_EMU_RUNNER_ABI_H
#define LF_EMU_RUNNER_ABI_H

#include <stddef.h>
#include <stdint.h>

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

namespace lf_emu {

enum { ABI_VERSION = 3, MAX_THREADS = 1024, WARP = 32, MAX_WARPS = MAX_THREADS / WARP };

enum ThreadState : int { NOT_STARTED = 0, RUNNING, WAIT_BARRIER, WAIT_WARP, READY, DONE };

struct Block;
struct Fiber;

// One GPU thread of the block being run. thread_idx and block are what the kernel reads; the rest is the
// runtime's.
struct Thread {
    uint3 thread_idx;
    const Block* block;
    unsigned linear, warp, lane;
    int state;
    Fiber* fiber;  // its own fiber, once it has blocked (always, in sanitizer builds)
    int wait_line;
    int sync_arg;  // __syncthreads_count/and/or predicate
    int sync_result;
    int warp_slot;
    int warp_arg;
    uint64_t warp_value, warp_result;
    void* tsan_fiber;
};

// The block being run. The first fields are what blockIdx, blockDim, gridDim and extern __shared__ read.
struct Block {
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
    char* dynamic_shared;
    unsigned nthreads;
    unsigned next_unstarted;  // the next thread a runner starts
    unsigned finished;        // threads that returned from the kernel
    Thread* threads;
};

// The state a module's run loop shares with the runtime: the block, the thread it runs, whether a thread of
// it blocked (then this stack is that thread's, and the loop ends when it returns), the kernel's arguments
// (one pointer per parameter, as cuLaunchKernel's kernelParams).
struct Runner {
    Block* block;
    Thread* current;
    int demoted;
    void* const* args;
};

// Warp operations (sync_warp's op), and block barriers (sync_block's op).
enum WarpOp : int {
    SHFL_IDX = 1, SHFL_UP, SHFL_DOWN, SHFL_XOR, SYNCWARP, BALLOT, ALL, ANY, MATCH_ANY, MATCH_ALL,
    REDUCE_ADD, REDUCE_MIN, REDUCE_MAX, REDUCE_AND, REDUCE_OR, REDUCE_XOR, REDUCE_UMIN, REDUCE_UMAX
};
enum BarrierOp : int { BAR_SYNC = 0, BAR_COUNT, BAR_AND, BAR_OR };

struct Api {
    unsigned abi_version;
    // __syncthreads and its _count/_and/_or forms; returns the reduction
    int (*sync_block)(Thread* self, int op, int predicate, int line);
    // a warp-level operation over the lanes of `mask`; value holds `size` bytes; arg: lane, delta or lane mask
    uint64_t (*sync_warp)(Thread* self, int op, unsigned mask, uint64_t value, int arg, int width, int size,
                          int line);
    // lanes of self's warp that have not exited
    unsigned (*active_mask)(Thread* self);
    // an error the kernel itself raises (assert, __trap); does not return
    void (*fault)(Thread* self, const char* what, const char* file, int line);
    // a thread on a demoted runner returned from the kernel; does not return
    void (*retire)(Runner* runner, Thread* self);
    // sanitizer builds: the running thread (their module code keeps no thread-local state of its own)
    Thread* (*current)();
};

struct ParamInfo {
    const char* base;        // C name of the type under the pointers, cv-qualifiers dropped
    unsigned pointer_depth;  // 0 for a value
    unsigned is_const;       // the pointee is const
    unsigned size;           // sizeof the parameter
};

struct KernelInfo {
    const char* name;
    unsigned nparams;
    const ParamInfo* params;
    void (*run)(Runner*);
};

}  // namespace lf_emu

// A launch, as the runtime's lf_emu_launch takes it (kernel_runner.py's _LaunchDesc mirrors it)
struct lf_emu_launch_desc {
    const char* name;
    void (*run)(lf_emu::Runner*);
    void* const* args;  // one pointer per parameter, to its value
    unsigned grid[3];
    unsigned block[3];
    unsigned long long dynamic_shared;
    int host_threads;             // at most this many host threads run blocks
    void (*touch_shared)();       // ThreadSanitizer builds: lf_emu_touch_shared of the module
};

#endif
