"""tianji on hosts simulated by network namespaces, from a checkout (root and iproute2):
``tianji bench scale`` with the weight fan-out on 2 and 4 hosts too, and ``tianji bench
chaos`` with ``--backend hosts`` (a run deployed by hand on two hosts, every service under
``tianji serve --restart``; ``--cut-every S`` takes the actors' host off the network)::

    sudo .venv/bin/python benchmarks/hosts.py scale --out DIR
    sudo .venv/bin/python benchmarks/hosts.py chaos examples/cartpole_ppo.toml --backend hosts

The hosts are ``netns.py``'s ``Bridge``; the chaos run on them is ``chaos_hosts.py``'s.
Everything else is tianji's bench code, unchanged.
"""

from __future__ import annotations

import argparse
import sys

from chaos_hosts import start_hosts
from netns import Bridge

from tianji.bench import chaos, scale_report
from tianji.cli import main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python benchmarks/hosts.py", description=__doc__)
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    scale_report.add_parser(sub, make_hosts=Bridge)
    chaos.add_parser(sub, start_hosts=start_hosts)
    return parser


if __name__ == "__main__":
    sys.exit(main(parser=build_parser()))
