// im2col / col2im for NCHW batches, column layout (C, kh, kw, N, out_h, out_w) as kernels/im2col.py.
//   col[c, i, j, n, y, x] = x[n, c, y sy - ph + i dy, x sx - pw + j dx]   (0 outside the image)
// T is float or double: LF_REAL, a -D define. One thread per output element, grid-stride loop.

typedef LF_REAL T;

extern "C" __global__ void im2col(const T* __restrict__ x, T* __restrict__ col, int count,
                                  int n_img, int channels, int height, int width,
                                  int kh, int kw, int sy, int sx, int ph, int pw, int dy, int dx,
                                  int out_h, int out_w) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int ox = index % out_w;
        int oy = (index / out_w) % out_h;
        int n = (index / (out_w * out_h)) % n_img;
        int j = (index / (out_w * out_h * n_img)) % kw;
        int i = (index / (out_w * out_h * n_img * kw)) % kh;
        int c = index / (out_w * out_h * n_img * kw * kh);
        int iy = oy * sy - ph + i * dy;
        int ix = ox * sx - pw + j * dx;
        T v = T(0);
        if (iy >= 0 && iy < height && ix >= 0 && ix < width) {
            v = x[((n * channels + c) * height + iy) * width + ix];
        }
        col[index] = v;
    }
}

// The adjoint: each image element (n, c, iy, ix) gathers every column entry that copied it, so no atomics.
// Kernel tap i reads row iy when iy + ph - i dy = oy sy for some 0 <= oy < out_h.
extern "C" __global__ void col2im(const T* __restrict__ col, T* __restrict__ gx, int count,
                                  int n_img, int channels, int height, int width,
                                  int kh, int kw, int sy, int sx, int ph, int pw, int dy, int dx,
                                  int out_h, int out_w) {
    for (int index = blockIdx.x * blockDim.x + threadIdx.x; index < count; index += blockDim.x * gridDim.x) {
        int ix = index % width;
        int iy = (index / width) % height;
        int c = (index / (width * height)) % channels;
        int n = index / (width * height * channels);
        T acc = T(0);
        for (int i = 0; i < kh; ++i) {
            int ry = iy + ph - i * dy;
            if (ry < 0 || ry % sy != 0) continue;
            int oy = ry / sy;
            if (oy >= out_h) continue;
            for (int j = 0; j < kw; ++j) {
                int rx = ix + pw - j * dx;
                if (rx < 0 || rx % sx != 0) continue;
                int ox = rx / sx;
                if (ox >= out_w) continue;
                acc += col[((((c * kh + i) * kw + j) * n_img + n) * out_h + oy) * out_w + ox];
            }
        }
        gx[index] = acc;
    }
}
