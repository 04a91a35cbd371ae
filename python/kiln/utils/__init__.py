"""kiln.utils: torch.utils' import paths for ported scripts; kiln.utils.data is kiln.data under
torch.utils.data's name."""
from . import data  # noqa: F401
