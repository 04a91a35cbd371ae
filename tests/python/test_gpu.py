# On a GPU (scripts/gpu-check runs these; elsewhere they skip): CUDA tensors cross between PyTorch
# and Kiln without copies and in stream order, Kiln's kernels run on them, and a model trains on the
# device from Python as on the CPU.
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (kiln.cuda_is_available() and torch.cuda.is_available()),
                                reason="needs a CUDA device visible to Kiln and to PyTorch")


def test_torch_cuda_round_trip_without_copies():
    tt = torch.arange(12.0, device="cuda").reshape(3, 4)
    tt.mul_(3)  # pending on torch's stream: from_dlpack orders it before Kiln's kernels
    k = kiln.from_dlpack(tt)
    assert str(k.device) == "cuda:0" and k.data_ptr() == tt.data_ptr()
    y = (k * 2).sum(dim=1)
    back = torch.from_dlpack(y)
    assert back.device.type == "cuda" and back.data_ptr() == y.data_ptr()
    assert back.tolist() == (tt * 2).sum(1).tolist()
    for dt in (torch.float16, torch.bfloat16, torch.int64, torch.bool):
        src = (torch.arange(6, device="cuda") % 2).to(dt)
        assert torch.equal(torch.from_dlpack(kiln.from_dlpack(src)), src)


def keep_kiln_busy():
    """Queues ~0.1 s of matmuls on Kiln's stream (the host returns at once), so that what is queued
    next runs late: a consumer that does not wait for it, or memory given back too early, shows."""
    big = kiln.randn(4096, 4096, device="cuda")
    for _ in range(40):
        big = (big @ big) * 1e-3
    return big


def test_consumer_stream_waits_for_kiln():
    k = kiln.randn(1024, 1024, device="cuda")
    expect = k.cpu().numpy() * 2 + 7
    busy = keep_kiln_busy()
    y = k * 2 + 7  # queued behind the matmuls
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = torch.from_dlpack(y).clone()  # on s, which must wait for Kiln's queued work
    torch.cuda.synchronize()
    np.testing.assert_array_equal(got.cpu().numpy(), expect)
    del busy


def test_kiln_does_not_reuse_memory_a_consumer_stream_still_reads():
    k = kiln.randn(2048, 1024, device="cuda")
    expect = k.cpu().numpy() + 1
    y = k + 1
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        back = torch.from_dlpack(y)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of s's time before it reads y
        got = back.clone()
    del back, y  # Kiln's block goes back while s's read is still queued
    z = k * 0 - 5  # the same size: must not get y's block until s has read it
    torch.cuda.synchronize()
    np.testing.assert_array_equal(got.cpu().numpy(), expect)
    assert float(z.cpu().numpy()[0, 0]) == -5.0


def test_lent_memory_goes_back_after_kilns_work():
    busy = keep_kiln_busy()
    tt = torch.full((4096, 1024), 2.0, device="cuda")
    held = torch.cuda.memory_allocated()
    imp = kiln.from_dlpack(tt)
    total = (imp * imp).sum()  # queued behind the matmuls
    del imp, tt  # PyTorch's block: back to PyTorch only once that work has run
    assert torch.cuda.memory_allocated() == held  # Kiln's queue is still busy: still lent
    torch.full((4096, 1024), 3.0, device="cuda")  # on PyTorch's idle stream
    assert total.item() == 4.0 * 4096 * 1024
    # The read waited for Kiln's work, and so gave the lent block back (to PyTorch's cache).
    assert torch.cuda.memory_allocated() == held - 4096 * 1024 * 4
    del busy


def test_copies_on_request():
    k = kiln.randn(64, 32, device="cuda")
    host = np.from_dlpack(k, device="cpu")  # dl_device: a copy to the host
    np.testing.assert_array_equal(host, k.cpu().numpy())
    c = torch.from_dlpack(k.__dlpack__(copy=True))
    assert c.data_ptr() != k.data_ptr() and np.array_equal(c.cpu().numpy(), k.cpu().numpy())


def test_ops_and_autograd_on_the_device():
    x = kiln.randn(64, 32, device="cuda", requires_grad=True)
    w = kiln.randn(32, 16, device="cuda", requires_grad=True)
    loss = kiln.nn.functional.gelu(x @ w).pow(2).mean()
    loss.backward()
    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    kiln.nn.functional.gelu(xc @ wc).pow(2).mean().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy(), xc.grad.numpy(), rtol=1e-3, atol=1e-5)
    with kiln.amp.autocast(kiln.bfloat16):
        assert (x @ w).dtype == kiln.bfloat16


def test_model_steps_on_gpu_follow_the_cpu():
    losses = {}
    for device in ("cpu", "cuda"):
        kiln.manual_seed(4)
        model = kiln.models.create("resnet20", set={"in_channels": 1, "num_classes": 10}).to(device)
        opt = kiln.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = kiln.randn(16, 1, 28, 28).to(device)
        y = kiln.randint(0, 10, (16,)).to(device)
        losses[device] = []
        for _ in range(3):
            loss = kiln.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[device].append(loss.item())
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=2e-3)
