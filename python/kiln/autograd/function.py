"""kiln.autograd.function: where torch keeps Function, FunctionCtx and once_differentiable
(`from torch.autograd.function import once_differentiable`)."""
from . import Function, FunctionCtx, once_differentiable

__all__ = ["Function", "FunctionCtx", "once_differentiable"]
