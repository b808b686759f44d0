"""fedur-tables: run a named grid (methods x datasets x settings x seeds) and write the paper's table.

    fedur-tables table1 --seeds 1,2,3 --data-root /data --launcher "fabric run --devices 8"
    fedur-tables proxy-table1 --data-root /tmp/cifar10-jpg --jobs 2
    fedur-tables table6 --data-root /data --slurm --submit
    fedur-tables table1 --table-only

See docs/tables.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from fedur.app.tables import runner, slurm
from fedur.app.tables.grids import GRIDS, Grid, RunSpec, expand
from fedur.app.tables.render import render

EPILOG = """\
runs: <out>/<grid>/<column>/<row>/seed<k>/ (a fedur run directory), its output in seed<k>.log beside it.
table: <out>/<grid>/table.md, table.csv (the paper's shape), cells.csv (one line per cell).
A finished run (summary.json) is skipped; any other is started with --run.resume auto, which resumes it
from its last committed checkpoint. Arguments after -- go to every run (they win over the grid's);
{seed} in them becomes the run's seed (-- --federation.partition_seed {seed}).
--data-root: DIR (DIR/<dataset> when the grid has several datasets), a template such as /data/{dataset},
or dtd=/data/DTD,cub=/data/CUB. Grids: """ + ", ".join(GRIDS)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedur-tables", description="Run a named grid of fedur runs and write the paper's table.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", nargs="?", choices=sorted(GRIDS), metavar="GRID", help="the grid: " + ", ".join(GRIDS))
    p.add_argument("--seeds", default="1,2,3", help="comma-separated run seeds (default: 1,2,3, the paper's)")
    p.add_argument("--data-root", help="where the datasets are (see below)")
    p.add_argument("--model-dir", help="proxy grids: the tiny-clip folder (default: $FEDUR_TINY_CLIP)")
    p.add_argument("--out", default="runs/tables", help="folder of the runs and tables (default: runs/tables)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once on this machine (default 1); each gets cores/jobs threads")
    p.add_argument("--launcher", help='prefix of each run, e.g. "fabric run --devices 8" (default: python -m fedur.main)')
    p.add_argument("--rows", help="only these rows (comma-separated keys, see --list)")
    p.add_argument("--columns", help="only these columns (comma-separated keys, see --list)")
    p.add_argument("--dry-run", action="store_true", help="print what would run (and write the SLURM script) but run nothing")
    p.add_argument("--table-only", action="store_true", help="run nothing; write the table from the runs that exist")
    p.add_argument("--list", action="store_true", help="print the grid's rows, columns and runs (or every grid)")
    p.add_argument("--task", type=int, help="run only run TASK of the grid (a SLURM array task id; see runs.tsv)")
    s = p.add_argument_group("SLURM")
    s.add_argument("--slurm", action="store_true", help="write <out>/<grid>/<grid>-array.sbatch, a job array of the runs to do")
    s.add_argument("--submit", action="store_true", help="with --slurm: sbatch it, and a job that renders the table after it")
    s.add_argument("--slurm-gpus", type=int, default=1, help="GPUs (= ranks) per task (default 1; 0 for CPU)")
    s.add_argument("--slurm-cpus", type=int, default=8, help="CPUs per rank (default 8)")
    s.add_argument("--slurm-time", default="24:00:00", help="time limit per task (default 24:00:00)")
    s.add_argument("--slurm-parallel", type=int, help="at most this many tasks at once")
    s.add_argument("--sbatch-option", action="append", default=[], metavar="OPT",
                   help="another #SBATCH option: partition=gpu or --sbatch-option=--partition=gpu (repeat)")
    return p


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def absolute_root(value: str | None) -> str | None:
    """--data-root with every path made absolute (runs start in the repository)."""
    if not value:
        return None
    if "=" in value:
        return ",".join(f"{name}={Path(path).expanduser().resolve()}" for name, path in
                        (item.split("=", 1) for item in value.split(",") if item))
    return str(Path(value).expanduser().resolve())


def describe(grid: Grid) -> str:
    lines = [f"{grid.name}: {grid.title}", "  rows:"]
    lines += [f"    {r.key:<18} {' '.join(r.flags)}" for r in grid.rows]
    lines.append("  columns:")
    lines += [f"    {c.key:<22} {c.config} {' '.join(c.flags)}" for c in grid.columns]
    return "\n".join(lines)


def check_inputs(grid: Grid, inputs: runner.Inputs) -> str | None:
    """An error message when the runs cannot start, else None."""
    if grid.uses_data_root and not inputs.data_root:
        return f"grid {grid.name} reads datasets: give --data-root (see --help)"
    if grid.uses_data_root and "=" in inputs.data_root:
        given = {item.split("=", 1)[0] for item in inputs.data_root.split(",") if item}
        lacking = sorted({c.dataset for c in grid.columns} - given)
        if lacking:
            return f"--data-root names no folder for {', '.join(lacking)}"
    if grid.uses_model_dir:
        folder = runner.model_dir_for(inputs.model_dir)
        if folder is None:
            return (f"grid {grid.name} runs the tiny-clip proxy model: give its folder with --model-dir DIR or "
                    f"${runner.TINY_CLIP_ENV} (it holds {runner.TINY_CLIP_NAME}.json and .pt)")
        if not (folder / f"{runner.TINY_CLIP_NAME}.pt").is_file():
            return f"grid {grid.name} needs the tiny-clip folder: {folder} has no {runner.TINY_CLIP_NAME}.pt (--model-dir)"
    return None


def main(argv: list[str] | None = None) -> int:
    """fedur-tables; an error a user can fix (a run's settings that cannot be read, ...) is one line, exit status 2."""
    from fedur.errors import FedurError

    try:
        return tables(argv)
    except FedurError as err:
        print(f"fedur-tables: error: {err.one_line()}", file=sys.stderr)
        return 2


def tables(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    own, extra = split_extra(list(sys.argv[1:] if argv is None else argv))
    p = parser()
    args = p.parse_args(own)
    if args.grid is None:
        if args.list:
            print("\n\n".join(describe(g) for g in GRIDS.values()))
            return 0
        p.error("give a GRID")
    grid = GRIDS[args.grid]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    out = Path(args.out).expanduser().resolve()
    folder = out / grid.name
    rows = args.rows.split(",") if args.rows else None
    columns = args.columns.split(",") if args.columns else None
    for given, known, what in ((rows, [r.key for r in grid.rows], "row"), (columns, [c.key for c in grid.columns], "column")):
        unknown = sorted(set(given or ()) - set(known))
        if unknown:
            p.error(f"unknown {what}(s) of {grid.name}: {', '.join(unknown)}; known: {', '.join(known)}")
    specs = expand(grid, seeds, out, rows, columns)
    if args.list:
        print(describe(grid))
        print(f"  {len(specs)} runs: {len(grid.rows)} rows x {len(grid.columns)} columns x {len(seeds)} seeds")
        return 0
    inputs = runner.Inputs(data_root=absolute_root(args.data_root),
                           model_dir=args.model_dir and str(runner.model_dir_for(args.model_dir)),
                           launcher=args.launcher, extra=tuple(extra),
                           threads=runner.default_threads(args.jobs) if args.task is None and not args.slurm else None)

    if args.table_only:
        return report(grid, specs, seeds, folder, [])
    problem = check_inputs(grid, inputs)
    if problem and not args.dry_run:
        print(f"fedur-tables: error: {problem}", file=sys.stderr)
        return 2
    checked = specs if args.task is None else expand(grid, seeds, out)[args.task:args.task + 1]
    clash = runner.other_settings(checked, inputs)
    if clash:
        shown = "\n".join(f"  {s.name}: " + ", ".join(f"{k} {a} (run) vs {b} (now)" for k, (a, b) in diff.items())
                          for s, diff in clash[:5])
        print(f"fedur-tables: error: {len(clash)} finished run(s) in {folder} ran with other settings than this call "
              f"would:\n{shown}\nA finished run is not run again, so the table would mix them. Use another --out "
              "for these settings, or delete those run directories to rerun them (--table-only draws the table "
              "as it is).", file=sys.stderr)
        return 2
    if args.task is not None:
        return run_task(grid, args.task, seeds, out, folder, inputs, args.dry_run)

    statuses = {s.index: runner.status(s) for s in specs}
    todo = [s for s in specs if statuses[s.index] != "done" and s.column.runs is None]  # a reading column's: its owner's
    resume = sum(statuses[s.index] == "resume" for s in todo)
    print(f"fedur-tables {grid.name}: {len(specs)} runs ({len({s.row.key for s in specs})} rows x "
          f"{len({s.column.key for s in specs})} columns x {len(seeds)} seeds): {len(specs) - len(todo)} finished, "
          f"{len(todo)} to run ({resume} to resume); out {folder}")
    if problem:
        print(f"fedur-tables: warning: {problem}")
    if args.slurm:
        return write_slurm(grid, args, (own, extra), seeds, specs, statuses, folder)
    if args.dry_run:
        for i, spec in enumerate(todo, start=1):
            print(f"[{i}/{len(todo)}] {statuses[spec.index]}: {spec.name}  log {spec.log}\n    {shlex.join(runner.command(spec, inputs))}")
        return 0
    if todo:
        print(f"running {len(todo)} run(s), {max(args.jobs, 1)} at a time")
    try:
        outcomes = runner.execute(todo, inputs, jobs=args.jobs)
    except KeyboardInterrupt:
        return 130
    return report(grid, specs, seeds, folder, [o for o in outcomes if not o.ok], ran=len(outcomes))


def run_task(grid: Grid, task: int, seeds: list[int], out: Path, folder: Path, inputs: runner.Inputs,
             dry_run: bool = False) -> int:
    every = expand(grid, seeds, out)
    if not 0 <= task < len(every):
        print(f"fedur-tables: error: --task {task}: {grid.name} has runs 0-{len(every) - 1}", file=sys.stderr)
        return 2
    spec = every[task]
    if spec.column.runs is not None:
        print(f"task {task}: {spec.name} reads the runs of column {spec.column.runs}: nothing to run")
        return 0
    if runner.status(spec) == "done":
        print(f"task {task}: {spec.name} is finished ({spec.run_dir / 'summary.json'})")
        return 0
    if dry_run:
        print(f"task {task}: {runner.status(spec)}: {spec.name}  log {spec.log}\n    {shlex.join(runner.command(spec, inputs))}")
        return 0
    outcome = runner.execute([spec], inputs)[0]
    render(grid, every, seeds, folder)  # written whole (atomic): other tasks may render at the same time
    return 0 if outcome.ok else 1


def write_slurm(grid: Grid, args: argparse.Namespace, argv: tuple[list[str], list[str]], seeds: list[int],
                specs: list[RunSpec], statuses: dict[int, str], folder: Path) -> int:
    """<grid>-array.sbatch for the runs not done yet (`statuses`); `argv`: this call's own arguments and
    those after `--`."""
    own, extra = argv
    todo = [s for s in specs if statuses[s.index] != "done" and s.column.runs is None]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "slurm").mkdir(exist_ok=True)
    (folder / "runs.tsv").write_text(slurm.index_tsv(specs, statuses))
    if not todo:
        print("every run is finished: no job array to write")
        report(grid, specs, seeds, folder, [])
        return 0
    task_args = ["--seeds", args.seeds, "--out", str(Path(args.out).expanduser().resolve()),
                 "--launcher", args.launcher or slurm.SRUN]
    if args.data_root:
        task_args += ["--data-root", absolute_root(args.data_root)]
    if grid.uses_model_dir:
        task_args += ["--model-dir", str(runner.model_dir_for(args.model_dir) or "")]
    options = slurm.SlurmOptions(gpus=args.slurm_gpus, cpus_per_task=args.slurm_cpus, time=args.slurm_time,
                                 parallel=args.slurm_parallel,
                                 options=tuple(o if o.startswith("-") else f"--{o}" for o in args.sbatch_option))
    invocation = "fedur-tables " + shlex.join(own + (["--", *extra] if extra else []))
    path = folder / f"{grid.name}-array.sbatch"
    total = len(grid.rows) * len(grid.columns) * len(seeds)
    path.write_text(slurm.script(grid.name, todo, total, folder, task_args, extra, options, invocation))
    path.chmod(0o755)
    print(f"wrote {path} ({len(todo)} array tasks) and {folder / 'runs.tsv'}\n")
    print(path.read_text())
    if args.submit and not args.dry_run:
        table = shlex.join([sys.executable, "-m", "fedur.app.tables.cli", grid.name, "--table-only", "--seeds", args.seeds,
                            "--out", str(Path(args.out).expanduser().resolve())])
        print(slurm.submit(path, table, folder, options))
    else:
        print(f"submit with: sbatch {path}")
    return 0


def report(grid: Grid, specs: list[RunSpec], seeds: list[int], folder: Path, failed: list, ran: int | None = None) -> int:
    cells, files = render(grid, specs, seeds, folder)
    print(files[0].read_text())
    if ran is not None:
        print(f"ran {ran} run(s): {ran - len(failed)} finished, {len(failed)} failed")
    for outcome in failed:
        print(f"  FAILED {outcome.spec.name}: log {outcome.spec.log}\n    {outcome.message}")
    print("table: " + ", ".join(map(str, files[:3])))
    if files[3:]:
        print("figures: " + ", ".join(str(f) for f in files[3:] if f.suffix == ".png") + " (and each as .pdf)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
