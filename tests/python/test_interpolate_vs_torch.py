# F.interpolate / nn.Upsample against torch in every mode and rank torch has: nearest, nearest-exact
# and area on 3-, 4- and 5-d input, linear (3-d), bilinear and bicubic (4-d), trilinear (5-d); sizes
# and scale factors (a number or one per dim, whole and not, up and down), recompute_scale_factor and
# align_corners; values and gradients in float64, and torch's refusals.
import math

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
F = kiln.nn.functional
TF = torch.nn.functional

SHAPES = {3: (2, 3, 7), 4: (2, 2, 5, 6), 5: (1, 2, 4, 5, 3)}
LINEAR = {3: "linear", 4: "bilinear", 5: "trilinear"}


def run_both(shape, seed, **kw):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    kx, tx = kiln.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    ky, ty = F.interpolate(kx, **kw), TF.interpolate(tx, **kw)
    assert tuple(ky.shape) == tuple(ty.shape), kw
    np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=str(kw))
    w = rng.standard_normal(tuple(ty.shape))
    (ky * kiln.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    want = tx.grad.numpy()
    if kw.get("mode", "nearest") in ("nearest", "nearest-exact"):
        # the gradient of torch's forward: the weights summed into the pixels it picked. torch's own 1-d and
        # 3-d nearest backward copies a dim whose size does not change, where its forward resamples it by
        # the scale (3 -> 3 at 1.3 picks 0, 0, 1), so it is not its forward's gradient there
        src = TF.interpolate(torch.arange(float(a.size), dtype=torch.float64).reshape(shape), **kw).numpy()
        want = np.zeros(a.size)
        np.add.at(want, src.astype(np.int64).ravel(), w.ravel())
        want = want.reshape(shape)
    np.testing.assert_allclose(kx.grad.numpy(), want, rtol=1e-10, atol=1e-12, err_msg=str(kw))


def sizes(rank):
    n = rank - 2
    # up, down, mixed, the same size, and 1
    return [tuple([9, 11, 6][:n]), tuple([3, 2, 2][:n]), tuple([13, 3, 5][:n]), SHAPES[rank][2:], 1]


def scales(rank):
    n = rank - 2
    return [2, 1.5, 0.6, 2.7, tuple([1.7, 0.45, 3.0][:n]), tuple([1.0, 2.0, 0.8][:n]), 1.3]


@pytest.mark.parametrize("rank", [3, 4, 5])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "area", "linear", "bicubic"])
def test_modes_by_size(rank, mode):
    if mode == "linear":
        mode = LINEAR[rank]
    if mode == "bicubic" and rank != 4:
        pytest.skip("bicubic is 4-d only (refusal: test_refusals)")
    corners = [None] if mode in ("nearest", "nearest-exact", "area") else [False, True]
    for i, size in enumerate(sizes(rank)):
        for ac in corners:
            run_both(SHAPES[rank], i, size=size, mode=mode, align_corners=ac)


@pytest.mark.parametrize("rank", [3, 4, 5])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "area", "linear", "bicubic"])
def test_modes_by_scale(rank, mode):
    if mode == "linear":
        mode = LINEAR[rank]
    if mode == "bicubic" and rank != 4:
        pytest.skip("bicubic is 4-d only (refusal: test_refusals)")
    corners = [None] if mode in ("nearest", "nearest-exact", "area") else [False, True]
    for i, sf in enumerate(scales(rank)):
        for ac in corners:
            for rsf in (None, False, True):
                run_both(SHAPES[rank], 100 + i, scale_factor=sf, mode=mode, align_corners=ac,
                         recompute_scale_factor=rsf)


def test_nearest_exact_differs_from_nearest():
    # the case the two rules disagree on (torch's nearest-exact centres the source pixel)
    a = np.arange(5.0).reshape(1, 1, 5)
    k = F.interpolate(kiln.tensor(a), size=3, mode="nearest-exact").numpy()
    assert k.tolist() == TF.interpolate(torch.tensor(a), size=3, mode="nearest-exact").numpy().tolist()
    assert k.tolist() != F.interpolate(kiln.tensor(a), size=3, mode="nearest").numpy().tolist()


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_source_indices(mode):
    # torch's index rules exactly: the step in float (a double step picks another pixel at some sizes),
    # and its 2-d nearest kernel's own cases (a copy where out == in, dst / 2 where out == 2 in, whatever
    # the scale: 5 -> 10 at 2.1), which its 1-d and 3-d kernels do not have (3 -> 3 at 1.3)
    rng = np.random.default_rng(9)
    cases = [(3, dict(scale_factor=1.3)), (5, dict(scale_factor=2.1)), (4, dict(scale_factor=1.2))]
    for _ in range(150):
        n = int(rng.integers(1, 60))
        if rng.random() < 0.5:
            sf = float(rng.choice([0.3, 0.7, 1.1, 1.3, 2.1, 2.5, 1 / 3, 0.1 * int(rng.integers(1, 40))]))
            if math.floor(n * sf) >= 1:
                cases.append((n, dict(scale_factor=sf)))
        else:
            cases.append((n, dict(size=int(rng.integers(1, 120)))))
    for n, kw in cases:
        for rank in (3, 4, 5):
            shape = (1, 1, n) + (1,) * (rank - 3)
            kw_nd = {k: (v,) + (1.0 if k == "scale_factor" else 1,) * (rank - 3) for k, v in kw.items()}
            k = F.interpolate(kiln.arange(float(n)).reshape(*shape), mode=mode, **kw_nd)
            t = TF.interpolate(torch.arange(float(n)).reshape(shape), mode=mode, **kw_nd)
            assert k.numpy().ravel().tolist() == t.numpy().ravel().tolist(), (rank, n, kw)


def test_integer_nearest_and_module():
    a = np.arange(24).reshape(1, 2, 3, 4)
    for mode in ("nearest", "nearest-exact"):
        k = F.interpolate(kiln.tensor(a), scale_factor=1.7, mode=mode)
        t = TF.interpolate(torch.tensor(a, dtype=torch.float64), scale_factor=1.7, mode=mode)  # (torch: no int64)
        assert k.dtype == kiln.int64 and np.asarray(k.tolist()).tolist() == t.long().tolist()
    b = np.random.default_rng(3).standard_normal((1, 2, 3, 4, 5))
    up, tup = kiln.nn.Upsample(scale_factor=(2, 1.5, 0.5), mode="trilinear"), torch.nn.Upsample(
        scale_factor=(2, 1.5, 0.5), mode="trilinear")
    np.testing.assert_allclose(up(kiln.tensor(b)).numpy(), tup(torch.tensor(b)).numpy(), rtol=1e-12)
    c = np.random.default_rng(4).standard_normal((2, 3, 8))
    np.testing.assert_allclose(F.upsample(kiln.tensor(c), size=5, mode="linear").numpy(),
                               TF.interpolate(torch.tensor(c), size=5, mode="linear").numpy(), rtol=1e-12)


def test_float32_area_and_antialias_false():
    a = np.random.default_rng(5).standard_normal((2, 3, 9, 7)).astype(np.float32)
    k = F.interpolate(kiln.tensor(a), size=(4, 3), mode="area", antialias=False)
    t = TF.interpolate(torch.tensor(a), size=(4, 3), mode="area", antialias=False)
    assert k.dtype == kiln.float32
    np.testing.assert_allclose(k.numpy(), t.numpy(), rtol=1e-5, atol=1e-6)


def refused(kind, match, *args, **kw):
    with pytest.raises(kind, match=match):
        F.interpolate(*args, **kw)


def test_refusals():
    x3, x4, x5 = (kiln.zeros(*SHAPES[r]) for r in (3, 4, 5))
    # torch: align_corners (even False) only with the interpolating modes
    for mode in ("nearest", "nearest-exact", "area"):
        refused(ValueError, "align_corners", x4, size=3, mode=mode, align_corners=False)
    # the rank each mode needs: a NotImplementedError, as torch's
    for (x, mode, match) in ((x4, "linear", "linear needs 3-d"), (x3, "bilinear", "bilinear needs 4-d"),
                             (x5, "bicubic", "bicubic needs 4-d"), (x4, "trilinear", "trilinear needs 5-d"),
                             (kiln.zeros(2, 3), "nearest", "3-d, 4-d or 5-d"),
                             (kiln.zeros(1, 1, 2, 2, 2, 2), "area", "3-d, 4-d or 5-d")):
        refused(NotImplementedError, match, x, size=3, mode=mode)
        with pytest.raises(NotImplementedError):
            TF.interpolate(torch.zeros(*x.shape), size=3, mode=mode)
    # sizes and scales: one per spatial dim
    refused(ValueError, "size has 2 values for the 3 spatial dims", x5, size=(2, 3))
    refused(ValueError, "scale_factor has 3 values for the 1 spatial dims", x3, scale_factor=(2, 2, 2))
    refused(ValueError, "only one of size or scale_factor", x3, size=2, scale_factor=2)
    refused(ValueError, "give size or scale_factor", x3)
    refused(ValueError, "recompute_scale_factor is not meaningful", x3, size=4, recompute_scale_factor=True)
    refused(kiln.KilnError, "scale factors must be finite and > 0", x4, scale_factor=(2, -1))
    refused(ValueError, "mode must be nearest, linear", x4, size=3, mode="cubic")
    refused(kiln.KilnError, "needs a floating tensor", kiln.zeros(1, 1, 4, dtype=kiln.int64), size=3, mode="area")
    # antialias: torch's rule for where it applies, and Kiln does not implement it
    refused(ValueError, "restricted to bilinear and bicubic", x3, size=3, mode="linear", antialias=True)
    refused(ValueError, "antialias=True is not implemented", x4, size=3, mode="bilinear", antialias=True)


def test_numpy_scalars():
    # a NumPy integer size and a NumPy float scale factor, alone or in a tuple, as torch takes them
    a = np.random.default_rng(6).standard_normal((1, 2, 8, 6))
    for kw in (dict(size=np.int64(3)), dict(size=(np.int32(3), np.int64(5))), dict(scale_factor=np.float32(0.5)),
               dict(scale_factor=(np.float32(1.5), np.float64(0.5))), dict(scale_factor=np.int64(2))):
        k = F.interpolate(kiln.tensor(a), mode="bilinear", **kw)
        t = TF.interpolate(torch.tensor(a), mode="bilinear", **kw)
        np.testing.assert_allclose(k.numpy(), t.numpy(), rtol=1e-12, err_msg=str(kw))
    refused(TypeError, "size: expected an int", kiln.tensor(a), size=3.0)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "area", "linear", "bicubic"])
@pytest.mark.parametrize("rank", [3, 4, 5])
def test_same_size_is_a_new_tensor(mode, rank):
    # as torch's: the result of a resize that changes nothing is a copy, not the input's storage
    if mode == "linear":
        mode = LINEAR[rank]
    if mode == "bicubic" and rank != 4:
        return
    a = np.random.default_rng(8).standard_normal(SHAPES[rank])
    x = kiln.tensor(a)
    y = F.interpolate(x, size=tuple(x.shape[2:]), mode=mode)
    y.add_(1)
    np.testing.assert_array_equal(x.numpy(), a)
    # with a leaf that requires grad: the copy is recorded for autograd (not the leaf itself), and the
    # gradient reaches x
    xg = kiln.tensor(a, requires_grad=True)
    yg = F.interpolate(xg, scale_factor=1, mode=mode)
    assert yg is not xg and not yg.is_leaf and yg.grad_fn is not None
    (yg * 2).sum().backward()
    np.testing.assert_array_equal(xg.grad.numpy(), np.full(a.shape, 2.0))


def test_area_matches_torch_at_large_sizes():
    # 1-d 8000 -> 4000 and 3000 -> 7 (uneven windows), 2-d 600 x 500 -> 7 x 9, in float64
    rng = np.random.default_rng(9)
    for shape, size in (((2, 3, 8000), 4000), ((1, 2, 3000), 7), ((1, 2, 600, 500), (7, 9))):
        a = rng.standard_normal(shape)
        kx, tx = kiln.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        ky, ty = F.interpolate(kx, size=size, mode="area"), TF.interpolate(tx, size=size, mode="area")
        np.testing.assert_allclose(ky.detach().numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-14)
        w = rng.standard_normal(tuple(ty.shape))
        (ky * kiln.tensor(w)).sum().backward()
        (ty * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(kx.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_area_memory_is_linear_in_the_input():
    # 1-d 12000 -> 6000 in float64: the input and output are 0.15 MB; a dense [in, out] matrix would be
    # 576 MB (twice that while it is copied into a tensor). Peak RSS in a fresh process, after a warm-up.
    import subprocess
    import sys
    code = (
        "import resource, numpy as np, kiln\n"
        "F = kiln.nn.functional\n"
        "F.interpolate(kiln.tensor(np.ones((1, 1, 40))), size=20, mode='area')\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "x = kiln.tensor(np.random.default_rng(0).standard_normal((1, 1, 12000)))\n"
        "y = F.interpolate(x, size=6000, mode='area')\n"
        "assert tuple(y.shape) == (1, 1, 6000)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grew_mb = int(out.stdout.split()[-1])
    assert grew_mb < 100, f"area interpolation of 12000 -> 6000 values grew the peak RSS by {grew_mb} MB"


def test_area_under_autocast_keeps_the_dtype():
    a = np.random.default_rng(10).standard_normal((2, 3, 50)).astype(np.float32)
    with kiln.amp.autocast("cpu", dtype=kiln.bfloat16):
        y = F.interpolate(kiln.tensor(a), size=20, mode="area")
    assert y.dtype == kiln.float32
    np.testing.assert_allclose(y.numpy(), TF.interpolate(torch.tensor(a), size=20, mode="area").numpy(), rtol=1e-5,
                               atol=1e-6)
