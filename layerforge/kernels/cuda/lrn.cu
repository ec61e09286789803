// LRN across channels (Caffe's lrn_layer.cu), x contiguous (N, C, S) with S = H * W:
//   scale[n, c, s] = k + alpha_n * sum_{|c' - c| <= (size - 1) / 2, 0 <= c' < C} x[n, c', s]^2
//   y = x * scale^(-beta)
//   gx = gy * scale^(-beta) - 2 alpha_n beta * x * sum_{same window} gy[c'] y[c'] / scale[c']
// alpha_n is alpha / size. T is float or double: LF_REAL, a -D define. One thread per element.

typedef LF_REAL T;

extern "C" __global__ void lrn_forward(const T* __restrict__ x, T* __restrict__ scale, T* __restrict__ y,
                                       int count, int channels, int spatial, int size,
                                       T alpha_n, T k, T beta) {
    int half = (size - 1) / 2;
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int s = index % spatial;
        int c = (index / spatial) % channels;
        int n = index / (spatial * channels);
        const T* column = x + (long long)n * channels * spatial + s;
        int c0 = c - half < 0 ? 0 : c - half;
        int c1 = c + half + 1 > channels ? channels : c + half + 1;
        T acc = T(0);
        for (int cc = c0; cc < c1; ++cc) {
            T v = column[(long long)cc * spatial];
            acc += v * v;
        }
        T sc = k + alpha_n * acc;
        scale[index] = sc;
        y[index] = x[index] * pow(sc, -beta);
    }
}

extern "C" __global__ void lrn_backward(const T* __restrict__ x, const T* __restrict__ scale,
                                        const T* __restrict__ gy, T* __restrict__ gx,
                                        int count, int channels, int spatial, int size,
                                        T alpha_n, T beta) {
    int half = (size - 1) / 2;
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int s = index % spatial;
        int c = (index / spatial) % channels;
        int n = index / (spatial * channels);
        long long base = (long long)n * channels * spatial + s;
        int c0 = c - half < 0 ? 0 : c - half;
        int c1 = c + half + 1 > channels ? channels : c + half + 1;
        T ratio = T(0);
        for (int cc = c0; cc < c1; ++cc) {
            long long at = base + (long long)cc * spatial;
            T sc = scale[at];
            ratio += gy[at] * x[at] * pow(sc, -beta) / sc;  // gy y / scale
        }
        gx[index] = gy[index] * pow(scale[index], -beta) - T(2) * alpha_n * beta * x[index] * ratio;
    }
}
