# Python objects the engine holds (a post-accumulate-grad hook, an autograd.Function's backward
# closure) form reference cycles through C++ that Python's GC cannot see; kiln lets go of them at
# exit, so a script ends without nanobind's "leaked instances" report.
import pytest


LEAK_SCRIPTS = {
    "hook": """
import kiln
w = kiln.randn(3, requires_grad=True)
w.register_post_accumulate_grad_hook(lambda p: None)
(w * 2).sum().backward()
""",
    "function graph": """
import kiln
class Sq(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g
x = kiln.randn(3, requires_grad=True)
y = Sq.apply(x)
""",
}


@pytest.mark.parametrize("name", sorted(LEAK_SCRIPTS))
def test_no_leaked_instances_at_exit(name):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", LEAK_SCRIPTS[name]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "leaked" not in r.stderr, r.stderr
