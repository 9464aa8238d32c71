"""Specs: every shipped spec loads; bad YAML names the file, line and field; host lists parse."""
import os
import textwrap

import pytest

from podrun.errors import HostError, SpecError
from podrun.specs import cluster_names, load_cluster, load_recipe, parse_hostfile, parse_hosts_option, recipe_names
from tests.harness.podrun_proc import run_podrun

GOOD = (load_cluster("ipu-pod16").path)


def test_shipped_specs_load():
    assert {"ipu-pod16", "ipu-pod64", "ipu-pod128", "ipu-pod256", "abci", "dgx-h100", "local"} <= set(cluster_names())
    assert {"efficientnet_b4", "resnet50", "vit_b16", "resnet18_cifar10"} <= set(recipe_names())
    for n in cluster_names():
        load_cluster(n)
    for n in recipe_names():
        load_recipe(n)


def test_cluster_figures():
    abci = load_cluster("abci")
    assert len(abci.hosts) == 1088 and abci.hosts[0] == "g0001" and abci.hosts[-1] == "g1088"
    assert abci.devices_per_host == 4 and abci.device.model == "v100" and abci.device.memory_gb == 16
    assert abci.scheduler == "uge" and abci.interconnect.inter_host.bandwidth_gbps == 200
    for n, h in ((16, 1), (64, 4), (128, 8), (256, 16)):
        c = load_cluster(f"ipu-pod{n}")
        assert len(c.hosts) * c.devices_per_host == n and len(c.hosts) == h and c.device.memory_gb == 0.9
    dgx = load_cluster("dgx-h100")
    assert dgx.devices_per_host == 8 and dgx.device.memory_gb == 80 and dgx.scheduler == "slurm"
    import os
    assert load_cluster("local").devices_per_host == os.cpu_count()


def write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def spec_text(extra=""):
    return open(GOOD).read() + extra


def test_a_clusters_jobs_block_is_what_a_directive_line_can_hold(tmp_path):
    """The jobs block (what a batch job asks the spec's scheduler for): the shipped ABCI specs name theirs; a name
    that cannot go on a directive line, a directive that is not options, a port out of range: exit 2 naming the
    field."""
    assert (load_cluster("abci").jobs.resource, load_cluster("abci").jobs.ssh_port) == ("rt_F", 2299)
    assert (load_cluster("abci3").jobs.queue, load_cluster("abci3").jobs.ssh_directives) == ("rt_HF", ("-v USE_SSH=1",))
    assert load_cluster("dgx-h100").jobs is None
    for jobs, words in (("{resource: 'rt F'}", "'jobs.resource' 'rt F' cannot go on a scheduler directive line"),
                        ("{pe: -mpi}", "'jobs.pe' '-mpi' cannot"),
                        ("{typed_queues: [rt_HF, 'a#b']}", "'jobs.typed_queues' item 1 'a#b' cannot"),
                        ("{ssh_directives: ['USE_SSH=1']}", "'jobs.ssh_directives' item 0 'USE_SSH=1' is not"),
                        ("{ssh_port: 70000}", "'jobs.ssh_port' must be at most 65535")):
        with pytest.raises(SpecError, match=words) as e:
            load_cluster(str(write(tmp_path, spec_text(f"jobs: {jobs}\n"))))
        assert e.value.exit_code == 2


def test_unknown_key_suggests_nearest_and_line(tmp_path):
    p = write(tmp_path, spec_text().replace("devices_per_host: 16", "devices_per_hots: 16"))
    with pytest.raises(SpecError) as e:
        load_cluster(str(p))
    line = [i for i, l in enumerate(p.read_text().splitlines(), 1) if "devices_per_hots" in l][0]
    assert f"{p}:{line}" in str(e.value) and "unknown key 'devices_per_hots'" in str(e.value)
    assert "did you mean 'devices_per_host'" in str(e.value)


def test_wrong_type_names_field_and_line(tmp_path):
    p = write(tmp_path, spec_text().replace("memory_gb: 0.9", "memory_gb: lots"))
    with pytest.raises(SpecError) as e:
        load_cluster(str(p))
    line = [i for i, l in enumerate(p.read_text().splitlines(), 1) if "memory_gb: lots" in l][0]
    assert f"{p}:{line}" in str(e.value) and "device.memory_gb" in str(e.value) and "a number" in str(e.value)


def test_bad_literal(tmp_path):
    p = write(tmp_path, spec_text().replace("kind: ipu", "kind: tpu"))
    with pytest.raises(SpecError, match="field 'device.kind' must be 'ipu' \\| 'gpu' \\| 'cpu'"):
        load_cluster(str(p))


def test_malformed_yaml(tmp_path):
    p = write(tmp_path, "name: x\nhosts: [a, b\n")
    with pytest.raises(SpecError, match=f"{p}:\\d+: malformed YAML"):
        load_cluster(str(p))


def test_missing_field(tmp_path):
    p = write(tmp_path, "name: x\nhosts: [a]\n")
    with pytest.raises(SpecError, match="missing required field 'devices_per_host'"):
        load_cluster(str(p))


def test_unknown_names_suggest():
    with pytest.raises(SpecError) as e:
        load_cluster("ipu-pod61")
    assert "unknown cluster 'ipu-pod61'" in str(e.value) and "did you mean 'ipu-pod64'" in str(e.value)
    with pytest.raises(SpecError, match="did you mean 'resnet50'"):
        load_recipe("resnet5O")


def test_recipe_bad_value(tmp_path):
    src = open(load_recipe("resnet50").path + "/recipe.yaml").read()
    d = tmp_path / "r"
    d.mkdir()
    (d / "recipe.yaml").write_text(src.replace("global_batch: 81920", "global_batch: -1"))
    with pytest.raises(SpecError, match="field 'global_batch' must be at least 1"):
        load_recipe(str(d))
    (d / "recipe.yaml").write_text(src.replace("name: lars", "name: adam"))
    with pytest.raises(SpecError, match="optimizer.name"):
        load_recipe(str(d))


@pytest.mark.parametrize("text,hosts_option,hosts", [
    ("# comment\nh1 slots=4\nh2 slots=4 max_slots=8\n\n", "h1:4,h2:4", [("h1", 4), ("h2", 4)]),   # Open MPI
    ("a\nb\n", "a,b", [("a", None), ("b", None)]),                                              # one per line
    ("h1:4\nh2:4\n", "h1:4,h2:4", [("h1", 4), ("h2", 4)]),                                      # MPICH
    ("h1 slots=4\nh2:2\nh1:2\nh2 slots=2\n", "h1:4,h2:2,h1:2,h2:2", [("h1", 6), ("h2", 4)]),  # repeated: added
    ("h1\nh1\nh2\nh2\n", "h1,h1,h2,h2", [("h1", 2), ("h2", 2)]),          # a bare repeated line is one slot
    ("fd00::2 slots=2\n", "fd00::2", [("fd00::2", 2)]),                      # an IPv6 address is a name
])
def test_hostfile_and_hosts_option_read_alike(tmp_path, text, hosts_option, hosts):
    """One rule for hostfiles and --hosts: Open MPI's `h slots=N`, MPICH's `h:N`, and a host listed more than
    once has its slots added, as Open MPI adds repeated hostfile lines (a line without slots counting 1)."""
    assert [(e.name, e.slots) for e in parse_hostfile(write(tmp_path, text, "hf"))] == hosts
    if hosts_option != "fd00::2":
        assert [(e.name, e.slots) for e in parse_hosts_option(hosts_option)] == hosts


@pytest.mark.parametrize("text,msg", [("h1 slots=x\n", "slots must be an integer from 1 to"),
                                      ("h1 cores=4\n", "unknown setting 'cores'"),
                                      ("h1:4 slots=2\n", "both give the slots"), ("\n# nothing\n", "lists no hosts"),
                                      ("h1:4000\nh1:4000\n", "listed 2 times, 8000 slots in all"),
                                      ("h1:x\n", "slots must be"),
                                      ("h1 slots\n", "cannot read 'slots'"), ("-oProxy=x\n", "not a valid host name")])
def test_bad_hostfiles(tmp_path, text, msg):
    p = write(tmp_path, text, "hf")
    with pytest.raises(HostError, match=msg) as e:
        parse_hostfile(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("value,loaded", [("300", 300.0), ("2.5", 2.5), ("auto", "auto"), ("off", False),
                                          ('"off"', "off")])
def test_hang_timeout_in_a_cluster_spec_and_a_recipe(tmp_path, value, loaded):
    """hang_timeout: seconds, auto or off (YAML reads a bare off as false; podrun launch reads both as off)."""
    assert load_cluster(str(write(tmp_path, spec_text(f"\nhang_timeout: {value}\n")))).hang_timeout == loaded
    d = tmp_path / "r"
    d.mkdir()
    src = open(load_recipe("resnet18_cifar10").path + "/recipe.yaml").read()
    (d / "recipe.yaml").write_text(src + f"\nhang_timeout: {value}\n")
    assert load_recipe(str(d)).hang_timeout == loaded
    assert load_cluster("local").hang_timeout is None and load_recipe("resnet18_cifar10").hang_timeout is None


@pytest.mark.parametrize("value,words", [("0", "at least 1"), ("-5", "at least 1"), ("0.5", "at least 1"),
                                         ("1000000", "at most"), ("soon", "'auto' | 'off'"), (".nan", "got nan")])
def test_a_bad_hang_timeout_names_the_file_line_and_field(tmp_path, value, words):
    p = write(tmp_path, spec_text(f"\nhang_timeout: {value}\n"))
    with pytest.raises(SpecError) as e:
        load_cluster(str(p))
    line = len(p.read_text().splitlines())
    assert f"{p}:{line}: field 'hang_timeout'" in str(e.value) and words in str(e.value), str(e.value)
    cp = run_podrun("launch", "--cluster", p, "--dry-run", "--", "true", timeout=60)
    assert cp.returncode == 2 and "field 'hang_timeout'" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr


def test_hang_timeout_precedence_cli_recipe_cluster_auto(tmp_path):
    """podrun launch's window: --hang-timeout, else the recipe's hang_timeout, else the cluster's, else auto;
    off (as the option's word or YAML's false) turns the watch off; the notices name the source."""
    from podrun.cli.watch_options import watch_for
    from podrun.launch.options import HangOptions

    cluster = load_cluster(str(write(tmp_path, spec_text("\nhang_timeout: 300\n"))))
    d = tmp_path / "r"
    d.mkdir()
    src = open(load_recipe("resnet18_cifar10").path + "/recipe.yaml").read()
    (d / "recipe.yaml").write_text(src + "\nhang_timeout: 900\n")
    recipe = load_recipe(str(d))
    plain = load_recipe("resnet18_cifar10")
    given = HangOptions()
    w = watch_for(HangOptions(60.0, "dump"), recipe, cluster)
    assert (w.hang_timeout, w.source, w.on_hang) == (60.0, "--hang-timeout", "dump")
    w = watch_for(given, recipe, cluster)
    assert (w.hang_timeout, w.source) == (900.0, f"hang_timeout in {d / 'recipe.yaml'}")
    w = watch_for(given, plain, cluster)
    assert (w.hang_timeout, w.source) == (300.0, f"hang_timeout in {cluster.path}")
    w = watch_for(given, None, load_cluster("local"))
    assert (w.hang_timeout, w.source) == ("auto", "--hang-timeout")
    assert watch_for(HangOptions("off"), recipe, cluster).hang_timeout is None
    off = load_cluster(str(write(tmp_path, spec_text("\nhang_timeout: off\n"), "off.yaml")))
    assert watch_for(given, plain, off).hang_timeout is None
    assert watch_for(HangOptions("auto"), recipe, off).hang_timeout == "auto"


def test_podruns_own_recipes_and_specs_are_not_asked_but_the_same_files_elsewhere_are(tmp_path, monkeypatch):
    """podrun's own recipes and cluster specs are as trusted as its code: a tree of podrun's whose recipes/ and
    cluster_specs/ others may write is used as it is; the same folder and file in the working directory are refused
    (exit 2, naming the path and its mode)."""
    import shutil

    import podrun.specs as specs

    own = tmp_path / "own"
    shutil.copytree(specs.project_root() / "recipes" / "resnet18_cifar10", own / "recipes" / "resnet18_cifar10")
    (own / "cluster_specs").mkdir()
    shutil.copy(specs.project_root() / "cluster_specs" / "local.yaml", own / "cluster_specs" / "local.yaml")
    here = tmp_path / "here"
    shutil.copytree(own, here)
    for tree in (own, here):
        for p in (tree / "recipes", tree / "recipes" / "resnet18_cifar10", tree / "cluster_specs",
                  tree / "cluster_specs" / "local.yaml"):
            os.chmod(p, 0o777 if p.is_dir() else 0o666)
    monkeypatch.setattr(specs, "project_root", lambda: own)
    monkeypatch.delenv("PODRUN_RECIPES_PATH", raising=False)
    monkeypatch.delenv("PODRUN_CLUSTER_SPECS_PATH", raising=False)
    monkeypatch.chdir(tmp_path)                        # no recipes/ nor cluster_specs/ here
    assert specs.load_recipe("resnet18_cifar10").path == str(own / "recipes" / "resnet18_cifar10")
    assert specs.load_cluster("local").name
    monkeypatch.chdir(here)
    for load, name, path in ((specs.load_recipe, "resnet18_cifar10", here / "recipes"),
                             (specs.load_cluster, "local", here / "cluster_specs")):
        with pytest.raises(SpecError) as err:
            load(name)
        assert str(path) in err.value.message and "mode 0777" in err.value.message, err.value.message
