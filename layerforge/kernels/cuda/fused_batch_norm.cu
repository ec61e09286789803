// Fused BatchNorm + Scale (+ ReLU) (layerforge/kernels/fused_batch_norm.py) over contiguous (N, C, S) arrays.
// Forward: y = gamma[c] x_norm + beta[c], then the ReLU of slope a when relu != 0 (x_norm comes from BatchNorm's
// own kernels). Backward: one pass per channel for the two sums of gz (the ReLU-masked gy) that every gradient
// needs, then one element-wise pass for gx. T is float or double: LF_REAL, a -D define.

typedef LF_REAL T;

#define FBN_THREADS 256
#define FBN_WARPS (FBN_THREADS / 32)

// The gradient past the ReLU: y > 0 exactly where its input is > 0, as the slope is >= 0.
__device__ __forceinline__ T relu_grad(T gy, T y, int relu, T slope) {
    return (relu == 0 || y > T(0)) ? gy : slope * gy;
}

// The block's sum of v, valid in thread 0: warp shuffles, then the warps' partial sums in shared memory.
__device__ __forceinline__ T block_total(T v, T* partial) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < FBN_WARPS ? partial[threadIdx.x] : T(0);
    if (threadIdx.x < 32) {
        for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    __syncthreads();  // partial is reused by the caller's next total
    return v;
}

extern "C" __global__ void scale_shift_relu(const T* __restrict__ x_norm, const T* __restrict__ gamma,
                                            const T* __restrict__ beta, T* __restrict__ y, int count,
                                            int channels, int spatial, int relu, T slope) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int c = (index / spatial) % channels;
        T z = gamma[c] * x_norm[index] + beta[c];
        y[index] = (relu == 0 || z > T(0)) ? z : slope * z;
    }
}

// sum_gz[c] = sum gz and sum_gz_xn[c] = sum gz * x_norm over N and S; one block per channel.
extern "C" __global__ void fused_grad_sums(const T* __restrict__ gy, const T* __restrict__ y,
                                           const T* __restrict__ x_norm, T* __restrict__ sum_gz,
                                           T* __restrict__ sum_gz_xn, int n_img, int channels, int spatial,
                                           int relu, T slope) {
    __shared__ T partial[FBN_WARPS];
    int c = blockIdx.x;
    int m = n_img * spatial;
    T a = T(0), b = T(0);
    for (int i = threadIdx.x; i < m; i += FBN_THREADS) {
        long long at = ((long long)(i / spatial) * channels + c) * spatial + i % spatial;
        T gz = relu_grad(gy[at], y[at], relu, slope);
        a += gz;
        b += gz * x_norm[at];
    }
    a = block_total(a, partial);
    b = block_total(b, partial);
    if (threadIdx.x == 0) {
        sum_gz[c] = a;
        sum_gz_xn[c] = b;
    }
}

// gx = coef_gz[c] gz - coef_xn[c] x_norm - shift[c]; gx may alias gy (each element read before written).
extern "C" __global__ void fused_backward(const T* gy, const T* __restrict__ y, const T* __restrict__ x_norm,
                                          const T* __restrict__ coef_gz, const T* __restrict__ coef_xn,
                                          const T* __restrict__ shift, T* gx, int count, int channels,
                                          int spatial, int relu, T slope) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int c = (index / spatial) % channels;
        gx[index] = coef_gz[c] * relu_grad(gy[index], y[index], relu, slope) - coef_xn[c] * x_norm[index] - shift[c];
    }
}
