// BatchNorm (Caffe's batch_norm_layer.cu) over x contiguous (N, C, S), statistics per channel over N and S.
// The per-channel sums run one block per channel (blockDim.x == 256, a power of two) with a shared-memory
// tree reduction; the element-wise steps are grid-stride loops. T is float or double: LF_REAL, a -D define.

typedef LF_REAL T;

#define BN_THREADS 256

// Tree-reduce buf[0 .. BN_THREADS) into buf[0]; every thread of the block must call it.
__device__ __forceinline__ void block_sum(T* buf) {
    __syncthreads();
    for (int stride = BN_THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) buf[threadIdx.x] += buf[threadIdx.x + stride];
        __syncthreads();
    }
}

// mean[c] = sum x / m and var[c] = sum (x - mean)^2 / m (biased), m = N * S: two passes, no cancellation.
extern "C" __global__ void channel_mean_var(const T* __restrict__ x, T* __restrict__ mean, T* __restrict__ var,
                                            int n_img, int channels, int spatial) {
    __shared__ T buf[BN_THREADS];
    int c = blockIdx.x;
    int m = n_img * spatial;
    T acc = T(0);
    for (int i = threadIdx.x; i < m; i += BN_THREADS) {
        acc += x[((long long)(i / spatial) * channels + c) * spatial + i % spatial];
    }
    buf[threadIdx.x] = acc;
    block_sum(buf);
    T mu = buf[0] / T(m);
    __syncthreads();
    acc = T(0);
    for (int i = threadIdx.x; i < m; i += BN_THREADS) {
        T d = x[((long long)(i / spatial) * channels + c) * spatial + i % spatial] - mu;
        acc += d * d;
    }
    buf[threadIdx.x] = acc;
    block_sum(buf);
    if (threadIdx.x == 0) {
        mean[c] = mu;
        var[c] = buf[0] / T(m);
    }
}

// y = (x - mean[c]) * inv_std[c]; y may be x (each element is read once, then written), so neither is restrict
extern "C" __global__ void normalize(const T* x, const T* __restrict__ mean,
                                     const T* __restrict__ inv_std, T* y,
                                     int count, int channels, int spatial) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int c = (index / spatial) % channels;
        y[index] = (x[index] - mean[c]) * inv_std[c];
    }
}

// sum_gy[c] = sum gy, sum_gy_y[c] = sum gy * y over N and S.
extern "C" __global__ void channel_grad_sums(const T* __restrict__ gy, const T* __restrict__ y,
                                             T* __restrict__ sum_gy, T* __restrict__ sum_gy_y,
                                             int n_img, int channels, int spatial) {
    __shared__ T buf[BN_THREADS];
    __shared__ T buf2[BN_THREADS];
    int c = blockIdx.x;
    int m = n_img * spatial;
    T a = T(0), b = T(0);
    for (int i = threadIdx.x; i < m; i += BN_THREADS) {
        long long at = ((long long)(i / spatial) * channels + c) * spatial + i % spatial;
        a += gy[at];
        b += gy[at] * y[at];
    }
    buf[threadIdx.x] = a;
    buf2[threadIdx.x] = b;
    block_sum(buf);
    block_sum(buf2);
    if (threadIdx.x == 0) {
        sum_gy[c] = buf[0];
        sum_gy_y[c] = buf2[0];
    }
}

// gx = (gy - sum_gy / m - sum_gy_y / m * y) * inv_std; gx may alias gy (each element read before written).
extern "C" __global__ void batch_norm_backward(const T* gy, const T* __restrict__ y,
                                               const T* __restrict__ sum_gy, const T* __restrict__ sum_gy_y,
                                               const T* __restrict__ inv_std, T* gx,
                                               int count, int channels, int spatial, int m) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int c = (index / spatial) % channels;
        gx[index] = (gy[index] - sum_gy[c] / T(m) - sum_gy_y[c] / T(m) * y[index]) * inv_std[c];
    }
}
