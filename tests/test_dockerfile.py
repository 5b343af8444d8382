"""docker/Dockerfile agrees with the lock and follows hadolint-style rules (read statically).

No container runtime is needed: the base tag's torch, CUDA and cuDNN versions are compared
with the pins of constraints.txt, and the instructions with a subset of hadolint's rules.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    ))  # fmt: skip
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def pins(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        if m:
            found[m.group(1).lower().replace("_", "-")] = m.group(2)
    return found


def base_image(steps: list[tuple[str, str]]) -> str:
    """The FROM image with ``${ARG}`` replaced by the ARG's default."""
    args = dict(
        re.fullmatch(r"(\w+)=(\S+)", a).groups() for k, a in steps if k == "ARG" and "=" in a
    )
    (image,) = [a.split()[0] for k, a in steps if k == "FROM"]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], image)


def lock_versions(lock: dict[str, str]) -> dict[str, str]:
    """torch, CUDA major.minor and cuDNN major of the lock's torch build."""
    cuda = re.match(r"(\d+\.\d+)", lock["nvidia-cuda-runtime"]).group(1)
    (cudnn_pkg,) = [k for k in lock if k.startswith("nvidia-cudnn-cu")]
    return {"torch": lock["torch"], "cuda": cuda, "cudnn": lock[cudnn_pkg].split(".")[0]}


def lint(text: str, lock: dict[str, str]) -> list[str]:
    """Rule violations of a Dockerfile, one line each (hadolint codes where one applies)."""
    steps = instructions(text)
    problems = []
    image = base_image(steps)
    m = re.fullmatch(r"pytorch/pytorch:([\d.]+)-cuda([\d.]+)-cudnn(\d+)-(runtime|devel)", image)
    want = lock_versions(lock)
    if m is None:
        problems.append(f"base {image}: expected pytorch/pytorch:<torch>-cuda<X.Y>-cudnn<N>-...")
    else:
        got = dict(zip(("torch", "cuda", "cudnn"), m.groups()[:3], strict=True))
        for key in got:
            if got[key] != want[key]:
                problems.append(f"base {image}: {key} {got[key]}, the lock has {want[key]}")
    if image.endswith(":latest") or ":" not in image:
        problems.append("DL3007: base image without a pinned tag")
    pipes = False
    for kind, args in steps:
        if kind == "ADD":
            problems.append(f"DL3020: ADD {args}: use COPY for files")
        if kind == "WORKDIR" and not args.startswith("/"):
            problems.append(f"DL3000: WORKDIR {args} is not absolute")
        if kind in ("ENTRYPOINT", "CMD"):
            try:
                json.loads(args)
            except ValueError:
                problems.append(f"DL3025: {kind} {args} is not in JSON form")
        if kind == "COPY":
            for source in shlex.split(args)[:-1]:
                if not source.startswith("--") and not (REPO / source).exists():
                    problems.append(f"COPY {source}: no such path in the repository")
        if kind != "RUN":
            continue
        tokens = list(shlex.shlex(args, posix=True, punctuation_chars=True))
        pipes |= "|" in tokens
        for words in split_commands(tokens):
            if words[:1] == ["sudo"]:
                problems.append("DL3004: sudo in RUN")
            if words[:1] == ["cd"]:
                problems.append("DL3003: cd in RUN (use WORKDIR)")
            if words[:1] == ["apt"]:
                problems.append("DL3027: apt in RUN (use apt-get)")
            if words[:2] == ["apt-get", "install"]:
                if "-y" not in words:
                    problems.append("DL3014: apt-get install without -y")
                if "--no-install-recommends" not in words:
                    problems.append("DL3015: apt-get install without --no-install-recommends")
                if "rm -rf /var/lib/apt/lists/*" not in args:
                    problems.append("DL3009: apt lists not removed in the same RUN")
                if "apt-get update" not in args:
                    problems.append("apt-get install without apt-get update in the same RUN")
            if words[1:3] == ["-m", "pip"] or words[:1] == ["pip"]:
                problems += pip_rules(words, lock)
    shell = [a for k, a in steps if k == "SHELL"]
    if pipes and not any("pipefail" in s for s in shell):
        problems.append("DL4006: a RUN pipes without SHELL [... -o pipefail ...]")
    for kind in ("FROM", "ENTRYPOINT", "CMD"):
        if sum(k == kind for k, _ in steps) > 1:
            problems.append(f"DL4003/DL4004: more than one {kind}")
    return problems


def split_commands(tokens: list[str]) -> list[list[str]]:
    """Shell tokens split into commands at ``&&``, ``||``, ``;`` and ``|`` (quotes respected)."""
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def pip_rules(words: list[str], lock: dict[str, str]) -> list[str]:
    """pip installs follow the lock: constraints.txt, or --no-deps, or an exact pinned pip."""
    if "install" not in words:
        return []
    targets = [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]
    if "-c" in words and "constraints.txt" in words:
        return []
    if "--no-deps" in words:
        return []
    problems = []
    for t in targets:
        name, _, version = t.partition("==")
        if name == "pip" and version and version == MAKEFILE_PIP:
            continue
        problems.append(f"DL3013: pip install {t} outside the lock (constraints.txt)")
    return problems


MAKEFILE_PIP = re.search(r"pip==([\d.]+)", (REPO / "Makefile").read_text()).group(1)
LOCK = pins((REPO / "constraints.txt").read_text())
DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()


def test_dockerfile_matches_the_lock_and_the_rules():
    assert lint(DOCKERFILE, LOCK) == []


def test_base_tag_carries_the_locked_torch_build():
    image = base_image(instructions(DOCKERFILE))
    want = lock_versions(LOCK)
    assert (
        image == f"pytorch/pytorch:{want['torch']}-cuda{want['cuda']}-cudnn{want['cudnn']}-runtime"
    )


def test_the_image_builds_the_native_helpers_with_a_compiler():
    runs = " ".join(a for k, a in instructions(DOCKERFILE) if k == "RUN")
    assert re.search(r"apt-get install [^&]*\bg\+\+", runs)
    assert "RL_GAP_NATIVE=1" in runs and "native_library()" in runs


BAD = {
    "FROM pytorch/pytorch:2.14.1-cuda12.8-cudnn9-runtime": "cuda 12.8, the lock has 13.0",
    "FROM pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime": "torch 2.9.0, the lock has 2.14.1",
    "FROM pytorch/pytorch": "expected pytorch/pytorch:",
    "RUN apt-get update && apt-get install -y g++": "DL3015",
    "RUN apt-get update && apt-get install --no-install-recommends g++ "
    "&& rm -rf /var/lib/apt/lists/*": "DL3014",
    "RUN apt-get install -y --no-install-recommends g++": "DL3009",
    "RUN cd /tmp && make": "DL3003",
    "RUN sudo make": "DL3004",
    "ADD rl_gap rl_gap": "DL3020",
    "WORKDIR workspace": "DL3000",
    "ENTRYPOINT rl-gap --help": "DL3025",
    "RUN pip install wandb": "DL3013",
    "RUN pip install --upgrade pip": "DL3013",
    "RUN curl -s x | sh": "DL4006",
    "COPY no_such_dir rl_gap": "no such path",
}


@pytest.mark.parametrize("line", list(BAD))
def test_each_rule_catches_its_mistake(line):
    base = "FROM pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime\n"
    text = line + "\n" if line.startswith("FROM") else base + line + "\n"
    problems = lint(text, LOCK)
    assert any(BAD[line] in p for p in problems), problems
    assert lint(base + 'ENTRYPOINT ["rl-gap"]\n', LOCK) == []
