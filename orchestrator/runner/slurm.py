"""SLURM as a fleet: the job-array script ``orchestrator slurm`` submits, and what a task
reads from its SLURM environment (its id, the allocation its local Ray is sized to).

Each array task is one ``orchestrator join`` of the sweep with a Ray of its own, so a lab's
cluster needs nothing but the shared database: no Ray cluster spans the nodes. What a task
does with a stop:

- SLURM sends TERM to the batch shell ``--signal=B:TERM@GRACE`` seconds before the time
  limit (and on ``scontrol requeue`` or ``scancel``, to every process it tracks). The shell
  forwards it to the join, which it started in a session of its own (``setsid``) so that a
  process-group signal reaches Ray's daemons only through the join's orderly stop: each
  running trial stores a checkpoint of its current step within ``$ORCH_STOP_GRACE_S``, its
  claims are released, and the task exits 130 (``runner.lifecycle.EXIT_INTERRUPTED``).
- ``--requeue``: a requeued task (same array job and task id, ``SLURM_RESTART_COUNT`` > 0)
  joins again; the trials it stopped are claimable by any task and continue from their
  checkpoints. A task killed outright (SIGKILL, a node lost) leaves its claims to lapse
  after ``$ORCH_LEASE_TTL_S``, when the other tasks take its trials over.

Everything here is pure: the script's text is a function of its options, a task's id and
sizing functions of an environment mapping.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.errors import UserError

DEFAULT_GRACE_S = 60
# Exit codes a task ends with (the join's): 0 the sweep has nothing left for it, 1 trials
# failed, 2 bad input, 130 stopped (preempted, requeued, cancelled, time limit).
EXIT_STOPPED = 130
# Ray's object store never below this (Ray refuses less than 75 MiB).
MIN_OBJECT_STORE = 100 * 2**20
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class ScriptOptions:
    """What the array script runs. ``db``: the URL as the tasks use it, password already
    removed (the CLI strips it: a task reads it from ~/.pgpass or $PGPASSWORD); ``command``: how a task invokes orchestrator (an
    absolute path, the same on every node of a shared file system)."""

    sweep: str
    db: str
    jobs: int
    command: Sequence[str]
    log_dir: str
    grace_s: int = DEFAULT_GRACE_S
    job_name: str | None = None
    sbatch_args: Sequence[str] = field(default_factory=tuple)
    max_concurrent: int | None = None

    def name(self) -> str:
        # The default is made safe for SLURM (and the output file names it becomes part of).
        return self.job_name or "orch-" + re.sub(r"[^A-Za-z0-9_.\-]", "_", self.sweep)[:59]


def check(opts: ScriptOptions) -> None:
    """Refuse options no script should carry (UserError, one line)."""
    if opts.jobs < 1:
        raise UserError(f"--jobs {opts.jobs}: an array needs at least one task")
    if opts.grace_s < 1:
        raise UserError(f"--grace {opts.grace_s}: the stop needs at least a second")
    if opts.max_concurrent is not None and opts.max_concurrent < 1:
        raise UserError(f"--max-concurrent {opts.max_concurrent}: at least 1")
    if not _JOB_NAME.match(opts.name()):
        raise UserError(f"--job-name {opts.name()!r}: letters, digits, '_', '.', '-' only (at most 64)")
    for arg in opts.sbatch_args:
        if "\n" in arg or "\r" in arg:
            raise UserError(f"--sbatch-arg {arg!r}: one line each")
        if not arg.startswith("-"):
            raise UserError(f"--sbatch-arg {arg!r}: an sbatch option (--partition=gpu, --gres=gpu:1, ...)")
        if arg.split("=", 1)[0] in ("--array", "-a"):
            raise UserError("--sbatch-arg --array: the array is --jobs")


def stop_grace_s(grace_s: int) -> int:
    """The join's own stop grace (``$ORCH_STOP_GRACE_S``) inside SLURM's: a third of it, at
    most 10 s (the default), so the checkpoints land well before SLURM's KILL."""
    return max(1, min(10, grace_s // 3))


def script(opts: ScriptOptions) -> str:
    """The sbatch script of an array of ``opts.jobs`` tasks, each an ``orchestrator join``."""
    check(opts)
    q = shlex.quote
    log = opts.log_dir.rstrip("/") or "/"
    lines = [
        "#!/bin/bash",
        f"# orchestrator slurm: {opts.jobs} task(s), each an `orchestrator join` of sweep {opts.sweep}",
        f"#SBATCH --job-name={opts.name()}",
        f"#SBATCH --array=0-{opts.jobs - 1}",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:TERM@{opts.grace_s}",
        f"#SBATCH --output={log}/%x-%A_%a.out",
        # A requeued task writes on after its first run's lines instead of over them.
        "#SBATCH --open-mode=append",
    ]
    lines += [f"#SBATCH {arg}" for arg in opts.sbatch_args]
    join = [*opts.command, "join", opts.sweep, "--db", opts.db, "--quiet"]
    if opts.max_concurrent is not None:
        join += ["--max-concurrent", str(opts.max_concurrent)]
    lines += [
        "",
        "set -u",
        'task="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-local}}_${SLURM_ARRAY_TASK_ID:-0}"',
        'restart="${SLURM_RESTART_COUNT:-0}"',
        "# A temp folder per task and run: its Ray's sockets and session files stay apart from",
        "# any other task's on the same node (and the path short: Ray's sockets need < 108 bytes).",
        'scratch="${TMPDIR:-/tmp}/orch-${task}-${restart}"',
        'mkdir -p "$scratch"',
        'export TMPDIR="$scratch"',
        f'export ORCH_STOP_GRACE_S="${{ORCH_STOP_GRACE_S:-{stop_grace_s(opts.grace_s)}}}"',
        'echo "orchestrator slurm: task $task, restart $restart, on $(hostname):'
        ' ${SLURM_CPUS_PER_TASK:-?} CPU(s), GPUs ${CUDA_VISIBLE_DEVICES:-none}"',
        "# The join sizes its local Ray to this allocation (runner/slurm.py ray_size). It runs in",
        "# a session of its own: a TERM reaches it, and through it its trials, from this shell.",
        "setsid " + " ".join(q(a) for a in join) + " &",
        "child=$!",
        "trap 'kill -TERM \"$child\" 2>/dev/null' TERM INT",
        "# wait returns early when the trap runs: wait again until the join has stopped.",
        "while :; do",
        '    wait "$child"',
        "    rc=$?",
        '    kill -0 "$child" 2>/dev/null || break',
        "done",
        'rm -rf "$scratch"',
        'echo "orchestrator slurm: task $task, restart $restart: join exited $rc"',
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


# ---- a task's environment ------------------------------------------------------------------------


def job_id(env: Mapping[str, str]) -> str | None:
    """``JOBID_TASKID`` of an array task as ``squeue`` prints it, the plain job id outside an
    array, None outside SLURM: what ``drivers.slurm_job`` and ``attempts.slurm_job`` hold."""
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"[:64]
    job = env.get("SLURM_JOB_ID")
    return job[:64] if job else None


def restart_count(env: Mapping[str, str]) -> int:
    """How many times SLURM requeued this task (0: its first run)."""
    try:
        return max(0, int(env.get("SLURM_RESTART_COUNT") or 0))
    except ValueError:
        return 0


@dataclass(frozen=True)
class RaySize:
    """The local Ray a task starts: its CPUs, GPUs and memory (None: Ray's own detection)."""

    num_cpus: int | None
    num_gpus: int | None
    memory: int | None  # bytes for tasks (Ray's ``_memory``)
    object_store_memory: int | None  # bytes


def _count(text: str | None) -> int | None:
    """``4`` of ``4``, ``4(x2)`` or ``4,4``: SLURM's per-node counts (this node's first)."""
    if not text:
        return None
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _gpus(env: Mapping[str, str]) -> int:
    on_node = _count(env.get("SLURM_GPUS_ON_NODE"))
    if on_node is not None:
        return on_node
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible or visible == "NoDevFiles":
        return 0
    return len([d for d in visible.split(",") if d.strip()])


def _memory(env: Mapping[str, str], cpus: int | None) -> int | None:
    """The allocation's memory in bytes: ``SLURM_MEM_PER_NODE`` (MiB), else
    ``SLURM_MEM_PER_CPU`` times the CPUs."""
    per_node = _count(env.get("SLURM_MEM_PER_NODE"))
    if per_node:
        return per_node * 2**20
    per_cpu = _count(env.get("SLURM_MEM_PER_CPU"))
    if per_cpu and cpus:
        return per_cpu * cpus * 2**20
    return None


def ray_size(env: Mapping[str, str]) -> RaySize | None:
    """The local Ray a SLURM task should start, from its allocation (None outside SLURM: Ray
    sizes itself). Without it a task's Ray would see the whole node (every CPU and GPU,
    where no cgroup hides them) and run trials on what other jobs were given.

    CPUs: ``SLURM_CPUS_PER_TASK``, else this node's ``SLURM_JOB_CPUS_PER_NODE``. GPUs:
    ``SLURM_GPUS_ON_NODE``, else the entries of ``CUDA_VISIBLE_DEVICES``, else none (a job
    given no GPU uses none). Memory: ``SLURM_MEM_PER_NODE`` (or per CPU), 30 % of it Ray's
    object store, the rest its task memory."""
    if not env.get("SLURM_JOB_ID"):
        return None
    cpus = _count(env.get("SLURM_CPUS_PER_TASK")) or _count(env.get("SLURM_JOB_CPUS_PER_NODE"))
    memory = _memory(env, cpus)
    store = max(MIN_OBJECT_STORE, int(memory * 0.3)) if memory else None
    task_memory = max(0, memory - store) if memory and store else None
    return RaySize(num_cpus=cpus, num_gpus=_gpus(env), memory=task_memory or None, object_store_memory=store)
