# pytest configuration for the Python package's tests: they import the installed `kiln` (the
# README's test command installs it with pip into a venv), or the build folder's copy when
# KILN_PYTHONPATH names one (BUILD/python).
import os
import sys

_extra = os.environ.get("KILN_PYTHONPATH")
if _extra:
    sys.path.insert(0, _extra)
    # and for the processes the tests start (python -m kiln, the notebook's kernel)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_extra, os.environ.get("PYTHONPATH")) if p)
