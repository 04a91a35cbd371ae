# The same training step as `kiln bench train --model resnet20` in PyTorch CPU eager mode (ResNet-20 with
# projection shortcuts as Kiln builds it, SGD + Nesterov momentum, synthetic batch), the peer of
# bench/train_vs_torch.py. Needs torch (PyPI).
# Usage: python3 bench/peer/torch_resnet20.py [--threads 2] [--batch 128] [--in-channels 3] [--image-size 32]
#        [--steps 30] [--warmup 3]; the last line printed is JSON.
import argparse, json, statistics, time, torch, torch.nn as nn, torch.nn.functional as F
ap = argparse.ArgumentParser()
for name, default in [("threads", 2), ("batch", 128), ("in-channels", 3), ("image-size", 32), ("steps", 30), ("warmup", 3)]:
    ap.add_argument("--" + name, type=int, default=default)
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
class Block(nn.Module):
    def __init__(s, i, o, st):
        super().__init__()
        s.c1 = nn.Conv2d(i, o, 3, st, 1, bias=False); s.b1 = nn.BatchNorm2d(o)
        s.c2 = nn.Conv2d(o, o, 3, 1, 1, bias=False); s.b2 = nn.BatchNorm2d(o)
        s.ds = None
        if st != 1 or i != o: s.ds = nn.Sequential(nn.Conv2d(i, o, 1, st, bias=False), nn.BatchNorm2d(o))
    def forward(s, x):
        out = F.relu(s.b1(s.c1(x)))
        out = s.b2(s.c2(out))
        return F.relu(out + (s.ds(x) if s.ds is not None else x))
class ResNet20(nn.Module):
    def __init__(s, cin, n=3):
        super().__init__()
        s.conv = nn.Conv2d(cin, 16, 3, 1, 1, bias=False); s.bn = nn.BatchNorm2d(16)
        layers = []; i = 16
        for o, st in [(16, 1), (32, 2), (64, 2)]:
            for b in range(n):
                layers.append(Block(i, o, st if b == 0 else 1)); i = o
        s.layers = nn.Sequential(*layers); s.fc = nn.Linear(64, 10)
    def forward(s, x):
        x = F.relu(s.bn(s.conv(x))); x = s.layers(x)
        return s.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))
m = ResNet20(a.in_channels).train()
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
x = torch.randn(a.batch, a.in_channels, a.image_size, a.image_size); y = torch.randint(0, 10, (a.batch,))
ms = []
for i in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    loss = F.cross_entropy(m(x), y); opt.zero_grad(); loss.backward(); opt.step()
    t = (time.perf_counter() - t0) * 1e3
    if i >= a.warmup: ms.append(t)
ms.sort()
print(json.dumps({"peer": "torch " + torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "threads": a.threads, "median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1]}))
