"""The report's curves (`podrun report`'s PNG), checked on the matplotlib figure it saves: one throughput line
for one instance, a training loss curve not squashed by an early evaluation loss, and an images/s axis that
leaves out the warm-up steps."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from podrun.rundir.metrics import MetricsWriter, read_metrics  # noqa: E402
from podrun.rundir.report import figure, plot, warmup_steps  # noqa: E402

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
    assert [ln.get_label() for ln in two.get_lines()] == ["total", "per instance"]
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
