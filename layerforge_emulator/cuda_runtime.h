// The CUDA device environment for kernels compiled as host C++ by the emulator (kernel_runner.py).
//
// kernel_runner.py force-includes this header before the kernel's own text, so CUDA C++ written for NVRTC
// (no headers of its own) compiles with g++: the qualifiers, the built-in index variables, vector types,
// CUDA's math functions and intrinsics, atomics, block barriers and warp operations. The barriers and warp
// operations call the emulator's runtime (runner_runtime.cpp), which runs every GPU thread of a block as a
// fiber and switches between them only there (runner_abi.h).
//
// Built with LF_EMU_SANITIZE (the ThreadSanitizer / AddressSanitizer builds), a module keeps no thread-local
// state: the runtime gives each GPU thread a fiber of its own and tells the sanitizer about every switch.
#ifndef LF_EMU_CUDA_RUNTIME_H
#define LF_EMU_CUDA_RUNTIME_H

#if defined(LF_EMU_DISCOVER)
// kernel_runner.py preprocesses the text once with this alone, to find the kernels and their parameters
#define __global__ __lf_emu_global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __shared__ __lf_emu_shared__
#define __forceinline__
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n)
#define __grid_constant__
#define __CUDACC__ 1
#define __CUDA_ARCH__ 900
#define __CUDACC_RTC__ 1
#define __CUDA_EMULATED__ 1
#else

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <limits>
#include <type_traits>
#include <utility>

#include "runner_abi.h"

// ---------------------------------------------------------------------------------------------------------
// Qualifiers. A kernel is inlined into its run loop (below), except in the sanitizer builds, whose reports
// then name it as a frame of its own.
#if defined(LF_EMU_SANITIZE)
#define LF_EMU_KERNEL_INLINE
#if defined(LF_EMU_ASAN)
// AddressSanitizer puts redzones around globals, not around thread-local variables; blocks run one at a time
#define __shared__ static
#else
#define __shared__ static thread_local
#endif
#else
#define LF_EMU_KERNEL_INLINE inline __attribute__((always_inline))
// one instance per host thread, and a host thread runs one block at a time
#define __shared__ static thread_local
#endif
#define __global__ LF_EMU_KERNEL_INLINE
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __CUDACC__ 1
#define __CUDA_ARCH__ 900
#define __CUDACC_RTC__ 1
#define __CUDA_EMULATED__ 1

// ---------------------------------------------------------------------------------------------------------
// The running thread and its block
static const lf_emu::Api* lf_emu_api_table;
#if !defined(LF_EMU_SANITIZE)
static thread_local const lf_emu::Thread* lf_emu_self_thread;
#endif

namespace lf_emu {
__attribute__((always_inline)) inline const Thread* self() {
#if defined(LF_EMU_SANITIZE)
    return lf_emu_api_table->current();
#else
    return lf_emu_self_thread;
#endif
}
__attribute__((always_inline)) inline void resume(const Thread* t) {
#if defined(LF_EMU_SANITIZE)
    (void)t;
#else
    lf_emu_self_thread = t;
#endif
}
inline Thread* mutable_self() { return const_cast<Thread*>(self()); }
}  // namespace lf_emu

#define threadIdx (::lf_emu::self()->thread_idx)
#define blockIdx (::lf_emu::self()->block->block_idx)
#define blockDim (::lf_emu::self()->block->block_dim)
#define gridDim (::lf_emu::self()->block->grid_dim)
static constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------------------
// Vector types (the alignments of CUDA's vector_types.h) and their make_ functions
#define LF_EMU_VEC1(T, N, A) \
    struct __attribute__((aligned(A))) N##1 { T x; }; \
    inline N##1 make_##N##1(T x) { return N##1{x}; }
#define LF_EMU_VEC2(T, N, A) \
    struct __attribute__((aligned(A))) N##2 { T x, y; }; \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define LF_EMU_VEC3(T, N) \
    struct N##3 { T x, y, z; }; \
    inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }
#define LF_EMU_VEC4(T, N, A) \
    struct __attribute__((aligned(A))) N##4 { T x, y, z, w; }; \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
#define LF_EMU_VECS(T, N, A1, A2, A4) LF_EMU_VEC1(T, N, A1) LF_EMU_VEC2(T, N, A2) LF_EMU_VEC3(T, N) LF_EMU_VEC4(T, N, A4)
LF_EMU_VECS(signed char, char, 1, 2, 4)
LF_EMU_VECS(unsigned char, uchar, 1, 2, 4)
LF_EMU_VECS(short, short, 2, 4, 8)
LF_EMU_VECS(unsigned short, ushort, 2, 4, 8)
LF_EMU_VECS(int, int, 4, 8, 16)
LF_EMU_VEC1(unsigned int, uint, 4)
LF_EMU_VEC2(unsigned int, uint, 8)
inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }
LF_EMU_VEC4(unsigned int, uint, 16)
LF_EMU_VECS(long, long, 8, 16, 16)
LF_EMU_VECS(unsigned long, ulong, 8, 16, 16)
LF_EMU_VECS(long long, longlong, 8, 16, 16)
LF_EMU_VECS(unsigned long long, ulonglong, 8, 16, 16)
LF_EMU_VECS(float, float, 4, 8, 16)
LF_EMU_VECS(double, double, 8, 16, 16)
#undef LF_EMU_VEC1
#undef LF_EMU_VEC2
#undef LF_EMU_VEC3
#undef LF_EMU_VEC4
#undef LF_EMU_VECS

// ---------------------------------------------------------------------------------------------------------
// min / max as CUDA overloads them (the usual arithmetic conversions; fmin / fmax for floating types)
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
__forceinline__ typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if (std::is_floating_point<C>::value) return fmin(C(a), C(b));
    return C(a) < C(b) ? C(a) : C(b);
}
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>::type>
__forceinline__ typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if (std::is_floating_point<C>::value) return fmax(C(a), C(b));
    return C(a) < C(b) ? C(b) : C(a);
}
inline unsigned int umin(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int umax(unsigned int a, unsigned int b) { return a < b ? b : a; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a < b ? b : a; }

// ---------------------------------------------------------------------------------------------------------
// Math beyond <math.h>: CUDA's extra functions, and the intrinsics (the __ forms compute the exact result
// here: fast-math precision is not emulated)
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline double rcbrt(double x) { return 1.0 / cbrt(x); }
inline float sinpif(float x) { return sinf(float(M_PI) * x); }
inline double sinpi(double x) { return sin(M_PI * x); }
inline float cospif(float x) { return cosf(float(M_PI) * x); }
inline double cospi(double x) { return cos(M_PI * x); }
inline void sincospif(float x, float* s, float* c) { *s = sinpif(x); *c = cospif(x); }
inline void sincospi(double x, double* s, double* c) { *s = sinpi(x); *c = cospi(x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * float(M_SQRT1_2)); }
inline double normcdf(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }
inline double erfinv(double y) {
    // Giles' single-precision starting point, then two Newton steps on erf(x) - y
    if (y <= -1.0) return y == -1.0 ? -HUGE_VAL : NAN;
    if (y >= 1.0) return y == 1.0 ? HUGE_VAL : NAN;
    double w = -log((1.0 - y) * (1.0 + y)), x;
    if (w < 5.0) {
        w -= 2.5;
        x = 2.81022636e-08;
        x = 3.43273939e-07 + x * w; x = -3.5233877e-06 + x * w; x = -4.39150654e-06 + x * w;
        x = 0.00021858087 + x * w; x = -0.00125372503 + x * w; x = -0.00417768164 + x * w;
        x = 0.246640727 + x * w; x = 1.50140941 + x * w;
    } else {
        w = sqrt(w) - 3.0;
        x = -0.000200214257;
        x = 0.000100950558 + x * w; x = 0.00134934322 + x * w; x = -0.00367342844 + x * w;
        x = 0.00573950773 + x * w; x = -0.0076224613 + x * w; x = 0.00943887047 + x * w;
        x = 1.00167406 + x * w; x = 2.83297682 + x * w;
    }
    x *= y;
    for (int i = 0; i < 2; ++i) x -= (erf(x) - y) / (2.0 / sqrt(M_PI) * exp(-x * x));
    return x;
}
inline float erfinvf(float y) { return float(erfinv(y)); }
inline double erfcinv(double y) { return erfinv(1.0 - y); }
inline float erfcinvf(float y) { return float(erfcinv(y)); }
inline double normcdfinv(double y) { return -M_SQRT2 * erfcinv(2.0 * y); }
inline float normcdfinvf(float y) { return float(normcdfinv(y)); }
inline float norm3df(float a, float b, float c) { return sqrtf(a * a + b * b + c * c); }
inline double norm3d(double a, double b, double c) { return sqrt(a * a + b * b + c * c); }
inline float rhypotf(float a, float b) { return 1.0f / hypotf(a, b); }
inline double rhypot(double a, double b) { return 1.0 / hypot(a, b); }
inline float fdividef(float a, float b) { return a / b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline double __drcp_rn(double x) { return 1.0 / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline double __dsqrt_rn(double x) { return sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

// conversions (CUDA saturates float -> int and maps NaN to 0)
template <class I, class F> inline I lf_emu_to_int(F v) {
    if (v != v) return I(0);
    if (v <= F(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
    if (v >= F(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return I(v);
}
inline int __float2int_rn(float x) { return lf_emu_to_int<int>(rintf(x)); }
inline int __float2int_rz(float x) { return lf_emu_to_int<int>(truncf(x)); }
inline int __float2int_rd(float x) { return lf_emu_to_int<int>(floorf(x)); }
inline int __float2int_ru(float x) { return lf_emu_to_int<int>(ceilf(x)); }
inline unsigned int __float2uint_rn(float x) { return lf_emu_to_int<unsigned int>(rintf(x)); }
inline unsigned int __float2uint_rz(float x) { return lf_emu_to_int<unsigned int>(truncf(x)); }
inline long long __float2ll_rn(float x) { return lf_emu_to_int<long long>(rintf(x)); }
inline long long __float2ll_rz(float x) { return lf_emu_to_int<long long>(truncf(x)); }
inline int __double2int_rn(double x) { return lf_emu_to_int<int>(rint(x)); }
inline int __double2int_rz(double x) { return lf_emu_to_int<int>(trunc(x)); }
inline int __double2int_rd(double x) { return lf_emu_to_int<int>(floor(x)); }
inline int __double2int_ru(double x) { return lf_emu_to_int<int>(ceil(x)); }
inline long long __double2ll_rn(double x) { return lf_emu_to_int<long long>(rint(x)); }
inline long long __double2ll_rz(double x) { return lf_emu_to_int<long long>(trunc(x)); }
inline float __int2float_rn(int x) { return float(x); }
inline float __uint2float_rn(unsigned int x) { return float(x); }
inline float __ll2float_rn(long long x) { return float(x); }
inline double __int2double_rn(int x) { return double(x); }
inline double __ll2double_rn(long long x) { return double(x); }
inline float __double2float_rn(double x) { return float(x); }

// bit reinterpretation
template <class To, class From> inline To lf_emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "same size");
    To out;
    memcpy(&out, &v, sizeof out);
    return out;
}
inline int __float_as_int(float x) { return lf_emu_bits<int>(x); }
inline unsigned int __float_as_uint(float x) { return lf_emu_bits<unsigned int>(x); }
inline float __int_as_float(int x) { return lf_emu_bits<float>(x); }
inline float __uint_as_float(unsigned int x) { return lf_emu_bits<float>(x); }
inline long long __double_as_longlong(double x) { return lf_emu_bits<long long>(x); }
inline double __longlong_as_double(long long x) { return lf_emu_bits<double>(x); }
inline int __double2hiint(double x) { return int(lf_emu_bits<unsigned long long>(x) >> 32); }
inline int __double2loint(double x) { return int(lf_emu_bits<unsigned long long>(x) & 0xffffffffu); }
inline double __hiloint2double(int hi, int lo) {
    return lf_emu_bits<double>((static_cast<unsigned long long>(static_cast<unsigned int>(hi)) << 32) |
                               static_cast<unsigned int>(lo));
}

// integer intrinsics
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
    return (static_cast<unsigned long long>(__brev(static_cast<unsigned int>(x))) << 32) | __brev(static_cast<unsigned int>(x >> 32));
}
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned int out = 0;
    for (int i = 0; i < 4; ++i) out |= static_cast<unsigned int>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return out;
}
inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
    unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>((v << (shift & 31)) >> 32);
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
    unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned int>(v >> (shift & 31));
}
inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __mulhi(int a, int b) { return int((static_cast<long long>(a) * b) >> 32); }
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return unsigned(((unsigned long long)a * b) >> 32);
}
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline unsigned int __sad(int a, int b, unsigned int c) { return (a > b ? unsigned(a - b) : unsigned(b - a)) + c; }
inline unsigned int __usad(unsigned int a, unsigned int b, unsigned int c) { return (a > b ? a - b : b - a) + c; }
inline int __hadd(int a, int b) { return int((static_cast<long long>(a) + b) >> 1); }
inline int __rhadd(int a, int b) { return int((static_cast<long long>(a) + b + 1) >> 1); }
inline unsigned int __uhadd(unsigned int a, unsigned int b) { return unsigned((0ull + a + b) >> 1); }
inline unsigned int __urhadd(unsigned int a, unsigned int b) { return unsigned((0ull + a + b + 1) >> 1); }

// loads and stores with cache hints are plain loads and stores here
template <class T> __forceinline__ T __ldg(const T* p) { return *p; }
template <class T> __forceinline__ T __ldcg(const T* p) { return *p; }
template <class T> __forceinline__ T __ldca(const T* p) { return *p; }
template <class T> __forceinline__ T __ldcs(const T* p) { return *p; }
template <class T> __forceinline__ T __ldlu(const T* p) { return *p; }
template <class T> __forceinline__ T __ldcv(const T* p) { return *p; }
template <class T> __forceinline__ void __stcg(T* p, T v) { *p = v; }
template <class T> __forceinline__ void __stcs(T* p, T v) { *p = v; }
template <class T> __forceinline__ void __stwb(T* p, T v) { *p = v; }
template <class T> __forceinline__ void __stwt(T* p, T v) { *p = v; }

#if defined(__x86_64__)
inline long long clock64() { return static_cast<long long>(__builtin_ia32_rdtsc()); }
#else
inline long long clock64() { return static_cast<long long>(__builtin_readcyclecounter()); }
#endif
inline long long clock() { return clock64(); }
inline void __nanosleep(unsigned int) {}
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---------------------------------------------------------------------------------------------------------
// Atomics. CUDA's atomics are relaxed; under ThreadSanitizer they order like acquire-release, so a kernel that
// publishes with __threadfence + an atomic (which TSan cannot see) is not reported as racing.
#if defined(LF_EMU_TSAN)
#define LF_EMU_ATOMIC_ORDER __ATOMIC_ACQ_REL
#else
#define LF_EMU_ATOMIC_ORDER __ATOMIC_RELAXED
#endif
template <class T, class F> __forceinline__ T lf_emu_atomic_update(T* address, F update) {
    typedef typename std::conditional<sizeof(T) == 4, unsigned int,
            typename std::conditional<sizeof(T) == 8, unsigned long long, unsigned short>::type>::type Bits;
    Bits* bits = reinterpret_cast<Bits*>(address);
    Bits old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    for (;;) {
        Bits desired = lf_emu_bits<Bits>(update(lf_emu_bits<T>(old)));
        if (__atomic_compare_exchange_n(bits, &old, desired, true, LF_EMU_ATOMIC_ORDER, __ATOMIC_RELAXED))
            return lf_emu_bits<T>(old);
    }
}
#define LF_EMU_ATOMIC_INT(NAME, T, BUILTIN) \
    inline T NAME(T* a, T v) { return BUILTIN(a, v, LF_EMU_ATOMIC_ORDER); } \
    inline T NAME##_block(T* a, T v) { return NAME(a, v); } \
    inline T NAME##_system(T* a, T v) { return NAME(a, v); }
#define LF_EMU_ATOMIC_CAS(NAME, T, EXPR) \
    inline T NAME(T* a, T v) { return lf_emu_atomic_update(a, [v](T old) -> T { return EXPR; }); } \
    inline T NAME##_block(T* a, T v) { return NAME(a, v); } \
    inline T NAME##_system(T* a, T v) { return NAME(a, v); }
LF_EMU_ATOMIC_INT(atomicAdd, int, __atomic_fetch_add)
LF_EMU_ATOMIC_INT(atomicAdd, unsigned int, __atomic_fetch_add)
LF_EMU_ATOMIC_INT(atomicAdd, unsigned long long, __atomic_fetch_add)
LF_EMU_ATOMIC_CAS(atomicAdd, float, old + v)
LF_EMU_ATOMIC_CAS(atomicAdd, double, old + v)
LF_EMU_ATOMIC_INT(atomicSub, int, __atomic_fetch_sub)
LF_EMU_ATOMIC_INT(atomicSub, unsigned int, __atomic_fetch_sub)
LF_EMU_ATOMIC_INT(atomicExch, int, __atomic_exchange_n)
LF_EMU_ATOMIC_INT(atomicExch, unsigned int, __atomic_exchange_n)
LF_EMU_ATOMIC_INT(atomicExch, unsigned long long, __atomic_exchange_n)
LF_EMU_ATOMIC_CAS(atomicExch, float, v)
LF_EMU_ATOMIC_CAS(atomicMin, int, old < v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMin, unsigned int, old < v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMin, long long, old < v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMin, unsigned long long, old < v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMax, int, old > v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMax, unsigned int, old > v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMax, long long, old > v ? old : v)
LF_EMU_ATOMIC_CAS(atomicMax, unsigned long long, old > v ? old : v)
LF_EMU_ATOMIC_CAS(atomicInc, unsigned int, old >= v ? 0u : old + 1u)
LF_EMU_ATOMIC_CAS(atomicDec, unsigned int, (old == 0u || old > v) ? v : old - 1u)
LF_EMU_ATOMIC_INT(atomicAnd, int, __atomic_fetch_and)
LF_EMU_ATOMIC_INT(atomicAnd, unsigned int, __atomic_fetch_and)
LF_EMU_ATOMIC_INT(atomicAnd, unsigned long long, __atomic_fetch_and)
LF_EMU_ATOMIC_INT(atomicOr, int, __atomic_fetch_or)
LF_EMU_ATOMIC_INT(atomicOr, unsigned int, __atomic_fetch_or)
LF_EMU_ATOMIC_INT(atomicOr, unsigned long long, __atomic_fetch_or)
LF_EMU_ATOMIC_INT(atomicXor, int, __atomic_fetch_xor)
LF_EMU_ATOMIC_INT(atomicXor, unsigned int, __atomic_fetch_xor)
LF_EMU_ATOMIC_INT(atomicXor, unsigned long long, __atomic_fetch_xor)
#undef LF_EMU_ATOMIC_INT
#undef LF_EMU_ATOMIC_CAS
template <class T> __forceinline__ T lf_emu_atomic_cas(T* a, T compare, T v) {
    __atomic_compare_exchange_n(a, &compare, v, false, LF_EMU_ATOMIC_ORDER, __ATOMIC_RELAXED);
    return compare;  // the old value, whether or not it was replaced
}
inline int atomicCAS(int* a, int c, int v) { return lf_emu_atomic_cas(a, c, v); }
inline unsigned int atomicCAS(unsigned int* a, unsigned int c, unsigned int v) { return lf_emu_atomic_cas(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
    return lf_emu_atomic_cas(a, c, v);
}
inline unsigned short atomicCAS(unsigned short* a, unsigned short c, unsigned short v) {
    return lf_emu_atomic_cas(a, c, v);
}

// ---------------------------------------------------------------------------------------------------------
// Block barriers and warp operations: the runtime suspends the calling thread until the others arrive.
// __builtin_LINE() names the call site in a fault report.
__forceinline__ int lf_emu_sync_block(int op, int predicate, int line) {
    lf_emu::Thread* t = lf_emu::mutable_self();
    int result = lf_emu_api_table->sync_block(t, op, predicate, line);
    lf_emu::resume(t);
    return result;
}
__forceinline__ void __syncthreads(int line = __builtin_LINE()) { lf_emu_sync_block(lf_emu::BAR_SYNC, 0, line); }
__forceinline__ int __syncthreads_count(int p, int line = __builtin_LINE()) {
    return lf_emu_sync_block(lf_emu::BAR_COUNT, p, line);
}
__forceinline__ int __syncthreads_and(int p, int line = __builtin_LINE()) {
    return lf_emu_sync_block(lf_emu::BAR_AND, p, line);
}
__forceinline__ int __syncthreads_or(int p, int line = __builtin_LINE()) {
    return lf_emu_sync_block(lf_emu::BAR_OR, p, line);
}

template <class T> __forceinline__ uint64_t lf_emu_warp(int op, unsigned mask, T value, int arg, int width, int line) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "warp operations move up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &value, sizeof(T));
    lf_emu::Thread* t = lf_emu::mutable_self();
    uint64_t out = lf_emu_api_table->sync_warp(t, op, mask, bits, arg, width, int(sizeof(T)), line);
    lf_emu::resume(t);
    return out;
}
template <class T> __forceinline__ T lf_emu_warp_value(uint64_t bits) {
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}
template <class T>
__forceinline__ T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, int line = __builtin_LINE()) {
    return lf_emu_warp_value<T>(lf_emu_warp(lf_emu::SHFL_IDX, mask, var, src_lane, width, line));
}
template <class T>
__forceinline__ T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, int line = __builtin_LINE()) {
    return lf_emu_warp_value<T>(lf_emu_warp(lf_emu::SHFL_UP, mask, var, int(delta), width, line));
}
template <class T>
__forceinline__ T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, int line = __builtin_LINE()) {
    return lf_emu_warp_value<T>(lf_emu_warp(lf_emu::SHFL_DOWN, mask, var, int(delta), width, line));
}
template <class T>
__forceinline__ T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, int line = __builtin_LINE()) {
    return lf_emu_warp_value<T>(lf_emu_warp(lf_emu::SHFL_XOR, mask, var, lane_mask, width, line));
}
__forceinline__ void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
    lf_emu_warp(lf_emu::SYNCWARP, mask, 0, 0, warpSize, line);
}
__forceinline__ unsigned __ballot_sync(unsigned mask, int p, int line = __builtin_LINE()) {
    return unsigned(lf_emu_warp(lf_emu::BALLOT, mask, p != 0, 0, warpSize, line));
}
__forceinline__ int __all_sync(unsigned mask, int p, int line = __builtin_LINE()) {
    return int(lf_emu_warp(lf_emu::ALL, mask, p != 0, 0, warpSize, line));
}
__forceinline__ int __any_sync(unsigned mask, int p, int line = __builtin_LINE()) {
    return int(lf_emu_warp(lf_emu::ANY, mask, p != 0, 0, warpSize, line));
}
template <class T> __forceinline__ unsigned __match_any_sync(unsigned mask, T value, int line = __builtin_LINE()) {
    return unsigned(lf_emu_warp(lf_emu::MATCH_ANY, mask, value, 0, warpSize, line));
}
template <class T> __forceinline__ unsigned __match_all_sync(unsigned mask, T value, int* pred, int line = __builtin_LINE()) {
    unsigned out = unsigned(lf_emu_warp(lf_emu::MATCH_ALL, mask, value, 0, warpSize, line));
    *pred = out != 0;
    return out;
}
#define LF_EMU_REDUCE(NAME, OP, T) \
    __forceinline__ T NAME(unsigned mask, T value, int line = __builtin_LINE()) { \
        return lf_emu_warp_value<T>(lf_emu_warp(lf_emu::OP, mask, value, 0, warpSize, line)); \
    }
LF_EMU_REDUCE(__reduce_add_sync, REDUCE_ADD, unsigned)
LF_EMU_REDUCE(__reduce_add_sync, REDUCE_ADD, int)
LF_EMU_REDUCE(__reduce_min_sync, REDUCE_UMIN, unsigned)
LF_EMU_REDUCE(__reduce_min_sync, REDUCE_MIN, int)
LF_EMU_REDUCE(__reduce_max_sync, REDUCE_UMAX, unsigned)
LF_EMU_REDUCE(__reduce_max_sync, REDUCE_MAX, int)
LF_EMU_REDUCE(__reduce_and_sync, REDUCE_AND, unsigned)
LF_EMU_REDUCE(__reduce_or_sync, REDUCE_OR, unsigned)
LF_EMU_REDUCE(__reduce_xor_sync, REDUCE_XOR, unsigned)
#undef LF_EMU_REDUCE
__forceinline__ unsigned __activemask() { return lf_emu_api_table->active_mask(lf_emu::mutable_self()); }
__forceinline__ unsigned __lanemask_lt() { return (1u << lf_emu::self()->lane) - 1u; }

// the kernel's own errors: assert and __trap end the launch with a KernelFault naming block and thread
#undef assert
#define assert(e) \
    ((e) ? (void)0 : lf_emu_api_table->fault(lf_emu::mutable_self(), "assertion '" #e "' failed", __FILE__, __LINE__))
inline void __trap(int line = __builtin_LINE()) { lf_emu_api_table->fault(lf_emu::mutable_self(), "__trap()", "", line); }
inline void __brkpt(int line = __builtin_LINE()) { lf_emu_api_table->fault(lf_emu::mutable_self(), "__brkpt()", "", line); }

// ---------------------------------------------------------------------------------------------------------
// What kernel_runner.py appends for each kernel: its parameter types (as the compiler sees them, typedefs
// resolved) and its run loop.
namespace lf_emu {

template <class T> const char* type_name() {
    // "const char* lf_emu::type_name() [with T = float; ...]": the compiler's spelling of T
    return __PRETTY_FUNCTION__;
}

template <class T> ParamInfo describe_param() {
    typedef typename std::remove_cv<T>::type U;
    if constexpr (std::is_pointer<U>::value) {
        typedef typename std::remove_pointer<U>::type Pointee;
        ParamInfo inner = describe_param<Pointee>();
        return ParamInfo{inner.base, inner.pointer_depth + 1, unsigned(std::is_const<Pointee>::value), sizeof(U)};
    } else if constexpr (std::is_void<U>::value) {
        return ParamInfo{type_name<U>(), 0, 0, 0};
    } else {
        return ParamInfo{type_name<U>(), 0, 0, sizeof(U)};
    }
}

template <size_t I, class T> struct Leaf {
    T value;
};
template <class S, class... T> struct Pack;
template <size_t... I, class... T> struct Pack<std::index_sequence<I...>, T...> : Leaf<I, T>... {
    explicit Pack(void* const* args) : Leaf<I, T>{load<T>(args[I])}... {}
    template <class T1> static T1 load(const void* p) {
        T1 v;
        memcpy(static_cast<void*>(&v), p, sizeof v);
        return v;
    }
    template <auto K> __forceinline__ void call() { K(static_cast<Leaf<I, T>&>(*this).value...); }
};

template <class F, F K> struct Kernel;
template <class... P, void (*K)(P...)> struct Kernel<void (*)(P...), K> {
    typedef Pack<std::index_sequence_for<P...>, typename std::remove_cv<P>::type...> Args;

#if defined(LF_EMU_SANITIZE)
    // one GPU thread, on its own fiber: the runtime has set it running
    static void run(Runner* r) {
        Args args(r->args);
        args.template call<K>();
    }
#else
    // start threads one after another until a thread blocks (the runtime then hands this stack to it)
    static void run(Runner* r) {
        Args args(r->args);
        Block* b = r->block;
        for (;;) {
            unsigned i = b->next_unstarted;
            if (i >= b->nthreads) return;
            b->next_unstarted = i + 1;
            Thread* t = b->threads + i;
            t->state = RUNNING;
            r->current = t;
            lf_emu_self_thread = t;
            args.template call<K>();
            if (__builtin_expect(r->demoted, 0)) lf_emu_api_table->retire(r, t);
            t->state = DONE;
            ++b->finished;
        }
    }
#endif

    static KernelInfo info(const char* name) {
        static const ParamInfo params[sizeof...(P) + 1] = {describe_param<P>()..., ParamInfo{"", 0, 0, 0}};
        return KernelInfo{name, unsigned(sizeof...(P)), params, &run};
    }
};

}  // namespace lf_emu

#define LF_EMU_KERNEL_INFO(expr, name) ::lf_emu::Kernel<decltype(&expr), &expr>::info(name)

extern "C" __attribute__((visibility("default"))) void lf_emu_module_init(const lf_emu::Api* api) {
    lf_emu_api_table = api;
}

#if defined(LF_EMU_SANITIZE) && !defined(LF_EMU_ASAN)
// ThreadSanitizer: the runtime calls this on a block's host thread before any fiber runs, so that thread's
// copy of the module's thread-local data (the __shared__ variables) is made there, not inside a fiber
static thread_local volatile char lf_emu_tls_anchor;  // volatile: the store must happen
extern "C" __attribute__((visibility("default"))) void lf_emu_touch_shared() { lf_emu_tls_anchor = 1; }
#endif

#endif  // LF_EMU_DISCOVER

#endif
