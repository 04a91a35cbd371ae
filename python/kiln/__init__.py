"""Kiln from Python: tensors, ops and autograd over Kiln's C++ engine (CPU, and CUDA where built).

    import kiln
    x = kiln.randn(4, 3, requires_grad=True)
    y = (x @ x.T).relu().sum()
    y.backward()
    x.grad.numpy()

NumPy and PyTorch tensors move in and out without copies: kiln.from_numpy(a), t.numpy(),
kiln.from_dlpack(torch_tensor), torch.from_dlpack(t). Errors raised by the engine are
kiln.KilnError (a RuntimeError); bad arguments raise kiln.KilnValueError (also a ValueError),
bad indices kiln.KilnIndexError (also an IndexError) and a missing file kiln.KilnFileNotFoundError
(also a FileNotFoundError).
"""
from . import _build


def _preload_cuda_libraries():
    """With CUDA compiled in, libkiln needs cudart, cuBLASLt, cuDNN and NCCL. Where pip's NVIDIA
    wheels are installed (PyTorch brings them), load those first, globally, as PyTorch does: one
    copy of each library serves both, whichever of kiln and torch is imported first (a process
    holds one library per soname, and the older system copy would lack what torch needs).
    KILN_NO_CUDA_PRELOAD=1 turns this off."""
    import ctypes
    import glob
    import importlib.util
    import os

    if not _build.cuda or os.environ.get("KILN_NO_CUDA_PRELOAD") == "1":
        return
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations:
        return
    # Only wheels of the CUDA major Kiln was built with: PyTorch's for another one bring a cuDNN and an
    # NCCL built against that runtime, which loaded globally would serve Kiln wrongly and get in
    # PyTorch's way; then the system's libraries serve Kiln.
    major = getattr(_build, "cuda_major", 13)
    names = [f"libcudart.so.{major}", f"libcublasLt.so.{major}", "libcudnn.so.9", "libnccl.so.2"]

    def find(name):
        for base in spec.submodule_search_locations:
            found = sorted(glob.glob(os.path.join(base, "*", "lib", name)))
            if found:
                return found[0]
        return None

    if find(names[0]) is None:
        return
    for name in names:
        path = find(name)
        if path:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


_preload_cuda_libraries()

from . import _C  # noqa: E402
from ._C import *  # noqa: F401,F403  (the engine's functions: zeros, matmul, sum, ...)
from ._C import Tensor, Device, dtype, KilnError, KilnValueError, KilnIndexError
from . import _tensor
from ._tensor import tensor, no_grad, enable_grad, set_grad_enabled, is_grad_enabled
from ._tensor import inference_mode, is_inference_mode_enabled  # noqa: E402
globals().update(_tensor._EXPORTS)  # torch's signatures over the engine's ops: sum(dtype=), split(sizes), bmm, ...
from . import _memory_format, _views  # noqa: E402
from ._memory_format import memory_format, contiguous_format, channels_last, preserve_format  # noqa: E402
from ._memory_format import (clone, empty_like, zeros_like, ones_like, full_like, rand_like,  # noqa: E402,F811
                             randn_like)
globals().update(_views._EXPORTS)  # tensor_split, swapaxes, swapdims, index_copy
from ._extras import (clip, clamp_min, clamp_max, logaddexp, addmm, cdist, get_rng_state,  # noqa: E402,F401
                      set_rng_state, device, cuda)
from . import _math  # noqa: E402
globals().update({name: getattr(_math, name) for name in _math.__all__})  # add(3, t), quantile, special, linalg
from . import _torch_more  # noqa: E402
globals().update({name: getattr(_torch_more, name) for name in _torch_more.__all__  # aliases, in-place forms, ...
                  if name not in globals()})
bernoulli = _torch_more.bernoulli  # torch's bernoulli(input, p=None) beside the engine's bernoulli(size, p)
from . import _linalg_lu  # noqa: E402
globals().update(_linalg_lu._EXPORTS)  # det, logdet, slogdet, inverse, cholesky, cholesky_solve, ... (kiln.linalg too)
from . import _linalg_spectral  # noqa: E402  (eigh, svd, qr, pinv, lstsq ... on kiln.linalg)
_linalg_spectral._install(_math.linalg)
globals().update({name: getattr(_linalg_spectral, name) for name in _linalg_spectral.__all__})  # svd, qr, pinverse
from . import autograd
from ._train import train, report
from . import nn
from . import optim, amp, models, data  # noqa: E402
from . import distributions  # noqa: E402  (torch.distributions' everyday subset)
from . import utils  # noqa: E402  (kiln.utils.data: torch.utils.data's import path over kiln.data)
from .amp import autocast  # noqa: E402,F811  (kiln.autocast is kiln.amp.autocast: a decorator too)

float32 = dtype.float32
float16 = dtype.float16
bfloat16 = dtype.bfloat16
float64 = dtype.float64
int32 = dtype.int32
int64 = dtype.int64
int16 = dtype.int16
int8 = dtype.int8
uint8 = dtype.uint8
bool = dtype.bool  # noqa: A001  (as torch.bool)
float = float32  # noqa: A001
half = float16
double = float64
long = int64
int = int32  # noqa: A001
short = int16

# numpy-style aliases
std = _C.std
__version__ = "0.1.0"


def save(tensors, f, metadata=None):
    """Writes a dict of tensors (or a module's state_dict) as safetensors: to a path atomically, or
    to a binary file object."""
    if hasattr(tensors, "state_dict"):
        # A kiln.models BERT's tied decoder is its word embeddings: written once (Hugging Face's
        # save_pretrained leaves it out too); load_state_dict and `kiln forward` tie it again.
        tied = tensors._tied_decoder() if hasattr(type(tensors), "_tied_decoder") else {}
        tensors = {k: v for k, v in tensors.state_dict().items() if k not in tied}
    if hasattr(f, "write"):
        import os
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tmp = os.path.join(d, "t.safetensors")
            _C.save_safetensors(tmp, dict(tensors), dict(metadata or {}))
            with open(tmp, "rb") as src:
                f.write(src.read())
        return
    _C.save_safetensors(str(f), dict(tensors), dict(metadata or {}))


class KilnFileNotFoundError(KilnError, FileNotFoundError):
    """A file that kiln.load, kiln.load_safetensors or kiln.load_checkpoint was asked for does not
    exist: both a kiln.KilnError and a FileNotFoundError (errno ENOENT, filename the path); str()
    is the engine's message."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


KilnFileNotFoundError.__module__ = "kiln"


def _opening(fn, path, *args):
    """fn(path, *args), an engine error for a file that does not exist raised as
    KilnFileNotFoundError with the engine's message."""
    import errno
    import os

    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    try:
        return fn(path, *args)
    except KilnError as e:
        try:
            os.stat(path)
        except FileNotFoundError:
            err = KilnFileNotFoundError(str(e))
            err.errno, err.strerror, err.filename = errno.ENOENT, os.strerror(errno.ENOENT), path
            raise err from None
        except OSError:
            pass
        raise


def load_safetensors(path, mmap=False):
    """(tensors, metadata) of a safetensors file; damaged files are errors naming the part.

    The tensors are read into memory. With mmap=True the file is mapped instead (as
    torch.load(mmap=True)) and the tensors are copy-on-write views of it, read from disk as they
    are used: the file must not be changed while its tensors live. Bytes rewritten in place change
    their values, and a file truncated under them kills the process (SIGBUS) when they are read;
    replacing the file by a rename, as kiln.save does, is safe. A missing file raises
    kiln.KilnFileNotFoundError (a FileNotFoundError and a kiln.KilnError)."""
    tensors, metadata = _opening(_C._load_safetensors, path, True if mmap else False)
    return dict(tensors), dict(metadata)


def load(f, mmap=False):
    """The tensors of a safetensors file (a path or a binary file object) as a dict, read into
    memory; kiln.load_safetensors(path) also gives its metadata. mmap=True maps a path's file
    instead: the file must not be changed while its tensors live (see kiln.load_safetensors)."""
    if hasattr(f, "read"):
        if mmap:
            raise KilnValueError("kiln.load: mmap=True needs a path; a file object is read into memory")
        return dict(_C._parse_safetensors(f.read(), str(getattr(f, "name", "<stream>")))[0])
    return load_safetensors(f, mmap)[0]


def load_checkpoint(path):
    """(tensors, state) of a Kiln checkpoint, every checksum verified; the tensors are read into
    memory. A missing file raises kiln.KilnFileNotFoundError (a FileNotFoundError and a
    kiln.KilnError)."""
    return _opening(_C.load_checkpoint, path)


def _install_interrupts():
    """Ctrl-C (a notebook's interrupt) stops a long call such as backward() between kernels rather
    than after it, when SIGINT has Python's default handler (a program with its own keeps it)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def on_sigint(sig, frame):
        _C._clear_interrupt()
        return signal.default_int_handler(sig, frame)

    signal.signal(signal.SIGINT, on_sigint)
    _C._install_interrupt()


_install_interrupts()


def _release_at_exit():
    """Hooks and Function closures are held by the engine, out of the GC's sight: a cycle through one
    (a hook whose globals hold its tensor) is never collected. At exit the engine lets go of them
    all, so the interpreter frees those tensors before nanobind counts leaked instances."""
    import atexit

    atexit.register(_C._release_python_refs)


_release_at_exit()


def from_dlpack(obj):
    """A tensor sharing the memory of any DLPack producer (NumPy, PyTorch, CuPy, JAX): no copy.

    A PyTorch CUDA tensor is asked for its memory with its device made PyTorch's current one:
    PyTorch refuses to export a tensor of another device, and keeps its own record of which is
    current beside the CUDA runtime's."""
    device = getattr(obj, "device", None)
    if type(obj).__module__.split(".")[0] == "torch" and getattr(device, "type", None) == "cuda":
        import torch

        with torch.cuda.device(device):
            return _C.from_dlpack(obj)
    return _C.from_dlpack(obj)


def cuda_is_available():
    """Whether a CUDA device is visible to this build."""
    return _C.cuda_device_count() > 0
