"""kiln.utils: torch.utils' import paths for ported scripts; kiln.utils.data is kiln.data under
torch.utils.data's name."""
from . import data  # noqa: F401
from . import checkpoint  # noqa: F401,E402  (torch.utils.checkpoint's checkpoint / checkpoint_sequential)
