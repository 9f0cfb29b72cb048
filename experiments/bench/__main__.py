"""`python -m experiments.bench NAME ...` (see `experiments.bench`)."""
import sys

from . import __doc__ as DOC
from . import forward, generate, harness, spec, train, transforms

BENCHMARKS = {"forward": forward, "train": train, "generate": generate, "spec": spec, "transforms": transforms}


def main(argv=None) -> int:
    return harness.main(BENCHMARKS, argv, DOC)


if __name__ == "__main__":
    sys.exit(main())
