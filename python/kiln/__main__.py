"""`python -m kiln ARGS...` (and the `kiln` script pip installs): the `kiln` command line, the
program built with the package."""
import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    binary = os.path.join(here, "bin", "kiln")
    if not os.path.exists(binary):
        sys.exit(f"kiln: the command-line program is not part of this build ({binary} is missing)")
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    main()
