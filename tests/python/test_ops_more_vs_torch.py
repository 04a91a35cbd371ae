# More of torch's tensor API against PyTorch itself: advanced indexing with several index tensors
# (values, gradients, assignment), and the functions and methods ported scripts use (bmm, index_add,
# bincount, lerp_, the dtype= reductions, ...). Random ops are checked statistically with a fixed
# seed, not for torch's exact numbers.
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)


def both(a, grad=False):
    return kiln.tensor(a, requires_grad=grad), torch.tensor(a, requires_grad=grad)


def same(k, t, tol=1e-10):
    assert tuple(k.shape) == tuple(t.shape), (tuple(k.shape), tuple(t.shape))
    kn, tn = np.asarray(k.detach().tolist()), t.detach().numpy()
    if t.dtype.is_floating_point:
        assert np.allclose(kn, tn, rtol=tol, atol=tol), np.abs(kn - tn).max()
    else:
        assert (kn == tn).all()


# ---- advanced indexing with several index tensors ----

def ix(a):
    return kiln.tensor(a), torch.tensor(a)


INDEX_CASES = [
    # (shape of x, a function of (module, i, j, m) building the key)
    ((4, 5), lambda i, j, m: (i, j)),                              # x[arange, y]
    ((4, 5, 3), lambda i, j, m: (i, j)),                           # trailing dim kept
    ((3, 4, 5, 6), lambda i, j, m: (slice(None), i, j)),           # adjacent, in place
    ((3, 4, 5, 6), lambda i, j, m: (slice(None), i, slice(None), j)),  # apart: index dims first
    ((3, 4, 5, 6), lambda i, j, m: (i, 0, j)),                     # an int between: adjacent after select
    ((3, 4, 5, 6), lambda i, j, m: (slice(None), i, None, j)),     # None between: apart
    ((4, 5, 6), lambda i, j, m: (i[:, None], j[None, :])),         # broadcast to a grid
    ((4, 5, 6), lambda i, j, m: (Ellipsis, i, j)),
    ((4, 5, 6), lambda i, j, m: (m, j[:2])),                       # a mask with an integer index
    ((4, 5, 6), lambda i, j, m: (i, slice(1, 4), j)),
]


@pytest.mark.parametrize("case", range(len(INDEX_CASES)))
def test_several_index_tensors_read_and_gradient(case):
    shape, key = INDEX_CASES[case]
    a = RNG.standard_normal(shape)
    i = np.array([0, 2, -1, 2])  # a repeated index: the gradient accumulates there
    j = np.array([1, 4, 0, 1]) % shape[-1]
    m = np.array([True, False, True, False])
    kx, tx = both(a, grad=True)
    kk = key(kiln.tensor(i), kiln.tensor(j), kiln.tensor(m))
    tk = key(torch.tensor(i), torch.tensor(j), torch.tensor(m))
    ky, ty = kx[kk], tx[tk]
    same(ky, ty)
    w = RNG.standard_normal(tuple(ty.shape))
    (ky * kiln.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    same(kx.grad, tx.grad)


@pytest.mark.parametrize("case", range(len(INDEX_CASES)))
def test_several_index_tensors_assignment(case):
    shape, key = INDEX_CASES[case]
    a = RNG.standard_normal(shape)
    i = np.array([0, 2, -1, 1])
    j = np.array([1, 4, 0, 2]) % shape[-1]
    m = np.array([True, False, True, False])
    kx, tx = both(a)
    kk = key(kiln.tensor(i), kiln.tensor(j), kiln.tensor(m))
    tk = key(torch.tensor(i), torch.tensor(j), torch.tensor(m))
    v = RNG.standard_normal(tuple(tx[tk].shape))
    kx[kk] = kiln.tensor(v)
    tx[tk] = torch.tensor(v)
    same(kx, tx)
    kx[kk] = 7.0
    tx[tk] = 7.0
    same(kx, tx)
    if tx[tk].dim() >= 1:  # a value broadcast along the last dim
        v1 = RNG.standard_normal(tuple(tx[tk].shape)[-1:])
        kx[kk] = kiln.tensor(v1)
        tx[tk] = torch.tensor(v1)
        same(kx, tx)


def test_cross_entropy_style_pick():
    logp = RNG.standard_normal((6, 10))
    y = np.array([3, 3, 0, 9, 1, 3])
    kx, tx = both(logp, grad=True)
    kl = -kx[kiln.arange(6), kiln.tensor(y)].mean()
    tl = -tx[torch.arange(6), torch.tensor(y)].mean()
    same(kl, tl)
    kl.backward()
    tl.backward()
    same(kx.grad, tx.grad)


def test_several_index_tensors_errors_as_torch():
    kx, tx = both(RNG.standard_normal((3, 4)))
    for key in [([0, 1, 2], [0, 1]), ([0, 1], [0, 7]), ([0, -4], [0, 1])]:
        with pytest.raises(IndexError) as te:
            tx[torch.tensor(key[0]), torch.tensor(key[1])]
        with pytest.raises(IndexError) as ke:
            kx[kiln.tensor(key[0]), kiln.tensor(key[1])]
        assert str(ke.value) == str(te.value)
