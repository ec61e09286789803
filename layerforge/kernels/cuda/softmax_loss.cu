// SoftmaxWithLoss (Caffe's softmax_loss_layer.cu) over probabilities p seen as (outer, C, inner).
// label holds outer * inner class indices as T (a float blob, as in Caffe). A position whose label is
// ignore_label (when has_ignore) contributes nothing and counts as invalid. FLT_MIN guards log(0) as
// Caffe does. T is float or double: LF_REAL, a -D define.

typedef LF_REAL T;

// Per position: loss[i] = -log(max(p[label], FLT_MIN)) and valid[i] = 1, or 0 and 0 when ignored.
extern "C" __global__ void softmax_loss_forward(const T* __restrict__ prob, const T* __restrict__ label,
                                                T* __restrict__ loss, T* __restrict__ valid,
                                                int count, int channels, int inner,
                                                int has_ignore, int ignore_label) {
    const T flt_min = T(1.17549435e-38f);
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int o = index / inner;
        int s = index % inner;
        int l = static_cast<int>(label[index]);
        if (has_ignore && l == ignore_label) {
            loss[index] = T(0);
            valid[index] = T(0);
        } else {
            T p = prob[((long long)o * channels + l) * inner + s];
            loss[index] = -log(p > flt_min ? p : flt_min);
            valid[index] = T(1);
        }
    }
}

// Per element: gx = scale * (p - [c == label]) at valid positions, 0 at ignored ones.
extern "C" __global__ void softmax_loss_backward(const T* __restrict__ prob, const T* __restrict__ label,
                                                 T* __restrict__ gx, int count, int channels, int inner,
                                                 int has_ignore, int ignore_label, T scale) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int s = index % inner;
        int c = (index / inner) % channels;
        int o = index / (inner * channels);
        int l = static_cast<int>(label[(long long)o * inner + s]);
        if (has_ignore && l == ignore_label) {
            gx[index] = T(0);
        } else {
            gx[index] = scale * (prob[index] - (c == l ? T(1) : T(0)));
        }
    }
}
