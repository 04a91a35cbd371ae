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


def test_streams_and_lifetimes_across_frameworks():
    # Export to a consumer on its own stream: that stream waits for Kiln's queued work (no host sync).
    k = kiln.randn(1024, 1024, device="cuda")
    expect = k.cpu().numpy() * 2
    y = k * 2  # queued on Kiln's stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        back = torch.from_dlpack(y)
        got = back.cpu().numpy()
    np.testing.assert_array_equal(got, expect)
    # Kiln keeps y's block from its own reuse until s has run what it queued; nothing else to see here
    # but that the memory stays consistent after both sides let go.
    del back, y
    z = k * 3
    np.testing.assert_allclose(z.cpu().numpy(), expect * 1.5, rtol=1e-6)
    # Import, then the lender drops its tensor while Kiln's work on the memory is still queued: the
    # memory goes back to PyTorch only once that work has run, so PyTorch's next tensor cannot overwrite it.
    tt = torch.full((4096, 1024), 2.0, device="cuda")
    imp = kiln.from_dlpack(tt)
    total = (imp * imp).sum()
    del imp, tt
    torch.full((4096, 1024), -1.0, device="cuda")
    assert total.item() == 4.0 * 4096 * 1024
    # A copy to the host on request (dl_device), and copy=True on the device.
    host = np.from_dlpack(k, device="cpu")
    np.testing.assert_array_equal(host, k.cpu().numpy())
    c = torch.from_dlpack(k.__dlpack__(copy=True))
    assert c.data_ptr() != k.data_ptr() and torch.equal(c.cpu(), torch.from_numpy(k.cpu().numpy()))


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
