"""What a new user types first: `podrun clusters` and `podrun recipes` list what names find, a mistyped command or a
cluster name in the wrong case gets the name it meant."""
from __future__ import annotations

import json

from click.testing import CliRunner

from podrun.cli.main import cli, main
from podrun.specs import cluster_names, recipe_names


def test_clusters_and_recipes_list_every_name_with_its_source():
    runner = CliRunner()
    for command, names, needle in (("clusters", cluster_names(), "gpu-v100"),
                                   ("recipes", recipe_names(), "resnet50 on imagenet")):
        shown = runner.invoke(cli, [command])
        assert shown.exit_code == 0 and needle in shown.output, shown.output
        rows = json.loads(runner.invoke(cli, [command, "--json"]).output)
        assert [r["name"] for r in rows] == names and all(r["source"] for r in rows if r["name"] != "local"), rows
    abci = next(r for r in json.loads(runner.invoke(cli, ["clusters", "--json"]).output) if r["name"] == "abci")
    assert (abci["hosts"], abci["devices_per_host"], abci["cores_per_host"], abci["scheduler"]) == (1088, 4, 40, "uge")


def test_near_misses_get_the_name_they_meant(capsys):
    assert main(["lauch", "x"]) == 2
    assert "No such command 'lauch'. Did you mean launch?" in capsys.readouterr().err
    assert main(["plan", "--cluster", "ABCI", "recipes/resnet50"]) == 2
    assert "did you mean 'abci' (names are case-sensitive)?" in capsys.readouterr().err
