"""The report's curves (`podrun report`'s PNG), checked on the matplotlib figure it saves: a title that says what ran
and how it ended, whole-step ticks, a slow host's span, one throughput line for one instance, a training loss curve
not squashed by an early evaluation loss, and an images/s axis that
leaves out the warm-up steps."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from podrun.rundir.metrics import MetricsWriter, read_metrics  # noqa: E402
from podrun.rundir.report import (figure, figures_text, plot, read_run, summarize, title_of,  # noqa: E402
                                  warmup_steps)

STEPS = 40
FIRST_VAL_LOSS = 6.19       # an evaluation after the first epoch, far above the training loss


def _records(tmp_path, instances: int) -> list[dict]:
    """metrics.jsonl as the runner writes it: a slow first step (20 img/s, the rest 150), two evaluations."""
    w = MetricsWriter(tmp_path / f"run{instances}", console=False)
    w.write({"kind": "run", "event": "start", "step": 0, "world_size": 2 * instances, "instances": instances,
             "local_batch": 32, "grad_accum": 1, "global_batch": 64 * instances, "total_steps": STEPS,
             "device": "cpu"})
    for s in range(1, STEPS + 1):
        total = 20.0 if s == 1 else 150.0 + s
        w.write({"kind": "step", "step": s, "epoch": (s - 1) // 20, "loss": 2.4 / s, "accuracy": min(1.0, s / 30),
                 "lr": 0.1, "images_per_sec": total, "images_per_sec_instance": total / instances,
                 "step_seconds": 64 / total})
        if s in (20, 40):
            w.write({"kind": "eval", "step": s, "epoch": (s - 1) // 20,
                     "val_loss": FIRST_VAL_LOSS if s == 20 else 0.05, "val_accuracy": 0.4 if s == 20 else 0.99})
    w.write({"kind": "run", "event": "end", "step": STEPS})
    w.close()
    return read_metrics(tmp_path / f"run{instances}")


@pytest.fixture
def drawn(tmp_path):
    figs = []

    def draw(instances: int):
        fig = figure(_records(tmp_path, instances), title="t")
        figs.append(fig)
        return fig.axes

    yield draw
    for f in figs:
        plt.close(f)


def test_one_instance_draws_one_throughput_line(drawn):
    one = drawn(1)[2]
    assert [ln.get_label() for ln in one.get_lines()] == ["total (1 instance)"]
    two = drawn(2)[2]                  # two instances: per instance is half the total, so both are drawn
    assert [ln.get_label() for ln in two.get_lines()] == ["total", "mean per instance"]
    total, per = two.get_lines()
    assert list(per.get_ydata()) == [t / 2 for t in total.get_ydata()]


def test_first_eval_loss_does_not_squash_the_training_curve(drawn):
    loss = drawn(1)[0]
    bottom, top = loss.get_ylim()
    assert 2.4 <= top < FIRST_VAL_LOSS / 2, (bottom, top)   # the training curve fills the axis
    texts = [t.get_text() for t in loss.texts]
    assert any(f"{FIRST_VAL_LOSS:.2f}" in t for t in texts), texts   # the clipped value is written out
    val = next(ln for ln in loss.get_lines() if ln.get_label() == "val loss")
    assert list(val.get_xdata()) == [20, 40] and math.isnan(val.get_ydata()[0]) and val.get_ydata()[1] == 0.05
    edge = next(ln for ln in loss.get_lines() if ln.get_marker() == "^")   # the off-axis value on the top edge
    assert list(edge.get_xdata()) == [20] and list(edge.get_ydata()) == [top]


def test_throughput_axis_leaves_out_the_warm_up_steps(drawn):
    speed = drawn(1)[2]
    line = speed.get_lines()[0]
    skip = warmup_steps(STEPS)
    assert skip >= 1 and list(line.get_xdata()) == list(range(skip + 1, STEPS + 1))
    assert min(line.get_ydata()) > 150 and speed.get_ylim()[0] > 20     # the 20 img/s first step is not drawn
    assert f"after {skip} warm-up step" in speed.get_title()


def test_plot_writes_the_figure_as_png(tmp_path):
    out = plot(_records(tmp_path, 1), tmp_path / "r.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_title_says_what_ran_and_how_it_ended_and_a_slow_host_is_drawn(tmp_path):
    """A run directory as podrun launch leaves it (plan.json, summary.json with a rank named slow, rank 0's
    metrics.jsonl of a 3-step run): the title names the recipe, cluster, decomposition, status and final validation
    accuracy; the x ticks are whole steps; the slow rank is a red span named with its host."""
    import json

    records = _records(tmp_path, 2)
    run_dir = tmp_path / "run2"
    (run_dir / "plan.json").write_text(json.dumps({
        "recipe": "resnet18_cifar10", "cluster": "twohost", "hosts": ["h0", "h1"], "replicas": 4}))
    (run_dir / "summary.json").write_text(json.dumps({
        "status": "ok", "exit_code": 0, "slow_ranks": [
            {"rank": 3, "host": "h1", "ratio": 1.8, "max_ratio": 2.1, "from_step": 12, "until_step": 30}],
        "host_busy": {"h0": [[1, 0.05], [20, 0.05]], "h1": [[1, 0.05], [20, 0.11]], "h2": "not a series"}}))
    run = read_run(run_dir)
    fig = figure(run.records, title_of(run, summarize(run.records)), slow=run.launch.slow_ranks,
                 host_busy=run.launch.host_busy)
    short = figure([r for r in records if r.get("step", 0) <= 3 or r.get("kind") == "run"], "short")
    try:
        title = fig._suptitle.get_text()
        assert title.splitlines() == [
            "resnet18_cifar10 on twohost: 2 host(s), 4 replicas x local batch 32 x GA 1 = global batch 128",
            f"launch ok (exit 0), step {STEPS}/{STEPS}, {figures_text(summarize(run.records))}  (run2)",
        ], title
        assert "val accuracy 0.9900 (best 0.9900)" in title, title
        speed = fig.axes[2]
        (span,) = speed.patches
        assert (span.get_x(), span.get_x() + span.get_width()) == (12, 30)
        assert [t.get_text() for t in speed.texts] == [" slow: rank 3 on h1 (2.1x)"]
        hosts = fig.axes[3]             # each host's own work per step: the slower host first, in ms
        assert [ln.get_label() for ln in hosts.get_lines()] == ["h1", "h0"]
        assert list(hosts.get_lines()[0].get_ydata()) == pytest.approx([50.0, 110.0])
        panels = [a for a in short.axes if a.get_xlabel() == "step"]    # not the learning rate's twin axis
        assert len(panels) == 3     # no per-host panel without host_busy
        for ax in short.axes:
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    finally:
        plt.close(fig)
        plt.close(short)
