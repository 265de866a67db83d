import pytest

from cellscale.magicargs import MagicUsageError, parse_line
from cellscale.spec import Launcher


@pytest.mark.parametrize(
    ("line", "nodes", "per_node"),
    [
        ("--gpus 2", 1, 2),
        ("--gpus 16 --nodes 2", 2, 8),
        ("--gpus 16 --gpus-per-node 8", 2, 8),
        ("--nodes 2 --gpus-per-node 4", 2, 4),
        ("", 1, 0),
    ],
)
def test_shapes(line, nodes, per_node):
    res = parse_line(line).resources()
    assert (res.nodes, res.gpus_per_node) == (nodes, per_node)


def test_every_flag():
    args = parse_line(
        "--gpus 4 --launcher ray --backend local --queue default --name sweep-1 --time 5 "
        "--env A=1 --env B=x=y --inputs df,lr --outputs loss,acc --detach --dry-run"
    )
    assert args.launcher is Launcher.ray
    assert args.env == {"A": "1", "B": "x=y"}
    assert (args.inputs, args.outputs) == (["df", "lr"], ["loss", "acc"])
    assert args.detach and args.dry_run
    spec = args.to_spec("x = 1", inputs_sha256="a" * 64)
    assert spec.resources.timeout_min == 5 and spec.queue == "default" and spec.name == "sweep-1"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--gpu 2", "did you mean --gpus"),
        ("--gpus -1", "--gpus must be 0"),
        ("--gpus 0 --gpus-per-node 2", "--gpus 0 is a CPU job"),
        ("--mem 10X", "--mem '10X' is not a memory size"),
        ("--cpus 0", "--cpus: Input should be greater than or equal to 1"),
        ("--tasks-per-node 2 --launcher plain", "a plain job has one"),
        ("--gpus two", "invalid int value"),
        ("--gpus 3 --nodes 2", "does not split evenly"),
        ("--gpus 4 --nodes 2 --gpus-per-node 4", "is not --nodes 2"),
        ("--launcher mpi", "invalid choice"),
        ("--env NOEQUALS", "is not KEY=VALUE"),
        ("--name 'a b'", "name"),
        ("--outputs 1x", "not a Python variable name"),
        ("--outputs class", "not a Python variable name"),
        ("--env CUDA_VISIBLE_DEVICES=3", "set by cellscale itself"),
        ("--queue Bad_Queue", "queue"),
        ('--name "unclosed', "cannot read"),
    ],
)
def test_bad_lines_say_what_to_change(line, message):
    with pytest.raises(MagicUsageError, match=message):
        parse_line(line).to_spec("x = 1")


def test_empty_cell_is_refused():
    with pytest.raises(MagicUsageError, match="the cell is empty"):
        parse_line("--gpus 1").to_spec("   \n")


@pytest.mark.parametrize(
    ("line", "cpus", "memory_mb", "gpus"),
    [
        ("--cpus 8 --mem 4G --launcher plain", 8, 4096, 0),
        ("--gpus 0 --launcher plain", 1, 0, 0),
        ("", 1, 0, 0),
        ("--gpus 2 --cpus 4 --mem 512M", 8, 512, 2),  # torchrun: a task per GPU, 4 cores each
        ("--nodes 2 --tasks-per-node 3 --cpus 2 --mem 1T", 12, 2 * 1024 * 1024, 0),
        ("--launcher jax --tasks-per-node 2", 2, 0, 0),  # two JAX processes on CPUs
    ],
)
def test_cpus_and_memory_make_the_gang(line, cpus, memory_mb, gpus):
    resources = parse_line(line).to_spec("x = 1").resources
    assert (resources.cpus, resources.memory_mb, resources.gpus) == (cpus, memory_mb, gpus)


def test_map_is_a_sweep_with_its_own_flags_and_a_plain_launcher():
    args = parse_line("map --over grid --max-parallel 8 --per-task 4 --as s --gpus 1 --outputs loss")
    assert args.sweep and args.over == "grid" and (args.max_parallel, args.per_task, args.bind_as) == (8, 4, "s")
    assert args.launcher is Launcher.plain
    spec = args.to_spec("x = 1", sweep=args.sweep_of(100, "a" * 64))
    assert (spec.sweep.tasks, spec.sweep.slots, spec.resources.gpus_per_node) == (25, 8, 1)
    assert spec.demand.gpus == 8  # admission holds its slots side by side


def test_without_map_the_line_parses_as_before():
    args = parse_line("--gpus 2 --name map")
    assert not args.sweep and args.launcher is Launcher.torchrun and args.name == "map"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--over grid", "--over belongs to %%cluster map"),
        ("--per-task 2", "--per-task belongs to %%cluster map"),
        ("--as s --gpus 1", "--as belongs to %%cluster map"),
        ("map --launcher torchrun", "use --launcher plain"),
        ("map --per-task 0", "--per-task: Input should be greater than or equal to 1"),
        ("map --over 'my grid'", "--over 'my grid' is not a Python variable name"),
    ],
)
def test_sweep_flags_say_where_they_belong(line, message):
    with pytest.raises(MagicUsageError, match=message):
        args = parse_line(line)
        args.to_spec("x = 1", sweep=args.sweep_of(10, "a" * 64))
