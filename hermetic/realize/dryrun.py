"""``realize --dry-run`` and ``realize --check``: a realize's plan (``realize.plan``: the decisions its steps
would make now, made by the same functions, through a read-only view of the root), printed, with nothing written
under the root (docs/builds.md, "Dry run"). This module only says the plan: a line per wheel and source to fetch,
unpack or prepare, a line per module, a line per object with -v, and the totals; with --json the plan is the result.

``--check`` (as ``uv sync --check``) asks the same planners without asking any index (``locate_files=False``:
a size the lock does not give is said as unknown) and answers with its exit code: 0 when a realize would do
nothing, ``errors.WORK_NEEDED`` (4) when it would fetch, unpack, prepare, compile, link or write anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hermetic.errors import WORK_NEEDED
from hermetic.realize.pipeline import RealizeOptions
from hermetic.realize.plan import Plan, plan_realize
from hermetic.reporter import Reporter, plural
from hermetic.root import Root, sweep_outside_scratch
from hermetic.wheels.unpacked import offline_error


def dry_run(root: Root, recipe_path: Path, reporter: Reporter, options: RealizeOptions) -> int:
    """Print the plan (stdout; with --json it is the result record) and return the exit code: 0, or 3 offline
    when something would have to be fetched."""
    for left in sweep_outside_scratch():   # a dry run killed with kill -9 left its folder outside the root
        reporter.detail("dry-run", f"removed {left}, left by a dry run that was killed")
    plan = plan_realize(root, recipe_path, reporter, options)
    say(plan, reporter)
    record = plan.record()
    fields = {"recipe": plan.recipe, "profile": str(plan.profile), "tree": plan.tree, "changed": not plan.up_to_date,
              "counts": record["counts"], "timings": {}, "receipt": None, "dry_run": True, "plan": record}
    if options.offline and (missing := plan.missing()):
        err = offline_error(missing)
        print(err.render(), file=sys.stderr)
        reporter.result("realize", False, err.exit_code, **fields, error=err.as_record())
        return err.exit_code
    reporter.result("realize", True, 0, **fields)
    return 0


def check(root: Root, recipe_path: Path, reporter: Reporter, options: RealizeOptions) -> int:
    """``--check``: 0 up to date, else the plan said and ``WORK_NEEDED``; nothing fetched (no index is asked,
    offline or not), nothing written under the root."""
    for left in sweep_outside_scratch():
        reporter.detail("check", f"removed {left}, left by a dry run that was killed")
    plan = plan_realize(root, recipe_path, reporter, options, locate_files=False)
    if not plan.needs_work():   # the command asked the no-op record first; this is a plan that found nothing
        reporter.data("check", f"check: {plan.recipe} is up to date")
        reporter.result("realize", True, 0, recipe=plan.recipe, profile=str(plan.profile), tree=plan.tree,
                        changed=False, check=True, counts=plan.counts.to_json())
        return 0
    say(plan, reporter, heading=f"check: {plan.recipe} is not up to date; a realize would")
    record = plan.record()
    reporter.result("realize", False, WORK_NEEDED, recipe=plan.recipe, profile=str(plan.profile), tree=plan.tree,
                    changed=True, check=True, counts=record["counts"], plan=record,
                    error={"kind": "work-needed", "what": f"{plan.recipe} is not up to date", "where": str(recipe_path),
                           "hint": f"hermetic realize {recipe_path} does the work"})
    return WORK_NEEDED


def say(plan: Plan, reporter: Reporter, heading: str = "") -> None:
    """The plan as data (stdout): a line per wheel and source to fetch, unpack or prepare, a line per module, a
    line per object with -v, and the totals."""
    c = plan.counts
    if plan.up_to_date:
        objects = f"; {plural(c.objects.total, 'objects')} reused" if c.objects is not None else ""
        reporter.data("plan", f"dry run: {plan.recipe} is up to date: nothing would be fetched, unpacked or "
                              f"compiled ({plural(c.wheels, 'wheels')} reused{objects}); nothing written")
        return
    lines = [f"{heading}: realize {plan.recipe} -> {plan.profile}" if heading
             else f"dry run: realize {plan.recipe} -> {plan.profile} (nothing written)"]
    for w in plan.wheels:
        if w.action == "reuse" and not reporter.verbose:
            continue
        size = f"  {_size(w.bytes)}" if w.action != "reuse" else ""
        lines.append(f"  {w.action:<8} {w.label}{size}  ({w.wheel.where})"
                     + (f"\n           {w.url}" if reporter.verbose and w.url else "")
                     + (f"\n           problem: {w.problem}" if w.problem else ""))
    tc = plan.toolchain
    if tc is not None:
        lines.append(f"  {tc.action:<8} the CUDA {tc.cuda} toolchain's tree")
    for s in plan.sources:
        what = plural(s.files, "files") if s.files is not None else "its archive fetched first"
        size = f", {_size(s.bytes)}" if s.action == "fetch" else ""
        patched = f", {plural(s.patches, 'patches')}" if s.patches else ""
        lines.append(f"  {s.action:<8} source {s.source} of variant {s.variant} ({what}{patched}{size})")
    for m in plan.modules:
        if m.objects is None:
            what = "objects not known until its source is fetched"
        else:
            n = m.decisions()
            what = (f"{plural(len(m.objects), 'objects')}: {n.get('compiled', 0) + n.get('compiled-uncacheable', 0)} "
                    f"compiled, {n.get('reused', 0)} reused, {n.get('reused-variant', 0)} reused across variants")
        lines.append(f"  {m.link.action:<8} module {m.module} of variant {m.variant} ({what})")
        if reporter.verbose:
            lines += [f"             {o.decision}: {o.source}" + (f" ({o.reason})" if o.reason else "")
                      for o in m.objects or ()]
    lines += [f"  note: {n}" for n in plan.notes]
    unknown = plan.fetch_bytes_unknown()
    known = f"{_size(c.fetched_bytes)}, and {unknown} of unknown size" if unknown else _size(c.fetched_bytes)
    total = f"fetch {plural(c.fetched, 'wheels')} ({'size unknown' if unknown and not c.fetched_bytes else known})"
    o = c.objects
    objects = (f"; compile {plural(o.compiled + o.uncacheable, 'objects')}, reuse {o.reused}, reuse "
               f"{o.reused_variant} across variants; link {plural(c.modules_linked or 0, 'modules')}"
               if o is not None else "")
    lines.append(f"would {total}, unpack {c.unpacked}, reuse {c.reused}{objects}")
    reporter.data("plan", "\n".join(lines))


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"
