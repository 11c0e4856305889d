"""``python -m perflab``: the ``perflab`` command (:mod:`perflab.cli`), for environments
whose ``bin/`` is not on PATH (``python -m perflab doctor``, ``python -m perflab --version``)."""
import sys

from perflab.cli import main

if __name__ == "__main__":
    sys.exit(main())
