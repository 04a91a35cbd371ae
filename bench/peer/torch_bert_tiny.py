# PyTorch CPU eager BERT-tiny masked-LM step (as `kiln bench train --model bert-tiny`): batch 32 x 128,
# 15% of positions through the tied-vocabulary MLM head, AdamW, dropout 0.1.
# The peer of bench/train_vs_torch.py. Needs torch (PyPI).
# Usage: python3 bench/peer/torch_bert_tiny.py [--threads 2] [--batch 32] [--seq-len 128] [--steps 20]
#        [--warmup 3]; the last line printed is JSON.
import argparse, json, statistics, time, math, torch, torch.nn as nn, torch.nn.functional as F
ap = argparse.ArgumentParser()
for name, default in [("threads", 2), ("batch", 32), ("seq-len", 128), ("steps", 20), ("warmup", 3)]:
    ap.add_argument("--" + name, type=int, default=default)
a = ap.parse_args()
torch.set_num_threads(a.threads); torch.manual_seed(0)
V, H, L, NH, I, B, S = 30522, 128, 2, 2, 512, a.batch, a.seq_len
class Layer(nn.Module):
    def __init__(s):
        super().__init__(); s.qkv = nn.Linear(H, 3 * H); s.o = nn.Linear(H, H); s.ln1 = nn.LayerNorm(H, eps=1e-12)
        s.f1 = nn.Linear(H, I); s.f2 = nn.Linear(I, H); s.ln2 = nn.LayerNorm(H, eps=1e-12)
    def forward(s, x, mask):
        b, t, _ = x.shape
        q, k, v = s.qkv(x).view(b, t, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-1, -2)) / math.sqrt(H // NH) + mask
        a = F.dropout(a.softmax(-1), 0.1, True)
        c = (a @ v).transpose(1, 2).reshape(b, t, H)
        x = s.ln1(x + F.dropout(s.o(c), 0.1, True))
        return s.ln2(x + F.dropout(s.f2(F.gelu(s.f1(x))), 0.1, True))
class Bert(nn.Module):
    def __init__(s):
        super().__init__(); s.tok = nn.Embedding(V, H); s.pos = nn.Embedding(512, H); s.typ = nn.Embedding(2, H)
        s.ln = nn.LayerNorm(H, eps=1e-12); s.layers = nn.ModuleList([Layer() for _ in range(L)])
        s.tr = nn.Linear(H, H); s.tln = nn.LayerNorm(H, eps=1e-12); s.bias = nn.Parameter(torch.zeros(V))
    def forward(s, ids, positions, attn):
        b, t = ids.shape
        x = s.tok(ids) + s.pos(torch.arange(t))[None] + s.typ(torch.zeros_like(ids))
        x = F.dropout(s.ln(x), 0.1, True)
        mask = (1.0 - attn[:, None, None, :].float()) * -1e4
        for l in s.layers: x = l(x, mask)
        h = x.reshape(b * t, H)[positions]
        h = s.tln(F.gelu(s.tr(h)))
        return h @ s.tok.weight.t() + s.bias
m = Bert().train(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
ids = torch.randint(0, V, (B, S)); sel = torch.rand(B * S) < 0.15
positions = sel.nonzero().flatten(); target = ids.flatten()[positions]; attn = torch.ones(B, S, dtype=torch.long)
ms = []
for i in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    loss = F.cross_entropy(m(ids, positions, attn), target); opt.zero_grad(); loss.backward(); opt.step()
    if i >= a.warmup: ms.append((time.perf_counter() - t0) * 1e3)
ms.sort()
print(json.dumps({"peer": "torch " + torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "threads": a.threads, "median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1]}))
