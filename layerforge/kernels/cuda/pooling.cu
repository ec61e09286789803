// Max and average pooling over NCHW batches with Caffe's window rules, as kernels/pooling.py.
// Window (oy, ox) covers rows [oy sy - ph, oy sy - ph + kh) and the matching columns; out_h / out_w
// come from the caller. argmax holds the kernel position i * kw + j of the first maximum in raster
// order (strict >), relative to the window's padded start: the CPU body's format, as int.
// T is float or double: LF_REAL, a -D define. Backward kernels gather per input element: no atomics.

typedef LF_REAL T;

// -inf of each element type, without math.h (NVRTC has no standard headers)
__device__ __forceinline__ float negative_infinity(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double negative_infinity(double) { return __longlong_as_double(0xfff0000000000000ULL); }

__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

extern "C" __global__ void max_pool_forward(const T* __restrict__ x, T* __restrict__ y, int* __restrict__ argmax,
                                            int count, int height, int width, int kh, int kw,
                                            int sy, int sx, int ph, int pw, int out_h, int out_w) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int ox = index % out_w;
        int oy = (index / out_w) % out_h;
        int plane = index / (out_w * out_h);  // n * C + c
        int y0 = oy * sy - ph;
        int x0 = ox * sx - pw;
        const T* src = x + (long long)plane * height * width;
        T best = negative_infinity(T(0));
        int arg = 0;
        for (int i = 0; i < kh; ++i) {
            int iy = y0 + i;
            if (iy < 0 || iy >= height) continue;
            for (int j = 0; j < kw; ++j) {
                int ix = x0 + j;
                if (ix < 0 || ix >= width) continue;
                T v = src[iy * width + ix];
                if (v > best) {
                    best = v;
                    arg = i * kw + j;
                }
            }
        }
        y[index] = best;
        argmax[index] = arg;
    }
}

// First and one-past-last window index along an axis whose windows cover input position i.
__device__ __forceinline__ int window_begin(int i, int k, int s, int p) {
    return (i + p < k) ? 0 : (i + p - k) / s + 1;
}

__device__ __forceinline__ int window_end(int i, int s, int p, int out) {
    return imin((i + p) / s + 1, out);
}

// The outputs whose windows cover input element `index` of an (N C, H, W) array: rows [oy0, oy1),
// columns [ox0, ox1), at `base` in the (N C, out_h, out_w) output.
struct Covering {
    int iy, ix, oy0, oy1, ox0, ox1;
    long long base;
};

__device__ __forceinline__ Covering covering(int index, int height, int width, int kh, int kw,
                                             int sy, int sx, int ph, int pw, int out_h, int out_w) {
    Covering v;
    v.ix = index % width;
    v.iy = (index / width) % height;
    v.base = (long long)(index / (width * height)) * out_h * out_w;
    v.oy0 = window_begin(v.iy, kh, sy, ph);
    v.oy1 = window_end(v.iy, sy, ph, out_h);
    v.ox0 = window_begin(v.ix, kw, sx, pw);
    v.ox1 = window_end(v.ix, sx, pw, out_w);
    return v;
}

extern "C" __global__ void max_pool_backward(const T* __restrict__ gy, const int* __restrict__ argmax,
                                             T* __restrict__ gx, int count, int height, int width,
                                             int kh, int kw, int sy, int sx, int ph, int pw,
                                             int out_h, int out_w) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        Covering v = covering(index, height, width, kh, kw, sy, sx, ph, pw, out_h, out_w);
        T acc = T(0);
        for (int oy = v.oy0; oy < v.oy1; ++oy) {
            for (int ox = v.ox0; ox < v.ox1; ++ox) {
                int a = argmax[v.base + oy * out_w + ox];
                if (oy * sy - ph + a / kw == v.iy && ox * sx - pw + a % kw == v.ix) {
                    acc += gy[v.base + oy * out_w + ox];
                }
            }
        }
        gx[index] = acc;
    }
}

// Caffe's AVE divisor: the window clipped to the padded image (size + p), padding included.
__device__ __forceinline__ int pool_extent(int start, int k, int size, int p) {
    return imin(start + k, size + p) - start;
}

extern "C" __global__ void ave_pool_forward(const T* __restrict__ x, T* __restrict__ y,
                                            int count, int height, int width, int kh, int kw,
                                            int sy, int sx, int ph, int pw, int out_h, int out_w) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int ox = index % out_w;
        int oy = (index / out_w) % out_h;
        int plane = index / (out_w * out_h);
        int y0 = oy * sy - ph;
        int x0 = ox * sx - pw;
        int pool = pool_extent(y0, kh, height, ph) * pool_extent(x0, kw, width, pw);
        const T* src = x + (long long)plane * height * width;
        T acc = T(0);
        for (int iy = imax(y0, 0); iy < imin(y0 + kh, height); ++iy) {
            for (int ix = imax(x0, 0); ix < imin(x0 + kw, width); ++ix) {
                acc += src[iy * width + ix];
            }
        }
        y[index] = acc / T(pool);
    }
}

extern "C" __global__ void ave_pool_backward(const T* __restrict__ gy, T* __restrict__ gx,
                                             int count, int height, int width, int kh, int kw,
                                             int sy, int sx, int ph, int pw, int out_h, int out_w) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        Covering v = covering(index, height, width, kh, kw, sy, sx, ph, pw, out_h, out_w);
        T acc = T(0);
        for (int oy = v.oy0; oy < v.oy1; ++oy) {
            int ey = pool_extent(oy * sy - ph, kh, height, ph);
            for (int ox = v.ox0; ox < v.ox1; ++ox) {
                int pool = ey * pool_extent(ox * sx - pw, kw, width, pw);
                acc += gy[v.base + oy * out_w + ox] / T(pool);
            }
        }
        gx[index] = acc;
    }
}
