"""`podrun plan` through the real console script: tables, JSON, exit code 2 without tracebacks, no heavy imports."""
import json
import subprocess
import sys

import pytest

from tests.harness.podrun_proc import run_podrun

def run(*args, check=False):
    return run_podrun(*args, timeout=60, check_exit=0 if check else None)


@pytest.mark.parametrize("pod,replicas,ga", [(16, 8, 256), (64, 32, 64), (128, 64, 32), (256, 128, 16)])
def test_seed_table_json_and_table(pod, replicas, ga):
    r = run("plan", "--pod", str(pod), "recipes/efficientnet_b4", "--json", check=True)
    d = json.loads(r.stdout)
    for key in ("cluster", "recipe", "hosts", "devices", "devices_per_replica", "replicas", "instances",
                "replicas_per_instance", "local_batch", "grad_accum", "global_batch", "learning_rate",
                "warmup_epochs", "pipeline_bubble"):
        assert key in d
    assert set(d["estimate"]) >= {"images_per_second", "scaling_efficiency", "time_to_train_hours"}
    assert (d["replicas"], d["local_batch"], d["grad_accum"], d["global_batch"]) == (replicas, 3, ga, 6144)
    t = run("plan", "--pod", str(pod), "recipes/efficientnet_b4", check=True).stdout
    assert f"6144 = 3 x {replicas} x {ga}" in t and "img/s" in t and "placement" in t


@pytest.mark.parametrize("args,needle", [
    (["plan", "--cluster", "nope", "resnet50"], "unknown cluster 'nope'"),
    (["plan", "nope_recipe"], "unknown recipe 'nope_recipe'"),
    (["plan", "--pod", "16", "efficientnet_b4", "--global-batch", "6150"], "nearest feasible: 6144 below, 6152 above"),
    (["plan", "--pod", "17", "efficientnet_b4"], "IPU-PODs come in 16, 64, 128 and 256"),
    (["plan", "--pod", "16", "efficientnet_b4", "--local-batch", "9"], "exceeds the recipe's max local batch"),
    (["plan", "--hosts", "a,,b", "resnet50"], "empty host name"),
    (["plan", "--hostfile", "/nonexistent/hf", "resnet50"], "hostfile /nonexistent/hf: cannot read it"),
    (["plan", "--bogus", "resnet50"], "No such option"),
])
def test_bad_input_exit_2_one_paragraph(args, needle):
    r = run(*args)
    assert r.returncode == 2, r
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_debug_shows_traceback():
    r = run("--debug", "plan", "--cluster", "nope", "resnet50")
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_hostfile_slots_must_match_plan(tmp_path):
    hf = tmp_path / "hf"
    hf.write_text("h1 slots=4\nh2 slots=4\n")
    r = run("plan", "--cluster", "dgx-h100", "--hostfile", str(hf), "resnet50")
    assert r.returncode == 2 and "4 slots per host but the plan needs 8 devices per host" in r.stderr
    ok = run("plan", "--cluster", "dgx-h100", "--hostfile", str(hf), "--devices-per-host", "4",
             "resnet50", "--global-batch", "2048", "--json", check=True)
    d = json.loads(ok.stdout)
    assert d["hosts"] == ["h1", "h2"] and d["replicas"] == 8


def test_plan_and_help_never_import_torch_or_paramiko():
    code = ("import sys; from podrun.cli.main import main; main(['plan','--pod','64','efficientnet_b4']); "
            "main(['--help']); main(['top','--help']); main(['launch','--help']); main(['data','bench','--help']); "
            "bad=[m for m in ('torch','paramiko','mpi4py','prometheus_client','tensorboard') if m in sys.modules]; "
            "sys.stderr.write('HEAVY:'+','.join(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY:" in r.stderr and r.stderr.split("HEAVY:")[1].strip() == ""


def test_lr_label_names_the_rules_reference_batch():
    """resnet50's LR 0.1 is given at 256 samples (lr.reference_batch), not at the recipe's global batch 81920."""
    r = run("plan", "--cluster", "abci", "--nodes", "512", "recipes/resnet50", check=True)
    assert "reference 0.1 at global batch 256)" in r.stdout and "at 81920" not in r.stdout
    d = json.loads(run("plan", "--cluster", "abci", "--nodes", "512", "recipes/resnet50", "--json", check=True).stdout)
    assert (d["reference_learning_rate"], d["lr_reference_batch"], d["reference_global_batch"]) == (0.1, 256, 81920)
