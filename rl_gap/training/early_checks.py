"""Mistakes in an ``rl-gap fit|validate|test|predict`` command line found before torch loads.

The full parser (jsonargparse over Lightning and every module class) needs seconds of
imports before it can say anything. This module reads the same command line with the
standard library and YAML only, and reports in one line:

- a ``--config`` file that is missing, empty or not a YAML mapping;
- a top-level key the CLI does not have (``--trainr.max_epochs``);
- an argument the recipe's model or data class does not take (``--model.init_args.lrr``,
  ``--data.init_args.batchsize``), read from the class's source with :mod:`ast` (no
  import), with the closest valid name;
- a value of the wrong kind for an ``int``/``float``/``bool`` argument
  (``--data.init_args.batch_size abc``), or a ``compile`` setting torch would refuse
  (``{dynamic: maybe}``), given on the command line or in a config file (under
  ``init_args`` or directly under the section: ``model: {micro_batch_size: 8}``);
- a data folder or file that does not exist (``--data.init_args.root /data/sopp``);
- ``trainer.accumulate_grad_batches > 1`` for a ranking module without
  ``allow_split_batch`` (the loss would rank parts of its batch).

Anything it cannot decide (a class outside this package, a key it does not model) is
left to the full parser, which reports it as before.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

import rl_gap

SUBCOMMANDS = ("fit", "validate", "test", "predict")
# LightningCLI's and rl-gap's own top-level keys (a subclass section may be written
# --model CLASS, --model.class_path CLASS, --model.init_args.K V or --model.K V)
TOP_LEVEL = {
    "config", "print_config", "seed_everything", "trainer", "model", "data", "optimizer",
    "lr_scheduler", "ckpt_path", "verbose", "return_predictions", "weights_only",
    "output_dir", "run_name", "wandb", "wandb_project", "wandb_entity", "wandb_tags",
    "wandb_group", "checkpoint_every_n_steps", "force_resume",
}  # fmt: skip
# data arguments naming an input that must exist (None values are left to the class)
PATH_ARGUMENTS = {
    "root", "train", "test", "train_dir", "val_dir", "train_table", "image_root",
    "train_list", "test_list", "font_dir",
}  # fmt: skip
RANKING_MODULES = {"MetricLearningModule", "CLIPFineTuneModule", "MoCoV3Module", "RankingModule"}


def config_file_args(words: list[str]) -> list[str]:
    """The values of ``--config``/``-c`` in a command line."""
    found = []
    for i, word in enumerate(words):
        if word in ("--config", "-c") and i + 1 < len(words):
            found.append(words[i + 1])
        elif word.startswith("--config="):
            found.append(word.split("=", 1)[1])
    return found


def command_line_keys(words: list[str]) -> dict[str, Any]:
    """``{"trainer.max_epochs": 3, ...}``: every ``--key value`` / ``--key=value`` pair of
    the command line (values read as YAML, as jsonargparse reads them), ``--config`` aside."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--") or word.startswith("--config"):
            i += 2 if word in ("--config", "-c") else 1
            continue
        key, sep, value = word[2:].partition("=")
        if not sep:
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                value, i = words[i + 1], i + 1
            else:
                value = "true"  # a flag
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key] = value
        i += 1
    return out


def early_error(words: list[str]) -> str | None:
    """The first mistake found in ``rl-gap <subcommand> ...`` (``words`` after ``rl-gap``),
    as one line, or None (also for ``--help`` and ``--print_config``, left to the parser)."""
    if not words or words[0] not in SUBCOMMANDS:
        return None
    rest = words[1:]
    if any(w in ("-h", "--help") or w.startswith("--print_config") for w in rest):
        return None
    recipe: dict[str, Any] = {}
    for path in config_file_args(rest):
        from rl_gap.resources import recipe_path
        from rl_gap.training.run_config import check_config_file

        if not Path(path).exists():
            try:
                path = str(recipe_path(path))  # a shipped recipe, as the parser resolves it
            except FileNotFoundError:
                pass
        try:
            check_config_file(path)
        except (FileNotFoundError, ValueError) as err:
            return str(err)
        content = yaml.safe_load(Path(path).read_text()) or {}
        content = content.get(words[0], content) if isinstance(content, dict) else content
        for key, value in content.items():
            if isinstance(value, dict) and isinstance(recipe.get(key), dict):
                recipe[key] = _merge_section(recipe[key], value)
            else:
                recipe[key] = value
    given = command_line_keys(rest)
    for key in given:
        top = key.split(".", 1)[0]
        if top not in TOP_LEVEL:
            close = difflib.get_close_matches(top, TOP_LEVEL, n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            return f"unknown key --{key}{hint}"
    for section in ("model", "data"):
        problem = _section_error(section, recipe.get(section), given)
        if problem:
            return problem
    return _split_batch_error(recipe, given)


def _merge_section(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """A later config file's section over an earlier one: its ``init_args`` (or keys written
    directly under the section) add to the earlier ones unless it names another class."""
    merged = {**base, **overlay}
    if overlay.get("class_path", base.get("class_path")) == base.get("class_path"):
        base_args, new_args = base.get("init_args"), overlay.get("init_args")
        if isinstance(base_args, dict) and isinstance(new_args, dict):
            merged["init_args"] = {**base_args, **new_args}
    return merged


def _section_values(recipe_section: Any) -> dict[str, Any]:
    """A config section's arguments: its ``init_args`` and any key written directly under
    the section (``model: {micro_batch_size: 8}``, which jsonargparse also reads)."""
    if not isinstance(recipe_section, dict):
        return {}
    values = {
        k: v
        for k, v in recipe_section.items()
        if k not in ("class_path", "init_args", "dict_kwargs")
    }
    values.update(recipe_section.get("init_args") or {})
    return values


def _class_path(section: str, recipe_section: Any, given: Mapping[str, Any]) -> str | None:
    for key in (section, f"{section}.class_path"):
        if isinstance(given.get(key), str):
            return given[key]
    if isinstance(recipe_section, dict):
        return recipe_section.get("class_path")
    return None


def _section_error(section: str, recipe_section: Any, given: Mapping[str, Any]) -> str | None:
    class_path = _class_path(section, recipe_section, given)
    signature = class_signature(class_path) if class_path else None
    if signature is None:
        return None
    values = _section_values(recipe_section)
    unknown = [name for name in values if name not in signature.params and not signature.open]
    if unknown:
        close = difflib.get_close_matches(unknown[0], signature.params, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return (
            f"{section}.{unknown[0]} in a config file: {class_path.rsplit('.', 1)[-1]} has no "
            f"argument {unknown[0]!r} ({hint}its arguments: {', '.join(sorted(signature.params))})"
        )
    for key, value in given.items():
        if not key.startswith(f"{section}.") or key == f"{section}.class_path":
            continue
        name = key[len(section) + 1 :].removeprefix("init_args.").split(".", 1)[0]
        if name not in signature.params and not signature.open:
            close = difflib.get_close_matches(name, signature.params, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            return (
                f"--{key}: {class_path.rsplit('.', 1)[-1]} has no argument {name!r} "
                f"({hint}its arguments: {', '.join(sorted(signature.params))})"
            )
        if "." not in key[len(section) + 1 :].removeprefix("init_args."):
            values[name] = value
    for name, value in values.items():
        if name == "compile" and section == "model":
            from rl_gap.modules.compile_settings import compile_settings_error

            problem = compile_settings_error(value)
        else:
            problem = _value_error(signature.params.get(name), value)
        if problem:
            return f"--{section}.init_args.{name}: {problem}"
        if (
            section == "data"
            and name in PATH_ARGUMENTS
            and isinstance(value, str)
            and not Path(value).expanduser().exists()
        ):
            return f"--data.init_args.{name}: {value} does not exist"
    return None


def _value_error(annotation: str | None, value: Any) -> str | None:
    """A value jsonargparse would refuse for a plain ``int``/``float``/``bool`` annotation."""
    if annotation is None or value is None:
        return None
    kinds = {part.strip() for part in annotation.split("|")}
    if "None" in kinds and value is None:
        return None
    allowed = kinds - {"None"}
    checks = {
        "int": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or _parses(int, v),
        # YAML reads 1e-4 as a string; jsonargparse still takes it as a float
        "float": lambda v: (
            (isinstance(v, int | float) and not isinstance(v, bool)) or _parses(float, v)
        ),
        "bool": lambda v: isinstance(v, bool),
    }
    if not allowed or not allowed <= set(checks):
        return None  # a type this check does not model
    if any(checks[kind](value) for kind in allowed):
        return None
    return f"expected {' or '.join(sorted(kinds))}, got {value!r}"


def _parses(kind: type, value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        kind(value)
    except ValueError:
        return False
    return True


class Signature:
    """An ``__init__``'s argument names with their annotations (source text); ``open`` when
    it forwards ``**kwargs`` to a class whose arguments could not be read."""

    def __init__(self, params: dict[str, str | None], open_: bool) -> None:
        self.params, self.open = params, open_


def class_signature(class_path: str) -> Signature | None:
    """The ``__init__`` arguments of an ``rl_gap`` class, read from its source (no import);
    None for a class outside this package or one that cannot be found."""
    if "." not in class_path:
        class_path = _short_name(class_path) or ""
    if not class_path.startswith("rl_gap."):
        return None
    module, _, name = class_path.rpartition(".")
    return _signature(module, name, depth=0)


def _short_name(name: str) -> str | None:
    for package in ("rl_gap.modules", "rl_gap.data.metric_learning", "rl_gap.data.image_text",
                    "rl_gap.data.ssl_imagefolder", "rl_gap.data.ssl_mnist",
                    "rl_gap.data.distractor_sets"):  # fmt: skip
        if _find_class(package, name) is not None:
            return f"{package}.{name}"
    return None


def _module_source(module: str) -> tuple[ast.Module, str] | None:
    base = Path(rl_gap.__file__).parent
    parts = module.split(".")[1:]
    for path in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
        if path.is_file():
            return ast.parse(path.read_text(encoding="utf-8")), module
    return None


def _find_class(
    module: str, name: str, depth: int = 0
) -> tuple[ast.ClassDef, str, ast.Module] | None:
    """The class ``name`` defined in ``module`` or re-exported by it (lazy exports too)."""
    if depth > 4:
        return None
    found = _module_source(module)
    if found is None:
        return None
    tree, _ = found
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, module, tree
    for target in _imports(tree, module).get(name, []):
        hit = _find_class(target, name, depth + 1)
        if hit is not None:
            return hit
    return None


def _imports(tree: ast.Module, module: str) -> dict[str, list[str]]:
    """Name -> modules it is imported from (``from x import Name``; ``_EXPORTS`` tables)."""
    out: dict[str, list[str]] = {}
    package = module if _is_package(module) else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            source = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                source = ".".join([*parts, source] if source else parts)
            for alias in node.names:
                out.setdefault(alias.asname or alias.name, []).append(source)
        is_exports = isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        )
        if is_exports and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    out.setdefault(key.value, []).append(package + value.value)
    return out


def _is_package(module: str) -> bool:
    base = Path(rl_gap.__file__).parent
    return base.joinpath(*module.split(".")[1:], "__init__.py").is_file()


def _signature(module: str, name: str, depth: int) -> Signature | None:
    found = _find_class(module, name)
    if found is None or depth > 6:
        return None
    node, home, tree = found
    init = next(
        (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )
    if init is None:  # inherited: the first base's
        return _base_signature(node, home, tree, depth)
    args = init.args
    params = {
        a.arg: (ast.unparse(a.annotation) if a.annotation else None)
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
        if a.arg != "self"
    }
    if args.kwarg is None:
        return Signature(params, False)
    base = _base_signature(node, home, tree, depth)
    if base is None:
        return Signature(params, True)
    return Signature({**base.params, **params}, base.open)


def _base_signature(
    node: ast.ClassDef, home: str, tree: ast.Module, depth: int
) -> Signature | None:
    imports = _imports(tree, home)
    for base in node.bases:
        base_name = ast.unparse(base).split("[")[0]
        if "." in base_name or base_name in ("abc.ABC", "ABC"):
            continue
        for source in imports.get(base_name, [home]):
            if source.startswith("rl_gap"):
                sig = _signature(source, base_name, depth + 1)
                if sig is not None:
                    return sig
    return None


def _split_batch_error(recipe: Mapping[str, Any], given: Mapping[str, Any]) -> str | None:
    factor = given.get("trainer.accumulate_grad_batches")
    if factor is None and isinstance(recipe.get("trainer"), dict):
        factor = recipe["trainer"].get("accumulate_grad_batches")
    if not isinstance(factor, int) or isinstance(factor, bool) or factor <= 1:
        return None
    class_path = _class_path("model", recipe.get("model"), given) or ""
    if class_path.rsplit(".", 1)[-1] not in RANKING_MODULES:
        return None
    model = recipe.get("model") if isinstance(recipe.get("model"), dict) else {}
    allow = (model.get("init_args") or {}).get("allow_split_batch", False)
    for key in ("model.allow_split_batch", "model.init_args.allow_split_batch"):
        allow = given.get(key, allow)
    if allow is True:
        return None
    from rl_gap.modules.batch_settings import split_batch_error

    return split_batch_error("trainer.accumulate_grad_batches", factor)
