// The kernels every backend implements, one declaration each, included inside namespace kiln::cpu
// (kernels/cpu/ops_cpu.h) and kiln::cuda (kernels/cuda/ops_cuda.h), so the two lists cannot drift.
// No include guard and no includes: the including header has kernels/backend.h.
void copy(const TensorDesc& dst, const TensorDesc& src);
void fill(const TensorDesc& dst, double value);
void arange(const TensorDesc& dst, double start, double step);
void unary(UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1);
void binary(BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha);
void where(const TensorDesc& dst, const TensorDesc& cond, const TensorDesc& a, const TensorDesc& b);
void reduce(ReduceOp op, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t outer, int64_t r,
            int64_t inner);
void random(RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1);

void conv2d_forward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* bias, void* y);
void conv2d_backward(DType dt, const Conv2dParams& p, const void* x, const void* w, const void* gy, void* gx, void* gw);
void max_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y, int64_t* idx);
void max_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, const int64_t* idx, void* gx);
void avg_pool2d_forward(DType dt, const Pool2dParams& p, const void* x, void* y);
void avg_pool2d_backward(DType dt, const Pool2dParams& p, const void* gy, void* gx);
void softmax_forward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* x, void* y);
void masked_softmax_forward(DType dt, int64_t rows, int64_t n, const void* x, double scale, const void* mask,
                            const MaskRows& mask_rows, void* y);
void masked_softmax_backward(DType dt, int64_t rows, int64_t n, const void* y, const void* gy, double scale, void* gx);
void softmax_backward(DType dt, bool log, int64_t outer, int64_t n, int64_t inner, const void* y, const void* gy,
                      void* gx);
void layer_norm_forward(DType dt, int64_t rows, int64_t d, double eps, const void* x, const void* gamma,
                        const void* beta, void* y, void* mean, void* rstd);
void layer_norm_backward(DType dt, int64_t rows, int64_t d, const void* x, const void* gamma, const void* mean,
                         const void* rstd, const void* gy, void* gx, void* ggamma, void* gbeta);
void batch_norm_forward(DType dt, int64_t n, int64_t c, int64_t hw, double eps, double momentum, bool training,
                        const void* x, const void* gamma, const void* beta, void* running_mean, void* running_var,
                        void* y, void* mean, void* rstd, bool nhwc);
void batch_norm_backward(DType dt, int64_t n, int64_t c, int64_t hw, bool training, double eps, const void* x,
                         const void* gamma, const void* mean, const void* rstd, const void* gy, void* gx, void* ggamma,
                         void* gbeta, bool nhwc);
void cross_entropy(DType dt, int64_t rows, int64_t classes, const void* logits, const int64_t* target,
                   int64_t ignore_index, double smoothing, void* loss, void* glogits, double grad_scale);
void index_select(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx,
                  const int64_t* idx, void* dst);
void index_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
               const void* src);
void gather(DType dt, int64_t outer, int64_t n_src, int64_t inner, const void* src, int64_t n_idx, const int64_t* idx,
            void* dst);
void unscale_check(DType dt, int64_t n, void* x, double inv_scale, float* found_inf);
void optimizer_step(OptimKind kind, const OptimSlice* slices, int64_t count, const OptimHyper& h);
void scatter_add(DType dt, int64_t outer, int64_t n_dst, int64_t inner, void* dst, int64_t n_idx, const int64_t* idx,
                 const void* src);
