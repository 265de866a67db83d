import pytest

from cellscale.magicargs import MagicUsageError, TooBig, parse_line
from cellscale.spec import JobLimits, Launcher


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
        ("--gpu 2", "unknown option --gpu (did you mean --gpus?)"),
        ("--gpu=2", "unknown option --gpu (did you mean --gpus?)"),
        (
            "--gpu 2 --nodez 3",
            "unknown option --gpu (did you mean --gpus?); unknown option --nodez (did you mean --nodes?)",
        ),
        ("--frobnicate", "unknown option --frobnicate; %cluster alone lists every flag"),
        ("2", "unexpected '2': each value follows its flag (--gpus 2); %cluster alone lists every flag"),
        ("--gpus two", "--gpus 'two' is not a whole number"),
        ("--gpus", "--gpus needs a value"),
        ("--gpus -1", "--gpus must be 0 (a CPU job) or more"),
        ("--gpus 999", "--gpus 999 is more than one job may ask for; ask for at most --gpus 64"),
        ("--gpus 200 --nodes 2", "--gpus 200 is more than one job may ask for; ask for at most --gpus 128"),
        ("--gpus 0 --gpus-per-node 2", "--gpus 0 is a CPU job: leave out --gpus-per-node"),
        ("--gpus 3 --nodes 2", "--gpus 3 does not split evenly over --nodes 2"),
        ("--gpus 4 --nodes 2 --gpus-per-node 4", "--gpus 4 is not --nodes 2 × --gpus-per-node 4"),
        (
            "--gpus-per-node 65 --nodes 2",
            "--gpus-per-node 65 is more than one job may ask for; ask for at most --gpus-per-node 64",
        ),
        ("--nodes 0", "--nodes 0: a job runs on 1 node or more"),
        ("--nodes x", "--nodes 'x' is not a whole number"),
        ("--nodes 2000", "--nodes 2000 is more than one job may ask for; ask for at most --nodes 1024"),
        ("--tasks-per-node 0", "--tasks-per-node: Input should be greater than or equal to 1"),
        (
            "--tasks-per-node 2 --launcher plain",
            "--tasks-per-node starts several processes per node: a plain job has one",
        ),
        ("--cpus 0", "--cpus: Input should be greater than or equal to 1"),
        ("--cpus 99999", "--cpus 99999 is more than one job may ask for; ask for at most --cpus 1024"),
        ("--mem 10X", "--mem '10X' is not a memory size: use a number with M, G or T (e.g. 4G, 512M, 1T)"),
        ("--mem 0", "--mem: Input should be greater than or equal to 1"),
        ("--mem 9999999G", "--mem 9999999G is more than one job may ask for; ask for at most --mem 65536G"),
        ("--time 0", "--time: Input should be greater than or equal to 1"),
        ("--time x", "--time 'x' is not a whole number"),
        ("--switches 99", "--switches: Input should be less than or equal to 64"),
        ("--retries -1", "--retries: Input should be greater than or equal to 0"),
        ("--retries-timeout 101", "--retries-timeout: Input should be less than or equal to 100"),
        ("--retries-user -1", "--retries-user: Input should be greater than or equal to 0"),
        ("--stall-timeout x", "--stall-timeout 'x' is not a number"),
        ("--stall-timeout 1", "--stall-timeout: Input should be greater than or equal to 10"),
        ("--launcher mpi", "--launcher 'mpi' is not one of torchrun, ray, plain, jax"),
        ("--burst maybe", "--burst 'maybe' is not one of never, allow"),
        ("--data-mode copy", "--data-mode 'copy' is not one of stage, stream"),
        ("--env NOEQUALS", "--env 'NOEQUALS' is not KEY=VALUE"),
        ("--outputs 1x", "--outputs: '1x' is not a Python variable name"),
        ("--outputs class", "--outputs: 'class' is not a Python variable name"),
        ("--inputs 1x", "--inputs: '1x' is not a Python variable name"),
        ('--name "unclosed', "cannot read the %%cluster line: No closing quotation"),
    ],
)
def test_bad_lines_say_what_to_change(line, message):
    """Each flag's refusal, word for word, names the flag as typed."""
    with pytest.raises(MagicUsageError) as refused:
        parse_line(line).to_spec("x = 1")
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        ("--name 'a b'", "--name"),
        ("--queue Bad_Queue", "--queue"),
        ("--priority 'x y'", "--priority"),
        ("--backend 'a b'", "--backend"),
        ("--site 'a b'", "--site"),
        ("--data 'a b'", "--data"),
        ("--env CUDA_VISIBLE_DEVICES=3", "--env"),
    ],
)
def test_a_refused_name_names_its_flag(line, flag):
    with pytest.raises(MagicUsageError) as refused:
        parse_line(line).to_spec("x = 1")
    assert str(refused.value).startswith(f"{flag}: ")


LIMITS = JobLimits(queue="default", cluster_queue="desk-a", gpus=4, cpus=32, memory_mb=65536)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("--gpus 999", "--gpus 999 is more than queue default can ever get; ask for at most --gpus 4"),
        (
            "--gpus-per-node 99 --nodes 2",
            "--gpus-per-node 99 is more than queue default can ever get; ask for at most --gpus-per-node 2",
        ),
        ("--cpus 4096", "--cpus 4096 is more than queue default can ever get; ask for at most --cpus 32"),
        (
            "--cpus 4096 --nodes 2 --launcher plain",
            "--cpus 4096 is more than queue default can ever get; ask for at most --cpus 16",
        ),
        ("--mem 999T", "--mem 999T is more than queue default can ever get; ask for at most --mem 64G"),
        (
            "--nodes 2000 --gpus-per-node 1",
            "--nodes 2000 is more than queue default can ever get; ask for at most --nodes 4",
        ),
    ],
)
def test_too_big_asks_for_what_the_queue_can_ever_get(line, words):
    with pytest.raises(TooBig) as refused:
        parse_line(line).to_spec("x = 1")
    assert refused.value.advice(LIMITS) == words


def test_too_big_beyond_the_static_bound_keeps_it():
    """A queue that could get more than one node holds: the per-node bound is what to ask for."""
    with pytest.raises(TooBig) as refused:
        parse_line("--gpus 999").to_spec("x = 1")
    big = LIMITS.model_copy(update={"gpus": 4096})
    assert refused.value.advice(big) == "--gpus 999 is more than one job may ask for; ask for at most --gpus 64"


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
