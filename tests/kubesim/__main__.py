"""``python -m kubesim``: serve a simulated cluster until killed (for the demo and the benchmark)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .cluster import SimCluster
from .sim import FAULTS, SimNode


def _node_arg(text: str) -> tuple[str, int]:
    name, _sep, gpus = text.partition("=")
    if not name or not gpus.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=GPUS, got {text!r}")
    return name, int(gpus)


def _label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not key or not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _fault_arg(text: str) -> tuple[str, str]:
    node, sep, fault = text.partition("=")
    if not sep or fault not in FAULTS:
        raise argparse.ArgumentTypeError(f"expected NODE=FAULT (NODE may be '*'), FAULT one of {', '.join(FAULTS)}")
    return node, fault


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kubesim", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="number of nodes gpu-node-1..N (ignored with --node)")
    parser.add_argument("--gpus", type=int, default=8, help="physical GPUs per node for --nodes")
    parser.add_argument(
        "--node",
        action="append",
        type=_node_arg,
        default=[],
        metavar="NAME=GPUS",
        help="a node by name and GPU count (repeatable)",
    )
    parser.add_argument(
        "--label",
        action="append",
        type=_label_arg,
        default=[],
        metavar="KEY=VALUE",
        help="a label on every node (repeatable)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        type=_fault_arg,
        default=[],
        metavar="NODE=FAULT",
        help="a fault at start (repeatable)",
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the simulator here")
    parser.add_argument("--context", default="kubesim")
    parser.add_argument("--tls", action="store_true", help="serve HTTPS with a generated CA")
    parser.add_argument("--token", default="test-token")
    parser.add_argument("--capacity-delay", type=float, default=0.2)
    parser.add_argument("--capacity-spread", type=float, default=0.0)
    parser.add_argument(
        "--crd", action="append", default=[], help="a CRD installed from the start (kubesim knows servicemonitors)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    labels = dict(args.label)
    specs = args.node or [(f"gpu-node-{i}", args.gpus) for i in range(1, args.nodes + 1)]
    nodes = [SimNode(name, gpus=gpus, labels=dict(labels)) for name, gpus in specs]
    faults: dict[str, list[str]] = {}
    for node, fault in args.fault:
        faults.setdefault(node, []).append(fault)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with SimCluster(
        nodes,
        tls=args.tls,
        token=args.token,
        capacity_delay=args.capacity_delay,
        capacity_spread=args.capacity_spread,
        faults=faults,
        port=args.port,
        crds=args.crd,
    ) as cluster:
        if args.kubeconfig:
            cluster.write_kubeconfig(args.kubeconfig, context=args.context)
        print(cluster.url, flush=True)
        if args.kubeconfig:
            print(f"kubeconfig: {args.kubeconfig}", file=sys.stderr, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
