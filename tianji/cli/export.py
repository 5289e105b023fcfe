"""The ``tianji export`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tianji.run.policy import FORMATS, load_policy

__all__ = ["add_export_parser"]


def _cmd_export(args: Any) -> int:
    policy = load_policy(args.source, checkpoint=args.checkpoint)
    out = Path(args.out) if args.out else _default_path(policy, args.format)
    policy.export(out, args.format)
    print(
        f"exported {policy.algorithm} on {policy.env_id} (policy version "
        f"{policy.policy_version}) as {args.format}: {out} (+ {out}.json)"
    )
    return 0


def _default_path(policy: Any, fmt: str) -> Path:
    """``<run dir>/export/policy-<version><suffix>``."""
    folder = Path(policy.checkpoint).parent.parent / "export"
    folder.mkdir(exist_ok=True)
    return folder / f"policy-{policy.policy_version}{FORMATS[fmt]}"


def add_export_parser(sub: Any) -> None:
    """Add ``tianji export`` to the CLI's subparsers."""
    p = sub.add_parser(
        "export",
        help="write a trained policy as TorchScript or ONNX, to run without tianji",
        description="Load a run directory's newest checkpoint (or a checkpoint file, or "
        "--checkpoint) and write its greedy policy (observations in, actions out) as "
        "TorchScript (torch.jit.load) or ONNX (onnxruntime), with a JSON file beside it "
        "naming its input and output. Recurrent and multi-agent policies are refused "
        "(exit 2).",
    )
    p.add_argument("source", metavar="RUN_OR_CHECKPOINT", help="a run directory or a checkpoint")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--checkpoint", metavar="PATH", help="checkpoint (default: the run's newest)")
    p.add_argument(
        "--out", metavar="PATH", help="the file (default: RUN/export/policy-VERSION.pt|.onnx)"
    )
    p.set_defaults(func=_cmd_export)
