"""Every GPU check in one script, for the machine it runs on; a case that fails loses nothing.

    cd <repo> && PYTHONPATH=. python3 benchmarks/gpu_check.py --out "$OUT"   # the GPU machine
    python benchmarks/gpu_check.py --dry-run                   # anywhere: every case, in order

It installs nothing and needs no network. Cases run most important first: the machine
record, selection, ``pytest tests/gpu``, the fused quantizer's byte agreement, block FP8 at
small M, the three benchmark figures, the GEMV crossover, every CUDA kernel of the catalog
on every shape, dtype and bias variant, then a compute-sanitizer memcheck pass.

Each case runs in its own try block, and DIR/gpu_check.json is rewritten atomically before
and after each one, so a killed run keeps what it measured and names the case it died in
("running"). A case's status is ok, failed (it ran and its check did not hold), rejected
(the selector turned the kernel down; its reasons), skipped (it cannot run here; why),
error (it raised: type, message and traceback tail) or pending (not reached). A case that
leaves the CUDA context unusable restarts the script in a fresh process (``--resume``),
which keeps every record so far. GPU work is timed with CUDA graphs or events, on operands
rotated past the L2 cache, against ``F.linear`` in the same run (benchmarks/gpu_common.py).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, NoReturn

# Run as a script, Python puts benchmarks/ itself on the path, not the repository root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_common import Context, Skip  # noqa: E402
from benchmarks.gpu_plan import FIGURES, Case, plan  # noqa: E402
from kernelpick.kernels import cupy_usable  # noqa: E402

__all__ = ["main"]

SCHEMA_VERSION = 1
JSON_NAME = "gpu_check.json"
MAX_RESTARTS = 3


@functools.cache
def _missing(need: str) -> str | None:
    """Why ``need`` is not met here, or None."""
    if need == "cuda":
        import torch

        if torch.version.hip is not None or not torch.cuda.is_available():
            return "no NVIDIA GPU here (torch.cuda.is_available() is False, or a ROCm torch)"
    if need == "cupy" and not cupy_usable():
        return "cupy is not usable here (kernelpick.kernels.cupy_usable() is False)"
    return None


def _context_lost() -> bool:
    """Whether CUDA still answers after a case raised (a sticky error ends the context)."""
    if _missing("cuda"):
        return False
    import torch

    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).cpu()
    except Exception:  # any error here means the context is gone
        return True
    return False


def _error(error: BaseException) -> dict[str, Any]:
    lines = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return {
        "type": type(error).__name__,
        "message": str(error)[:4000],
        "traceback": lines.splitlines()[-12:],
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    """The whole record, replaced atomically: a reader never sees half a file."""
    doc["updated_at"] = time.time()
    fd, tmp = tempfile.mkstemp(prefix=".gpu_check.", suffix=".json", dir=path.parent)
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out, indent=1, default=str)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from whoever collects the results
    os.replace(tmp, path)


def _document(cases: list[Case], path: Path, argv: list[str], resume: bool) -> dict[str, Any]:
    old: dict[str, Any] = json.loads(path.read_text()) if resume and path.exists() else {}
    kept = {r["name"]: r for r in old.get("cases", ())}
    fresh = {
        "schema": SCHEMA_VERSION,
        "argv": argv,
        "started_at": time.time(),
        "restarts": 0,
        "finished": False,
        "machine": {},
        "figures": {},
    }
    doc = {**fresh, **{k: v for k, v in old.items() if k != "cases"}}
    doc["cases"] = [
        kept.get(c.name)
        or {"name": c.name, "params": c.params, "needs": list(c.needs), "status": "pending"}
        for c in cases
    ]
    return doc


def _hooks(specs: list[str], names: set[str]) -> dict[str, str]:
    """--fail-case NAME[:exit|:lost] as {name: mode}; an unknown name is refused."""
    hooks = {}
    for spec in specs:
        name, _, mode = (
            spec.rpartition(":") if spec.endswith((":exit", ":lost")) else (spec, "", "")
        )
        if name not in names:
            raise SystemExit(f"gpu_check: --fail-case {spec!r}: no case is named {name!r}")
        hooks[name] = mode or "raise"
    return hooks


def _say(line: str) -> None:
    """Progress on stdout; a closed stdout (``| head``) must not end the run."""
    with contextlib.suppress(OSError):
        print(line, flush=True)


def _headline(rec: dict[str, Any]) -> str:
    result, bits = rec.get("result", {}), []
    if "vs_baseline" in result:
        bits.append(f"{result['vs_baseline']:.3f} x {result['baseline']}")
    if result.get("reasons"):
        bits.append(result["reasons"][0][:120])
    if "error_vs_reference" in result:
        bits.append(f"err {result['error_vs_reference']:.2e}")
    if "error" in rec:
        bits.append(f"{rec['error']['type']}: {rec['error']['message'][:120]}")
    if "reason" in rec:
        bits.append(rec["reason"][:120])
    return "  ".join(bits)


def _run_one(case: Case, rec: dict[str, Any], ctx: Context, hook: str | None) -> bool:
    """Run one case into ``rec``; True when it left the CUDA context unusable."""
    start = time.monotonic()
    lost = False
    try:
        if hook == "exit":
            os._exit(3)
        if hook:
            raise RuntimeError(f"injected failure (--fail-case {case.name})")
        for need in case.needs:
            if why := _missing(need):
                raise Skip(why)
        result = case.run(ctx, **case.params)
        rec.update(status=result.pop("status", "ok"), result=result)
    except Skip as why:
        rec.update(status="skipped", reason=str(why))
    except Exception as error:  # the case's record, and on to the next
        rec.update(status="error", error=_error(error))
        lost = hook == "lost" or ("cuda" in case.needs and _context_lost())
        rec["cuda_context_lost"] = lost
    rec["seconds"] = time.monotonic() - start
    rec["over_limit"] = rec["seconds"] > case.limit_s
    if "cuda" in case.needs and not _missing("cuda") and not lost:
        import torch

        torch.cuda.empty_cache()  # the next case's rings start from free memory
    return lost


def _settled(rec: dict[str, Any]) -> bool:
    """Whether a record (kept from an earlier process by --resume) needs no run."""
    if rec["status"] == "running":  # that process ended inside this case
        message = "the process ended during this case"
        rec.update(status="error", error={"type": "ProcessEnded", "message": message})
    return str(rec["status"]) != "pending"


def _why_not(case: Case, args: argparse.Namespace, started: float) -> str | None:
    if case.name == "pytest" and args.skip_pytest:
        return "--skip-pytest"
    if case.name != "machine" and time.time() - started > args.budget:
        return f"over the run's time budget (--budget {args.budget:g} s)"
    return None


def _restart(argv: list[str], out_dir: Path) -> NoReturn:
    """The same run in a fresh process (a fresh CUDA context), keeping the records."""
    script = str(Path(__file__).resolve())
    os.execv(sys.executable, [sys.executable, script, *argv, "--out", str(out_dir), "--resume"])


def run(cases: list[Case], args: argparse.Namespace, out_dir: Path, argv: list[str]) -> int:
    """Every case in order, the JSON rewritten around each; 1 if any errored or failed."""
    path = out_dir / JSON_NAME
    doc = _document(cases, path, argv, args.resume)
    hooks = _hooks(args.fail_case, {c.name for c in cases})
    records = {r["name"]: r for r in doc["cases"]}
    for case in cases:
        rec = records[case.name]
        if _settled(rec):
            continue
        if why := _why_not(case, args, doc["started_at"]):
            rec.update(status="skipped", reason=why)
        else:
            rec.update(status="running", process=doc["restarts"])  # 0, then 1 after a restart
            _write(path, doc)
            ctx = Context(ROOT, out_dir, time.monotonic() + case.limit_s)
            lost = _run_one(case, rec, ctx, hooks.get(case.name))
            doc["figures"].update(rec.get("result", {}).get("figures", {}))
            if case.name == "machine":
                doc["machine"] = rec.get("result", {})
            if lost and doc["restarts"] < MAX_RESTARTS:
                doc["restarts"] += 1
                _write(path, doc)
                _say(f"gpu_check: {case.name} left CUDA unusable; restarting")
                _restart(argv, out_dir)
        elapsed = time.time() - doc["started_at"]
        _say(f"[{elapsed:6.1f} s] {rec['status']:<8} {case.name}  {_headline(rec)}")
        _write(path, doc)
    doc["finished"] = True
    statuses = [r["status"] for r in doc["cases"]]
    doc["summary"] = {s: statuses.count(s) for s in sorted(set(statuses))}
    _write(path, doc)
    _say(f"gpu_check: {doc['summary']}; figures {doc['figures']}; wrote {path}")
    return 1 if {"error", "failed"} & set(statuses) else 0


def _print_plan(cases: list[Case]) -> None:
    print(f"{len(cases)} cases, in the order they run:")
    for i, case in enumerate(cases, 1):
        params = " ".join(f"{k}={v}" for k, v in case.params.items())
        needs = f"  [needs {', '.join(case.needs)}]" if case.needs else ""
        print(f"{i:4d}. {case.name:<52} {params}{needs}")
    print(f"figures: {', '.join(FIGURES)}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="where gpu_check.json goes (default: $OUT, else ./gpu_check_out)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list every case and its parameters, in order; needs no GPU",
    )
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        default=None,
        help="only the cases whose names contain one of these (and machine)",
    )
    parser.add_argument("--skip-pytest", action="store_true", help="do not run pytest tests/gpu")
    parser.add_argument(
        "--budget",
        type=float,
        default=330.0,
        metavar="S",
        help="start no case after S seconds of the run (default 330)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep DIR's records and run the pending cases (used after a lost CUDA context)",
    )
    parser.add_argument(
        "--fail-case",
        action="append",
        default=[],
        metavar="NAME[:exit|:lost]",
        help="for testing the harness: case NAME raises inside its try block; "
        "with :exit the process ends there (os._exit(3)); with :lost the "
        "CUDA context counts as lost, so the run restarts",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    cases = plan()
    if args.only:
        wanted = [w for w in args.only.split(",") if w]
        cases = [c for c in cases if c.name == "machine" or any(w in c.name for w in wanted)]
    if args.dry_run:
        _print_plan(cases)
        return 0
    _hooks(args.fail_case, {c.name for c in cases})  # a misspelt name stops the run here
    out_dir = Path(args.out or os.environ.get("OUT") or "gpu_check_out").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    return run(cases, args, out_dir, argv)


if __name__ == "__main__":
    sys.exit(main())
