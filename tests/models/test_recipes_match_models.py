"""Each recipe's declared parameter count (the estimate's gradient bytes) equals its model's real count."""
import pytest
import torch

from podrun.models import build, count_parameters
from podrun.specs import load_recipe, recipe_names


@pytest.mark.parametrize("name", recipe_names())
def test_recipe_params_match_built_model(name):
    r = load_recipe(name)
    kw = {k: v for k, v in (("norm", r.model.norm), ("stem", r.model.stem), ("classifier", r.model.classifier)) if v}
    with torch.device("meta"):
        model = build(r.model.name, num_classes=r.dataset.num_classes, **kw)
    assert count_parameters(model) == r.model.params, f"{r.path}/recipe.yaml model.params"
