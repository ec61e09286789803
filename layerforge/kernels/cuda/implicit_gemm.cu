// Implicit-GEMM convolution (as swCaffe describes): the column matrix never exists. Each block computes
// a TILE x TILE tile of one group's GEMM, staging TILE x TILE tiles of both operands through shared
// memory; an operand tile of "columns" is gathered straight from the NCHW image by coordinate mapping,
// and a tap that falls in the padding reads as 0 (no padded copy). Shapes, with G groups,
// M = Cout / G, Cg = Cin / G, K = Cg kh kw, P = out_h out_w, and k = (ci kh + i) kw + j:
//
//   forward        y[n, g M + co, p]      = sum_k        W[g M + co, k] xcol[g; k, (n, p)]
//   data gradient  gx[n, g Cg + ci, iy, ix] = sum_(co,i,j) W[g M + co, (ci, i, j)] gy[n, g M + co, oy, ox]
//                  (the tap reaches (iy, ix) when iy + ph - i dy = oy sy, ix + pw - j dx = ox sx)
//   weight grad    gW[g M + co, k]       += sum_(n,p)     gy[n, g M + co, p] xcol[g; k, (n, p)]
//                  (split over chunks of (n, p), added atomically: the sum order varies run to run)
//
// with xcol[g; k, (n, p)] = x[n, g Cg + ci, oy sy - ph + i dy, ox sx - pw + j dx] (0 outside the image).
// Launch: block (TILE, TILE), grid (ceil(cols / TILE), ceil(rows / TILE), G), times the splits for gW. T is float or double:
// LF_REAL, a -D define.

typedef LF_REAL T;

#define TILE 16

struct Geometry {
    int n_img, cin, height, width, cout, group;
    int kh, kw, sy, sx, ph, pw, dy, dx, out_h, out_w;
};

__device__ __forceinline__ Geometry make_geometry(int n_img, int cin, int height, int width, int cout, int group,
                                                  int kh, int kw, int sy, int sx, int ph, int pw, int dy, int dx,
                                                  int out_h, int out_w) {
    Geometry q = {n_img, cin, height, width, cout, group, kh, kw, sy, sx, ph, pw, dy, dx, out_h, out_w};
    return q;
}

// xcol[g; k, (n, p)] by coordinate mapping: 0 where the tap lies in the padding.
__device__ __forceinline__ T column_value(const T* x, const Geometry& q, int g, int k, long long col) {
    int plane = q.out_h * q.out_w;
    int n = (int)(col / plane);
    int p = (int)(col % plane);
    int ci = k / (q.kh * q.kw);
    int i = (k / q.kw) % q.kh;
    int j = k % q.kw;
    int iy = (p / q.out_w) * q.sy - q.ph + i * q.dy;
    int ix = (p % q.out_w) * q.sx - q.pw + j * q.dx;
    if (iy < 0 || iy >= q.height || ix < 0 || ix >= q.width) return T(0);
    int cg = q.cin / q.group;
    return x[(((long long)n * q.cin + g * cg + ci) * q.height + iy) * q.width + ix];
}

// gy seen through tap t = (co, i, j) at image position r = (n, iy, ix): 0 where no output reads it.
__device__ __forceinline__ T tap_gradient(const T* gy, const Geometry& q, int g, int t, long long r) {
    int image = q.height * q.width;
    int n = (int)(r / image);
    int iy = (int)(r % image) / q.width;
    int ix = (int)(r % image) % q.width;
    int co = t / (q.kh * q.kw);
    int i = (t / q.kw) % q.kh;
    int j = t % q.kw;
    int ry = iy + q.ph - i * q.dy;
    int rx = ix + q.pw - j * q.dx;
    if (ry < 0 || rx < 0 || ry % q.sy != 0 || rx % q.sx != 0) return T(0);
    int oy = ry / q.sy;
    int ox = rx / q.sx;
    if (oy >= q.out_h || ox >= q.out_w) return T(0);
    int m = q.cout / q.group;
    return gy[(((long long)n * q.cout + g * m + co) * q.out_h + oy) * q.out_w + ox];
}

// One thread's element (row, col) of a TILE x TILE block of A B, A rows x [begin, end), B [begin, end) x
// cols. a(r, t) and b(t, c) load single elements (the caller's bounds and coordinate mapping: 0 outside);
// each step stages a TILE-wide slab of both through shared memory, one element per thread.
template <class LoadA, class LoadB>
__device__ __forceinline__ T tiled_product(int row, long long col, long long begin, long long end, LoadA a, LoadB b) {
    __shared__ T a_tile[TILE][TILE + 1];
    __shared__ T b_tile[TILE][TILE + 1];
    T acc = T(0);
    for (long long t0 = begin; t0 < end; t0 += TILE) {
        a_tile[threadIdx.y][threadIdx.x] = a(row, t0 + threadIdx.x);
        b_tile[threadIdx.y][threadIdx.x] = b(t0 + threadIdx.y, col);
        __syncthreads();
        for (int t = 0; t < TILE; ++t) acc += a_tile[threadIdx.y][t] * b_tile[t][threadIdx.x];
        __syncthreads();
    }
    return acc;
}

#define GEOMETRY_PARAMS int n_img, int cin, int height, int width, int cout, int group, \
    int kh, int kw, int sy, int sx, int ph, int pw, int dy, int dx, int out_h, int out_w
#define GEOMETRY_ARGS n_img, cin, height, width, cout, group, kh, kw, sy, sx, ph, pw, dy, dx, out_h, out_w

extern "C" __global__ void conv_forward(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                        GEOMETRY_PARAMS) {
    const Geometry q = make_geometry(GEOMETRY_ARGS);
    int g = blockIdx.z;
    int m = cout / group;
    int k_total = (cin / group) * kh * kw;
    int plane = out_h * out_w;
    long long cols = (long long)n_img * plane;
    int row = blockIdx.y * TILE + threadIdx.y;                   // co within the group
    long long col = (long long)blockIdx.x * TILE + threadIdx.x;  // (n, p)
    T acc = tiled_product(row, col, 0, k_total,
        [&](int r, long long k) { return (r < m && k < k_total) ? w[(long long)(g * m + r) * k_total + k] : T(0); },
        [&](long long k, long long c) { return (k < k_total && c < cols) ? column_value(x, q, g, (int)k, c) : T(0); });
    if (row < m && col < cols) {
        long long n = col / plane;
        y[(n * cout + g * m + row) * plane + col % plane] = acc;
    }
}

extern "C" __global__ void conv_backward_data(const T* __restrict__ gy, const T* __restrict__ w, T* __restrict__ gx,
                                              GEOMETRY_PARAMS) {
    const Geometry q = make_geometry(GEOMETRY_ARGS);
    int g = blockIdx.z;
    int m = cout / group;
    int cg = cin / group;
    int taps = kh * kw;
    int k_total = cg * taps;
    int t_total = m * taps;
    int image = height * width;
    long long cols = (long long)n_img * image;
    int row = blockIdx.y * TILE + threadIdx.y;                   // ci within the group
    long long col = (long long)blockIdx.x * TILE + threadIdx.x;  // (n, iy, ix)
    T acc = tiled_product(row, col, 0, t_total,
        [&](int r, long long t) {  // tap t = (co, i, j): W[g m + co, (r, i, j)]
            return (r < cg && t < t_total) ? w[(long long)(g * m + t / taps) * k_total + r * taps + t % taps] : T(0);
        },
        [&](long long t, long long c) { return (t < t_total && c < cols) ? tap_gradient(gy, q, g, (int)t, c) : T(0); });
    if (row < cg && col < cols) {
        long long n = col / image;
        gx[(n * cin + g * cg + row) * image + col % image] = acc;
    }
}

// The reduction over (n, p) is long (N out_h out_w) while gW is small: it is split into chunks of
// `chunk` positions (a multiple of TILE), one per blockIdx.z / group, whose partial sums are added
// into gW atomically. blockIdx.z = split * group + g.
extern "C" __global__ void conv_backward_filter(const T* __restrict__ x, const T* __restrict__ gy, T* __restrict__ gw,
                                                GEOMETRY_PARAMS, int chunk) {
    const Geometry q = make_geometry(GEOMETRY_ARGS);
    int g = blockIdx.z % group;
    long long split = blockIdx.z / group;
    int m = cout / group;
    int k_total = (cin / group) * kh * kw;
    int plane = out_h * out_w;
    long long reduce = (long long)n_img * plane;
    long long begin = split * chunk;
    long long end = begin + chunk < reduce ? begin + chunk : reduce;
    int row = blockIdx.y * TILE + threadIdx.y;  // co within the group
    int col = blockIdx.x * TILE + threadIdx.x;  // k
    T acc = tiled_product(row, col, begin, end,
        [&](int r, long long i) {  // i = (n, p)
            return (r < m && i < end) ? gy[((i / plane) * cout + g * m + r) * plane + i % plane] : T(0);
        },
        [&](long long i, long long k) { return (k < k_total && i < end) ? column_value(x, q, g, (int)k, i) : T(0); });
    if (row < m && col < k_total) {
        atomicAdd(&gw[(long long)(g * m + row) * k_total + col], acc);  // diffs accumulate
    }
}
