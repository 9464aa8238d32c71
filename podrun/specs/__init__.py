"""Specs are data: cluster specs and recipes found by name or path, loaded into frozen dataclasses."""
from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from podrun import safefs
from podrun.errors import SpecError
from podrun.specs.cluster import ClusterFile, ClusterSpec, DeviceSpec, InterconnectSpec, LinkSpec, resolve
from podrun.specs.hosts import HostEntry, parse_hostfile, parse_hosts_option, shown_path
from podrun.specs.loader import build_dataclass, read_yaml
from podrun.specs.recipe import RecipeFile, RecipeSpec, validate

__all__ = [
    "ClusterSpec", "DeviceSpec", "InterconnectSpec", "LinkSpec", "RecipeSpec", "HostEntry",
    "load_cluster", "load_recipe", "cluster_names", "recipe_names", "parse_hostfile", "parse_hosts_option",
    "project_root",
]


def project_root() -> Path:
    """The folder holding cluster_specs/ and recipes/ shipped with podrun (the source checkout)."""
    return Path(__file__).resolve().parent.parent.parent


def _search_dirs(kind: str) -> list[Path]:
    """cluster_specs/ or recipes/: $PODRUN_<KIND>_PATH entries, then ./<kind>, then podrun's own."""
    env = os.environ.get("PODRUN_CLUSTER_SPECS_PATH" if kind == "cluster_specs" else "PODRUN_RECIPES_PATH", "")
    dirs = [Path(p) for p in env.split(os.pathsep) if p]
    dirs += [Path.cwd() / kind, project_root() / kind]
    out: dict[Path, Path] = {}              # each folder once, by where it resolves to, first in order
    for d in filter(Path.is_dir, dirs):
        out.setdefault(d.resolve(), d)
    return list(out.values())


def cluster_names() -> list[str]:
    return sorted({p.stem for d in _search_dirs("cluster_specs") for p in d.glob("*.yaml")})


def recipe_names() -> list[str]:
    return sorted({p.parent.name for d in _search_dirs("recipes") for p in d.glob("*/recipe.yaml")})


def _unknown(kind: str, name: str, names: list[str]) -> SpecError:
    same = [n for n in names if n.lower() == name.lower()]      # names are matched as written: say the case differs
    close = same or difflib.get_close_matches(name[:200], names, n=1, cutoff=0.4)
    hint = f"did you mean '{close[0]}'{' (names are case-sensitive)' if same else ''}? " if close else ""
    hint += f"known {kind}s: {', '.join(names) or '(none)'}; or give a path to a YAML file"
    return SpecError(f"unknown {kind} '{shown_path(name)}'", hint=hint)


def _probe(check, path: Path) -> bool:
    """path.is_file() and friends, False for a path the system cannot even look up (too long, NUL)."""
    try:
        return check(path)
    except (OSError, ValueError):
        return False


def _check_name(kind: str, name_or_path: str) -> None:
    if not name_or_path or len(name_or_path) > 4096 or "\0" in name_or_path:
        raise SpecError(f"{kind} {shown_path(name_or_path)}: not a name or path podrun can look up",
                        hint="give a name in the search path or a path of at most 4096 characters")


def find_cluster_file(name_or_path: str) -> Path:
    _check_name("cluster spec", name_or_path)
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not _probe(Path.exists, p):     # one that is no regular file is refused when read (read_yaml)
            raise SpecError(f"cluster spec file {shown_path(p)} does not exist")
        return p
    for d in _search_dirs("cluster_specs"):
        for suffix in (".yaml", ".yml"):
            if _probe(Path.is_file, d / f"{name_or_path}{suffix}"):
                return d / f"{name_or_path}{suffix}"
    raise _unknown("cluster", name_or_path, cluster_names())


def find_recipe_dir(name_or_path: str) -> Path:
    _check_name("recipe", name_or_path)
    p = Path(name_or_path)
    if p.name == "recipe.yaml":
        p = p.parent
    if _probe(Path.exists, p / "recipe.yaml"):     # one that is no regular file is refused when read (read_yaml)
        return p
    if os.sep in name_or_path.rstrip(os.sep) or _probe(Path.exists, p):
        if not _probe(Path.exists, p):
            raise SpecError(f"recipe {shown_path(p)} does not exist", hint=_recipe_path_hint(p))
        raise SpecError(f"recipe folder {shown_path(p)} has no recipe.yaml" if _probe(Path.is_dir, p)
                        else f"recipe {shown_path(p)} is not a folder",
                        hint="a recipe is a folder with recipe.yaml and train.py")
    for d in _search_dirs("recipes"):
        if _probe(Path.is_file, d / name_or_path / "recipe.yaml"):
            return d / name_or_path
    raise _unknown("recipe", name_or_path, recipe_names())


def _recipe_path_hint(p: Path) -> str:
    """For a recipe path that does not exist: the nearest recipe folder next to it (or a known recipe's name),
    as the name form's did-you-mean, then the known recipes."""
    try:
        here = sorted(d.name for d in p.parent.iterdir() if _probe(Path.is_file, d / "recipe.yaml"))
    except (OSError, ValueError):        # no folder there, or none the system can look up
        here = []
    close = difflib.get_close_matches(p.name[:200], here, n=1, cutoff=0.4)
    hint = f"did you mean '{shown_path(p.parent / close[0])}'? " if close else ""
    if not close:
        close = difflib.get_close_matches(p.name[:200], recipe_names(), n=1, cutoff=0.4)
        hint = f"did you mean '{close[0]}'? " if close else ""
    return hint + f"known recipes: {', '.join(recipe_names())}"


def _check_owner(paths, kind: str, name_or_path: str) -> None:
    """Refuse (exit 2) a recipe's folder and files or a cluster spec that another user owns or may change, found by
    name in the working directory (./NAME, ./recipes, ./cluster_specs), on $PODRUN_*_PATH or given as a path
    (safefs.input_problem: git's safe.directory rule); podrun's own, which are as trusted as its code, are not
    asked."""
    own = project_root()
    mine = os.path.realpath(own / ("recipes" if kind == "recipe" else "cluster_specs"))
    for path in paths:
        if Path(os.path.realpath(path)).is_relative_to(mine):      # realpath: never raises, a loop included
            return
        named = Path(name_or_path.rstrip(os.sep) or ".")          # podrun's own of the same name, for the hint
        named = named.parent if named.name == "recipe.yaml" else named
        builtin = own / "recipes" / named.name if kind == "recipe" else own / "cluster_specs" / f"{named.stem}.yaml"
        safefs.check_input(path, f"{kind} {shown_path(name_or_path)}", error=SpecError, hint=(
            f"podrun runs a {kind} only from folders and files of your own (or root's) that no one else may change, "
            "as git and OpenSSH do: `chown` it or `chmod go-w` it if it is yours"
            + (f", or name podrun's own by its path: {builtin}" if _probe(Path.exists, builtin) else "")))


def load_cluster(name_or_path: str) -> ClusterSpec:
    path = find_cluster_file(name_or_path)
    data, src = read_yaml(path, "cluster spec")          # a device, a FIFO, a huge file: refused there first
    _check_owner([path], "cluster spec", name_or_path)
    return resolve(build_dataclass(ClusterFile, data, (), src), str(path))


def load_recipe(name_or_path: str) -> RecipeSpec:
    folder = find_recipe_dir(name_or_path)
    path = folder / "recipe.yaml"
    data, src = read_yaml(path, "recipe")
    rf = build_dataclass(RecipeFile, data, (), src)
    validate(rf, str(path))
    script = folder / rf.train_script
    _check_owner([folder, path, *([script] if _probe(Path.exists, script) else [])], "recipe", name_or_path)
    return RecipeSpec(**{f.name: getattr(rf, f.name) for f in dataclasses.fields(RecipeFile)}, path=str(folder))
