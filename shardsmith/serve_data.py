"""`shardsmith serve-data`: the tf.data service's dispatcher and workers (`readers.service`).

  shardsmith serve-data --port 5050 --workers 2     # dispatcher + 2 local workers
  shardsmith serve-data --port 5050                 # a dispatcher alone (dynamic sharding)
  shardsmith serve-data --dispatcher host:5050      # a worker joining it

Prints the address trainers pass as `service=` on a line of its own (and the
fixed worker list, for static sharding), then serves until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from conversion import console

    parser.add_argument("--port", type=int, default=0,
                        help="The dispatcher's port, or with --dispatcher the worker's own "
                             "(0: a free one; default 0).")
    parser.add_argument("--dispatcher", default=None, metavar="HOST:PORT",
                        help="Start a worker that joins this dispatcher instead of a dispatcher.")
    parser.add_argument("--workers", type=int, default=0,
                        help="Also start this many worker processes on this host, on fixed "
                             "ports listed with the dispatcher (static sharding). Default 0.")
    parser.add_argument("--worker_port", type=int, default=0,
                        help="The first local worker's port (the others follow; 0: free ports).")
    parser.add_argument("--worker_addresses", default="", metavar="HOST:PORT,...",
                        help="The fixed worker list of workers on other hosts, for static "
                             "sharding (each started with --dispatcher, --port and --host).")
    parser.add_argument("--host", default="localhost",
                        help="The name other hosts reach this one by (default localhost).")
    parser.add_argument("--worker_timeout", type=float, default=20.0,
                        help="Seconds without a heartbeat before a worker is dropped (default 20).")
    parser.add_argument("--cross_trainer_cache_mb", type=int, default=None, metavar="MB",
                        help="Memory each worker started here may hold for every job that "
                             "trainers share with trainer ids (a hyper-parameter sweep: "
                             "service_trainer_id=): the batches a trial may lag behind the "
                             "fastest one before it skips ahead. Costs up to MB of RAM per "
                             "worker per such job, filled as the job runs; must hold one batch "
                             "(default 1024; TensorFlow's own default is 10240).")
    parser.add_argument(console.VERBOSE_FLAG, action="store_true", help=console.VERBOSE_HELP)


# Flag of each `ServiceOptions` field, for its errors.
_FLAGS = ("port", "dispatcher", "workers", "worker_port", "worker_addresses", "host",
          "worker_timeout", "cross_trainer_cache_mb")


def main(argv: list[str] | None = None) -> int:
    """Runs `serve-data` until stopped; 2 for bad arguments."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="shardsmith serve-data", add_help=False)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the usage error.
        return int(e.code or 0)
    from conversion import console

    if not console.is_verbose(argv) and "tensorflow" not in sys.modules:
        # The servers log their whole config at INFO, on lines the console's filter cannot
        # tell from output; --verbose shows them. (The command's own process only.)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from readers.service import ServiceOptions, serve

    try:
        options = ServiceOptions(**{name: getattr(args, name) for name in _FLAGS})
    except ValueError as e:
        message = str(e)
        for name in _FLAGS:  # Name the flags, not the fields ('port' not inside 'worker_port').
            message = re.sub(rf"`{name}`|(?<![\w`-]){name}(?==)", f"--{name}", message)
        print(f"shardsmith serve-data: error: {message}", file=sys.stderr)
        return 2
    return serve(options, announce=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
