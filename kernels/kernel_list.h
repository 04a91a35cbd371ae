// The kernels a backend implements, one row each with its contract: the only list. Included with
// KILN_KERNEL(name, (params)) defined, it makes the Backend table's fields (kernels/backend.h), each
// backend's declarations (kernels/kernel_decls.h) and both tables (kernels/cpu/backend_cpu.cpp,
// kernels/cuda/context.cu); a kernel a backend does not define is a link error, never a null slot.
// Adding a kernel: one row here, then its body in kernels/cpu and kernels/cuda. No include guard.

// dst[i] = src[i] for same-shaped views, converting dtypes.
KILN_KERNEL(copy, (const TensorDesc& dst, const TensorDesc& src))
KILN_KERNEL(fill, (const TensorDesc& dst, double value))
KILN_KERNEL(arange, (const TensorDesc& dst, double start, double step))
// dst and src have one shape and dtype.
KILN_KERNEL(unary, (UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1))
// a and b have dst's shape (broadcast dims have stride 0) and one dtype; dst has it too, or
// bool for comparisons and logical ops.
KILN_KERNEL(binary, (BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha))
KILN_KERNEL(where, (const TensorDesc& dst, const TensorDesc& cond, const TensorDesc& a, const TensorDesc& b))
// Contiguous src viewed as [outer, r, inner] reduced over r into contiguous dst [outer, inner].
// sum accumulates floats in f64 in a fixed order (results do not depend on the thread count);
// dst has src's dtype except sum of integers (i64) and argmax/argmin (i64).
KILN_KERNEL(reduce, (ReduceOp op, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t outer,
               int64_t r, int64_t inner))
// Scans along the middle dim of contiguous [outer, n, inner], dst alike; idx (cummax/cummin only) the
// position of each running extreme. Types: f32, f64, i32, i64.
KILN_KERNEL(scan,
            (ScanOp op, DType dt, int64_t outer, int64_t n, int64_t inner, const void* src, void* dst, int64_t* idx))
// cumprod's input gradient, exact where x has zeros: gx_i = sum_{j >= i} gy_j prod_{k <= j, k != i} x_k.
KILN_KERNEL(cumprod_backward,
            (DType dt, int64_t outer, int64_t n, int64_t inner, const void* x, const void* gy, void* gx))
// A stable sort of each [.., n, ..] column of contiguous [outer, n, inner] (NaN greater than every
// number, equal to NaN): idx gets the source positions in sorted order. Types: f32, f64, i32, i64.
KILN_KERNEL(argsort,
            (DType dt, int64_t outer, int64_t n, int64_t inner, const void* src, bool descending, int64_t* idx))
// Contiguous dst filled from the Philox stream (seed, offset): uniform [p0, p1), normal (mean p0,
// std p1), bernoulli (probability p0).
KILN_KERNEL(random, (RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1))

// ---- neural-network kernels; every buffer contiguous, dtype f32 or f64 on the CPU ----
KILN_KERNEL(conv2d_forward, (DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y))
// Writes (does not accumulate) gx and gw where non-null.
KILN_KERNEL(conv2d_backward, (DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx,
                        void* gw))
// Max pooling writes y and the flat index (ih * W + iw) of each maximum within its plane.
KILN_KERNEL(max_pool2d_forward, (DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx))
KILN_KERNEL(max_pool2d_backward, (DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx))
KILN_KERNEL(avg_pool2d_forward, (DType dt, const Pool2dParams& p, const void* x, void* y))
KILN_KERNEL(avg_pool2d_backward, (DType dt, const Pool2dParams& p, const void* gy, void* gx))
// Softmax or log-softmax over the middle dim of [outer, n, inner].
KILN_KERNEL(softmax_forward, (DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* x, void* y))
// gx = y * (gy - sum(gy * y)) for softmax, gy - exp(y) * sum(gy) for log-softmax (y: the output).
KILN_KERNEL(softmax_backward, (DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* y, const void* gy,
                         void* gx))
// Attention's softmax in one pass over contiguous rows of n: y = softmax(scale * x + mask), mask
// (same dtype, may be null) placed by MaskRows. Rows that are all -inf follow softmax's rule.
KILN_KERNEL(masked_softmax_forward, (DType dt, int64_t rows, int64_t n, const void* x, double scale, const void* mask,
                               const MaskRows& mask_rows, void* y))
// gx = scale * y * (gy - sum(gy * y)).
KILN_KERNEL(masked_softmax_backward, (DType dt, int64_t rows, int64_t n, const void* y, const void* gy, double scale,
                                void* gx))
// Layer norm over rows of length d: y = (x - mean) * rstd * gamma + beta (gamma/beta may be null);
// writes mean and rstd (f32 or f64, one per row) for the backward.
KILN_KERNEL(layer_norm_forward, (DType dt, int64_t rows, int64_t d, double eps, const void* x, const void* gamma,
                           const void* beta, void* y, void* mean, void* rstd))
KILN_KERNEL(layer_norm_backward, (DType dt, int64_t rows, int64_t d, const void* x, const void* gamma, const void* mean,
                            const void* rstd, const void* gy, void* gx, void* ggamma, void* gbeta))
// Batch norm over NCHW viewed as [n, c, hw]. Training: batch statistics into mean/rstd (and the
// running buffers updated with momentum, unbiased variance); eval: running statistics. Then, where
// given, residual (x's layout) is added and, with relu, ReLU applied: y = relu(bn(x) + residual).
KILN_KERNEL(batch_norm_forward,
            (DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training, const void* x,
             const void* gamma, const void* beta, void* running_mean, void* running_var, void* y, void* mean,
             void* rstd, bool nhwc, const void* residual, bool relu))
// eps is the forward's (cuDNN asks for the same value in both passes); mean/rstd are the forward's outputs.
// nhwc (only where native_channels_last): x, y, gy and gx lie as [n, hw, c] in memory. y (non-null when
// the forward ended in ReLU: its output) masks gy first, gy' = y <= 0 ? 0 : gy, and gresidual (non-null
// when the forward added a residual that needs a gradient) receives gy'.
KILN_KERNEL(batch_norm_backward, (DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                                  const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx,
                                  void* ggamma, void* gbeta, bool nhwc, const void* y, void* gresidual))
// Cross-entropy of logits [rows, classes] against i64 targets, with ignore_index and label
// smoothing; writes per-row losses (0 for ignored rows) and, when grad_scale != 0, the gradient
// grad_scale * d loss_row / d logits into glogits.
KILN_KERNEL(cross_entropy, (DType dt, int64_t rows, int64_t classes, const void* logits, const int64_t* target,
                      int64_t ignore_index, double smoothing, void* loss, void* glogits, double grad_scale))
// Gather along the middle dim: dst[o, i, in] = src[o, idx[i], in] ([outer, n_src, inner] -> [outer, n_idx, inner]).
KILN_KERNEL(index_select, (DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                     const int64_t* idx, void* dst))
// The adjoint: dst[o, idx[i], in] += src[o, i, in], in a fixed order.
KILN_KERNEL(index_add, (DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx,
                  const int64_t* idx, const void* src))
// Elementwise along the middle dim with a full index tensor: gather dst[o,i,in] = src[o, idx[o,i,in], in];
// scatter: dst[o, idx[o,i,in], in] combined with src[o,i,in] by `op` (kernels/common/scatter.h), the
// writes to one element taken in index order (the last assign wins); without include_self the first
// write replaces dst; mean divides by the writes (+ 1 with include_self).
KILN_KERNEL(gather, (DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
               const int64_t* idx, void* dst))
KILN_KERNEL(scatter, (ScatterOp op, bool include_self, DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst,
                      int64_t n_idx, const int64_t* idx, const void* src))

// ---- mixed precision ----
// One pass over a contiguous floating buffer: x *= 1 / *scale, and *found_inf (an f32 flag) is set
// to 1 if any element is inf or NaN. scale and found_inf are in the backend's memory, so a GPU step
// never waits for the host.
KILN_KERNEL(unscale_check, (DType dt, int64_t n, void* x, const double* scale, float* found_inf))
// The end of a loss-scaling step on the scaler's device-resident state {scale, growth_tracker,
// skipped} (f64, kernels/common/amp_math.h), from this step's flag.
KILN_KERNEL(amp_update_scale, (double* state, const float* found_inf, double growth, double backoff, int64_t interval))

// ---- optimizers ----
// One fused step over `count` parameters of one group (multi-tensor: one pass over each weight,
// gradient and state; LAMB's per-tensor trust ratios never leave the device). The arithmetic is
// kernels/common/optim_math.h, the same as the unfused tensor ops.
KILN_KERNEL(optimizer_step, (OptimKind kind, const OptimSlice* slices, int64_t count, const OptimHyper& h))
