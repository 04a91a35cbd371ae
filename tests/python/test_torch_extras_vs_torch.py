# Small torch APIs ported research code uses, against PyTorch itself: Tensor.fill_diagonal_ (SimCLR's
# mask), clamp_min/clamp_max, the unary in-place methods (exp_, sqrt_, pow_, ...), kiln.clip, logaddexp,
# addmm, cdist (values and gradients), the adaptive 1-d pools and adaptive_max_pool2d (values, indices,
# gradients), get_rng_state/set_rng_state, kiln.device and kiln.cuda.is_available.
import importlib

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RNG = np.random.default_rng(11)


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def same(k, t, tol=1e-6):
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = np.asarray(k.detach().numpy()), t.detach().numpy()
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=tol, atol=tol, equal_nan=True), np.nanmax(np.abs(kn - tn))
    else:
        assert (kn == tn).all()


@pytest.mark.parametrize("shape,wrap", [((4, 4), False), ((7, 3), False), ((7, 3), True), ((3, 5), True),
                                        ((3, 3, 3), False), ((2, 6), False)])
def test_fill_diagonal_as_torch(shape, wrap):
    x = RNG.standard_normal(shape).astype(np.float32)
    k, t = both(x)
    assert k.fill_diagonal_(-np.inf, wrap) is k
    t.fill_diagonal_(-np.inf, wrap)
    same(k, t, 0)
    ki, ti = kiln.zeros(*shape, dtype=kiln.int64), torch.zeros(*shape, dtype=torch.int64)
    same(ki.fill_diagonal_(3, wrap), ti.fill_diagonal_(3, wrap))


def test_fill_diagonal_refusals():
    with pytest.raises(kiln.KilnValueError, match="fill_diagonal_: all dimensions of input must be of equal length"):
        kiln.zeros(2, 3, 3).fill_diagonal_(1.0)
    with pytest.raises(kiln.KilnValueError, match="fill_diagonal_: dimensions must be larger than 1"):
        kiln.zeros(3).fill_diagonal_(1.0)
    with pytest.raises(kiln.KilnError, match="fill_diagonal_: in-place update of a tensor that requires grad"):
        kiln.zeros(3, 3, requires_grad=True).fill_diagonal_(1.0)
    # the SimCLR idiom: the similarity matrix's diagonal masked out of a detached copy, or under no_grad
    sim = kiln.ones(3, 3, requires_grad=True) * 2
    with kiln.no_grad():
        masked = sim.detach().clone().fill_diagonal_(-1e9)
    assert masked.numpy().tolist() == [[-1e9, 2, 2], [2, -1e9, 2], [2, 2, -1e9]]


def test_clamp_min_max_and_clip_as_torch():
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    (k, t), (kg, tg) = both(x), both(x, True)
    same(kiln.clamp_min(k, 0.2), torch.clamp_min(t, 0.2))
    same(kiln.clamp_max(k, -0.1), torch.clamp_max(t, -0.1))
    same(k.clamp_min(0.0), t.clamp_min(0.0))
    same(k.clamp_max(0.3), t.clamp_max(0.3))
    same(kiln.clip(k, -0.5, 0.5), torch.clip(t, -0.5, 0.5))
    kc, tc = k.clone(), t.clone()
    kc.clamp_min_(0.1)
    tc.clamp_min_(0.1)
    same(kc, tc)
    kc.clamp_max_(0.4)
    tc.clamp_max_(0.4)
    same(kc, tc)
    g = RNG.standard_normal((4, 5)).astype(np.float32)
    kiln.clamp_min(kg, 0.1).backward(kiln.tensor(g))
    torch.clamp_min(tg, 0.1).backward(torch.tensor(g))
    same(kg.grad, tg.grad)


@pytest.mark.parametrize("name", ["exp_", "sqrt_", "log_", "abs_", "neg_", "sigmoid_", "tanh_", "sin_", "cos_",
                                  "rsqrt_", "reciprocal_", "log1p_", "expm1_", "floor_", "ceil_", "round_",
                                  "trunc_", "frac_", "sign_", "relu_", "erf_"])
def test_unary_in_place_as_torch(name):
    x = (RNG.standard_normal((3, 4)) * 2).astype(np.float32)
    if name in ("sqrt_", "log_", "rsqrt_"):
        x = np.abs(x) + 0.1
    k, t = both(x)
    assert getattr(k, name)() is k
    getattr(t, name)()
    same(k, t, 1e-6)


def test_pow_in_place_and_refusals_as_torch():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    (k, t), (e, te) = both(x), both(np.abs(x))
    k.pow_(2)
    t.pow_(2)
    same(k, t)
    e.pow_(k)
    te.pow_(t)
    same(e, te, 1e-5)
    # an integer tensor cannot hold exp's floats, as torch refuses
    with pytest.raises(kiln.KilnError, match="exp_: the result type float32 cannot be written into int64"):
        kiln.tensor([1, 2]).exp_()
    with pytest.raises(RuntimeError):
        torch.tensor([1, 2]).exp_()
    with pytest.raises(kiln.KilnError, match="sqrt_: in-place update of a tensor that requires grad"):
        kiln.ones(2, requires_grad=True).sqrt_()
    with kiln.no_grad():
        w = kiln.ones(2, requires_grad=True)
        w.mul_(4).sqrt_()
    assert w.detach().numpy().tolist() == [2.0, 2.0]


def test_logaddexp_values_and_gradients_as_torch():
    a = np.array([-np.inf, 1.0, np.inf, 3.0, -np.inf, 0.5, 2.0, -50.0], dtype=np.float64)
    b = np.array([-np.inf, 2.0, np.inf, -1e30, 0.0, 0.5, 90.0, 50.0], dtype=np.float64)
    (ka, ta), (kb, tb) = both(a), both(b)
    same(kiln.logaddexp(ka, kb), torch.logaddexp(ta, tb), 1e-12)
    same(ka.logaddexp(kb), ta.logaddexp(tb), 1e-12)
    x, y = RNG.standard_normal((3, 4)), RNG.standard_normal((4,))
    x[0, :] = y  # ties: half the gradient to each, as torch
    (kx, tx), (ky, ty) = both(x, True), both(y, True)
    g = RNG.standard_normal((3, 4))
    kiln.logaddexp(kx, ky).backward(kiln.tensor(g))
    torch.logaddexp(tx, ty).backward(torch.tensor(g))
    same(kx.grad, tx.grad, 1e-12)
    same(ky.grad, ty.grad, 1e-12)


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1)])
def test_addmm_as_torch(beta, alpha):
    i, m1, m2 = RNG.standard_normal((5,)), RNG.standard_normal((3, 4)), RNG.standard_normal((4, 5))
    if beta == 0:
        i[0] = np.nan  # ignored with beta=0, as torch
    (ki, ti), (k1, t1), (k2, t2) = both(i, True), both(m1, True), both(m2, True)
    k, t = kiln.addmm(ki, k1, k2, beta=beta, alpha=alpha), torch.addmm(ti, t1, t2, beta=beta, alpha=alpha)
    same(k, t, 1e-12)
    same(ki.addmm(k1, k2, beta=beta, alpha=alpha), ti.addmm(t1, t2, beta=beta, alpha=alpha), 1e-12)
    g = RNG.standard_normal((3, 5))
    k.backward(kiln.tensor(g))
    t.backward(torch.tensor(g))
    same(k1.grad, t1.grad, 1e-12)
    same(k2.grad, t2.grad, 1e-12)
    if beta != 0:
        same(ki.grad, ti.grad, 1e-12)
    with pytest.raises(kiln.KilnValueError, match="addmm: mat2 must be a 2-D matrix, got a 1-D tensor"):
        kiln.addmm(ki, k1, ki)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("shapes", [((5, 3), (4, 3)), ((2, 5, 3), (2, 4, 3)), ((2, 1, 6, 2), (3, 7, 2))])
def test_cdist_values_and_gradients_as_torch(p, shapes):
    x1, x2 = RNG.standard_normal(shapes[0]), RNG.standard_normal(shapes[1])
    if x1.ndim == x2.ndim:
        x2[..., 1, :] = x1[..., 2, :]  # a distance of 0: torch's gradient there is 0, not NaN
    (k1, t1), (k2, t2) = both(x1, True), both(x2, True)
    k, t = kiln.cdist(k1, k2, p), torch.cdist(t1, t2, p)
    same(k, t, 1e-10)
    g = RNG.standard_normal(tuple(t.shape))
    k.backward(kiln.tensor(g))
    t.backward(torch.tensor(g))
    same(k1.grad, t1.grad, 1e-10)
    same(k2.grad, t2.grad, 1e-10)


def test_cdist_refusals():
    with pytest.raises(kiln.KilnValueError, match="cdist: x1 and x2 must have the same number of columns"):
        kiln.cdist(kiln.zeros(3, 2), kiln.zeros(3, 4))
    with pytest.raises(kiln.KilnValueError, match="cdist: x2 must be at least 2-D"):
        kiln.cdist(kiln.zeros(3, 2), kiln.zeros(2))
    with pytest.raises(kiln.KilnValueError, match="cdist: p value for the p-norm distance must be >= 0"):
        kiln.cdist(kiln.zeros(3, 2), kiln.zeros(3, 2), -1.0)


@pytest.mark.parametrize("shape", [(2, 3, 10), (3, 7)])
@pytest.mark.parametrize("out", [1, 3, 4, 7])
def test_adaptive_pool1d_as_torch(shape, out):
    x = RNG.standard_normal(shape)
    (k, t) = both(x, True)
    g = RNG.standard_normal(shape[:-1] + (out,))
    ka, ta = F.adaptive_avg_pool1d(k, out), TF.adaptive_avg_pool1d(t, out)
    same(ka, ta, 1e-12)
    (km, ki), (tm, ti) = F.adaptive_max_pool1d(k, out, True), TF.adaptive_max_pool1d(t, out, True)
    same(km, tm, 0)
    same(ki, ti)
    (ka * 2 + km).backward(kiln.tensor(g))
    (ta * 2 + tm).backward(torch.tensor(g))
    same(k.grad, t.grad, 1e-12)
    same(kiln.nn.AdaptiveAvgPool1d(out)(k), torch.nn.AdaptiveAvgPool1d(out)(t), 1e-12)
    same(kiln.nn.AdaptiveMaxPool1d(out)(k), torch.nn.AdaptiveMaxPool1d(out)(t), 0)
    assert repr(kiln.nn.AdaptiveMaxPool1d(out)) == repr(torch.nn.AdaptiveMaxPool1d(out))


@pytest.mark.parametrize("out", [1, 3, (4, None), (2, 5), (7, 9)])
def test_adaptive_max_pool2d_as_torch(out):
    x = RNG.standard_normal((2, 3, 7, 9))
    (k, t) = both(x, True)
    (km, ki), (tm, ti) = F.adaptive_max_pool2d(k, out, True), TF.adaptive_max_pool2d(t, out, True)
    same(km, tm, 0)
    same(ki, ti)
    g = RNG.standard_normal(tuple(tm.shape))
    km.backward(kiln.tensor(g))
    tm.backward(torch.tensor(g))
    same(k.grad, t.grad, 1e-12)
    same(kiln.nn.AdaptiveMaxPool2d(out)(k[0]), torch.nn.AdaptiveMaxPool2d(out)(t[0]), 0)
    with pytest.raises(kiln.KilnValueError, match=r"adaptive_max_pool2d: expected a 3-D or 4-D input"):
        F.adaptive_max_pool2d(k[0, 0], 2)


def test_rng_state_restores_the_next_draws():
    kiln.manual_seed(3)
    kiln.randn(7)
    state = kiln.get_rng_state()
    assert state.dtype == kiln.uint8 and list(state.shape) == [16]
    a, b = kiln.randn(5), kiln.rand(3)
    kiln.randn(11)
    kiln.set_rng_state(state)
    assert kiln.randn(5).numpy().tolist() == a.numpy().tolist()
    assert kiln.rand(3).numpy().tolist() == b.numpy().tolist()
    with pytest.raises(kiln.KilnValueError, match="set_rng_state: new_state must be the uint8 tensor of 16 bytes"):
        kiln.set_rng_state(kiln.zeros(16))


def test_device_and_cuda_is_available_as_torch():
    for args in [("cpu",), ("cuda", 1), ("cuda:0",)]:
        d, td = kiln.device(*args), torch.device(*args)
        assert d.type == td.type and str(d) == str(td)
        assert isinstance(d, kiln.device) and isinstance(d, kiln.Device)
    assert kiln.device("cpu") == "cpu" and kiln.zeros(2).device == kiln.device("cpu")
    assert kiln.zeros(2, device=kiln.device("cpu")).device.type == "cpu"
    with pytest.raises(kiln.KilnValueError, match="must not include an index because index was passed"):
        kiln.device("cuda:0", 1)
    assert kiln.cuda.is_available() == (kiln._C.cuda_device_count() > 0)
    assert kiln.cuda.device_count() == kiln._C.cuda_device_count()


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_cdist_fractional_p_gradient_where_one_coordinate_agrees(p):
    # rows [1,2,3] and [1,4,1] agree in one coordinate: |d|^p's derivative is infinite there, torch's 0
    (k1, t1), (k2, t2) = both(np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]]), True), both(
        np.array([[1.0, 4.0, 1.0], [0.5, 0.5, 0.5]]), True)
    k, t = kiln.cdist(k1, k2, p), torch.cdist(t1, t2, p)
    same(k, t, 1e-10)
    k.sum().backward()
    t.sum().backward()
    assert not np.isnan(k1.grad.numpy()).any()
    same(k1.grad, t1.grad, 1e-10)
    same(k2.grad, t2.grad, 1e-10)


def test_cdist_inf_gradient_with_tied_coordinates_as_torch():
    # |d| = [0, 2, 2]: each tied maximum gets sign(d), not half of it
    (k1, t1), (k2, t2) = both(np.array([[1.0, 2.0, 3.0]]), True), both(np.array([[1.0, 4.0, 1.0]]), True)
    k, t = kiln.cdist(k1, k2, float("inf")), torch.cdist(t1, t2, float("inf"))
    same(k, t, 0)
    k.sum().backward()
    t.sum().backward()
    same(k1.grad, t1.grad, 0)
    same(k2.grad, t2.grad, 0)


@pytest.mark.parametrize("mode,rows", [("use_mm_for_euclid_dist_if_necessary", 40),
                                       ("use_mm_for_euclid_dist", 5),
                                       ("donot_use_mm_for_euclid_dist", 40)])
def test_cdist_euclid_matrix_product_form_as_torch(mode, rows):
    x1, x2 = RNG.standard_normal((2, rows, 6)), RNG.standard_normal((2, 30, 6))
    x2[:, 3] = x1[:, 1]  # a distance of 0: gradient 0 on both paths, as torch's
    (k1, t1), (k2, t2) = both(x1, True), both(x2, True)
    k, t = kiln.cdist(k1, k2, 2.0, mode), torch.cdist(t1, t2, 2.0, mode)
    same(k, t, 1e-6)
    g = RNG.standard_normal(tuple(t.shape))
    k.backward(kiln.tensor(g))
    t.backward(torch.tensor(g))
    same(k1.grad, t1.grad, 1e-6)
    same(k2.grad, t2.grad, 1e-6)


def test_cdist_euclid_large_takes_the_matrix_product_form():
    # Past 25 rows (torch's rule) the default is the matrix-product form, which needs only the result: 1024 x
    # 1024 x 128 f32 differences were 512 MiB (3.1 GB peak). Checked by its numbers, not its time: the default
    # equals the explicit matrix-product form bit for bit, and the difference form only to rounding.
    x1, x2 = RNG.standard_normal((300, 64)).astype(np.float32), RNG.standard_normal((200, 64)).astype(np.float32)
    (k1, t1), (k2, t2) = both(x1), both(x2)
    k = kiln.cdist(k1, k2)
    assert k.tolist() == kiln.cdist(k1, k2, compute_mode="use_mm_for_euclid_dist").tolist()
    assert k.tolist() != kiln.cdist(k1, k2, compute_mode="donot_use_mm_for_euclid_dist").tolist()
    same(k, torch.cdist(t1, t2), 1e-4)


def test_cdist_refuses_mixed_dtypes_as_torch():
    with pytest.raises(kiln.KilnValueError, match="cdist: x1 and x2 must have the same dtype, got float32 and "
                                                  "float64"):
        kiln.cdist(kiln.zeros(3, 2), kiln.zeros(3, 2, dtype=kiln.float64))
    with pytest.raises(RuntimeError):
        torch.cdist(torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.float64))


def test_addmm_input_must_broadcast_to_the_product_as_torch():
    with pytest.raises(RuntimeError):
        torch.addmm(torch.ones(3, 4), torch.ones(1, 2), torch.ones(2, 1))
    with pytest.raises(kiln.KilnValueError, match=r"addmm: input \[3, 4\] cannot be broadcast to the product's "
                                                  r"shape \[1, 1\]"):
        kiln.addmm(kiln.ones(3, 4), kiln.ones(1, 2), kiln.ones(2, 1))
    with pytest.raises(kiln.KilnValueError, match=r"addmm: input \[3, 4\] cannot be broadcast"):
        kiln.addmm(kiln.ones(3, 4), kiln.ones(1, 2), kiln.ones(2, 1), beta=0)


def test_addmm_beta_0_gives_input_a_zero_gradient_and_alpha_0_ignores_inf():
    i, m1, m2 = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 4)), RNG.standard_normal((4, 5))
    (ki, ti), (k1, t1), (k2, t2) = both(i, True), both(m1, True), both(m2, True)
    kiln.addmm(ki, k1, k2, beta=0).sum().backward()
    torch.addmm(ti, t1, t2, beta=0).sum().backward()
    assert ki.grad is not None
    same(ki.grad, ti.grad, 0)
    m1[0, 0] = np.inf
    (ki, ti), (k1, t1), (k2, t2) = both(i, True), both(m1, True), both(m2, True)
    k, t = kiln.addmm(ki, k1, k2, alpha=0), torch.addmm(ti, t1, t2, alpha=0)
    same(k, t, 0)
    assert not np.isnan(k.detach().numpy()).any()
    k.sum().backward()
    t.sum().backward()
    same(ki.grad, ti.grad, 0)
    same(k1.grad, t1.grad, 0)


def test_kiln_cuda_imports_and_synchronize_as_torch():
    mod = importlib.import_module("kiln.cuda")
    assert mod is kiln.cuda
    from kiln.cuda import is_available, device_count  # noqa: F401
    assert is_available() == (kiln._C.cuda_device_count() > 0)
    with pytest.raises(kiln.KilnValueError, match="cuda.synchronize: expected a CUDA device, got 'cpu'"):
        kiln.cuda.synchronize(kiln.device("cpu"))
    with pytest.raises(kiln.KilnValueError, match="cuda.synchronize: expected a CUDA device, got 'cpu'"):
        kiln.cuda.synchronize("cpu")
    with pytest.raises(TypeError, match=r"cuda\.synchronize\(\): argument 'device' must be"):
        kiln.cuda.synchronize(1.5)
    if kiln.cuda.is_available():
        kiln.cuda.synchronize("cuda:0")
        kiln.cuda.synchronize(kiln.device("cuda", 0))
        kiln.cuda.synchronize()


def test_device_ordinal_and_cpu_index_as_torch():
    for args in [(0,), (1,), ("cuda", 2)]:
        d, td = kiln.device(*args), torch.device(*args)
        assert (d.type, d.index, str(d)) == (td.type, td.index, str(td)), (args, d)
    # Kiln's devices always hold an index (docs/python.md): cpu:0 is "cpu", "cuda" is cuda:0
    d, td = kiln.device("cpu", 0), torch.device("cpu", 0)
    assert (d.type, d.index) == (td.type, td.index) and d == kiln.device("cpu")
    assert kiln.device("cuda").type == "cuda" and kiln.device("cuda").index == 0
    with pytest.raises(kiln.KilnValueError, match=r"device\(\): Kiln has one cpu device, index 0; got index 1"):
        kiln.device("cpu", 1)


def test_adaptive_max_pools_output_size_0_and_numpy_ints_as_torch():
    x = RNG.standard_normal((2, 3, 7, 9))
    (k, t) = both(x, True)
    for out in [0, (0, 3), (2, 0)]:
        (km, ki), (tm, ti) = F.adaptive_max_pool2d(k, out, True), TF.adaptive_max_pool2d(t, out, True)
        same(km, tm)
        same(ki, ti)
        assert ki.dtype == kiln.int64
    (km, ki), (tm, ti) = F.adaptive_max_pool1d(k[0], 0, True), TF.adaptive_max_pool1d(t[0], 0, True)
    same(km, tm)
    same(ki, ti)
    assert km.requires_grad == tm.requires_grad
    same(F.adaptive_max_pool1d(k[0], np.int64(4)), TF.adaptive_max_pool1d(t[0], np.int64(4)), 0)
    same(F.adaptive_max_pool2d(k, (np.int32(3), np.int64(2))), TF.adaptive_max_pool2d(t, (3, 2)), 0)


def test_clamp_min_and_max_in_place_refusals_name_themselves():
    k = kiln.ones(3, requires_grad=True)
    with pytest.raises(kiln.KilnError, match="clamp_min_"):
        k.clamp_min_(0.5)
    with pytest.raises(kiln.KilnError, match="clamp_max_"):
        k.clamp_max_(0.5)


def test_review_cases_of_cdist_addmm_and_clamp_as_torch():
    # cdist's matrix-product form (past 25 rows) made a NaN distance 0: NaN and inf propagate as torch's
    a, b = RNG.standard_normal((30, 3)), RNG.standard_normal((4, 3))
    a[0, 0], a[1, 1] = np.nan, np.inf
    (k1, t1), (k2, t2) = both(a), both(b)
    for mode in ("use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"):
        same(kiln.cdist(k1, k2, compute_mode=mode), torch.cdist(t1, t2, compute_mode=mode))
    # addmm of mixed dtypes is refused as torch's
    with pytest.raises(RuntimeError):
        torch.addmm(torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(kiln.KilnError, match="addmm: input, mat1 and mat2 must have the same dtype"):
        kiln.addmm(kiln.zeros(2, 2, dtype=kiln.float64), kiln.ones(2, 2), kiln.ones(2, 2))
    # clamp_min_/clamp_max_ castability refusals name themselves, a tensor bound by its type
    x = kiln.ones(3, dtype=kiln.int64)
    with pytest.raises(kiln.KilnError, match=r"^clamp_min_: .*out-of-place clamp_min "):
        x.clamp_min_(0.5)
    with pytest.raises(kiln.KilnError, match=r"^clamp_max_: .*a float32 tensor of shape \[\]"):
        x.clamp_max_(kiln.tensor(0.5))


@pytest.mark.parametrize("size", [0, (0, 3), (2, None), (np.int64(2), np.int32(3)), 3])
def test_adaptive_avg_pools_output_size_0_and_numpy_ints_as_torch(size):
    # as the max pools: a size of 0 gives torch's empty result (it was refused, the 1-d one naming the 2-d
    # pool), NumPy ints are sizes
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    (kx, tx) = both(x, True)
    k, t = F.adaptive_avg_pool2d(kx, size), torch.nn.functional.adaptive_avg_pool2d(tx, size)
    same(k, t)
    assert k.requires_grad
    assert tuple(kiln.nn.AdaptiveAvgPool2d(size)(kx).shape) == tuple(t.shape)
    y = both(x[0])
    n = size[0] if isinstance(size, tuple) else size
    same(F.adaptive_avg_pool1d(y[0], n), torch.nn.functional.adaptive_avg_pool1d(y[1], n))
