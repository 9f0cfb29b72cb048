"""`python -m experiments.bench NAME ...` (see `experiments.bench`)."""

from . import __doc__ as DOC
from .. import cli
from . import aot, check, cycle, device, forward, generate, harness, length, live, plan, spec, train, transforms

BENCHMARKS = {"forward": forward, "train": train, "generate": generate, "spec": spec, "transforms": transforms,
              "plan": plan, "aot": aot, "device": device, "cycle": cycle,
              "live": live, "length": length, "check": check}


def main(argv=None) -> int:
    return harness.main(BENCHMARKS, argv, DOC)


if __name__ == "__main__":
    cli.main(main)
