"""`python -m teraio`: the package's command line (`demo`, `--version`)."""
from __future__ import annotations

import sys

USAGE = """usage: python -m teraio [--version] COMMAND [options]

commands:
  demo    train a small GPT under a memory budget and check it bit for bit against plain PyTorch
"""


def _import_teraio():
    try:
        import teraio
    except ImportError as e:
        sys.exit(f"teraio: cannot import the package ({e}); build it with `bash scripts/demo.sh` "
                 "or `pip install --no-build-isolation .`")
    return teraio


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    if argv[0] == "--version":
        teraio = _import_teraio()
        build = ", ".join(f"{key} {value}" for key, value in teraio.build.items())
        print(f"teraio {teraio.__version__} ({build})")
        return 0
    if argv[0] == "demo":
        _import_teraio()
        from . import demo

        return demo.main(argv[1:], prog="teraio demo")
    print(f"teraio: unknown command {argv[0]!r}\n\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
