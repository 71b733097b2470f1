"""`shardsmith doctor DATASET --model ...`: does training wait for its input?

Runs `readers.diagnose` (see `readers.doctor` for the method) and prints its
paragraph, then the figures it rests on.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "main"]

_PROG = "shardsmith doctor"


def _image_size(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected SIDE or HEIGHT,WIDTH of positive integers, received {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `shardsmith doctor` to `parser`."""
    from conversion import console

    parser.add_argument("dataset_dir", help="Folder written by the converter.")
    parser.add_argument(
        "--model", required=True,
        help="The model to train: a saved Keras model file (.keras, compiled), or "
        "MODULE:FUNCTION, a function of a module importable from the current folder that "
        "takes no argument and returns a compiled Keras model.")
    parser.add_argument("--split", default="train", help="Split to read (default: train).")
    parser.add_argument("--batch_size", type=int, default=32,
                        help="Examples per step (default: 32).")
    parser.add_argument("--image_size", type=_image_size, default=(224, 224),
                        help="The model's input size, SIDE or HEIGHT,WIDTH (default: 224).")
    parser.add_argument("--steps", type=int, default=50,
                        help="Timed steps of each measurement (default: 50).")
    parser.add_argument("--warmup", type=int, default=5,
                        help="Untimed steps before each measurement (default: 5).")
    parser.add_argument("--augment", choices=("standard",), default=None,
                        help="The reader's augmentation (default: none).")
    parser.add_argument("--label_mode", default="int",
                        help="The reader's label_mode, what the model's loss takes (default: int).")
    parser.add_argument("--no_cold", action="store_true",
                        help="Skip the cold page cache measurement.")
    parser.add_argument(console.VERBOSE_FLAG, action="store_true", help=console.VERBOSE_HELP)


def main(argv: list[str] | None = None) -> int:
    """Prints the diagnosis; 2 with a one-line error for a bad dataset, model or option."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or argparse's own usage error.
        return int(e.code or 0)

    import readers
    from schemas import ManifestError

    try:
        options = readers.DoctorOptions(
            batch_size=args.batch_size, image_size=args.image_size, steps=args.steps,
            warmup=args.warmup, augment=args.augment,
            label_mode=None if args.label_mode == "none" else args.label_mode,
            cold=not args.no_cold,
        )
        report = readers.diagnose(args.dataset_dir, args.split, args.model, options)
    except (FileNotFoundError, ManifestError, ValueError, TypeError) as e:
        message = " ".join(str(e).split())
        print(f"{_PROG}: error: {message}", file=sys.stderr)
        return 2
    print(report.text)
    print()
    print(_figures(report))
    return 0


def _figures(report) -> str:
    rows = [
        ("model alone, batches on the device", f"{report.ceiling_steps_per_s:.2f} steps/s"),
        ("decoded batches from memory", f"{report.cached_steps_per_s:.2f} steps/s"),
        ("reader, warm page cache",
         f"{report.warm_steps_per_s:.2f} steps/s ({100 * report.wait_share:.0f}% below the "
         f"ceiling; blocked in next {100 * report.blocked_share:.0f}% of the time)"),
        ("reader, cold page cache",
         f"{report.cold_steps_per_s:.2f} steps/s ({100 * report.cold_wait_share:.0f}% below the "
         f"ceiling; blocked in next {100 * report.cold_blocked_share:.0f}% of the time)"
         if report.cold_steps_per_s is not None else f"not measured: {report.cold_note}"),
        ("reader alone", f"{report.reader_images_per_s:,.0f} images/s"),
    ]
    costs = report.stage_ms_per_image()
    rows += [(f"  stage {name}", f"{rate:,.0f} images/s (+{costs[name]:.2f} ms/image)")
             for name, rate in report.stage_images_per_s]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


if __name__ == "__main__":
    sys.exit(main())
